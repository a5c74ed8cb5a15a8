"""GPTQ's Hessian: the running mean ``H = 2/T * sum_t x_t x_t^T`` of a linear's calibration inputs.

Example:
    >>> H, n = accumulate_hessian(torch.ones(4, 3), None, 0)
    >>> n, H[0].tolist()
    (4, [2.0, 2.0, 2.0])
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quantkit.numerics.gram import fold_gram

#: Precision of Hessians and of the solve, whatever the model's dtype.
GPTQ_PRECISION = torch.float32


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
