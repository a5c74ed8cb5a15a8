"""The integer grids learned rounding optimises on: scales from clipped ranges, codes with a
rounding offset, and the same in a differentiable form.

The methods follow the number-format contract's names (``scales``, ``quantize``,
``dequantize``, ``fake_quantize``, ``global_scale``), so the optimisation never branches on a
format. Scales are ``calculate_qparams`` of the clipped min-max range, the ones RTN and GPTQ
write; a value's code is ``clamp(round(w / s + V) + zp, qmin, qmax)``.

Example:
    >>> from quantkit.config.scheme import QuantArgs
    >>> grid = grid_for(QuantArgs(num_bits=4, group_size=8))
    >>> w = torch.randn(2, 16)
    >>> qp = grid.scales(w)
    >>> bool(torch.equal(grid.dequantize(grid.quantize(w, qp), qp), grid.fake_quantize(w)))
    True
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quantkit.config.scheme import QuantArgs
from quantkit.errors import QuantkitError
from quantkit.numerics.primitives import calculate_qparams, dequantize, reduce_minmax
from quantkit.quantizers.learned_rounding.signround import round_ste


@dataclass(frozen=True)
class QParams:
    """What the checkpoint stores beside the codes."""

    scale: torch.Tensor
    zero_point: torch.Tensor | None = None
    global_scale: torch.Tensor | None = None


@dataclass(frozen=True)
class Clip:
    """Factors on each group's max and min, the scale's shape; None: 1."""

    max: torch.Tensor | None = None
    min: torch.Tensor | None = None

    def apply(self, lo: torch.Tensor, hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (lo if self.min is None else lo * self.min), (hi if self.max is None else hi * self.max)


class IntGrid:
    """Signed integer codes ``(q - zp) * scale`` per group or per channel."""

    has_global_scale = False

    def __init__(self, args: QuantArgs) -> None:
        self.args = args

    def global_scale(self, w: torch.Tensor) -> None:
        return None

    def shared_global_scale(self, amaxes: list[torch.Tensor], dtype: torch.dtype) -> None:
        return None

    def scales(self, w: torch.Tensor, clip: Clip | None = None, global_scale: torch.Tensor | None = None) -> QParams:
        lo, hi = reduce_minmax(w, self.args)
        lo, hi = (clip or Clip()).apply(lo, hi)
        scale, zp = calculate_qparams(lo, hi, self.args, dtype=w.dtype)
        return QParams(scale, zp)

    def quantize(self, w: torch.Tensor, qp: QParams, offset: torch.Tensor | None = None) -> torch.Tensor:
        v = _grouped(w.float(), self.args) / qp.scale.float().unsqueeze(-1)
        if offset is not None:
            v = v + _grouped(offset.float(), self.args)
        if qp.zero_point is not None:
            v = v + qp.zero_point.float().unsqueeze(-1)
        return torch.round(v).clamp(self.args.qmin, self.args.qmax).reshape(w.shape).to(torch.int8)

    def dequantize(self, codes: torch.Tensor, qp: QParams, dtype: torch.dtype | None = None) -> torch.Tensor:
        return dequantize(codes, qp.scale, qp.zero_point, self.args, None, dtype)

    def fake_quantize(self, w: torch.Tensor, offset: torch.Tensor | None = None, clip: Clip | None = None,
                      global_scale: torch.Tensor | None = None) -> torch.Tensor:
        """``dequantize(quantize(w, scales(w, clip), offset))`` in the forward pass (float32
        arithmetic), differentiable in ``offset`` and the clip factors (``round`` straight through)."""
        a = self.args
        lo, hi = reduce_minmax(w.float(), a)
        lo, hi = (clip or Clip()).apply(lo.clamp(max=0), hi.clamp(min=0))
        if a.symmetric:
            scale = torch.maximum(-lo, hi) / ((a.qmax - a.qmin) / 2)
            zp = None
        else:
            scale = (hi - lo) / (a.qmax - a.qmin)
            scale = torch.where(scale == 0, torch.ones_like(scale), scale)
            zp = round_ste(a.qmin - lo / scale).clamp(a.qmin, a.qmax).unsqueeze(-1)
        scale = _stored(scale, w.dtype).unsqueeze(-1)
        v = _grouped(w.float(), a) / scale
        if offset is not None:
            v = v + _grouped(offset, a)
        q = round_ste(v if zp is None else v + zp).clamp(a.qmin, a.qmax)
        out = (q if zp is None else q - zp) * scale
        return out.reshape(w.shape).to(w.dtype)


def _stored(scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``scale`` as the checkpoint stores it (``dtype``, an all-zero range's scale the dtype's
    epsilon), its gradient passed straight through."""
    floor = torch.finfo(dtype).eps
    exact = torch.where(scale == 0, torch.full_like(scale, floor), scale).to(dtype).float()
    return scale + (exact - scale).detach()


def _grouped(x: torch.Tensor, args: QuantArgs) -> torch.Tensor:
    """``x`` ``[out, in]`` as ``[out, groups, group_size]`` (one group per row for channel scales)."""
    size = args.group_size if args.strategy == "group" else x.shape[-1]
    return x.reshape(x.shape[0], x.shape[1] // size, size)


def grid_for(args: QuantArgs) -> IntGrid:
    """The grid of a weight's ``QuantArgs``; refused where learned rounding has none."""
    if args.type != "int" or args.strategy not in ("group", "channel") or args.actorder == "group":
        raise QuantkitError(f"weights: learned rounding takes integer weights with group or channel scales "
                            f"(no act-order groups), got type {args.type!r}, strategy {args.strategy!r}")
    return IntGrid(args)
