"""True-sequential GPTQ in one pass: each linear solved in its forward pre-hook.

The calibration batches run through the layer in lockstep (``ctx.forward(interleaved=True)``).
Each batch's pre-hook of a linear adds that batch's input to the Hessian and waits at
``ctx.sync``; when all batches are there, the linear is solved from the complete Hessian (its
calibration inputs were computed by the linears before it, already quantized) and the quantized
weight is swapped in before any batch runs the linear.

The first linear of a sub-group to run is solved stacked with its siblings (q/k/v, gate/up
normally read the very same tensor: one Hessian, one factorisation). Each later batch's arrival
at a sibling is one of three ``Arrival`` kinds: the input the stacked solve assumed (its
provisional result stands; when the first batch to arrive brings it, the result is confirmed
there and no batch pauses), the input the last solve read, or a new tensor (a Hessian of its
own: the provisional result is discarded and the linear solved on its own input). Every batch
must bring the same kind. The pass's output is the quantized layer's output, so the pipeline
propagates it as is.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from enum import Enum

import torch
from torch import nn

from quantkit.errors import QuantkitError
from quantkit.steps.base import LayerContext, QuantizedWeight
from quantkit.quantizers.gptq.float_inputs import FloatInputs
from quantkit.quantizers.gptq.gptaq import Asymmetry
from quantkit.quantizers.gptq.hessian import RunningHessian
from quantkit.quantizers.gptq.solve import SolveSettings
from quantkit.quantizers.gptq.stack import solve_batches, solve_stack


class Arrival(Enum):
    """What one batch brings to a linear's pre-hook."""

    ASSUMED = "assumed"   # the input its stacked solve assumed: the provisional result stands
    LAST = "last"         # the input the last solve read: its Hessian is the current one
    NEW = "new"           # another tensor: a Hessian of its own, filled batch by batch


@dataclass
class Provisional:
    """A linear solved stacked with the sibling that ran first, on that sibling's input."""

    result: QuantizedWeight
    original: torch.Tensor     # its float weight, restored if it reads another input
    leader: str                # the linear whose input the stacked solve assumed


@dataclass
class BatchInputs:
    """One batch's inputs that Hessians were built from: the last one, and each leader's.

    Held weakly: a strong reference kept every batch's input of every linear alive to the
    pass's end (SmolLM2, 16 batches of 4096 tokens: about 800 MiB, most of the pass's peak);
    a tensor that was freed cannot be the one arriving.
    """

    last: weakref.ref | None = None
    of_leader: dict[str, weakref.ref] = field(default_factory=dict)

    def is_last(self, x: torch.Tensor) -> bool:
        return self.last is not None and self.last() is x

    def is_input_of(self, leader: str, x: torch.Tensor) -> bool:
        ref = self.of_leader.get(leader)
        return ref is not None and ref() is x

    def record(self, leader: str, x: torch.Tensor) -> None:
        self.last = self.of_leader[leader] = weakref.ref(x)


