"""The Gram matrix ``x^T x`` of a batch of inputs, computed as the symmetric product it is.

GPTQ's Hessians and AWQ's clip sweeps both need the ``[cols, cols]`` Gram of a linear's inputs
over every calibration token; with many tokens it is their largest cost after the layer's own
forward pass, and a symmetric product needs about half the multiply-adds of a general one.

Example:
    >>> x = torch.arange(6.0).view(3, 2)
    >>> gram(x).tolist()
    [[20.0, 26.0], [26.0, 35.0]]
"""

from __future__ import annotations

import torch

#: Column block of ``gram``: its products stay large enough for the BLAS to run at full speed.
_GRAM_BLOCK = 128
#: From this many columns the blocks are twice as wide: 1536 columns (SmolLM2's down_proj),
#: 4096 tokens, 2 threads: 12% less time than 128 (interleaved, median of 25); at 576 columns
#: 256 is no faster (benchmarks/RESULTS.md).
_WIDE_GRAM_COLUMNS = 1024


def fold_gram(H: torch.Tensor, x: torch.Tensor, beta: float, alpha: float) -> torch.Tensor:
    """``H <- beta * H + alpha * x^T x`` in place, for ``x`` ``[tokens, cols]`` and a symmetric ``H``,
    computing only the blocks on and above the diagonal.

    A symmetric product needs about half the multiply-adds of a general one; with many
    tokens this is GPTQ's largest cost after the layer's own forward pass. Each block row of
    the upper triangle is one ``addmm`` into ``H``'s own memory (no product to allocate, scale
    and add: that was 12% of the fold at 1536 columns), then copied to the lower triangle, so
    ``H`` stays exactly symmetric.
    """
    cols = x.shape[1]
    block = _GRAM_BLOCK * (2 if cols >= _WIDE_GRAM_COLUMNS else 1)
    if cols < 2 * block:
        product = x.T @ x
        return H.copy_(product).mul_(alpha) if beta == 0 else H.mul_(beta).add_(product, alpha=alpha)
    for i in range(0, cols, block):
        rows = H[i:i + block, i:]
        torch.addmm(rows, x[:, i:i + block].T, x[:, i:], beta=beta, alpha=alpha, out=rows)
        diagonal = H[i:i + block, i:i + block]
        diagonal.copy_(diagonal.triu() + diagonal.triu(1).T)   # its lower half from the upper
        H[i + block:, i:i + block] = H[i:i + block, i + block:].T
    return H


def gram(x: torch.Tensor) -> torch.Tensor:
    """``x^T x`` for ``x`` ``[tokens, cols]``, exactly symmetric (``fold_gram`` into nothing)."""
    return fold_gram(torch.empty(x.shape[1], x.shape[1], dtype=x.dtype, device=x.device), x, 0.0, 1.0)
