"""A window of tokens as text a reader can read: whole characters only.

A byte-level tokenizer splits a Chinese character (three UTF-8 bytes) across tokens; decoding a
window that starts or ends inside one gives U+FFFD ('四年多来，他�'). The window is widened by
the few tokens that hold the rest of the character, and whatever still cannot be decoded at
either end (a window at the very start or end of the text) is dropped.

>>> text = "四年多来，他说".encode()
>>> decode = lambda ids: bytes(ids).decode("utf-8", errors="replace")
>>> ids = list(text)                       # one token per byte: every character spans three
>>> decode(ids[:17])                        # the sixth character cut after two of its bytes
'四年多来，\ufffd'
>>> context(decode, ids, 1, 17)             # before the cut: the whole characters only
'年多来，'
>>> token_text(decode, ids, 16)             # the token inside a character: the character
'他'
"""
from __future__ import annotations

from typing import Callable, Sequence

REPLACEMENT = "\ufffd"
#: the most tokens one character's bytes spread over (UTF-8: four bytes)
SPREAD = 3


def context(decode: Callable[[Sequence[int]], str], ids: Sequence[int], start: int, end: int) -> str:
    """``ids[start:end]`` as text, cut at character boundaries: a character split at ``start`` is
    left out, one split at ``end`` (it belongs to the token at ``end``) left out too."""
    text = decode(ids[start:end])
    return text.lstrip(REPLACEMENT).rstrip(REPLACEMENT)


def token_text(decode: Callable[[Sequence[int]], str], ids: Sequence[int], pos: int) -> str:
    """The token at ``pos`` as text: when it holds part of a character, the whole character,
    decoded with the neighbouring tokens that hold its other bytes."""
    for before in range(SPREAD + 1):
        for after in range(SPREAD + 1):
            lo, hi = max(0, pos - before), min(len(ids), pos + 1 + after)
            text = decode(ids[lo:hi])
            if not text.startswith(REPLACEMENT) and not text.endswith(REPLACEMENT):
                return text
    return decode(ids[pos:pos + 1]).strip(REPLACEMENT)
