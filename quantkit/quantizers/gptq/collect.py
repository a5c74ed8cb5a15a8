"""Hessians from a layer's real calibration inputs, one layer pass per sub-group.

The schedule for when the calibration set does not fit one pass (or ``true_sequential`` is
off): each sub-group's Hessians are collected in a pass of their own, with the sub-groups
before it already quantized, then solved; the pipeline runs the propagation pass after.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from quantkit.errors import QuantkitError
from quantkit.steps.base import LayerContext, QuantizedWeight
from quantkit.quantizers.gptq.float_inputs import FloatInputs
from quantkit.quantizers.gptq.gptaq import Asymmetry
from quantkit.quantizers.gptq.hessian import accumulate_asymmetry, accumulate_hessian
from quantkit.quantizers.gptq.solve import SolveSettings
from quantkit.quantizers.shared_inputs import leader_inputs
from quantkit.quantizers.gptq.stack import solve_batches, solve_stack


@dataclass
class HessianSet:
    """Hessians of one forward pass: one per distinct input tensor.

    ``leader[name]`` is the module whose input ``name`` shares (itself when not shared);
    ``H`` and ``tokens`` are keyed by leader.
    """

    H: dict[str, torch.Tensor] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)
    leader: dict[str, str] = field(default_factory=dict)
    dXXT: dict[str, torch.Tensor] = field(default_factory=dict)   # GPTAQ's, keyed by leader

    def sharing(self, leader: str) -> list[str]:
        return [n for n, lead in self.leader.items() if lead == leader]


def collect_hessians(ctx: LayerContext, names: list[str], offload: bool = False,
                     floats: FloatInputs | None = None) -> HessianSet:
    """Run the layer once with pre-hooks on ``names`` and accumulate their Hessians (and, given
    the float model's inputs ``floats``, GPTAQ's ``dXXT`` beside each).

    Linears called one after another with the very same tensor object (q/k/v on the
    normed hidden states, gate/up) share one Hessian, accumulated once.
    """
    hs = HessianSet()

    def accumulate(name: str, x: torch.Tensor) -> None:
        xt = ctx.tokens(x.detach())
        if floats is not None:
            hs.dXXT[name] = accumulate_asymmetry(floats.of(name, ctx.batch_index()), xt,
                                                 hs.dXXT.get(name), hs.tokens.get(name, 0))
        hs.H[name], hs.tokens[name] = accumulate_hessian(xt, hs.H.get(name), hs.tokens.get(name, 0))

    with leader_inputs(ctx, names, hs.leader, accumulate, "gptq"), torch.no_grad():
        ctx.forward()
    missing = [n for n in names if n not in hs.leader]
    if missing:
        raise QuantkitError(f"{ctx.name}.{missing[0]}: never called during calibration (no Hessian)")
    if offload:
        hs.H = {k: v.cpu() for k, v in hs.H.items()}
        hs.dXXT = {k: v.cpu() for k, v in hs.dXXT.items()}
    return hs


def quantize_in_passes(ctx: LayerContext, subgroups: list[list[str]], settings: SolveSettings,
                       offload: bool = False, floats: FloatInputs | None = None) -> dict[str, QuantizedWeight]:
    """One layer pass per sub-group: collect its Hessians, solve, and write the dequantized
    weights into the layer, so that the next sub-group's inputs are computed with them (with
    ``floats``, by GPTAQ)."""
    results: dict[str, QuantizedWeight] = {}
    for index, names in enumerate(subgroups):
        hs = collect_hessians(ctx, names, offload=offload, floats=floats)
        for leader in list(hs.H):
            H = hs.H.pop(leader)
            asymmetry = Asymmetry(hs.dXXT.pop(leader), floats.alpha) if floats is not None else None
            for batch in solve_batches(ctx, hs.sharing(leader)):
                solved = solve_stack(ctx, settings, batch, H, hs.tokens[leader], index, hs.sharing(leader),
                                     asymmetry)
                for name, (qw, w_hat) in solved.items():
                    ctx.targets[name][0].weight.data.copy_(w_hat)
                    results[name] = qw
            del H
    return results
