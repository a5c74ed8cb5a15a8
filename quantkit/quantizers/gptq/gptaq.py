"""GPTAQ (Li et al., 2025, "GPTAQ: Efficient Finetuning-Free Quantization for Asymmetric Calibration").

GPTQ fits ``Q x ~ W x`` on the inputs ``x`` the already-quantized earlier layers give. GPTAQ keeps
that Hessian, ``H = 2/T * sum x x^T``, but aims at the float model's output ``W xf``: the
objective is ``||W xf - Q x||^2``. With ``dXXT = 2/T * sum (xf - x) x^T`` (``accumulate_asymmetry``),
quantizing column ``p`` (its value ``w_p`` as the solve reaches it) moves every later column
``j`` by GPTQ's term plus ``w_p * P[p, j]``, where

    P = alpha * triu(dXXT @ U^T, 1) @ U,        U^T U = H^-1 (U upper, GPTQ's factor)

Row ``p`` of ``P`` (``alpha = 1``) is ``dXXT[p, F] H_F^-1`` for the columns ``F`` still free: the
float target's share of column ``p`` that its input's drift leaves unmet, handed to the
columns that can still absorb it. ``alpha`` scales the correction (0.25 in the authors' code and
in GPTQModel; the paper leaves it out); at ``alpha = 1`` the correction is the exact
least-squares step of the asymmetric objective.

A lazily updated block hands its columns' corrections to the columns after it with the values
each column had when it was rounded, as it does within the block, so the result does not
depend on ``block_size`` (GPTQModel's code applies the block's rounded values after the block).

Example:
    >>> x = torch.randn(256, 64); xf = x + 0.1 * torch.randn(256, 64)
    >>> H = 2 * x.T @ x / 256; dXXT = 2 * (xf - x).T @ x / 256
    >>> U = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)
    >>> correction(dXXT, U, 1.0).triu(1).equal(correction(dXXT, U, 1.0))    # later columns only
    True
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quantkit.quantizers.gptq.hessian import GPTQ_PRECISION

#: GPTAQ's default correction scale: the authors' released code and GPTQModel use it.
DEFAULT_ALPHA = 0.25


@dataclass(frozen=True)
class Asymmetry:
    """What GPTAQ adds to a solve: ``dXXT`` ``[cols, cols]`` (columns in the weight's order) and ``alpha``."""

    dXXT: torch.Tensor
    alpha: float = DEFAULT_ALPHA


def correction(dXXT: torch.Tensor, U: torch.Tensor, alpha: float) -> torch.Tensor:
    """``P = alpha * triu(dXXT @ U^T, 1) @ U``, in solve order (``dXXT`` permuted as ``U`` is).

    Strictly upper triangular: column ``p``'s correction reaches only the columns after it.
    """
    P = (dXXT.to(GPTQ_PRECISION) @ U.T).triu_(1)
    return (P @ U).mul_(alpha)


def in_solve_order(asymmetry: Asymmetry, dead: torch.Tensor, perm: torch.Tensor | None) -> torch.Tensor:
    """``dXXT`` with the dead columns' entries zeroed (their inputs are always zero, their weights
    dropped) and rows and columns permuted to the solve's order."""
    dXXT = asymmetry.dXXT.to(GPTQ_PRECISION).clone()
    dXXT[:, dead] = 0.0
    dXXT[dead, :] = 0.0
    if perm is not None:
        dXXT = dXXT[perm][:, perm]
    return dXXT
