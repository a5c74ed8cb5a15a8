"""The float model's inputs of a layer's linears, captured for GPTAQ before any of them is quantized.

GPTAQ pairs each calibration token's input in the quantized model (``x``, what GPTQ's Hessian is
built from) with the same token's input in the float model (``xf``). The pipeline carries the
float model's layer inputs beside the quantized ones (``LayerContext.forward_float``); one pass
of the layer, its weights still float, over those inputs gives every target linear's ``xf``,
held here per batch until the quantized pass pairs it with ``x``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from quantkit.errors import QuantkitError
from quantkit.steps.base import LayerContext


@dataclass
class FloatInputs:
    """Real-token float inputs ``[n, cols]`` per (leader, batch): linears that read one tensor share it."""

    alpha: float
    leader: dict[str, str] = field(default_factory=dict)
    x: dict[tuple[str, int | None], torch.Tensor] = field(default_factory=dict)

    def of(self, name: str, batch: int | None) -> torch.Tensor:
        """``name``'s float input in ``batch``."""
        key = (self.leader.get(name, name), batch)
        if key not in self.x:
            raise QuantkitError(f"gptaq: {name} got no float-model input in calibration batch {batch}")
        return self.x[key]

    def release(self) -> None:
        self.x.clear()


def capture_float_inputs(ctx: LayerContext, names: list[str], alpha: float) -> FloatInputs:
    """Run the layer (as it is: float weights) over the float model's inputs, holding each target's
    real-token input per batch; the pass's outputs become the float model's next layer inputs."""
    if ctx.forward_float is None:
        raise QuantkitError(f"{ctx.name}: gptaq needs the float model's layer inputs, which this run does not carry")
    floats = FloatInputs(alpha)
    last: list[Any] = [None, None]   # the last input tensor held, and its leader

    def make_hook(name: str):
        def hook(module: nn.Module, inputs: tuple) -> None:
            x = inputs[0]
            leader = last[1] if last[0] is x else name
            floats.leader.setdefault(name, leader)
            if leader == name:
                floats.x[(name, ctx.batch_index())] = ctx.tokens(x.detach())
                last[0], last[1] = x, name
        return hook

    handles = [ctx.targets[n][0].register_forward_pre_hook(make_hook(n)) for n in names]
    try:
        with torch.no_grad():
            ctx.forward_float()
    finally:
        for h in handles:
            h.remove()
        last[0] = None
    return floats
