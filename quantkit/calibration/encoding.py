"""Token counts and ids with the target model's tokenizer, batched on the fast (Rust) backend.

BOS rules: texts are encoded without special tokens, then the affixes the tokenizer adds on its
own (Llama's ``<s>``, none for SmolLM2) are added unless the text already starts/ends with them
(a chat template that writes ``<|begin_of_text|>`` itself must not get a second one).

Counting every row of a large log is the sampler's main cost, so rows far longer than
``max_len`` are counted on a prefix: ``PREFIX_CHARS_PER_TOKEN * (max_len + 1)`` characters (BPE
vocabularies average 3-4.5 characters a token on English and code, about 1 on Chinese). If
that prefix already yields more than ``max_len`` tokens the row is truncated for certain and its
exact full length does not matter; otherwise (a rare row of very long tokens) the whole row is
encoded again.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

PREFIX_CHARS_PER_TOKEN = 5
BATCH_ROWS = 2048


@dataclass(frozen=True)
class Affixes:
    prefix: tuple[int, ...]
    suffix: tuple[int, ...]
    prefix_text: str = ""
    suffix_text: str = ""

    def extra_for(self, text: str) -> int:
        """Affix tokens ``with_affixes`` will add to this text."""
        pre = 0 if not self.prefix or (self.prefix_text and text.startswith(self.prefix_text)) \
            else len(self.prefix)
        suf = 0 if not self.suffix or (self.suffix_text and text.endswith(self.suffix_text)) \
            else len(self.suffix)
        return pre + suf


def special_affixes(tokenizer: Any) -> Affixes:
    """The ids the tokenizer adds around any text by default (BOS/EOS rules)."""
    probe = "a"
    plain = list(tokenizer(probe, add_special_tokens=False)["input_ids"])
    full = list(tokenizer(probe, add_special_tokens=True)["input_ids"])
    start = _find(full, plain)
    if start < 0:
        return Affixes((), ())
    prefix, suffix = tuple(full[:start]), tuple(full[start + len(plain):])
    return Affixes(prefix, suffix, tokenizer.decode(list(prefix)) if prefix else "",
                   tokenizer.decode(list(suffix)) if suffix else "")


def _find(haystack: list[int], needle: list[int]) -> int:
    for i in range(len(haystack) - len(needle) + 1):
        if haystack[i:i + len(needle)] == needle:
            return i
    return -1


def _backend(tokenizer: Any) -> Any | None:
    backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
    return backend if hasattr(backend, "encode_batch") else None


def encode_ids(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each text (no specials added here; see ``with_affixes``)."""
    backend = _backend(tokenizer)
    out: list[list[int]] = []
    for start in range(0, len(texts), BATCH_ROWS):
        batch = list(texts[start:start + BATCH_ROWS])
        if backend is not None:
            out.extend(e.ids for e in backend.encode_batch(batch, add_special_tokens=False))
        else:
            out.extend(tokenizer(batch, add_special_tokens=False)["input_ids"])
    return out


def count_tokens(tokenizer: Any, texts: Sequence[str], max_len: int, affixes: Affixes) -> np.ndarray:
    """Token count of each text including affixes; exact up to ``max_len``, and any value above
    ``max_len`` means "longer than max_len" (possibly a prefix count, see the module docstring)."""
    cap = PREFIX_CHARS_PER_TOKEN * (max_len + 1)
    heads = [t if len(t) <= cap else t[:cap] for t in texts]
    counts = np.fromiter((len(ids) for ids in _encode_lengths(tokenizer, heads)), dtype=np.int64,
                         count=len(texts))
    if affixes.prefix or affixes.suffix:
        counts += np.fromiter((affixes.extra_for(t) for t in texts), dtype=np.int64, count=len(texts))
    short_heads = [i for i, t in enumerate(texts) if len(t) > cap and counts[i] <= max_len]
    if short_heads:  # prefix under-counted a row of very long tokens: count it whole
        full = _encode_lengths(tokenizer, [texts[i] for i in short_heads])
        for i, ids in zip(short_heads, full):
            counts[i] = len(ids) + affixes.extra_for(texts[i])
    return counts


def _encode_lengths(tokenizer: Any, texts: list[str]) -> list[Any]:
    backend = _backend(tokenizer)
    if backend is None:
        return encode_ids(tokenizer, texts)
    out: list[Any] = []
    encode = getattr(backend, "encode_batch_fast", backend.encode_batch)  # no offsets: faster
    for start in range(0, len(texts), BATCH_ROWS):
        out.extend(encode(texts[start:start + BATCH_ROWS], add_special_tokens=False))
    return out


def with_affixes(ids: list[int], affixes: Affixes) -> list[int]:
    prefix = list(affixes.prefix) if tuple(ids[:len(affixes.prefix)]) != affixes.prefix else []
    suffix = list(affixes.suffix) if affixes.suffix and \
        tuple(ids[-len(affixes.suffix):]) != affixes.suffix else []
    return prefix + ids + suffix


def truncate(ids: list[int], max_len: int, affixes: Affixes) -> list[int]:
    """Keep the head, and keep a trailing EOS-style suffix so truncated rows still end well."""
    if len(ids) <= max_len:
        return ids
    keep = len(affixes.suffix)
    return ids[:max_len - keep] + list(affixes.suffix) if keep else ids[:max_len]


def tokenizer_fingerprint(tokenizer: Any) -> dict[str, Any]:
    """Identifies a tokenizer by content (vocab + specials), so saved ids are reused only for the
    tokenizer that made them."""
    vocab = tokenizer.get_vocab()
    payload = json.dumps(sorted(vocab.items(), key=lambda kv: kv[1]), ensure_ascii=False)
    affixes = special_affixes(tokenizer)
    specials = json.dumps([list(affixes.prefix), list(affixes.suffix)])
    digest = hashlib.sha256((payload + specials).encode()).hexdigest()
    return {"name_or_path": str(getattr(tokenizer, "name_or_path", "")), "vocab_size": len(vocab),
            "sha256": digest}