@dataclass
class InFlightPass:
    """The state of one layer's lockstep pass, advanced by the linears' pre-hooks."""

    ctx: LayerContext
    settings: SolveSettings
    subgroups: list[list[str]]
    floats: FloatInputs | None = None    # GPTAQ: the float model's inputs, paired with each batch's own
    subgroup_of: dict[str, int] = field(init=False)
    results: dict[str, QuantizedWeight] = field(default_factory=dict)
    leader_of: dict[str, str] = field(default_factory=dict)          # whose input each solve read
    provisional: dict[str, Provisional] = field(default_factory=dict)
    confirmed: dict[str, str] = field(default_factory=dict)          # confirmed at the first arrival: leader
    current: RunningHessian = field(default_factory=RunningHessian)  # the Hessian of the last input solved
    current_leader: str | None = None
    pending: dict[str, RunningHessian] = field(default_factory=dict)  # new inputs' Hessians, filling
    arrivals: dict[str, list[Arrival]] = field(default_factory=dict)  # per linear, per batch so far
    inputs: dict[int | None, BatchInputs] = field(default_factory=dict)
    called: dict[str, set[int | None]] = field(default_factory=dict)  # per linear, the batches here

    def __post_init__(self) -> None:
        self.subgroup_of = {n: k for k, g in enumerate(self.subgroups) for n in g}

    def hook(self, name: str):
        def pre_hook(module: nn.Module, inputs: tuple) -> None:
            self.arrive(name, inputs[0])
        return pre_hook

    def arrive(self, name: str, x: torch.Tensor) -> None:
        """A batch reached ``name`` with input ``x``: note what it brings and wait for the others."""
        batch = self.ctx.batch_index()
        callers = self.called.setdefault(name, set())
        if batch in callers:
            raise QuantkitError(f"{self.ctx.name}.{name}: called twice in one layer pass; "
                                "set algorithm.true_sequential: false")
        callers.add(batch)
        seen = self.inputs.setdefault(batch, BatchInputs())
        if name in self.confirmed:   # an earlier batch confirmed the stacked solve's input
            if not seen.is_input_of(self.confirmed[name], x):
                raise self.mixed(name)
            return
        kind = self.arrival(name, x, seen)
        if kind is Arrival.ASSUMED and name not in self.arrivals:
            # The first batch here reads the input the stacked solve assumed, whose result is
            # already swapped in: confirm it now, no pause (a pause kept every batch's
            # act(gate) alive at up_proj); any later batch must agree.
            self.confirm(name)
            return
        if kind is Arrival.NEW:
            seen.record(name, x)
            x_float = self.floats.of(name, self.ctx.batch_index()) if self.floats is not None else None
            self.pending.setdefault(name, RunningHessian()).add(self.ctx.tokens(x.detach()), x_float)
        self.arrivals.setdefault(name, []).append(kind)
        self.ctx.sync(name, lambda: self.finish(name), park=(x,))

    def arrival(self, name: str, x: torch.Tensor, seen: BatchInputs) -> Arrival:
        if name in self.provisional and seen.is_input_of(self.provisional[name].leader, x):
            return Arrival.ASSUMED
        return Arrival.LAST if seen.is_last(x) else Arrival.NEW

    def confirm(self, name: str) -> None:
        held = self.provisional.pop(name)
        self.results[name], self.leader_of[name], self.confirmed[name] = held.result, held.leader, held.leader

    def finish(self, name: str) -> None:
        """All batches reached ``name``'s pre-hook: solve it (unless a stacked solve did)."""
        kinds = set(self.arrivals.pop(name))
        if len(kinds) != 1:
            raise self.mixed(name)
        kind = kinds.pop()
        if name in self.provisional:
            held = self.provisional.pop(name)
            if kind is Arrival.ASSUMED:
                self.results[name], self.leader_of[name] = held.result, held.leader
                return
            self.ctx.targets[name][0].weight.data = held.original
        if kind is Arrival.NEW:   # the previous input's Hessian is done
            self.current, self.current_leader = self.pending.pop(name), name
        self.solve_with_siblings(name)

    def solve_with_siblings(self, name: str) -> None:
        """Solve ``name`` on the current Hessian, stacked with the siblings not solved yet, whose
        results stay provisional until their own inputs arrive."""
        # stacked with its siblings only (q/k/v in self_attn, gate/up in one MLP or expert): a
        # sub-group of many experts would otherwise re-solve every expert at each expert's input
        parent = name.rpartition(".")[0]
        peers = [n for n in self.subgroups[self.subgroup_of[name]]
                 if n != name and n not in self.results and n not in self.provisional
                 and n.rpartition(".")[0] == parent]
        stack = next(b for b in solve_batches(self.ctx, [name] + peers) if name in b)
        asymmetry = Asymmetry(self.current.dXXT, self.floats.alpha) if self.floats is not None else None
        solved = solve_stack(self.ctx, self.settings, stack, self.current.H, self.current.tokens,
                             self.subgroup_of[name], stack, asymmetry)
        for n, (qw, _) in solved.items():
            module, scheme = self.ctx.targets[n]
            if n != name:
                self.provisional[n] = Provisional(qw, module.weight.data, self.current_leader)
            module.weight.data = qw.dequantized(scheme.weights, module.weight.dtype)
        self.results[name], self.leader_of[name] = solved[name][0], self.current_leader

    def mixed(self, name: str) -> QuantkitError:
        return QuantkitError(f"{self.ctx.name}.{name}: reads a shared input in some calibration batches and "
                             "not in others; set algorithm.true_sequential: false")

    def release(self) -> None:
        """Drop the Hessians, weights and inputs the pass holds (an error's traceback keeps it)."""
        self.current = RunningHessian()
        for held in (self.provisional, self.pending, self.inputs, self.confirmed, self.called):
            held.clear()


def quantize_in_flight(ctx: LayerContext, subgroups: list[list[str]], settings: SolveSettings,
                       floats: FloatInputs | None = None) -> dict[str, QuantizedWeight]:
    """Quantize ``subgroups``' linears in one lockstep pass (the module docstring tells how);
    with ``floats``, by GPTAQ."""
    state = InFlightPass(ctx, settings, subgroups, floats)
    handles = [ctx.targets[n][0].register_forward_pre_hook(state.hook(n)) for n in state.subgroup_of]
    try:
        ctx.forward(propagate=True, interleaved=True)
    finally:
        for h in handles:
            h.remove()
        state.release()
    missing = [n for n in state.subgroup_of if n not in state.results]
    if missing:
        raise QuantkitError(f"{ctx.name}.{missing[0]}: never called during calibration (no Hessian)")
    for name, qw in state.results.items():
        qw.stats["hessian_shared_with"] = [n for n, lead in state.leader_of.items()
                                           if lead == state.leader_of[name] and n != name]
    return state.results
