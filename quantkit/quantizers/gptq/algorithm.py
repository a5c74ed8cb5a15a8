"""``GPTQ``, the registered quantizer: its recipe options, and which schedule runs a layer."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from quantkit.errors import QuantkitError
from quantkit.numerics.number_formats import number_format
from quantkit.steps.base import Algorithm, LayerContext, QuantizedWeight, register_algorithm
from quantkit.quantizers.gptq.collect import quantize_in_passes
from quantkit.quantizers.gptq.float_inputs import capture_float_inputs
from quantkit.quantizers.gptq.gptaq import DEFAULT_ALPHA
from quantkit.quantizers.gptq.lockstep import quantize_in_flight
from quantkit.quantizers.gptq.solve import SolveSettings


@register_algorithm("gptq")
@dataclass
class GPTQ(Algorithm):
    """GPTQ on each decoder layer's target linears, from their real calibration inputs.

    Options (recipe ``algorithm:`` keys):
        block_size: columns per lazy-update block.
        dampening_frac: damping added to ``H``'s diagonal, as a fraction of its mean.
        max_damping_retries: tenfold damping increases tried when Cholesky fails, before
            the layer fails with an error (never a silent fall back to rounding).
        true_sequential: quantize the layer's sub-groups (attention inputs, attention
            output, MLP inputs, MLP output) one after another, so each sub-group's Hessian
            sees the already-quantized earlier ones. When the calibration set fits in memory
            as one pass (``calibration.batch_tokens``: by default as many tokens as fit a
            quarter of the free memory) this takes one pass per layer: the calibration
            batches run in lockstep, each linear is solved in its forward pre-hook once all
            batches have reached it, and that pass's output is propagated. Otherwise
            the layer is re-run once per sub-group, plus the propagation pass. Off: every
            Hessian comes from the layer with float weights (one pass), plus the
            propagation pass. On by default: on SmolLM2 (benchmarks/RESULTS.md) it is as
            good as off and takes 0.58x the time.
        static_groups: group qparams from the original weight before the solve, instead of
            from the error-updated columns when the solve reaches each group.
        offload_hessians: keep Hessians on the CPU between accumulation and solve.
        gptaq: GPTAQ (``quantizers/gptq/gptaq.py``): keep the Hessian of the quantized model's
            inputs, but aim at the float model's output. The run then carries the float model's
            layer inputs beside the quantized ones (offloaded with them under
            ``calibration.offload``), and each layer holds every target linear's float input
            per batch, in memory, while it is quantized: about twice the calibration
            activations, and one more pass per layer. The in-memory pass
            (``calibration.batch_tokens``' default, from the memory a cap leaves) is sized
            for it. Not on mixture-of-experts models, nor on a resumed run. Off by default.
        gptaq_alpha: the scale of GPTAQ's correction (0.25, the authors' and GPTQModel's; 1 is
            the exact least-squares step).

    Act-order comes from the scheme: ``weights.actorder: weight | group``.

    Example:
        >>> from quantkit.steps import build_algorithm
        >>> build_algorithm("gptq", {"block_size": 64}).settings
        SolveSettings(block_size=64, dampening_frac=0.01, max_damping_retries=5, static_groups=False)
    """

    block_size: int = 128
    dampening_frac: float = 0.01
    max_damping_retries: int = 5
    true_sequential: bool = True
    static_groups: bool = False
    offload_hessians: bool = False
    gptaq: bool = False
    gptaq_alpha: float = DEFAULT_ALPHA

    requires_calibration: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int) or self.block_size <= 0:
            raise QuantkitError(f"block_size: must be a positive integer, got {self.block_size!r}")
        if isinstance(self.dampening_frac, bool) or not isinstance(self.dampening_frac, (int, float)) \
                or not math.isfinite(self.dampening_frac) or self.dampening_frac < 0:
            raise QuantkitError(f"dampening_frac: must be a number >= 0, got {self.dampening_frac!r}")
        if isinstance(self.max_damping_retries, bool) or not isinstance(self.max_damping_retries, int) \
                or self.max_damping_retries < 0:
            raise QuantkitError(f"max_damping_retries: must be an integer >= 0, got {self.max_damping_retries!r}")
        for key in ("true_sequential", "static_groups", "offload_hessians", "gptaq"):
            if not isinstance(getattr(self, key), bool):
                raise QuantkitError(f"{key}: must be true or false, got {getattr(self, key)!r}")
        if isinstance(self.gptaq_alpha, bool) or not isinstance(self.gptaq_alpha, (int, float)) \
                or not math.isfinite(self.gptaq_alpha) or self.gptaq_alpha <= 0:
            raise QuantkitError(f"gptaq_alpha: must be a number > 0, got {self.gptaq_alpha!r}")
        if self.gptaq_alpha != DEFAULT_ALPHA and not self.gptaq:
            raise QuantkitError("gptaq_alpha: set only with gptaq: true")

    @property
    def needs_float_inputs(self) -> bool:
        return self.gptaq

    @property
    def settings(self) -> SolveSettings:
        """The options the solve itself reads."""
        return SolveSettings(self.block_size, self.dampening_frac, self.max_damping_retries, self.static_groups)

    def quantize_layer(self, ctx: LayerContext) -> dict[str, QuantizedWeight]:
        _check_targets(ctx)
        subgroups = _subgroups(ctx)
        floats = capture_float_inputs(ctx, [n for g in subgroups for n in g], self.gptaq_alpha) if self.gptaq else None
        try:
            if self.true_sequential and ctx.single_pass:
                return quantize_in_flight(ctx, subgroups, self.settings, floats)
            if not self.true_sequential:
                subgroups = [[n for g in subgroups for n in g]]
            return quantize_in_passes(ctx, subgroups, self.settings, offload=self.offload_hessians, floats=floats)
        finally:
            if floats is not None:
                floats.release()


def _check_targets(ctx: LayerContext) -> None:
    for name, (module, scheme) in ctx.targets.items():
        if scheme.weights is None:
            raise QuantkitError(f"{ctx.name}.{name}: GPTQ needs a weight scheme")
        fmt = number_format(scheme.weights)
        if not fmt.solvable:
            raise QuantkitError(f"{ctx.name}.{name}: weights.type: GPTQ quantizes integer weights, got {scheme.weights.type!r}")
        if not fmt.stores_g_idx and scheme.weights.actorder not in (None, "weight"):
            raise QuantkitError(f"{ctx.name}.{name}: weights.actorder: {fmt.name} GPTQ takes 'weight' or none "
                                "('group' needs a g_idx, which the format does not store)")
        if scheme.weights.strategy == "block":   # its column loop keeps one scale per row or group
            raise QuantkitError(f"{ctx.name}.{name}: weights.strategy: GPTQ does not take block scales, use rtn")
        scheme.weights.check_width(module.in_features, f"{ctx.name}.{name}")


def _subgroups(ctx: LayerContext) -> list[list[str]]:
    """The layer's sub-groups in order, restricted to the targets; targets in none last, together."""
    ordered = [n for group in ctx.subgroups for n in group if n in ctx.targets]
    rest = [n for n in ctx.targets if n not in ordered]
    subgroups = [[n for n in g if n in ctx.targets] for g in ctx.subgroups] + ([rest] if rest else [])
    return [g for g in subgroups if g]
