"""Dense packing of codes whose width does not divide 32 (3, 5, 6, 7 bits).

compressed-tensors (0.20) packs every width as one stream of bits per row: element ``i`` of a
row occupies bits ``[b*i, b*i + b)`` of the row's little-endian stream of 32-bit words, so a
code can straddle two words, and a row of ``n`` codes takes ``ceil(n*b / 32)`` words. For
widths that divide 32 this is exactly the per-word layout of ``packing.py``. (compressed-tensors
up to 0.17 left the top bits of each word empty for these widths instead: the two disagree,
and the dense layout is the one the current reference reader decodes.)
"""

from __future__ import annotations

import math

import torch

_WORD = 32


def pack_dense(u: torch.Tensor, num_bits: int) -> torch.Tensor:
    """Unsigned codes ``[rows, cols]`` (any integer dtype, values < 2**num_bits) -> int32 words."""
    rows, cols = u.shape
    n_words = math.ceil(cols * num_bits / _WORD)
    # 32 codes fill exactly num_bits words: pack blocks of 32 codes, then trim the tail words.
    pad = (-cols) % _WORD
    v = torch.nn.functional.pad(u.to(torch.int64), (0, pad)).reshape(rows, -1, _WORD)
    start = torch.arange(_WORD, dtype=torch.int64, device=u.device) * num_bits
    word, shift = start // _WORD, start % _WORD
    acc = torch.zeros(rows, v.shape[1], num_bits + 1, dtype=torch.int64, device=u.device)
    # bits of one code never overlap another's: adding is or-ing. A code that straddles a word
    # boundary leaves its high bits above bit 31, carried into the next word below.
    acc.index_add_(2, word, v << shift)
    low = acc & 0xFFFFFFFF
    carry = acc >> _WORD
    low[..., 1:] |= carry[..., :-1]
    words = low[..., :num_bits].reshape(rows, -1)[:, :n_words]
    return (words - ((words >> 31) << _WORD)).to(torch.int32)   # as signed int32, same bits


def unpack_dense(packed: torch.Tensor, num_bits: int, cols: int) -> torch.Tensor:
    """Inverse of ``pack_dense``: unsigned codes ``[rows, cols]`` as int64."""
    rows, n_words = packed.shape
    w = packed.to(torch.int64) & 0xFFFFFFFF
    w = torch.nn.functional.pad(w, (0, 1))   # a straddling last code reads one word past the end
    start = torch.arange(cols, dtype=torch.int64, device=packed.device) * num_bits
    word, shift = start // _WORD, start % _WORD
    both = w[:, word] | (w[:, (word + 1).clamp(max=n_words)] << _WORD)
    return (both >> shift) & ((1 << num_bits) - 1)
