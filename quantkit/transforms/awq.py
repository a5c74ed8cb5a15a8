"""AWQ: activation-aware scales, then a per-group clip search (Lin et al., 2023).

For each mapping (a norm or producer feeding balance linears, ``arch.SmoothMapping``):

    s(r) = x̄^r / w̄^(1-r)        x̄: mean |x| per input channel over the calibration tokens
                                 w̄: mean over output rows of |w| / max|w| of its group
    s    = s / sqrt(max s * min s)
    r*   = argmin_r || P(x) - P_q,s(x) ||²     over r in {0, 1/n, ..., (n-1)/n}

where ``P`` is the smallest module holding the balance linears (the attention block for
q/k/v, the MLP for gate/up, the linear itself otherwise) and ``P_q,s`` is ``P`` with each
balance weight replaced by ``Q(W diag(s)) diag(s)^-1`` (``Q``: round-to-nearest on the
target's grid). "Duo scaling" uses ``w̄``; without it ``s = x̄^r``. The scales fold into the
layer (``transforms.fold_scales``): the float layer is unchanged, the quantized one keeps
its salient channels.

The loss is computed at the least cost (``transforms.ratio_loss``): where ``P`` is the balance
linear itself it is ``tr(Δ G Δᵀ)`` over the sample's input Gram ``G`` (no forward per
candidate); where ``P`` must run, every candidate runs on the first sample batch and only the
``finalists`` best of them (and no scaling) on the rest, so the choice is the exhaustive
search's whenever that candidate is among the first batch's best. ``screen_tokens`` makes that
first part smaller: the first batch's rows up to that many tokens (``Replay.split_first``), its
other rows a part of their own.

Then, per target linear and per group (row ``o``, group ``g``), a clip ratio ``c``
shrinks the group's range to ``c * max|w|`` before quantization, chosen from
``{1, 1 - max_shrink/n, ...}`` to minimise the group's output error
``d^T G_g d`` (``d``: the group's rounding error, ``G_g``: the Gram matrix of the group's
scaled inputs over every calibration token). llm-awq has this step; llm-compressor's
AWQModifier leaves it out.

With ``clip_in_search`` each candidate ``s`` is scored with its clip ranges searched first
(``Q`` becomes round to nearest of the clipped ``W diag(s)``): the ratio is then chosen for the
weights that will be written, not for min-max ones, at the cost of one clip search (a small
matrix product per candidate ratio and clip ratio) per candidate; ``search_clip_grid`` can make
that inner clip grid coarser than the final one (the ranking needs less resolution).

The search returns data (``TransformResult``); ``apply`` folds the scales and clamps the
weights. Quantization itself is the next step's (RTN or GPTQ).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from quantkit.arch.spec import SmoothMapping
from quantkit.errors import QuantkitError
from quantkit.numerics.number_formats import number_format
from quantkit.config.scheme import QuantArgs
from quantkit.steps.base import LayerContext, Transform, TransformResult, register_algorithm
from quantkit.transforms.observe import ChannelStats, observe_layer, search_batches
from quantkit.transforms.fold import fold_scales, mapping_applies, tie_of
from quantkit.transforms.ratio_loss import LinearReplay, screened_losses


def minmax(args: QuantArgs) -> QuantArgs:
    """The same grid with plain min-max ranges (the searches loop on RTN; the quantizer may clip)."""
    return dataclasses.replace(args, observer="minmax", actorder=None)


def fake_quantize_weight(w: torch.Tensor, args: QuantArgs) -> torch.Tensor:
    """``w`` rounded to nearest on its number format and decoded, in its dtype."""
    fmt = number_format(args)
    qp = fmt.scales(w)
    return fmt.dequantize(fmt.quantize(w, qp), qp, None, w.dtype)


def weight_salience(weights: list[torch.Tensor], args: QuantArgs) -> torch.Tensor:
    """w̄: mean over output rows of |w| relative to its group's max, per input channel."""
    w = torch.cat([t.float() for t in weights], dim=0)
    g = args.group_size if args.strategy == "group" else w.shape[1]
    wg = w.abs().view(w.shape[0], -1, g)
    wg = wg / wg.amax(dim=-1, keepdim=True).clamp(min=1e-8)
    return wg.view(w.shape[0], -1).mean(0)


