"""``LearnedRounding``, the registered quantizer: its recipe options, and one layer's run.

For each decoder layer: capture its calibration calls and the float layer's output
(``block.py``), learn every target's rounding offsets and clip factors together against that
output (``signround.py``) through its number format's differentiable fake-quantization, starting
from the ranges the scheme's observer picks (min-max; the ``mse`` search; the ``imatrix_mse``
search weighted by each column's mean squared input, taken in the capture's pass), and
write the format's codes on the learned scales (``numerics/number_formats``: every format the
same way, none named here).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

import torch

from quantkit.errors import QuantkitError
from quantkit.numerics.number_formats import Clip, NumberFormat, importance_clip, number_format
from quantkit.numerics.primitives import sqnr_db
from quantkit.quantizers.learned_rounding.block import BlockRows, capture_block, values_at
from quantkit.quantizers.learned_rounding.step_error import LayerTargets, StepError
from quantkit.quantizers.learned_rounding.signround import (RoundingParams, SignRoundSettings,
                                                           sign_sgd)
from quantkit.quantizers.importance import ColumnImportance
from quantkit.serving.capabilities import Capabilities
from quantkit.steps.base import Algorithm, LayerContext, QuantizedWeight, register_algorithm

#: preset -> (iters, lr, batch_size): AutoRound's default recipe, and its "light" one
PRESETS = {"default": (200, None, 8), "fast": (50, 5e-3, 8)}


@register_algorithm("learned_rounding")
@dataclass
class LearnedRounding(Algorithm):
    """AutoRound-style learned rounding on each decoder layer's target linears.

    Options (recipe ``algorithm:`` keys):
        preset: "default" (200 steps, lr 1/200, 8 rows a step) or "fast" (50 steps, lr 0.005,
            8 rows a step: AutoRound's "light" recipe); the options below override it.
        iters: signed-gradient steps per layer.
        lr: step size at the first step, decaying linearly to 0 (default 1 / iters).
        batch_size: calibration rows drawn at random for each step.
        minmax_tuning: learn each group's clip factors on its min and max too (else only the
            rounding offsets, on min-max ranges).
        float_target: the target is the float model's output of the layer (the float layer on
            the float model's inputs, while the quantized layer sees the quantized model's:
            AutoRound's); the run then carries the float model's activations beside the
            quantized ones. Off: the float layer's output on the quantized model's inputs.
        amp: run each step's layer forward and backward under bfloat16 autocast (AutoRound's
            default where the device computes bfloat16 natively), the target, the loss and the
            learned parameters staying float32. None (default): on where the host has native
            bfloat16 (a CUDA device that supports it; a CPU with AMX or AVX-512 BF16), else off.
            Off: float32 throughout.
        compile: run each step's fake-quantization and layer through ``torch.compile`` (as
            AutoRound does by default; ``step_error.py``). A compiler failure leaves the run
            eager, recorded as ``compile_fallback`` in the layer's figures.
        seed: the row draws' seed.

    Example:
        >>> from quantkit.steps import build_algorithm
        >>> build_algorithm("learned_rounding", {"preset": "fast"}).settings
        SignRoundSettings(iters=50, lr=0.005, batch_size=8, minmax=True, seed=0)
    """

    preset: Literal["default", "fast"] = "default"
    iters: int | None = None
    lr: float | None = None
    batch_size: int | None = None
    minmax_tuning: bool = True
    float_target: bool = True
    amp: bool | None = None
    compile: bool = True
    seed: int = 0

    requires_calibration: ClassVar[bool] = True

    def __post_init__(self) -> None:
        for key in ("iters", "batch_size"):
            value = getattr(self, key)
            if value is not None and value <= 0:
                raise QuantkitError(f"{key}: must be a positive integer, got {value!r}")
        if self.lr is not None and not (math.isfinite(self.lr) and self.lr > 0):
            raise QuantkitError(f"lr: must be a number > 0, got {self.lr!r}")

    @property
    def needs_float_inputs(self) -> bool:
        return self.float_target

    @property
    def settings(self) -> SignRoundSettings:
        iters, lr, batch = PRESETS[self.preset]
        if self.iters is not None and self.lr is None:
            lr = None   # 1 / iters, as AutoRound's own default
        return SignRoundSettings(self.iters or iters, self.lr if self.lr is not None else lr,
                                 self.batch_size or batch, self.minmax_tuning, self.seed)

    def quantize_layer(self, ctx: LayerContext) -> dict[str, QuantizedWeight]:
        grids = {name: number_format(scheme.weights) for name, (_, scheme) in _checked(ctx).items()}
        if not grids:   # a layer left out by ``ignore``: the float model still moves on past it
            if self.float_target:
                with torch.no_grad():
                    ctx.forward_float()
            return {}
        t0 = time.perf_counter()
        # the weighted range search's input statistics come from the capture's own pass
        weighted = ColumnImportance(ctx, [n for n, g in grids.items() if g.args.observer == "imatrix_mse"])
        amp = self.amp if self.amp is not None else native_bf16(ctx.layer)
        block = capture_block(ctx, self.float_target, weighted.watching(), amp)
        importance = weighted.result()
        weights = {name: module.weight.detach() for name, (module, _) in ctx.targets.items()}
        global_scales = _global_scales(ctx, grids, weights)
        settings = self.settings
        params = {name: RoundingParams.start(tuple(w.shape), _scale_shape(grids[name], w, global_scales[name]),
                                             settings.minmax,
                                             _start_clip(grids[name], w, global_scales[name], importance.get(name)))
                  for name, w in weights.items()}

        error = StepError(self.compile)
        targets = LayerTargets(ctx.layer, grids, weights, params, global_scales)

        def error_of(args: tuple, kwargs: dict, reference: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
            return error(targets, args, kwargs, reference, keep, block.amp)

        def clamp() -> None:
            for p in params.values():
                p.clamp_()

        result = sign_sgd([t for p in params.values() for t in p.learned()], _loss(block, error_of, settings),
                          settings, clamp)
        figures = {"algorithm": "learned_rounding", "iters": settings.iters, "lr": settings.step_size,
                   "batch_size": settings.batch_size, "rows": len(block.rows), "amp": block.amp,
                   "compiled": error.compiled, **({"compile_fallback": error.fallback} if error.fallback else {}),
                   "rtn_loss": result.first_loss, "loss": result.best_loss, "last_loss": result.last_loss,
                   "best_step": result.best_step, "seconds": round(time.perf_counter() - t0, 2)}
        return {name: _encode(grids[name], w, params[name], global_scales[name], figures)
                for name, w in weights.items()}


def _checked(ctx: LayerContext) -> dict:
    for name, (module, scheme) in ctx.targets.items():
        if scheme.weights is None:
            raise QuantkitError(f"{ctx.name}.{name}: learned rounding needs a weight scheme")
        if scheme.weights.actorder == "group":
            raise QuantkitError(f"{ctx.name}.{name}: weights.actorder: learned rounding keeps groups contiguous "
                                "(no g_idx); take 'weight' or none")
        scheme.weights.check_width(module.in_features, f"{ctx.name}.{name}", module.out_features)
    return ctx.targets


def _scale_shape(fmt: NumberFormat, w: torch.Tensor, global_scale: torch.Tensor | None) -> tuple[int, ...]:
    """The shape of ``w``'s scales, which the clip factors take."""
    return tuple(fmt.scales(w, Clip(1.0, 1.0), global_scale).scale.shape)


