"""What transforms observe of a layer in one calibration pass, and the replay their searches loop on.

One pass over every calibration batch (``LayerContext.forward_batches``) records, through
forward hooks, for the linears asked:

- per input channel: mean |x| (AWQ's activation salience) and max |x| (SmoothQuant's range);
- per group of input channels: the Gram matrix ``X_g^T X_g / n`` (the block diagonal of
  GPTQ's Hessian): the output error of a change ``d`` of a weight row's group is exactly
  ``d^T G_g d``, so clip ranges are searched over every calibration token at the cost of
  one small matrix product per candidate;

and, for the parent modules asked, on the first batches only (the search's sample): their
call arguments and float outputs at real tokens, so that a search can run the parent again
with candidate weights (``Replay.loss``) without running the whole layer.

``skip_first`` leaves the first tokens of every row out of all of it. The first position is an
attention sink: in SmolLM2's last layers its down_proj input holds most of the squared signal of
a 512-token row (77% in layer 28, 42x the median token's norm), so a squared-error loss and a
mean |x| taken over every token are decided by one token per row, whose error the next norm
divides by that same large norm.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from quantkit.numerics.gram import gram
from quantkit.steps.base import LayerContext


@dataclass
class ChannelStats:
    abs_sum: torch.Tensor
    abs_max: torch.Tensor
    count: int = 0
    gram: torch.Tensor | None = None      # [groups, group_size, group_size], summed
    group_size: int = 0
    full: torch.Tensor | None = None      # [in, in], summed: the whole Gram (with ``full_gram``)

    @property
    def abs_mean(self) -> torch.Tensor:
        return self.abs_sum / max(self.count, 1)

    def group_gram(self) -> torch.Tensor:
        """``[groups, group_size, group_size]``: the diagonal blocks of the whole Gram where that is kept."""
        if self.gram is None and self.full is not None:
            n, g = self.full.shape[0] // self.group_size, self.group_size
            return self.full.view(n, g, n, g).diagonal(dim1=0, dim2=2).permute(2, 0, 1) / max(self.count, 1)
        return self.gram / max(self.count, 1)

    def full_gram(self) -> torch.Tensor:
        return self.full / max(self.count, 1)

    @classmethod
    def empty(cls, features: int, group_size: int | None, full: bool) -> ChannelStats:
        """Nothing seen yet; group Grams kept apart unless the whole Gram holds them (its diagonal blocks)."""
        st = cls(torch.zeros(features), torch.zeros(features), group_size=group_size or 0)
        if full:
            st.full = torch.zeros(features, features)
        elif group_size:
            st.gram = torch.zeros(features // group_size, group_size, group_size)
        return st

    def add(self, x: torch.Tensor, memo) -> None:
        """Fold observed inputs ``x`` ``[tokens, features]`` in; ``memo(key, compute)`` gives what was
        computed from the same input for another linear (q/k/v and gate/up read one tensor)."""
        if self.full is not None:
            self.full += memo("full", lambda: gram(x))
        ax = memo("abs", x.abs)
        self.abs_sum += memo("abs_sum", lambda: ax.sum(0))
        self.abs_max = torch.maximum(self.abs_max, memo("abs_max", lambda: ax.amax(0)))
        self.count += x.shape[0]
        if self.gram is not None:
            g = self.group_size

            def groups() -> torch.Tensor:
                xg = x.view(x.shape[0], -1, g).transpose(0, 1)   # [groups, n, g]
                return xg.transpose(1, 2) @ xg
            self.gram += memo(f"groups{g}", groups)


@dataclass
class Replay:
    """A parent module's captured calls (first batches) and its float outputs at real tokens."""

    module: nn.Module
    calls: list[tuple[tuple, dict, torch.Tensor]] = field(default_factory=list)  # args, kwargs, kept positions
    reference: list[torch.Tensor] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(int(k.numel()) for _, _, k in self.calls)

    @property
    def parts(self) -> int:
        return len(self.calls)

    def squared_error(self, part: int) -> tuple[float, int]:
        """The summed squared error of one captured call's output now against its float
        reference, and the number of output values it sums."""
        args, kwargs, keep = self.calls[part]
        with torch.no_grad():
            y = self.module(*args, **kwargs)
        y = y[0] if isinstance(y, (tuple, list)) else y
        ref = self.reference[part]
        return float((y.reshape(-1, y.shape[-1])[keep].float() - ref).pow(2).sum()), ref.numel()

    def loss(self) -> float:
        """Mean squared error of the module's output now against the float reference."""
        errors = [self.squared_error(k) for k in range(self.parts)]
        return sum(e for e, _ in errors) / max(sum(n for _, n in errors), 1)

    def split_first(self, tokens: int) -> Replay:
        """This replay with its first call cut after the row that reaches ``tokens`` kept tokens:
        a smaller first part for a search to screen its candidates on, the rest of the rows as
        the second. Every tensor argument whose first dimension is the call's rows is cut there;
        the first piece is run once with the weights as they are (the float ones) and must
        reproduce its rows of the reference, or the replay is returned as it is."""
        if not self.calls:
            return self
        args, kwargs, keep = self.calls[0]
        x = args[0] if args else kwargs.get("hidden_states")
        if x is None or x.dim() != 3 or x.shape[0] < 2:
            return self
        rows, row_len = x.shape[0], x.shape[1]
        row_of = keep // row_len
        cut = int(row_of[min(tokens, keep.numel()) - 1]) + 1 if keep.numel() else rows
        if cut >= rows:
            return self
        first, rest = keep < cut * row_len, keep >= cut * row_len
        pieces = [(_rows(args, slice(0, cut), rows), _rows(kwargs, slice(0, cut), rows), keep[first]),
                  (_rows(args, slice(cut, rows), rows), _rows(kwargs, slice(cut, rows), rows),
                   keep[rest] - cut * row_len)]
        refs = [self.reference[0][first], self.reference[0][rest]]
        try:
            with torch.no_grad():
                y = self.module(*pieces[0][0], **pieces[0][1])
            y = y[0] if isinstance(y, (tuple, list)) else y
            y = y.reshape(-1, y.shape[-1])[pieces[0][2]].float()
        except (RuntimeError, ValueError, IndexError):   # an argument the cut did not fit
            return self
        if y.shape != refs[0].shape or not torch.allclose(y, refs[0], rtol=1e-4, atol=1e-5 * float(refs[0].abs().max())):
            return self
        return Replay(self.module, [*pieces, *self.calls[1:]], [*refs, *self.reference[1:]])