def candidate_scales(x_mean: torch.Tensor, w_mean: torch.Tensor | None, ratio: float) -> torch.Tensor:
    s = x_mean.clamp(min=1e-4).pow(ratio)
    if w_mean is not None:
        s = s / w_mean.clamp(min=1e-4).pow(1.0 - ratio)
    s = s.clamp(min=1e-4)
    return s / (s.max() * s.min()).sqrt()


def clip_search(w: torch.Tensor, gram: torch.Tensor, args: QuantArgs, grid: int, max_shrink: float) -> torch.Tensor:
    """Per (row, group) clip ratio minimising the group's output error ``d^T G d``; ``[out, groups]``.

    The ratios are tried in order and a later one must be strictly better, so ties keep the wider range.
    """
    out, cols = w.shape
    g = gram.shape[-1]
    # groups first ([groups, out, g]): each ratio's error is one batched product with no copy
    wt = w.float().view(out, -1, g).transpose(0, 1).contiguous()
    best_err = torch.full(wt.shape[:2], float("inf"))
    best = torch.ones_like(best_err)
    hi, lo = wt.amax(-1), wt.amin(-1)
    absmax = torch.maximum(hi.abs(), lo.abs())
    for i in range(int(max_shrink * grid) + 1):
        c = 1.0 - i / grid
        if args.symmetric:
            d = _clipped_symmetric(wt, absmax * c, args).sub_(wt)
        else:
            clipped = torch.maximum(torch.minimum(wt, (hi * c)[..., None]), (lo * c)[..., None])
            rows = fake_quantize_weight(clipped.transpose(0, 1).reshape(out, cols), args)
            d = rows.view(out, -1, g).transpose(0, 1).sub(wt)
        err = torch.bmm(d, gram).mul_(d).sum(-1)
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best.masked_fill_(better, c)
    return best.T


def _clipped_symmetric(wg: torch.Tensor, bound: torch.Tensor, args: QuantArgs) -> torch.Tensor:
    """``fake_quantize_weight`` of ``wg`` clipped to ``±bound`` per group, in one pass.

    The clipped group's absmax is ``bound`` itself, so its scale is ``bound / 7.5`` (4 bits,
    ``calculate_qparams``); a clipped element's ratio to that scale is ``±bound / scale``, so
    clamping ``wg / scale`` to those limits gives the same codes as clipping first, bit for bit.
    """
    scale = bound / ((args.qmax - args.qmin) / 2)
    scale = torch.where(scale == 0, torch.full_like(scale, max(torch.finfo(wg.dtype).tiny, 1e-12)), scale)[..., None]
    lim = bound[..., None] / scale
    v = torch.minimum(torch.maximum(wg / scale, -lim), lim)
    return torch.round(v).clamp(args.qmin, args.qmax) * scale


