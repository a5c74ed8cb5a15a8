"""GPTQ's Hessian: the running mean ``H = 2/T * sum_t x_t x_t^T`` of a linear's calibration inputs.

GPTAQ (Li et al., 2025) adds a second running mean beside it, ``dXXT = 2/T * sum_t (xf_t - x_t) x_t^T``:
how far the float model's input ``xf`` of the same token is from the quantized model's ``x``
(``accumulate_asymmetry``).

Example:
    >>> H, n = accumulate_hessian(torch.ones(4, 3), None, 0)
    >>> n, H[0].tolist()
    (4, [2.0, 2.0, 2.0])
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quantkit.errors import QuantkitError
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


def accumulate_asymmetry(x_float: torch.Tensor, x: torch.Tensor, dXXT: torch.Tensor | None,
                         num_tokens: int) -> torch.Tensor:
    """Fold one batch into GPTAQ's running mean ``dXXT = 2/T * sum_t (xf_t - x_t) x_t^T``.

    ``x`` ``[..., cols]`` is what the linear reads in the quantized model, ``x_float`` the same
    tokens' input in the float model; ``num_tokens`` is ``T`` before this batch (the count
    ``accumulate_hessian`` keeps for the same inputs: call this first). Row ``i`` of ``dXXT``
    is how the float input's channel ``i`` departs from the quantized one, seen through every
    quantized channel. Returns the updated ``dXXT`` (in place when given).

    Example:
        >>> x, xf = torch.ones(4, 2), torch.full((4, 2), 1.5)
        >>> accumulate_asymmetry(xf, x, None, 0).tolist()      # 2/4 * 4 * 0.5 * 1
        [[1.0, 1.0], [1.0, 1.0]]
    """
    x = x.reshape(-1, x.shape[-1]).to(GPTQ_PRECISION)
    x_float = x_float.reshape(-1, x_float.shape[-1])
    if x_float.shape != x.shape:
        raise QuantkitError(f"gptaq: the float input {tuple(x_float.shape)} and the quantized one {tuple(x.shape)} "
                            "differ in shape (not the same tokens)")
    delta = x_float.to(GPTQ_PRECISION) - x
    if dXXT is None:
        dXXT = torch.zeros(x.shape[1], x.shape[1], dtype=GPTQ_PRECISION, device=x.device)
    total = num_tokens + x.shape[0]
    if total == 0:
        return dXXT
    return dXXT.addmm_(delta.T, x, beta=num_tokens / total, alpha=2.0 / total)


@dataclass
class RunningHessian:
    """A Hessian being accumulated batch by batch: ``H`` (None before the first input) over ``tokens``,
    and GPTAQ's ``dXXT`` beside it when the float model's inputs are given."""

    H: torch.Tensor | None = None
    tokens: int = 0
    dXXT: torch.Tensor | None = None

    def add(self, x: torch.Tensor, x_float: torch.Tensor | None = None) -> None:
        if x_float is not None:
            self.dXXT = accumulate_asymmetry(x_float, x, self.dXXT, self.tokens)
        self.H, self.tokens = accumulate_hessian(x, self.H, self.tokens)
