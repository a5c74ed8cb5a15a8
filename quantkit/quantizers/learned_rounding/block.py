"""A decoder layer as a function of its target weights, over its calibration rows.

``capture_block`` runs the layer once over every calibration batch (``LayerContext.forward``)
and keeps each call's arguments and which positions are real tokens, and the target: the float
model's output of this layer (the float layer on the float model's inputs,
``LayerContext.forward_float``: AutoRound's target), or the float layer's output on the same
inputs. ``BlockRows`` then runs the layer on any rows of them with candidate weights
(``torch.func.functional_call``), every floating tensor in float32, and gives the squared error
against the target at the real tokens. With ``amp`` on, the layer's matmuls run under bfloat16
autocast (AutoRound's default on CPUs and GPUs that have bfloat16) and its activations and other
parameters are bfloat16 (AutoRound casts the whole model): the target stays the float32 output of
the model's own passes, the squared error is taken in float32, and the gradients reach the
float32 parameters.

A step's rows are drawn from every calibration batch; ``joined`` makes the batches one call
where their arguments allow, so that a step runs one batch, not one per calibration batch.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.func import functional_call

from quantkit.errors import QuantkitError
from quantkit.steps.base import LayerContext


@dataclass
class BlockRows:
    """The layer's calibration calls: ``calls[c] = (args, kwargs)`` (args[0] the hidden states
    ``[rows, row_len, hidden]``), ``kept[c]`` bool ``[rows, row_len]``, ``reference[c]`` the
    float32 target output."""

    layer: nn.Module
    calls: list[tuple[tuple, dict]] = field(default_factory=list)
    kept: list[torch.Tensor] = field(default_factory=list)
    reference: list[torch.Tensor] = field(default_factory=list)
    amp: bool = False

    @property
    def rows(self) -> list[tuple[int, int]]:
        """Every calibration row as ``(call, row)``."""
        return [(c, r) for c, k in enumerate(self.kept) for r in range(k.shape[0])]

    def inputs(self, call: int, rows: torch.Tensor) -> tuple[tuple, dict, torch.Tensor, torch.Tensor]:
        """``rows`` of one call: its arguments (every floating tensor in the dtype the layer runs
        in), the target output and the real-token mask."""
        return (*self._arguments(call, rows), self.reference[call][rows], self.kept[call][rows])

    def _arguments(self, call: int, rows: torch.Tensor) -> tuple[tuple, dict]:
        args, kwargs = self.calls[call]
        n = self.kept[call].shape[0]
        dtype = torch.bfloat16 if self.amp else torch.float32
        return _cast(_rows(args, rows, n), dtype), _cast(_rows(kwargs, rows, n), dtype)

    def run(self, call: int, rows: torch.Tensor, weights: dict[str, torch.Tensor]) -> torch.Tensor:
        """The layer's float32 output on ``rows`` of one call, with ``weights`` (name -> tensor) in
        place of its own parameters of those names."""
        return layer_output(self.layer, weights, *self._arguments(call, rows), self.amp)


def layer_output(layer: nn.Module, weights: dict[str, torch.Tensor], args: tuple, kwargs: dict,
                 amp: bool) -> torch.Tensor:
    """``layer``'s float32 output on ``args`` and ``kwargs`` with ``weights`` in place of its own
    parameters of those names; under ``amp`` its other parameters bfloat16 (AutoRound casts the
    whole model) and its matmuls under bfloat16 autocast."""
    dtype = torch.bfloat16 if amp else torch.float32
    params = {k: _cast(v, dtype) for k, v in layer.named_parameters() if k not in weights}
    params.update({k: _cast(v, dtype) for k, v in layer.named_buffers()})
    params.update(weights)
    device = next(iter(params.values())).device.type
    with torch.autocast(device, dtype=torch.bfloat16, enabled=amp):
        out = functional_call(layer, params, args, kwargs, strict=False)
    return (out[0] if isinstance(out, (tuple, list)) else out).float()


def masked_squared_error(y: torch.Tensor, reference: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """The summed squared error of ``y`` against ``reference`` at the positions ``keep`` marks
    (a mask, not a selection: the shapes stay fixed, which a compiled step needs)."""
    return torch.where(keep.unsqueeze(-1), y - reference, 0.0).pow(2).sum()


def values_at(keep: torch.Tensor, reference: torch.Tensor) -> int:
    """How many values ``masked_squared_error`` sums."""
    return int(keep.sum()) * reference.shape[-1]


def capture_block(ctx: LayerContext, float_target: bool,
                  watch: AbstractContextManager | None = None, amp: bool = False) -> BlockRows:
    """One pass over the calibration batches: each call's arguments and real tokens; then the
    target, with ``float_target`` the float model's output of the layer (one pass over its
    inputs, which become its next layer's), else the float layer's own on the same calls.
    ``watch`` is entered around the first pass alone (hooks that observe the layer's inputs
    there, as a pass of their own would). With ``amp`` that first pass runs under bfloat16
    autocast: it keeps the layer's arguments as they come in and hands its outputs to no one,
    so only ``watch``'s statistics see bfloat16's rounding. The block comes back with ``amp``."""
    if float_target and ctx.forward_float is None:
        raise QuantkitError(f"{ctx.name}: learned rounding's float target needs the float model's layer inputs, "
                            "which this run does not carry")
    block = BlockRows(ctx.layer)

    def pre(module: nn.Module, args: tuple, kwargs: dict) -> None:
        x = args[0] if args else kwargs.get("hidden_states")
        if x is None or x.dim() != 3:
            raise QuantkitError(f"{ctx.name}: learned rounding runs whole decoder layers on [rows, row_len, hidden] "
                                f"inputs, got {None if x is None else tuple(x.shape)}")
        positions = torch.arange(x.shape[:-1].numel()).view(*x.shape[:-1], 1)
        kept = torch.zeros(x.shape[:-1].numel(), dtype=torch.bool)
        kept[ctx.tokens(positions).flatten()] = True
        block.calls.append((tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args), dict(kwargs)))
        block.kept.append(kept.view(x.shape[:-1]))

    handle = ctx.layer.register_forward_pre_hook(pre, with_kwargs=True)
    try:
        device = next(ctx.layer.parameters()).device.type
        with watch or nullcontext(), torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16, enabled=amp):
            ctx.forward()
    finally:
        handle.remove()
    if float_target:
        _float_model_outputs(ctx, block)
    else:
        with torch.no_grad():
            for c, k in enumerate(block.kept):
                block.reference.append(block.run(c, torch.arange(k.shape[0]), {}))
    block.amp = amp   # after the target: it is the float32 output
    return joined(block)


class _Apart(Exception):
    """Two calls' arguments that one call cannot hold."""


