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

import torch
from torch import nn

from ..arch import SmoothMapping
from ..errors import QuantkitError


def smooth_channels(layer: nn.Module, mapping: SmoothMapping, config) -> tuple[nn.Module, slice]:
    """The module whose outputs the scales divide, and which of its output channels they cover."""
    smooth = layer.get_submodule(mapping.smooth)
    if isinstance(smooth, nn.Linear):
        start, stop = mapping.rows(config) if mapping.rows is not None else (0, smooth.out_features)
    else:
        start, stop = 0, smooth.weight.shape[0]
    return smooth, slice(start, stop)


def mapping_applies(layer: nn.Module, mapping: SmoothMapping, config) -> bool:
    """Whether the mapping's channel counts match (v_proj -> o_proj does not under GQA)."""
    _, rows = smooth_channels(layer, mapping, config)
    width = rows.stop - rows.start
    return all(layer.get_submodule(b).in_features == width for b in mapping.balance)


def fold_scales(layer: nn.Module, mapping: SmoothMapping, scales: torch.Tensor, config,
                norm_offset: float = 0.0) -> None:
    """Divide ``mapping.smooth``'s outputs by ``scales`` and multiply the balance linears' inputs by it."""
    if not mapping_applies(layer, mapping, config):
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
        for name in mapping.balance:
            lin = layer.get_submodule(name)
            lin.weight.copy_((lin.weight.float() * s[None, :]).to(lin.weight.dtype))
