"""The number-format contract every quantizer codes against, and its registry.

A number format turns a weight ``[out, in]`` into codes and scales and back. A quantizer asks
``number_format(args)`` for the format its scheme names and calls only these methods, so it
gets every format (int grids, FP8, NVFP4, MXFP4) without naming one:

- ``global_scale(w)``: a per-tensor scale chosen before any group scale (NVFP4's), else None;
  ``shared_global_scale(amaxes, dtype)`` the one several linears share (q/k/v, gate/up).
- ``scales(w, clip, global_scale, g_idx, importance)``: the group (channel, tensor) scales of a
  weight as ``QParams``, the range chosen by the scheme's observer; ``clip`` scales each group's
  max and min (``Clip``, factors in (0, 1]) and replaces the observer's search.
- ``quantize(w, qp, g_idx, offset)``: codes; ``offset`` (same shape as ``w``) is added to the
  scaled value before rounding (a learned rounding offset, ``V`` in [-0.5, 0.5]).
- ``dequantize(codes, qp, g_idx, dtype)``: the weight the checkpoint computes with.
- ``fake_quantize(w, offset, clip, global_scale)``: ``dequantize(quantize(w, scales(w, clip),
  offset=offset))`` bit for bit in the forward pass, differentiable in ``w``, ``offset`` and the
  clip factors: rounding (and the rounding of scales to their stored encoding) passes the
  gradient straight through.
- GPTQ's column loop: ``step(qp)`` (float32 size of one grid unit per group),
  ``round_to_grid(v)`` (codes of values already divided by the step), ``grid_values(codes)``.

Example:
    >>> from quantkit.config.scheme import QuantArgs
    >>> fmt = number_format(QuantArgs(num_bits=4, type="float", group_size=16))
    >>> w = torch.randn(4, 32)
    >>> qp = fmt.scales(w)
    >>> bool(torch.equal(fmt.dequantize(fmt.quantize(w, qp), qp), fmt.fake_quantize(w)))
    True
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch

from quantkit.config.scheme import QuantArgs, fp4_kind
from quantkit.numerics.primitives import reduce_sum


@dataclass(frozen=True)
class QParams:
    """What a format stores beside the codes: ``scale`` (the format's encoding), an int8
    ``zero_point`` (asymmetric int grids), a float32 ``global_scale`` ``[1]`` (NVFP4)."""

    scale: torch.Tensor
    zero_point: torch.Tensor | None = None
    global_scale: torch.Tensor | None = None


@dataclass(frozen=True)
class Clip:
    """Factors on each group's max and min, the scale's shape (or scalars); None: 1.

    A symmetric format takes the larger magnitude of the clipped max and min; a learned-rounding
    quantizer trains both, a range search tries one factor for both.
    """

    max: torch.Tensor | float | None = None
    min: torch.Tensor | float | None = None

    def apply(self, lo: torch.Tensor, hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (lo if self.min is None else lo * self.min), (hi if self.max is None else hi * self.max)

    def detach(self) -> Clip:
        def d(t):
            return t.detach() if isinstance(t, torch.Tensor) else t
        return Clip(d(self.max), d(self.min))


class _StraightThrough(torch.autograd.Function):
    """Forward: ``exact``; backward: the gradient goes to ``x`` as if the map were the identity."""

    @staticmethod
    def forward(ctx, x, exact):  # noqa: D102
        return exact.clone()

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        return grad, None


def straight_through(x: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """``exact``'s values with ``x``'s gradient (the straight-through estimator)."""
    if not x.requires_grad:
        return exact
    return _StraightThrough.apply(x, exact.to(x.dtype))


class NumberFormat(ABC):
    """One number format bound to a scheme's weight args (``self.args``)."""

    name: ClassVar[str] = ""
    #: a float32 per-tensor scale sits above the group scales (``global_scale``)
    has_global_scale: ClassVar[bool] = False
    #: codes on the integer grid, ``(q - zp) * scale``: GPTQ's integer solve (act-order groups,
    #: ``g_idx``, zero points); other formats are solved on ``step``/``round_to_grid``
    affine: ClassVar[bool] = False
    #: GPTQ's column loop can round to this format's grid
    solvable: ClassVar[bool] = True
    #: the checkpoint can store a ``g_idx`` (act-order "group")
    stores_g_idx: ClassVar[bool] = False
    #: the args of a format its name fixes completely (NVFP4, MXFP4); None: the scheme says
    named_args: ClassVar[QuantArgs | None] = None

    def __init__(self, args: QuantArgs) -> None:
        self.args = args

    @property
    def group_size(self) -> int | None:
        return self.args.group_size

    # -- scales ---------------------------------------------------------------------------
    def global_scale(self, w: torch.Tensor) -> torch.Tensor | None:
        """The per-tensor scale chosen before the group scales; None when the format has none."""
        return None

    def shared_global_scale(self, amaxes: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor | None:
        """The global scale of linears whose largest magnitudes are ``amaxes`` (a streaming caller
        reads each weight once for its amax); None when the format has none."""
        return None

    def scales(self, w: torch.Tensor, clip: Clip | None = None, global_scale: torch.Tensor | None = None,
               g_idx: torch.Tensor | None = None, importance: torch.Tensor | None = None) -> QParams:
        """The scales of ``w`` under the scheme's observer (``clip`` given: that range, no search).

        ``importance`` (``[in]``, e.g. the mean squared input of each column) weights each
        column's squared error in the ``imatrix_mse`` search; without it that search is plain MSE.
        """
        if clip is None and self.args.observer == "imatrix_mse":
            clip = importance_clip(self, w, importance, global_scale, g_idx)
        return self.range_scales(w, clip, global_scale, g_idx)

    @abstractmethod
    def range_scales(self, w: torch.Tensor, clip: Clip | None, global_scale: torch.Tensor | None,
                     g_idx: torch.Tensor | None) -> QParams:
        """Scales from ``w``'s ranges times ``clip`` (None: the observer's own choice)."""

    # -- codes ----------------------------------------------------------------------------
    @abstractmethod
    def quantize(self, w: torch.Tensor, qp: QParams, g_idx: torch.Tensor | None = None,
                 offset: torch.Tensor | None = None) -> torch.Tensor:
        """Codes of ``w`` (the checkpoint's dtype) under ``qp``."""

    @abstractmethod
    def dequantize(self, codes: torch.Tensor, qp: QParams, g_idx: torch.Tensor | None = None,
                   dtype: torch.dtype | None = None) -> torch.Tensor:
        """The values the codes decode to (``dtype``: the format's own when None)."""

    @abstractmethod
    def fake_quantize(self, w: torch.Tensor, offset: torch.Tensor | None = None, clip: Clip | None = None,
                      global_scale: torch.Tensor | None = None) -> torch.Tensor:
        """Quantized and dequantized ``w`` in its dtype, differentiable (see the module docstring)."""

    # -- GPTQ's column loop ---------------------------------------------------------------
    def step(self, qp: QParams) -> torch.Tensor:
        """float32 ``[rows, groups]``: the size of one grid unit in each group."""
        raise NotImplementedError(f"{self.name}: no column grid")

    def round_to_grid(self, v: torch.Tensor) -> torch.Tensor:
        """Codes of values already divided by their step."""
        raise NotImplementedError(f"{self.name}: no column grid")

    def grid_values(self, codes: torch.Tensor) -> torch.Tensor:
        """float32 values of codes, in grid units."""
        raise NotImplementedError(f"{self.name}: no column grid")

    # -- helpers every format shares --------------------------------------------------------
    def reduce_to_scales(self, x: torch.Tensor, g_idx: torch.Tensor | None = None) -> torch.Tensor:
        """Per-element ``x`` ``[out, in]`` summed to the scale's shape."""
        groups = None if self.args.group_size is None else (x.shape[0], x.shape[1] // self.args.group_size)
        if groups is not None and g_idx is None and self.args.strategy in ("group", "tensor_group"):
            return x.reshape(*groups, self.args.group_size).sum(-1)   # contiguous groups: no scatter
        return reduce_sum(x, self.args, g_idx, groups)


#: The range search's candidates: each group's range times ``1 - CLIP_MAX_SHRINK * i / CLIP_GRID``,
#: ``i < CLIP_GRID`` (the candidates of the ``mse`` observer, ``primitives._mse_range``), then
#: widened, ``1 + CLIP_MAX_GROW * i / CLIP_GROW_GRID`` for ``0 < i <= CLIP_GROW_GRID``: a scale
#: stored coarsely (FP8 under NVFP4, a power of two under MXFP4) or a grid whose largest code is
#: not the range's end (int's 7 of 7.5) can land better a little above the group's range, as
#: AutoRound's scale search (factors 0.5 to 1.5) finds.
CLIP_GRID, CLIP_MAX_SHRINK = 40, 0.6
CLIP_GROW_GRID, CLIP_MAX_GROW = 20, 0.5


def clip_candidates() -> list[float]:
    """The range search's factors, in the order it tries them (ties keep the earlier).

    >>> c = clip_candidates(); len(c), c[0], round(c[39], 3), c[40], c[-1]
    (60, 1.0, 0.415, 1.025, 1.5)
    """
    shrink = [1.0 - CLIP_MAX_SHRINK * i / CLIP_GRID for i in range(CLIP_GRID)]
    return shrink + [1.0 + CLIP_MAX_GROW * i / CLIP_GROW_GRID for i in range(1, CLIP_GROW_GRID + 1)]


def importance_clip(fmt: NumberFormat, w: torch.Tensor, importance: torch.Tensor | None,
                    global_scale: torch.Tensor | None = None, g_idx: torch.Tensor | None = None) -> Clip:
    """Each group's clip factor minimising ``sum_j importance_j * (w_ij - q(w_ij))^2`` over its
    columns (``clip_candidates()``, the earliest on ties); ``importance`` None: all ones.

    llm-compressor's ``imatrix_mse`` idea: with ``importance`` the mean squared input of each
    column (``diag(H)`` up to a factor), the error is the layer-output error a group makes when
    its inputs are uncorrelated, so a group trades error on rarely-large inputs for error on
    the columns whose inputs are large.

    >>> from quantkit.config.scheme import QuantArgs
    >>> fmt = number_format(QuantArgs(num_bits=4, group_size=8))
    >>> importance_clip(fmt, torch.randn(2, 16), torch.ones(16)).max.shape
    torch.Size([2, 2])
    """
    x = w.float()
    imp = torch.ones(w.shape[-1], device=w.device) if importance is None else importance.float().to(w.device)
    if fmt.has_global_scale and global_scale is None:
        global_scale = fmt.global_scale(w)
    best_err: torch.Tensor | None = None
    best = torch.ones(())
    for c in clip_candidates():
        qp = fmt.range_scales(w, Clip(c, c), global_scale, g_idx)
        d = fmt.dequantize(fmt.quantize(w, qp, g_idx), qp, g_idx, w.dtype).float().sub_(x)
        err = fmt.reduce_to_scales(d.pow_(2).mul_(imp), g_idx)
        if best_err is None:
            best_err, best = err, torch.ones_like(err)
            continue
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best = best.masked_fill(better, c)
    return Clip(best, best)


FORMATS: dict[str, type[NumberFormat]] = {}


def register_format(name: str):
    """Class decorator: the format ``number_format`` returns for args named ``name``."""

    def deco(cls):
        cls.name = name
        FORMATS[name] = cls
        return cls

    return deco


def format_name(args: QuantArgs) -> str:
    """The registry key of ``args``' number format: "nvfp4", "mxfp4", "fp8" or "int"."""
    kind = fp4_kind(args)
    if kind is not None:
        return kind
    return "fp8" if args.type == "float" else "int"


def number_format(args: QuantArgs | str) -> NumberFormat:
    """The number format of a weight's ``QuantArgs``, or of a name that fixes its args ("nvfp4")."""
    if isinstance(args, str):
        cls = FORMATS[args]
        if cls.named_args is None:
            raise ValueError(f"number format {args!r}: its name does not fix its args, give QuantArgs")
        return cls(cls.named_args)
    return FORMATS[format_name(args)](args)