def refine_clip(w: torch.Tensor, hessian: torch.Tensor, ratios: torch.Tensor, args: QuantArgs, grid: int,
                max_shrink: float, sweeps: int) -> torch.Tensor:
    """Clip ratios that minimise each row's whole output error ``d^T H d`` (``H``: the linear's
    ``[in, in]`` Gram), by coordinate descent over the groups from ``ratios`` (``clip_search``'s).

    ``clip_search`` scores a group alone, on its diagonal block of ``H``; the products between
    groups of one row (inputs correlate across groups: one outlier token lifts every channel)
    are what is left. A sweep visits each group with the others held, scoring each candidate
    ``c`` by ``d_c^T H_gg d_c + 2 d_c^T r`` (``r``: the other groups' errors seen through
    ``H``); the current ratio is a candidate, so no sweep raises any row's error.
    """
    out, cols = w.shape
    g = cols // ratios.shape[1]
    wf, h = w.float(), hessian.float()
    candidates = [1.0 - i / grid for i in range(int(max_shrink * grid) + 1)]
    ratios = ratios.clone()

    def quantized_group(j: int, c: torch.Tensor) -> torch.Tensor:   # group j clipped per row by c [out]
        wg = wf[:, j * g:(j + 1) * g]
        if args.symmetric:
            bound = wg.abs().amax(-1) * c
            return _clipped_symmetric(wg[:, None, :], bound[:, None], args)[:, 0, :]
        clipped = torch.maximum(torch.minimum(wg, (wg.amax(-1) * c)[:, None]), (wg.amin(-1) * c)[:, None])
        return fake_quantize_weight(clipped, dataclasses.replace(args, group_size=g))

    d = torch.cat([wf[:, j * g:(j + 1) * g] - quantized_group(j, ratios[:, j]) for j in range(ratios.shape[1])], 1)
    r_all = d @ h
    for _ in range(sweeps):
        for j in range(ratios.shape[1]):
            sl = slice(j * g, (j + 1) * g)
            h_jj, d_old = h[sl, sl], d[:, sl]
            r = r_all[:, sl] - d_old @ h_jj                      # the other groups' part
            best_err = torch.full((out,), float("inf"))
            best_c, best_d = ratios[:, j].clone(), d_old
            for c in candidates:
                d_c = wf[:, sl] - quantized_group(j, torch.full((out,), c))
                err = ((d_c @ h_jj) * d_c).sum(-1) + 2 * (d_c * r).sum(-1)
                better = err < best_err
                best_err = torch.where(better, err, best_err)
                best_c = torch.where(better, torch.full_like(best_c, c), best_c)
                best_d = torch.where(better[:, None], d_c, best_d)
            r_all += (best_d - d_old) @ h[sl, :]
            d[:, sl], ratios[:, j] = best_d, best_c
    return ratios


def apply_clip(w: torch.Tensor, ratios: torch.Tensor, symmetric: bool) -> torch.Tensor:
    out, cols = w.shape
    wg = w.float().view(out, ratios.shape[1], -1)
    hi, lo = wg.amax(-1) * ratios, wg.amin(-1) * ratios
    if symmetric:
        bound = torch.maximum(hi.abs(), lo.abs())
        hi, lo = bound, -bound
    return torch.maximum(torch.minimum(wg, hi[..., None]), lo[..., None]).view(out, cols).to(w.dtype)


