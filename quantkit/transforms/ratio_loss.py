"""The output errors AWQ's ratio search ranks its candidates by, computed at the least cost.

A mapping whose parent is its one balance linear (``v_proj -> o_proj``, ``up_proj -> down_proj``)
has a quadratic output error: with ``Δ = W_q - W`` and the sample's inputs ``x_t``,

    Σ_t ||Δ x_t||² = tr(Δ G Δᵀ),    G = Σ_t x_t x_tᵀ

so one ``[out, in] @ [in, in]`` product replaces a forward over every sample token
(``LinearReplay``; for SmolLM2's down_proj at 8192 tokens, 2.7 GFLOP against 14.5).

A parent with a nonlinearity (the attention block, the MLP) has to run. Its captured calls are
batches of similar size, and the loss is their sum; ``screened_losses`` runs every candidate on
the first batch, then only the ``keep`` best of them (and the unscaled one, whose loss is
reported) on the rest. The candidate chosen is the exhaustive search's whenever that one is
among the first batch's ``keep`` best.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass

import torch
from torch import nn


def linear_output_error(delta: torch.Tensor, gram: torch.Tensor) -> torch.Tensor:
    """``Σ_t ||Δ x_t||²`` from the inputs' second moments ``G = Σ_t x_t x_tᵀ``: ``tr(Δ G Δᵀ)``.

    >>> x, delta = torch.randn(100, 8, dtype=torch.float64), torch.randn(3, 8, dtype=torch.float64)
    >>> bool(torch.isclose(linear_output_error(delta, x.T @ x), (x @ delta.T).pow(2).sum()))
    True
    """
    return ((delta @ gram) * delta).sum()


@dataclass
class LinearReplay:
    """A linear parent's replay in Gram form: its weight at capture, ``G`` over the sample's tokens."""

    module: nn.Linear
    original: torch.Tensor
    gram: torch.Tensor
    num_tokens: int
    parts: int = 1                  # one part: every token at once

    @classmethod
    def from_calls(cls, module: nn.Linear, calls: list[tuple[tuple, dict, torch.Tensor]]) -> LinearReplay:
        """From a ``Replay``'s captured calls (inputs and kept positions) of ``module``."""
        gram = torch.zeros(module.in_features, module.in_features)
        tokens = 0
        for args, kwargs, keep in calls:
            x = args[0] if args else kwargs["input"]
            x = x.reshape(-1, x.shape[-1])[keep].float()
            gram += x.T @ x
            tokens += x.shape[0]
        return cls(module, module.weight.data.float().clone(), gram, tokens)

    def squared_error(self, part: int = 0) -> tuple[float, int]:
        """The summed squared output error of the module's weight now, and the values it sums."""
        delta = self.module.weight.data.float() - self.original
        return float(linear_output_error(delta, self.gram)), self.num_tokens * delta.shape[0]


def screened_losses(candidates: list[Hashable], parts: int, error: Callable[[Hashable, int], tuple[float, int]],
                    keep: int, always: Hashable) -> dict[Hashable, float]:
    """The mean loss over all ``parts`` of the ``keep`` candidates best on part 0, and of ``always``.

    ``error(candidate, part)`` returns a part's summed error and the values it sums. With one
    part, or ``keep`` covering every candidate, every candidate is scored on everything. On
    equal first-part losses the earlier candidate ranks first.
    """
    first = {c: error(c, 0) if parts else (0.0, 0) for c in candidates}   # no data: every loss 0
    finalists = sorted(candidates, key=lambda c: first[c][0] / max(first[c][1], 1))[:keep] if parts > 1 else candidates
    out = {}
    for c in dict.fromkeys([*finalists, always]):
        total, n = first[c]
        for p in range(1, parts):
            e, k = error(c, p)
            total, n = total + e, n + k
        out[c] = total / max(n, 1)
    return out
