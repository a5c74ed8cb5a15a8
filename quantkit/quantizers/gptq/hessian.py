"""GPTQ's Hessian: the running mean ``H = 2/T * sum_t x_t x_t^T`` of a linear's calibration inputs.

Example:
    >>> H, n = accumulate_hessian(torch.ones(4, 3), None, 0)
    >>> n, H[0].tolist()
    (4, [2.0, 2.0, 2.0])
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: Precision of Hessians and of the solve, whatever the model's dtype.
GPTQ_PRECISION = torch.float32

#: Column block of ``gram``: its products stay large enough for the BLAS to run at full speed.
_GRAM_BLOCK = 128
#: From this many columns the blocks are twice as wide: 1536 columns (SmolLM2's down_proj),
#: 4096 tokens, 2 threads: 12% less time than 128 (interleaved, median of 25); at 576 columns
#: 256 is no faster (benchmarks/RESULTS.md).
_WIDE_GRAM_COLUMNS = 1024


def accumulate_hessian(x: torch.Tensor, H: torch.Tensor | None, num_tokens: int) -> tuple[torch.Tensor, int]:
    """Fold inputs ``x`` ``[..., cols]`` into the running mean ``H = 2/T * sum_t x_t x_t^T``.

    Returns the updated ``H`` (``GPTQ_PRECISION``, updated in place when given) and the new
    token count ``T``. The running mean keeps the entries O(|x|^2) however many tokens
    are seen, so fp32 holds them without overflow.
    """
    x = x.reshape(-1, x.shape[-1]).to(GPTQ_PRECISION)
    new = x.shape[0]
    if H is None:
        H = torch.zeros(x.shape[1], x.shape[1], dtype=GPTQ_PRECISION, device=x.device)
    total = num_tokens + new
    if total == 0:
        return H, 0
    fold_gram(H, x, num_tokens / total, 2.0 / total)
    return H, total


@dataclass
class RunningHessian:
    """A Hessian being accumulated batch by batch: ``H`` (None before the first input) over ``tokens``."""

    H: torch.Tensor | None = None
    tokens: int = 0

    def add(self, x: torch.Tensor) -> None:
        self.H, self.tokens = accumulate_hessian(x, self.H, self.tokens)


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