@register_algorithm("awq")
@dataclass
class AWQ(Transform):
    """Activation-aware scales per mapping and clip ranges per group (see the module docstring)."""

    folds_scales: ClassVar[bool] = True

    grid: int = 20                  # ratios searched: r = 0, 1/grid, ..., (grid-1)/grid
    duo_scaling: bool = True        # s = x̄^r / w̄^(1-r); False: s = x̄^r
    clip: bool = True               # the per-group clip search after the scales
    clip_grid: int = 20
    max_shrink: float = 0.5         # clip ratios searched down to 1 - max_shrink
    clip_skip: list[str] | None = None  # linears (name suffixes) left out of the clip search, e.g. q/k
    clip_in_search: bool = False    # score each ratio with its clip ranges searched first (slower)
    search_clip_grid: int | None = None  # the clip grid inside the ratio search (None: clip_grid)
    clip_sweeps: int = 0            # then sweeps over groups scoring each row's whole output error
    search_tokens: int = 8192       # calibration tokens (first batches) whose output error picks r
    finalists: int = 4              # ratios the first of those batches passes on to the rest (> grid: all)
    screen_tokens: int | None = None  # screen on the first batch's rows up to this many tokens (None: all of it)
    skip_first: int = 0             # first tokens of each row left out of statistics, Grams and losses
    load_from: str | None = None    # an earlier output folder: apply its saved result, no search

    def __post_init__(self) -> None:
        for key in ("grid", "clip_grid", "search_clip_grid"):
            value = getattr(self, key)
            if value is not None and value < 1:
                raise QuantkitError(f"{key}: must be >= 1, got {value}")
        if not 0.0 <= self.max_shrink < 1.0:
            raise QuantkitError(f"max_shrink: must be in [0, 1), got {self.max_shrink}")
        if self.clip_sweeps < 0:
            raise QuantkitError(f"clip_sweeps: must be >= 0, got {self.clip_sweeps}")
        if self.skip_first < 0:
            raise QuantkitError(f"skip_first: must be >= 0, got {self.skip_first}")
        if self.search_tokens < 1:
            raise QuantkitError(f"search_tokens: must be >= 1, got {self.search_tokens}")
        if self.finalists < 1:
            raise QuantkitError(f"finalists: must be >= 1, got {self.finalists}")
        if self.screen_tokens is not None and self.screen_tokens < 1:
            raise QuantkitError(f"screen_tokens: must be >= 1, got {self.screen_tokens}")

    # -- search ------------------------------------------------------------------------------
    def search(self, ctx: LayerContext) -> TransformResult:
        mappings = self._mappings(ctx)
        # clip ranges per group (a channel-wise grid would need an [in, in] Gram per linear)
        targets = {n: s.weights for n, (_, s) in ctx.targets.items()
                   if self.clip and s.weights is not None and s.weights.type == "int" and s.weights.strategy == "group"
                   and not n.endswith(tuple(self.clip_skip or ()))}
        linears = sorted({m.balance[0] for m in mappings} | set(targets))
        grams = {n: a.group_size for n, a in targets.items()}
        stats, replays = observe_layer(ctx, linears, [m.parent for m in mappings],
                                       search_batches(ctx, self.search_tokens), grams, self.skip_first,
                                       set(targets) if self.clip_sweeps else None)
        tensors: dict[str, torch.Tensor] = {}
        summary: dict[str, dict] = {}
        scales_of: dict[str, torch.Tensor] = {}      # per balance linear: the scales its inputs get
        clip_of = {n: (minmax(a), stats[n].group_gram()) for n, a in targets.items()} if self.clip_in_search else {}
        for m in mappings:
            replay = replays[m.parent]
            parent = ctx.layer.get_submodule(m.parent)
            if m.balance == (m.parent,) and isinstance(parent, nn.Linear):   # its error in Gram form
                replay = LinearReplay.from_calls(parent, replay.calls)
            elif self.screen_tokens is not None:
                replay = replay.split_first(self.screen_tokens)
            s, info = self._search_mapping(ctx, m, stats[m.balance[0]], replay, clip_of)
            tensors[f"scales.{m.smooth}"] = s
            summary[m.smooth] = info
            for b in m.balance:
                scales_of[b] = tie_of(ctx.layer, m, ctx.config).expand(s)
        for name, args in targets.items():
            lin = ctx.targets[name][0]
            s = scales_of.get(name)
            w = lin.weight.data.float() if s is None else lin.weight.data.float() * s[None, :]
            gram = stats[name].group_gram()
            if s is not None:  # the inputs the folded weight will see: x / s
                inv = (1.0 / s).view(gram.shape[0], -1)
                gram = gram * inv[:, :, None] * inv[:, None, :]
            ratios = clip_search(w, gram, minmax(args), self.clip_grid, self.max_shrink)
            if self.clip_sweeps:
                hessian = stats[name].full_gram()
                if s is not None:
                    hessian = hessian / s[:, None] / s[None, :]
                ratios = refine_clip(w, hessian, ratios, minmax(args), self.clip_grid, self.max_shrink, self.clip_sweeps)
            tensors[f"clip.{name}"] = ratios
            summary.setdefault("clip_mean_ratio", {})[name] = round(float(ratios.mean()), 4)
        return TransformResult(tensors, summary)

    def _mappings(self, ctx: LayerContext) -> list[SmoothMapping]:
        out = []
        for m in ctx.arch.smooth_mappings:
            if not all(b in ctx.targets and ctx.targets[b][1].weights is not None
                       and ctx.targets[b][1].weights.type == "int" for b in m.balance):
                continue
            if mapping_applies(ctx.layer, m, ctx.config):
                out.append(m)
        return out

    def _search_mapping(self, ctx: LayerContext, m: SmoothMapping, st: ChannelStats, replay,
                        clip_of: dict[str, tuple[QuantArgs, torch.Tensor]] | None = None) -> tuple[torch.Tensor, dict]:
        lins: list[nn.Linear] = [ctx.targets[b][0] for b in m.balance]
        args = [minmax(ctx.targets[b][1].weights) for b in m.balance]
        clips = [(clip_of or {}).get(b) for b in m.balance]
        originals = [lin.weight.data.clone() for lin in lins]
        # statistics per smooth channel (a value channel under GQA: the mean over its copies)
        tie = tie_of(ctx.layer, m, ctx.config)
        x_mean = tie.reduce(st.abs_mean)
        w_mean = tie.reduce(weight_salience(originals, args[0])) if self.duo_scaling else None
        # no scaling (None) is a candidate too: with duo scaling r = 0 gives 1 / w̄, not 1, and on a
        # mapping where every scaled grid loses, the scales must not make it worse
        scales = {None: torch.ones_like(x_mean)}
        scales.update({i / self.grid: candidate_scales(x_mean, w_mean, i / self.grid) for i in range(self.grid)})

        order = {r: i for i, r in enumerate(scales)}
        kept: dict = {}     # candidate -> (first part's loss, order, weights) for those a later part may run

        def quantized(s: torch.Tensor) -> list[torch.Tensor]:   # the balance weights as scaled and rounded
            cols = tie.expand(s)
            out = []
            for w, a, clip in zip(originals, args, clips):
                ws = w.float() * cols[None, :]
                if clip is not None:   # the clip ranges this scaling would get (see search())
                    inv = (1.0 / cols).view(clip[1].shape[0], -1)
                    gram = clip[1] * inv[:, :, None] * inv[:, None, :]
                    grid = self.search_clip_grid or self.clip_grid
                    ws = apply_clip(ws, clip_search(ws, gram, clip[0], grid, self.max_shrink), a.symmetric)
                out.append((fake_quantize_weight(ws, a) / cols[None, :]).to(w.dtype))
            return out

        def error(r: float | None, part: int) -> tuple[float, int]:
            weights = kept.pop(r, (None, None, None))[2] or quantized(scales[r])
            for lin, w in zip(lins, weights):
                lin.weight.data = w
            e, n = replay.squared_error(part)
            if part + 1 < replay.parts:   # the later parts run it again if it stays among the best
                kept[r] = (e / max(n, 1), order[r], weights)
                if len(kept) > self.finalists + 1:   # the unscaled one and the best so far
                    del kept[max((k for k in kept if k is not None), key=lambda k: kept[k][:2])]
            return e, n

        try:
            losses = screened_losses(list(scales), replay.parts, error, self.finalists, None)
        finally:
            for lin, w in zip(lins, originals):
                lin.weight.data = w
        best = None
        for r in scales:                 # in order: on a tie the earlier candidate stays
            if r in losses and losses[r] < losses[best]:
                best = r
        return scales[best], {"ratio": best, "loss_rtn": losses[None], "loss_awq": losses[best],
                              "tokens": replay.num_tokens}

    # -- apply -------------------------------------------------------------------------------
    def apply(self, ctx: LayerContext, result: TransformResult) -> None:
        for m in ctx.arch.smooth_mappings:
            s = result.tensors.get(f"scales.{m.smooth}")
            # a hybrid's layer kinds may share a norm's name over other linears: fold into this layer's only
            if s is not None and all(b in ctx.targets for b in m.balance):
                fold_scales(ctx.layer, m, s, ctx.config, ctx.arch.norm_weight_offset)
        for name, (lin, scheme) in ctx.targets.items():
            ratios = result.tensors.get(f"clip.{name}")
            if ratios is not None:
                with torch.no_grad():
                    lin.weight.data = apply_clip(lin.weight.data, ratios, scheme.weights.symmetric)