def _rows(value, rows: slice, batch: int):
    """``value`` with every tensor whose first dimension is ``batch`` cut to ``rows`` (in tuples,
    lists and dicts too)."""
    if isinstance(value, torch.Tensor):
        return value[rows] if value.dim() > 0 and value.shape[0] == batch else value
    if isinstance(value, (tuple, list)):
        return type(value)(_rows(v, rows, batch) for v in value)
    if isinstance(value, dict):
        return {k: _rows(v, rows, batch) for k, v in value.items()}
    return value


def search_batches(ctx: LayerContext, tokens: int) -> list[int]:
    """The first batches holding at least ``tokens`` calibration tokens (batches are similar in size)."""
    if ctx.num_batches <= 0:
        return []
    per = max(ctx.num_tokens / ctx.num_batches, 1.0)
    return list(range(min(ctx.num_batches, max(1, math.ceil(tokens / per)))))


def after_first(keep: torch.Tensor, row_len: int, skip: int) -> torch.Tensor:
    """The flat token indices ``keep`` (real tokens, row-major) without the first ``skip`` of each row.

    >>> after_first(torch.tensor([0, 1, 2, 5, 6, 7]), row_len=4, skip=1).tolist()
    [1, 2, 6, 7]
    """
    if skip <= 0 or keep.numel() == 0:
        return keep
    _, counts = torch.unique_consecutive(keep // row_len, return_counts=True)
    starts = torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)
    return keep[torch.arange(keep.numel()) - starts >= skip]


def observe_layer(ctx: LayerContext, linears: list[str], parents: list[str], batches: list[int],
                  group_size: dict[str, int] | None = None,
                  skip_first: int = 0, full_gram: set[str] | None = None,
                  ) -> tuple[dict[str, ChannelStats], dict[str, Replay]]:
    """One pass over every calibration batch: channel statistics of ``linears``, replays of ``parents``.

    ``group_size[name]``: also accumulate that linear's per-group Gram matrices.
    ``full_gram``: linears whose whole ``[in, in]`` Gram is accumulated too.
    Linears that read the same input tensor (q/k/v, gate/up) share every statistic's computation.
    ``skip_first``: leave the first tokens of each row out (see the module docstring).
    """
    group_size = group_size or {}
    full_gram = full_gram or set()
    # q/k/v (gate/up) read one tensor: what is computed from it is computed once, for all of them
    shared: dict[str, object] = {"input": None}

    def from_input(inputs: tuple, key: str, compute):
        if shared["input"] is not inputs[0]:
            shared.clear()
            shared["input"] = inputs[0]
        if key not in shared:
            shared[key] = compute()
        return shared[key]

    def kept(x: torch.Tensor) -> torch.Tensor:
        """Flat indices of the tokens of ``x`` ([rows, row_len, features] or [tokens, features]) observed."""
        positions = torch.arange(x.shape[:-1].numel()).view(*x.shape[:-1], 1)
        keep = ctx.tokens(positions).flatten()
        return after_first(keep, x.shape[-2] if x.dim() > 2 else x.shape[0], skip_first)

    stats: dict[str, ChannelStats] = {}
    replays = {p: Replay(ctx.layer.get_submodule(p)) for p in parents}
    sample = set(batches)
    pending: dict[str, tuple[tuple, dict, torch.Tensor]] = {}

    def observed(inputs: tuple) -> torch.Tensor:
        x = inputs[0].detach()
        return (x.reshape(-1, x.shape[-1])[kept(x)] if skip_first else ctx.tokens(x)).float()

    def stat_hook(name: str):
        def hook(module: nn.Module, inputs: tuple) -> None:
            def memo(key: str, compute):
                return from_input(inputs, key, compute)
            x = memo("x", lambda: observed(inputs))
            if name not in stats:
                stats[name] = ChannelStats.empty(x.shape[-1], group_size.get(name), name in full_gram)
            stats[name].add(x, memo)
        return hook

    def parent_pre(name: str):
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            if ctx.batch_index() in sample:
                first = args[0] if args else kwargs["hidden_states"]
                pending[name] = (args, dict(kwargs), kept(first))
        return hook

    def parent_post(name: str):
        def hook(module: nn.Module, args: tuple, kwargs: dict, output) -> None:
            if name in pending:
                a, kw, keep = pending.pop(name)
                y = output[0] if isinstance(output, (tuple, list)) else output
                replays[name].calls.append((a, kw, keep))
                replays[name].reference.append(y.detach().reshape(-1, y.shape[-1])[keep].float())
        return hook

    handles = [ctx.layer.get_submodule(n).register_forward_pre_hook(stat_hook(n)) for n in linears]
    for p in parents:
        m = ctx.layer.get_submodule(p)
        handles.append(m.register_forward_pre_hook(parent_pre(p), with_kwargs=True))
        handles.append(m.register_forward_hook(parent_post(p), with_kwargs=True))
    try:
        ctx.forward_batches()
    finally:
        for h in handles:
            h.remove()
        shared.clear()
    return stats, replays
