"""SmoothQuant: move activation outliers into the weights before W8A8 (Xiao et al., 2023).

For each mapping (``arch.SmoothMapping``) whose balance linears quantize their inputs::

    s_j = max|X_j|^alpha / max|W_:,j|^(1 - alpha)

over input channel ``j`` (``max|X_j|`` over every calibration token, ``max|W_:,j|`` over the
balance weights' column ``j``), folded into the norm or producer (``transforms.fold_scales``,
offset-aware) and the balance linears: ``X diag(s)^-1`` has flatter channels, which per-token
int8 activations can hold, and ``diag(s) W`` takes up the difference, which per-channel
int8 weights can.

With ``alphas`` (a grid), each mapping takes the alpha whose W8A8 simulation (weights
``Q(W diag(s))`` per channel, inputs ``Q(X diag(s)^-1)`` as the scheme quantizes them) gives
the least output error of the mapping's parent module on the first calibration batches.
The search returns the scales as data; ``apply`` folds them. Quantization is the next
step's (RTN or GPTQ).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from quantkit.arch.spec import SmoothMapping
from quantkit.errors import QuantkitError
from quantkit.config.scheme import QuantArgs
from quantkit.transforms.awq import fake_quantize_weight, minmax
from quantkit.steps.base import LayerContext, Transform, TransformResult, register_algorithm
from quantkit.transforms.observe import ChannelStats, Replay, observe_layer, search_batches
from quantkit.transforms.fold import fold_scales, tie_of


def smoothing_scales(act_max: torch.Tensor, weights: list[torch.Tensor], alpha: float) -> torch.Tensor:
    w_max = torch.cat([w.float().abs() for w in weights], dim=0).amax(0)
    s = act_max.clamp(min=1e-5).pow(alpha) / w_max.clamp(min=1e-5).pow(1.0 - alpha)
    return s.clamp(min=1e-5)


def fake_quantize_input(x: torch.Tensor, args: QuantArgs, amax: torch.Tensor | None) -> torch.Tensor:
    """Activations as a W8A8 kernel sees them: per token (dynamic) or with one static range."""
    qmax = 127.0 if args.type == "int" else 448.0
    if args.strategy == "token":
        scale = x.abs().amax(-1, keepdim=True).float().clamp(min=1e-8) / qmax
    else:
        scale = (amax if amax is not None else x.abs().amax()).float().clamp(min=1e-8) / qmax
    y = (x.float() / scale).clamp(-qmax, qmax)
    y = y.round() if args.type == "int" else y.to(torch.float8_e4m3fn).float()
    return (y * scale).to(x.dtype)


@register_algorithm("smoothquant")
@dataclass
class SmoothQuant(Transform):
    """Per-channel smoothing of W8A8 linears' inputs (see the module docstring)."""

    folds_scales: ClassVar[bool] = True

    alpha: float = 0.5                    # migration strength when no grid is given
    alphas: list[float] | None = None     # a grid: each mapping takes the alpha with least W8A8 error
    search_tokens: int = 8192             # calibration tokens (first batches) the grid is scored on
    producers: bool = True                # also producer -> consumer mappings (up_proj -> down_proj), not only norms
    load_from: str | None = None          # an earlier output folder: apply its saved result, no search

    def __post_init__(self) -> None:
        for a in [self.alpha, *(self.alphas or [])]:
            if not 0.0 <= a <= 1.0:
                raise QuantkitError(f"alpha: must be in [0, 1], got {a}")
        if self.alphas is not None and not self.alphas:
            raise QuantkitError("alphas: give at least one value, or null for the fixed alpha")
        if self.search_tokens < 1:
            raise QuantkitError(f"search_tokens: must be >= 1, got {self.search_tokens}")

    def search(self, ctx: LayerContext) -> TransformResult:
        mappings = self._mappings(ctx)
        parents = [m.parent for m in mappings] if self.alphas else []
        stats, replays = observe_layer(ctx, [m.balance[0] for m in mappings], parents,
                                       search_batches(ctx, self.search_tokens) if parents else [])
        tensors, summary = {}, {}
        for m in mappings:
            st = stats[m.balance[0]]
            if self.alphas:
                s, info = self._search_alpha(ctx, m, st, replays[m.parent])
            else:
                s = smoothing_scales(st.abs_max, [ctx.targets[b][0].weight.data for b in m.balance], self.alpha)
                info = {"alpha": self.alpha}
            tensors[f"scales.{m.smooth}"] = s
            summary[m.smooth] = {**info, "act_max_before": round(float(st.abs_max.max()), 4),
                                 "act_max_after": round(float((st.abs_max / s).max()), 4)}
        return TransformResult(tensors, summary)

    def apply(self, ctx: LayerContext, result: TransformResult) -> None:
        for m in ctx.arch.smooth_mappings:
            s = result.tensors.get(f"scales.{m.smooth}")
            # a hybrid's layer kinds may share a norm's name over other linears: fold into this layer's only
            if s is not None and all(b in ctx.targets for b in m.balance):
                fold_scales(ctx.layer, m, s, ctx.config, ctx.arch.norm_weight_offset)

    def _mappings(self, ctx: LayerContext) -> list[SmoothMapping]:
        out = []
        for m in ctx.arch.smooth_mappings:
            if not all(b in ctx.targets and ctx.targets[b][1].input_activations is not None for b in m.balance):
                continue
            if not self.producers and isinstance(ctx.layer.get_submodule(m.smooth), torch.nn.Linear):
                continue
            # value heads under GQA (v -> o_proj with fewer KV heads): AWQ ties their scales per
            # value channel; SmoothQuant's per-column maxima are not measured there yet, so skip
            tie = tie_of(ctx.layer, m, ctx.config)
            if tie is not None and tie.repeat == 1:
                out.append(m)
        return out

    def _search_alpha(self, ctx: LayerContext, m: SmoothMapping, st: ChannelStats, replay: Replay):
        lins = [ctx.targets[b][0] for b in m.balance]
        schemes = [ctx.targets[b][1] for b in m.balance]
        originals = [lin.weight.data.clone() for lin in lins]
        current: dict[str, torch.Tensor] = {}

        def quantize_input(module, inputs):
            s = current["s"]
            amax = (st.abs_max / s).max()
            return (fake_quantize_input(inputs[0] / s, schemes[0].input_activations, amax),)

        hooks = [lin.register_forward_pre_hook(quantize_input) for lin in lins]
        results = {}
        try:
            for a in [None, *self.alphas]:   # None: no smoothing, the W8A8 baseline
                s = (torch.ones_like(st.abs_max) if a is None
                     else smoothing_scales(st.abs_max, originals, a))
                current["s"] = s
                for lin, w, sc in zip(lins, originals, schemes):
                    lin.weight.data = fake_quantize_weight(w.float() * s[None, :], minmax(sc.weights)).to(w.dtype)
                results[a] = (replay.loss(), s)
        finally:
            for h in hooks:
                h.remove()
            for lin, w in zip(lins, originals):
                lin.weight.data = w
        best = min((a for a in results if a is not None), key=lambda a: results[a][0])
        return results[best][1], {"alpha": best, "loss_unsmoothed": results[None][0], "loss": results[best][0],
                                  "tokens": replay.num_tokens}
