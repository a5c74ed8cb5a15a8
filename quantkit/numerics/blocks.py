"""Block scales: one scale per ``[rows, cols]`` tile of a weight ``[out, in]``.

The scale of tile ``(i, j)`` covers rows ``i*rows .. (i+1)*rows`` and columns
``j*cols .. (j+1)*cols``; scales are laid out ``[out // rows, in // cols]``, the layout
compressed-tensors' block strategy writes (``weight_scale``) and DeepSeek-style FP8 models
ship. Widths the tile does not divide are refused before quantization (``check_width``).

Example:
    >>> w = torch.arange(16.0).reshape(4, 4)
    >>> block_reduce(w, (2, 2), "amax").tolist()
    [[5.0, 7.0], [13.0, 15.0]]
    >>> expand_blocks(torch.tensor([[1.0, 2.0]]), (2, 2), (2, 4)).tolist()
    [[1.0, 1.0, 2.0, 2.0], [1.0, 1.0, 2.0, 2.0]]
"""

from __future__ import annotations

import torch


def block_tiles(x: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """``x [out, in]`` viewed as tiles ``[out // rows, in // cols, rows * cols]``."""
    rows, cols = block
    out, inn = x.shape
    return x.reshape(out // rows, rows, inn // cols, cols).transpose(1, 2).reshape(out // rows, inn // cols, -1)


def block_reduce(x: torch.Tensor, block: tuple[int, int], how: str) -> torch.Tensor:
    """One value per tile: ``"amin"``, ``"amax"`` or ``"sum"``."""
    return getattr(block_tiles(x, block), how)(dim=-1)


def expand_blocks(t: torch.Tensor, block: tuple[int, int], shape: tuple[int, int]) -> torch.Tensor:
    """Tile values ``[out // rows, in // cols]`` broadcast to the full weight ``shape``."""
    rows, cols = block
    return t.repeat_interleave(rows, dim=0).repeat_interleave(cols, dim=1)[: shape[0], : shape[1]]