def native_bf16(layer: torch.nn.Module) -> bool:
    """Whether the device ``layer`` sits on computes bfloat16 natively: on a CPU without it
    autocast emulates bfloat16 and is slower than float32, so the host's flags decide."""
    device = next(layer.parameters()).device
    if device.type == "cuda":
        return bool(torch.cuda.is_bf16_supported())
    if device.type != "cpu":
        return False
    info = Path("/proc/cpuinfo")
    caps = Capabilities.from_cpuinfo(info.read_text()) if info.exists() else None
    return bool(caps and (caps.amx or caps.avx512_bf16))


def _start_clip(fmt: NumberFormat, w: torch.Tensor, global_scale: torch.Tensor | None,
                importance: torch.Tensor | None) -> torch.Tensor | None:
    """Each group's clip factor where learning starts: None (min-max) for the ``minmax``
    observer, else ``importance_clip``'s search (unweighted under ``mse``, its columns weighted
    by ``importance`` under ``imatrix_mse``)."""
    if fmt.args.observer == "minmax":
        return None
    weighted = importance if fmt.args.observer == "imatrix_mse" else None
    return importance_clip(fmt, w.detach(), weighted, global_scale).max


def _global_scales(ctx: LayerContext, grids: dict[str, NumberFormat], weights: dict[str, torch.Tensor]) -> dict:
    """Each target's per-tensor scale where its format has one, shared by the linears of one
    sub-group (q/k/v, gate/up: one fused linear in the engine), else its own."""
    out = {name: grids[name].global_scale(w) for name, w in weights.items()}
    for group in ctx.subgroups:
        members = [n for n in group if n in grids and grids[n].has_global_scale]
        if len(members) > 1:
            shared = grids[members[0]].shared_global_scale([weights[n].abs().amax() for n in members],
                                                           weights[members[0]].dtype)
            out.update({n: shared for n in members})
    return out


def _loss(block: BlockRows, error_of, settings: SignRoundSettings):
    """``loss_of(step)``: the mean squared error of the quantized layer's output on
    ``batch_size`` rows drawn at random (the same draws for the same seed); ``error_of(args,
    kwargs, reference, keep)`` the summed squared error on some rows of one call."""
    rows = block.rows
    generator = torch.Generator().manual_seed(settings.seed)

    def loss_of(step: int) -> torch.Tensor:
        pick = torch.randperm(len(rows), generator=generator)[: settings.batch_size].tolist()
        total, count = 0.0, 0
        for call in sorted({rows[i][0] for i in pick}):
            chosen = torch.tensor([rows[i][1] for i in pick if rows[i][0] == call])
            args, kwargs, reference, keep = block.inputs(call, chosen)
            total, count = total + error_of(args, kwargs, reference, keep), count + values_at(keep, reference)
        return total / max(count, 1)

    return loss_of


def _encode(grid: NumberFormat, w: torch.Tensor, p: RoundingParams, global_scale, figures: dict) -> QuantizedWeight:
    """The codes on the learned scales, as the checkpoint stores them, with the layer's
    ``figures`` and this weight's own."""
    with torch.no_grad():
        qp = grid.scales(w, Clip(p.beta.detach(), p.alpha.detach()), global_scale)
        codes = grid.quantize(w, qp, offset=p.v.detach())
        decoded = grid.dequantize(codes, qp, dtype=w.dtype)
    stats = {**figures, "rounded_up_or_down": float((p.v.detach().abs() >= 0.5).float().mean()),
             "sqnr_db": round(sqnr_db(w, decoded), 3)}
    return QuantizedWeight(codes, qp.scale, qp.zero_point, None, stats, qp.global_scale)
