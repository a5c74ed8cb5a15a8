"""Each target linear's mean squared input per column, which the ``imatrix_mse`` observer weighs a
group's squared error by: the diagonal of GPTQ's Hessian ``2/T * X^T X`` over two, taken as each
column's running sum of squares, without forming the Hessian (a ``cols``-long sum per token
instead of a ``cols x cols`` Gram matrix).

Linears that read one input tensor share one sum, taken once (``shared_inputs``), as GPTQ's
Hessians are shared.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

import torch

from quantkit.common.distributed import merge_mean
from quantkit.errors import QuantkitError
from quantkit.quantizers.shared_inputs import leader_inputs
from quantkit.steps.base import LayerContext


class ColumnImportance:
    """Running per-column sums of squared inputs of ``names`` (targets of ``ctx``), over the real
    calibration tokens of every layer pass run while ``watching()``."""

    def __init__(self, ctx: LayerContext, names: list[str]):
        self.ctx, self.names = ctx, list(names)
        self.sums: dict[str, torch.Tensor] = {}     # keyed by leader, float64
        self.tokens: dict[str, int] = {}
        self.leader: dict[str, str] = {}

    def watching(self) -> AbstractContextManager:
        """Pre-hooks on the linears for the passes run inside; removed on leaving."""
        return leader_inputs(self.ctx, self.names, self.leader, self._add, "input statistics")

    def _add(self, name: str, x: torch.Tensor) -> None:
        xt = self.ctx.tokens(x.detach()).to(torch.float64)
        squares = xt.pow(2).sum(0)
        self.sums[name] = squares if name not in self.sums else self.sums[name] + squares
        self.tokens[name] = self.tokens.get(name, 0) + xt.shape[0]

    def result(self) -> dict[str, torch.Tensor]:
        """Each name's mean squared input per column (float32), over every rank's tokens; a
        linear no calibration token reached has none."""
        missing = [n for n in self.names if n not in self.leader]
        if missing:
            raise QuantkitError(f"{self.ctx.name}.{missing[0]}: never called during calibration (no input statistics)")
        out: dict[str, torch.Tensor] = {}
        for leader, sums in self.sums.items():
            count = self.tokens[leader]
            mean, total = merge_mean(sums / max(count, 1), count)
            if total > 0:
                out.update({n: mean.float() for n, lead in self.leader.items() if lead == leader})
        return out


def input_importance(ctx: LayerContext, names: list[str]) -> dict[str, torch.Tensor]:
    """Each linear's mean squared input per column from one layer pass; none for a linear no
    calibration token reached, or without calibration data."""
    if not names or ctx.num_batches == 0:
        return {}
    importance = ColumnImportance(ctx, names)
    with importance.watching(), torch.no_grad():
        ctx.forward()
    return importance.result()
