"""Duplicate removal.

- Exact duplicates: same text after Unicode NFKC, case folding and whitespace collapsing
  (a re-sent prompt with a trailing space is the same prompt). The first occurrence is kept and
  stands for all its copies: de-duplication stops a text being drawn twice, while its copies
  still count towards its cell's traffic share (allocate.py).
- Near duplicates: MinHash over 5-token shingles estimates the Jaccard similarity of two
  samples; a candidate at or above the threshold (default 0.8) to any sample already drawn is
  skipped and counted. This runs on the drawn candidates only (hundreds, not the whole log),
  which keeps a 100k-row log fast and is exactly where a duplicate would do harm: twice the
  same template in a 512-sample set.
"""

from __future__ import annotations

import hashlib
import unicodedata
from typing import Sequence

import numpy as np

SHINGLE = 5
NUM_PERM = 64
_MASK32 = np.uint64(0xFFFFFFFF)


def exact_key(text: str) -> bytes:
    norm = " ".join(unicodedata.normalize("NFKC", text).casefold().split())
    return hashlib.blake2b(norm.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def content_key(content: str) -> str:
    """Hex hash of a row's template-free content (``Row.content``), normalised as ``exact_key``:
    the manifest lists the sample's, an evaluation leaves out the rows that match one."""
    return exact_key(content).hex()


def occurrences(texts: Sequence[str]) -> tuple[list[int], list[int]]:
    """Indices of the first row of each exact-duplicate group, and how many rows each stands for
    (the traffic a distinct text carries: a request sent 40 times weighs 40 in its cell's share)."""
    first: dict[bytes, int] = {}
    kept, copies = [], []
    for i, text in enumerate(texts):
        key = exact_key(text)
        if key in first:
            copies[first[key]] += 1
        else:
            first[key] = len(kept)
            kept.append(i)
            copies.append(1)
    return kept, copies


def _permutations(num_perm: int) -> tuple[np.ndarray, np.ndarray]:
    # Fixed, seed-independent hash family: signatures stay comparable across runs.
    rng = np.random.default_rng(0x5EED)
    a = rng.integers(1, 2**63 - 1, size=num_perm, dtype=np.uint64) | np.uint64(1)
    b = rng.integers(0, 2**63 - 1, size=num_perm, dtype=np.uint64)
    return a, b


_A, _B = _permutations(NUM_PERM)


def minhash(ids: Sequence[int]) -> np.ndarray:
    """MinHash signature (``NUM_PERM`` uint32 values) of a token-id sequence."""
    arr = np.asarray(ids, dtype=np.uint64)
    if arr.size == 0:
        return np.zeros(NUM_PERM, dtype=np.uint64)
    k = min(SHINGLE, arr.size)
    n = arr.size - k + 1
    shingles = np.zeros(n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(k):  # polynomial rolling hash of k consecutive ids (wraps mod 2^64)
            shingles = shingles * np.uint64(1_000_003) + arr[j:j + n]
        shingles = np.unique(shingles)
        hashed = (shingles[:, None] * _A[None, :] + _B[None, :]) >> np.uint64(32)
    return hashed.min(axis=0) & _MASK32


class NearDuplicateIndex:
    """Signatures of the samples drawn so far; answers "is this one too close to any of them?"."""

    def __init__(self, threshold: float):
        self.threshold = threshold
        self._sigs = np.zeros((64, NUM_PERM), dtype=np.uint64)
        self._n = 0

    def is_near_duplicate(self, signature: np.ndarray) -> bool:
        if self._n == 0:
            return False
        similarity = (self._sigs[:self._n] == signature[None, :]).mean(axis=1)
        return bool(similarity.max() >= self.threshold)

    def add(self, signature: np.ndarray) -> None:
        if self._n == self._sigs.shape[0]:
            self._sigs = np.concatenate([self._sigs, np.zeros_like(self._sigs)])
        self._sigs[self._n] = signature
        self._n += 1
