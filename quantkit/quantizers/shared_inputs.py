"""Pre-hooks on a layer's target linears that see each distinct input tensor once.

Linears called one after another with the very same tensor object (q/k/v on the normed hidden
states, gate/up) read one input: the first of them leads, and a statistic of that input (GPTQ's
Hessian, the mean squared input) is taken once, for the leader, and shared by the others.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from quantkit.steps.base import LayerContext


@contextmanager
def leader_inputs(ctx: LayerContext, names: list[str], leader: dict[str, str],
                  on_input: Callable[[str, torch.Tensor], None], what: str) -> Iterator[None]:
    """While inside: each call of a linear of ``names`` records its leader in ``leader`` (name ->
    leading name) and, when it leads, hands its input to ``on_input(name, x)``."""
    last: list[Any] = [None, None]   # the last input tensor handed on, and its leader

    def make_hook(name: str):
        def hook(module: nn.Module, inputs: tuple) -> None:
            x = inputs[0]
            lead = last[1] if last[0] is x else name
            if leader.setdefault(name, lead) != lead:
                raise RuntimeError(f"{what}: {ctx.name}.{name} changed which input it shares between calls")
            if lead == name:
                on_input(name, x)
                last[0], last[1] = x, name
        return hook

    handles = [ctx.targets[n][0].register_forward_pre_hook(make_hook(n)) for n in names]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
        last[0] = None
