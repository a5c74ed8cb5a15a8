"""Bit packing of integer codes into int32 words (compressed-tensors "pack-quantized").

Codes are signed (``[-2^(b-1), 2^(b-1)-1]``, int8). Packing offsets them to unsigned and
places element ``i`` of a row at bits ``[b*i, b*i + b)`` of the row's stream of 32-bit
words, least significant first. Widths that divide 32 (2, 4, 8 bits) never straddle two
words and are packed here byte by byte; the others (3, 5, 6, 7) by ``bitstream.py``.
"""

from __future__ import annotations

import sys

import torch

from quantkit.config.scheme import PACKABLE_BITS
from quantkit.formats.bitstream import pack_dense, unpack_dense



def _check_bits(num_bits: int) -> int:
    if num_bits not in PACKABLE_BITS:
        raise ValueError(f"num_bits: packing supports {PACKABLE_BITS} bits, got {num_bits}")
    return 32 // num_bits


def _byte_aligned(num_bits: int) -> bool:
    return 32 % num_bits == 0


def pack_int32(codes: torch.Tensor, num_bits: int, dim: int = 1) -> torch.Tensor:
    """Pack int8 codes ``[rows, cols]`` into int32 along ``dim`` (1: columns, 0: rows)."""
    per_word = _check_bits(num_bits)
    if codes.dtype != torch.int8 or codes.ndim != 2:
        raise ValueError(f"codes: expected a 2-D int8 tensor, got {codes.dtype} {tuple(codes.shape)}")
    x = codes.t() if dim == 0 else codes
    if not _byte_aligned(num_bits):
        packed = pack_dense(x.to(torch.int16) + (1 << (num_bits - 1)), num_bits)
        return packed.t().contiguous() if dim == 0 else packed
    rows, cols = x.shape
    pad = (-cols) % per_word
    u = (x.to(torch.int16) + (1 << (num_bits - 1))).to(torch.uint8)
    if pad:
        u = torch.nn.functional.pad(u, (0, pad))
    # Fill bytes first (8 / num_bits codes each), then read four bytes as one little-endian word.
    per_byte = 8 // num_bits
    u = u.reshape(rows, -1, per_byte)
    byte = u[..., 0].clone()
    for i in range(1, per_byte):
        byte |= u[..., i] << (num_bits * i)
    if sys.byteorder != "little":  # pragma: no cover
        raise RuntimeError("packing assumes a little-endian host")
    packed = byte.contiguous().view(torch.int32)
    return packed.t().contiguous() if dim == 0 else packed.contiguous()


def unpack_int32(packed: torch.Tensor, num_bits: int, shape: tuple[int, int], dim: int = 1) -> torch.Tensor:
    """Inverse of ``pack_int32``: int8 codes of the original ``shape``."""
    per_word = _check_bits(num_bits)
    if packed.dtype != torch.int32:
        raise ValueError(f"packed: expected int32, got {packed.dtype}")
    rows, cols = (shape[1], shape[0]) if dim == 0 else (shape[0], shape[1])
    x = packed.t() if dim == 0 else packed
    if not _byte_aligned(num_bits):
        if x.shape[0] != rows or x.shape[1] != packed_cols(cols, num_bits):
            raise ValueError(f"packed: shape {tuple(packed.shape)} does not hold {tuple(shape)}")
        codes = (unpack_dense(x, num_bits, cols) - (1 << (num_bits - 1))).to(torch.int8)
        return codes.t().contiguous() if dim == 0 else codes
    shifts = torch.arange(per_word, dtype=torch.int32, device=packed.device) * num_bits
    u = (x.unsqueeze(-1) >> shifts) & ((1 << num_bits) - 1)
    codes = (u.reshape(x.shape[0], -1)[:, :cols] - (1 << (num_bits - 1))).to(torch.int8)
    if codes.shape[0] != rows:
        raise ValueError(f"packed: shape {tuple(packed.shape)} does not hold {tuple(shape)}")
    return codes.t().contiguous() if dim == 0 else codes


def packed_cols(cols: int, num_bits: int) -> int:
    _check_bits(num_bits)
    return (cols * num_bits + 31) // 32
