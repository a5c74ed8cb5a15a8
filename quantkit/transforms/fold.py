"""Folding per-channel scales into a layer without changing what it computes (in exact arithmetic).

For a mapping (``arch.SmoothMapping``) with scales ``s > 0`` over the channels between
``smooth`` and its ``balance`` linears::

    y = W (x)            with x = smooth(h)
      = (W diag(s)) (diag(1/s) x)

so ``smooth``'s outputs are divided by ``s`` and every balance linear's input columns are
multiplied by it. A norm ``x * (offset + w)`` (Gemma's RMSNorm has offset 1) divides by
``s`` through ``w' = (offset + w) / s - offset``; a producer linear divides its output rows
(and bias). AWQ then quantizes ``W diag(s)``, whose salient columns are larger and so lose
less to rounding; SmoothQuant moves activation outliers into the weights.

These functions only change parameters; searching for ``s`` is the algorithms' business.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from quantkit.arch.spec import SmoothMapping
from quantkit.errors import QuantkitError


def smooth_channels(layer: nn.Module, mapping: SmoothMapping, config) -> tuple[nn.Module, slice]:
    """The module whose outputs the scales divide, and which of its output channels they cover."""
    smooth = layer.get_submodule(mapping.smooth)
    if isinstance(smooth, nn.Linear):
        start, stop = mapping.rows(config) if mapping.rows is not None else (0, smooth.out_features)
    else:
        start, stop = 0, smooth.weight.shape[0]
    return smooth, slice(start, stop)


@dataclass(frozen=True)
class Tie:
    """How the smooth channels reach the balance linears' inputs: one to one (``repeat == 1``),
    or, for value heads under GQA, each ``[kv, head_dim]`` channel copied to ``repeat`` query
    heads (o_proj's columns ``(kv, repeat, head_dim)``, transformers' ``repeat_kv`` order)."""

    repeat: int = 1
    kv_heads: int = 0
    head_dim: int = 0

    def expand(self, s: torch.Tensor) -> torch.Tensor:
        """Smooth-channel scales -> balance-column scales."""
        if self.repeat == 1:
            return s
        return s.view(self.kv_heads, 1, self.head_dim).expand(-1, self.repeat, -1).reshape(-1)

    def reduce(self, x: torch.Tensor, how: str = "mean") -> torch.Tensor:
        """A balance-column statistic -> one per smooth channel (``mean`` or ``amax`` over the copies)."""
        if self.repeat == 1:
            return x
        v = x.view(self.kv_heads, self.repeat, self.head_dim)
        return (v.mean(1) if how == "mean" else v.amax(1)).reshape(-1)


def tie_of(layer: nn.Module, mapping: SmoothMapping, config) -> Tie | None:
    """How the mapping's channels meet (``Tie``), or None where its channel counts differ."""
    _, rows = smooth_channels(layer, mapping, config)
    width = rows.stop - rows.start
    ins = {layer.get_submodule(b).in_features for b in mapping.balance}
    if ins == {width}:
        return Tie()
    if mapping.kv_heads is None or len(ins) != 1:
        return None
    kv, hd = mapping.kv_heads(config)
    (cols,) = ins
    if kv * hd != width or cols % width:
        return None
    return Tie(cols // width, kv, hd)


def mapping_applies(layer: nn.Module, mapping: SmoothMapping, config) -> bool:
    """Whether scales can fold here (the channel counts match, or value heads meet o_proj under GQA)."""
    return tie_of(layer, mapping, config) is not None


def fold_scales(layer: nn.Module, mapping: SmoothMapping, scales: torch.Tensor, config,
                norm_offset: float = 0.0) -> None:
    """Divide ``mapping.smooth``'s outputs by ``scales`` and multiply the balance linears' inputs by it."""
    tie = tie_of(layer, mapping, config)
    if tie is None:
        raise QuantkitError(f"{mapping.smooth} -> {', '.join(mapping.balance)}: channel counts differ, "
                            "scales cannot be folded here")
    if not bool((scales > 0).all()) or not bool(torch.isfinite(scales).all()):
        raise ValueError(f"{mapping.smooth}: scales must be positive and finite")
    smooth, rows = smooth_channels(layer, mapping, config)
    with torch.no_grad():
        s = scales.to(torch.float32)
        if isinstance(smooth, nn.Linear):
            w = smooth.weight
            w[rows] = (w[rows].float() / s[:, None]).to(w.dtype)
            if smooth.bias is not None:
                smooth.bias[rows] = (smooth.bias[rows].float() / s).to(smooth.bias.dtype)
        else:
            w = smooth.weight
            w.copy_(((norm_offset + w.float()) / s - norm_offset).to(w.dtype))
            if getattr(smooth, "bias", None) is not None:
                smooth.bias.copy_((smooth.bias.float() / s).to(smooth.bias.dtype))
        cols = tie.expand(s)
        for name in mapping.balance:
            lin = layer.get_submodule(name)
            lin.weight.copy_((lin.weight.float() * cols[None, :]).to(lin.weight.dtype))
