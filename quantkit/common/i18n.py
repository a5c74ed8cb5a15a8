"""The languages a report is written in, and the tables of its words.

A report's numbers, names and JSON keys are the same in every language; only the words around
them change. Each report keeps its words in one ``Catalog``: message id -> one text per language,
in ``LANGUAGES`` order, checked complete when the catalog is built, so a message missing its
Chinese fails at import rather than showing English in a Chinese report.

>>> words = Catalog({"title": ("Coverage of {n} rows", "{n} 行的覆盖情况")})
>>> words.bind("zh")("title", n=3)
'3 行的覆盖情况'
>>> check_lang("fr")
Traceback (most recent call last):
quantkit.errors.QuantkitError: --lang: expected one of en, zh, got 'fr'
"""
from __future__ import annotations

import re
from typing import Callable, Iterator, Mapping, Sequence

from quantkit.errors import QuantkitError

LANGUAGES = ("en", "zh")
DEFAULT_LANG = "en"
#: the ``lang`` attribute of an HTML page in each language
HTML_LANG = {"en": "en", "zh": "zh-CN"}

Words = Callable[..., str]


def check_lang(value: object, where: str = "--lang") -> str:
    """``value`` when it is one of ``LANGUAGES``; otherwise a one-line error naming ``where``."""
    if value not in LANGUAGES:
        raise QuantkitError(f"{where}: expected one of {', '.join(LANGUAGES)}, got {value!r}")
    return value  # type: ignore[return-value]


class Catalog:
    """Message id -> its text in each of ``LANGUAGES`` (``str.format`` fields allowed)."""

    def __init__(self, messages: Mapping[str, Sequence[str]]):
        short = [key for key, texts in messages.items() if len(texts) != len(LANGUAGES)]
        if short:
            raise ValueError(f"messages without one text per language {LANGUAGES}: {', '.join(short)}")
        self._messages = {key: dict(zip(LANGUAGES, texts)) for key, texts in messages.items()}

    def __contains__(self, key: str) -> bool:
        return key in self._messages

    def __iter__(self) -> Iterator[str]:
        return iter(self._messages)

    def text(self, lang: str, key: str, **fields: object) -> str:
        template = self._messages[key][check_lang(lang, "lang")]
        return template.format(**fields) if fields else template

    def bind(self, lang: str) -> Words:
        """``words(key, **fields)`` in ``lang``."""
        check_lang(lang, "lang")
        return lambda key, **fields: self.text(lang, key, **fields)


Patterns = Sequence[tuple["re.Pattern[str]", str]]


def reworded(text: str, patterns: Patterns, words: Words, fields: Callable[[dict], dict] | None = None) -> str:
    """A sentence the code writes in English (and report.json keeps so) in ``words``'s language:
    the message of the first of ``patterns`` (a compiled pattern, its message id) that matches it
    whole, its named groups as the message's fields (``fields`` may reword them in turn); a
    sentence no pattern knows, as it is.

    >>> said = Catalog({"thin": ("only {n} rows", "只有 {n} 行")})
    >>> reworded("only 3 rows", [(re.compile(r"only (?P<n>\\d+) rows"), "thin")], said.bind("zh"))
    '只有 3 行'
    """
    for pattern, key in patterns:
        m = pattern.fullmatch(text)
        if m:
            found = {k: v or "" for k, v in m.groupdict().items()}
            return words(key, **(fields(found) if fields else found))
    return text