def joined(block: BlockRows) -> BlockRows:
    """The block's calls as one call of all their rows, where their arguments allow it (each
    tensor cut by rows alike, everything else equal); else the block as it is. A step's rows,
    drawn from every call, then run as one batch: one attention call and one cast of each
    weight a step instead of one per calibration batch."""
    if len(block.calls) < 2:
        return block
    ns = [k.shape[0] for k in block.kept]
    try:
        args = _join([a for a, _ in block.calls], ns)
        kwargs = _join([k for _, k in block.calls], ns)
    except _Apart:
        return block
    return BlockRows(block.layer, [(args, kwargs)], [torch.cat(block.kept)], [torch.cat(block.reference)], block.amp)


def _join(values: list, ns: list[int]):
    """One value for every call's ``values``: tensors holding each call's rows concatenated,
    equal ones kept once (in tuples, lists and dicts too); ``_Apart`` otherwise."""
    first = values[0]
    if all(isinstance(v, torch.Tensor) for v in values):
        if all(v.dim() > 0 and v.shape[0] == n and v.shape[1:] == first.shape[1:] and v.dtype == first.dtype
               for v, n in zip(values, ns)):
            return torch.cat(values)
        if all(v.shape == first.shape and v.dtype == first.dtype and torch.equal(v, first) for v in values):
            return first
        raise _Apart
    if isinstance(first, (tuple, list)) and all(type(v) is type(first) and len(v) == len(first) for v in values):
        return type(first)(_join(list(items), ns) for items in zip(*values))
    if isinstance(first, dict) and all(isinstance(v, dict) and v.keys() == first.keys() for v in values):
        return {key: _join([v[key] for v in values], ns) for key in first}
    if all(v is first or (not isinstance(v, (torch.Tensor, tuple, list, dict)) and v == first) for v in values):
        return first
    raise _Apart


def _float_model_outputs(ctx: LayerContext, block: BlockRows) -> None:
    """The layer's outputs over the float model's inputs (the same batches, in the same order)."""
    def post(module: nn.Module, args: tuple, output) -> None:
        y = output[0] if isinstance(output, (tuple, list)) else output
        c = len(block.reference)
        if c >= len(block.kept) or tuple(y.shape[:-1]) != tuple(block.kept[c].shape):
            raise QuantkitError(f"{ctx.name}: the float model's calibration batches do not match the quantized ones")
        block.reference.append(y.detach().float())

    handle = ctx.layer.register_forward_hook(post)
    try:
        with torch.no_grad():
            ctx.forward_float()
    finally:
        handle.remove()


def _rows(value, rows: torch.Tensor, n: int):
    """``value`` with every tensor whose first dimension is the call's ``n`` rows cut to ``rows``
    (in tuples, lists and dicts too)."""
    if isinstance(value, torch.Tensor):
        return value[rows.to(value.device)] if value.dim() > 0 and value.shape[0] == n else value
    if isinstance(value, (tuple, list)):
        return type(value)(_rows(v, rows, n) for v in value)
    if isinstance(value, dict):
        return {k: _rows(v, rows, n) for k, v in value.items()}
    return value


def _cast(value, dtype: torch.dtype):
    """Every floating tensor of ``value`` in ``dtype`` (in tuples, lists and dicts too)."""
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, (tuple, list)):
        return type(value)(_cast(v, dtype) for v in value)
    if isinstance(value, dict):
        return {k: _cast(v, dtype) for k, v in value.items()}
    return value
