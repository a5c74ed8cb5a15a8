"""The sensitivity search: per unit and candidate format, the predicted damage, as data.

Each candidate is applied to each unit by round to nearest on its grid (with the recipe's
range observer), ``ΔW = Wq - W`` is formed once, and one forward and backward of the float
model over a few thousand calibration tokens scores every (unit, candidate) at once
(``scores.py``). Optionally a sample of units is also measured exactly, one at a time
(``exact.py``), and the agreement of each score variant with it is recorded.

The whole float model is held in memory (with one ``ΔW`` per candidate and Linear): meant for
the models this machine converts, not for ones the layer loop streams from disk.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from quantkit.arch.lookup import arch_for
from quantkit.pipeline.batches import make_chunks
from quantkit.numerics.primitives import fake_quantize, weight_qparams
from quantkit.recipe import Recipe
from quantkit.sensitivity.agreement import spearman
from quantkit.config.candidates import _Candidate, fits
from quantkit.sensitivity.data import Sensitivity
from quantkit.sensitivity.exact import ExactKL
from quantkit.sensitivity.scores import VARIANTS, gradient_scores
from quantkit.config.mixed_section import DEFAULT_TOKENS
from quantkit.sensitivity.units import FormatUnit, plan_units

#: The variant plans use, chosen by its agreement with the exact KL (benchmarks/RESULTS.md).
DEFAULT_METHOD = "diag"
#: Positions per forward and backward: logits and their gradient are [tokens, vocab] floats.
BATCH_TOKENS = 1024


def subset(samples: list[list[int]], tokens: int) -> list[list[int]]:
    """Samples spread evenly over the set (a calibration set is often ordered by source) until
    about ``tokens`` are taken."""
    total = sum(len(s) for s in samples)
    if total <= tokens:
        return list(samples)
    step = total / tokens
    out, taken = [], 0
    for k in range(len(samples)):
        if taken >= tokens:
            break
        i = int(k * step) % len(samples)
        out.append(samples[i])
        taken += len(samples[i])
    return out


def deltas_for(model: nn.Module, units: list[FormatUnit], cands: list[_Candidate]) -> dict[str, dict[str, torch.Tensor]]:
    """``ΔW = RTN(W) - W`` per member Linear and candidate that fits its unit (kept: none)."""
    modules = dict(model.named_modules())
    out: dict[str, dict[str, torch.Tensor]] = {}
    for u in units:
        for m in u.members:
            w = modules[m].weight.data
            out[m] = {}
            for c in cands:
                if c.weights is not None and all(fits(c.weights, i) for _, i in u.shapes):
                    scale, zp = weight_qparams(w, c.weights)
                    out[m][c.name] = (fake_quantize(w, scale, zp, c.weights).float() - w.float())
    return out


@dataclass(frozen=True)
class SearchOptions:
    """How the sensitivity search scores: on about ``tokens`` calibration tokens, with ``labels``
    ("sampled" from the model's own distribution, or the data's "true" next tokens), ranked by
    ``method``. ``exact_units``: also measure this many units (spread over the depth) one at a time
    in ``exact_candidates`` (default: every quantized candidate) on ``exact_tokens`` tokens, and
    record the agreement.

    >>> SearchOptions(method="cubic")
    Traceback (most recent call last):
    ValueError: method must be one of ('diag', 'token', 'sample', 'local'), got 'cubic'
    """

    tokens: int = DEFAULT_TOKENS
    labels: str = "sampled"
    method: str = DEFAULT_METHOD
    exact_units: int = 0
    exact_candidates: list[str] | None = None
    exact_tokens: int = 2048
    seed: int = 0

    def __post_init__(self) -> None:
        if self.method not in VARIANTS:
            raise ValueError(f"method must be one of {VARIANTS}, got {self.method!r}")


def sensitivity_search(model: nn.Module, config, recipe: Recipe, samples: list[list[int]],
                       candidates: list[_Candidate], options: SearchOptions = SearchOptions(),
                       log: Callable[[str], None] | None = None) -> Sensitivity:
    """Score every unit of ``model`` (float, in memory) in every candidate format."""
    t0, c0 = time.perf_counter(), time.process_time()
    arch, spec = arch_for(config)
    units, dtype = plan_units(config, recipe)
    model.eval()
    deltas = deltas_for(model, units, candidates)
    chosen = subset(samples, options.tokens)
    chunks = make_chunks(chosen, BATCH_TOKENS, packed=spec.packed_calibration)
    if log is not None:
        log(f"sensitivity: {len(units)} units x {len(candidates)} candidates, {sum(map(len, chosen))} tokens "
            f"in {len(chunks)} batches, one forward and backward ({options.labels} labels)")
    t1 = time.perf_counter()
    g = gradient_scores(model, deltas, chunks, labels=options.labels, seed=options.seed)
    t2 = time.perf_counter()
    nbytes = {u.name: {c.name: u.nbytes(c.weights, dtype) for c in candidates
                       if c.weights is None or all(fits(c.weights, i) for _, i in u.shapes)} for u in units}
    scores = {v: {u.name: {c: g.score(u.members, c, v) for c in nbytes[u.name] if c in deltas[u.members[0]]}
                  for u in units} for v in VARIANTS}
    sens = Sensitivity(
        model={"architecture": arch, "dtype": str(dtype).removeprefix("torch."),
               "name": str(getattr(config, "_name_or_path", "") or ""), "num_layers": len(set(u.layer for u in units))},
        candidates={c.name: c.weights for c in candidates}, units=units, nbytes=nbytes, scores=scores,
        method=options.method,
        calibration={"num_samples": len(chosen), "num_tokens": g.tokens, "labels": options.labels,
                     "seed": options.seed},
        seconds={"prepare": round(t1 - t0, 2), "scores": round(t2 - t1, 2)},
    )
    if options.exact_units > 0:
        _measure_exact(sens, model, deltas, chosen, spec, options, log)
    sens.seconds["total"] = round(time.perf_counter() - t0, 2)
    # CPU seconds too: on a shared machine the wall clock mostly measures the others
    sens.seconds["cpu_total"] = round(time.process_time() - c0, 2)
    return sens


def _measure_exact(sens: Sensitivity, model, deltas, samples, spec, options: SearchOptions, log) -> None:
    t = time.perf_counter()
    quantized = [c for c, a in sens.candidates.items() if a is not None]
    cands = quantized if options.exact_candidates is None else options.exact_candidates
    n_units = options.exact_units
    step = max(1, len(sens.units) // n_units)
    picked = sens.units[::step][:n_units]
    kl = ExactKL(model, make_chunks(subset(samples, options.exact_tokens), BATCH_TOKENS, packed=spec.packed_calibration))
    modules = dict(model.named_modules())
    for k, u in enumerate(picked):
        for c in cands:
            if c in deltas[u.members[0]]:
                weights = {m: modules[m].weight.data.float() + deltas[m][c] for m in u.members}
                sens.exact.setdefault(u.name, {})[c] = kl(weights)
        if log is not None:
            log(f"sensitivity: exact KL {k + 1}/{len(picked)} {u.name}: "
                + ", ".join(f"{c} {v:.3g}" for c, v in sens.exact.get(u.name, {}).items()))
    sens.agreement = agreement(sens)
    sens.agreement["exact_tokens"] = kl.tokens
    sens.seconds["exact"] = round(time.perf_counter() - t, 2)


def agreement(sens: Sensitivity) -> dict:
    """Spearman of each variant's scores against the exact KL: per candidate (over units) and
    pooled over every (unit, candidate) measured."""
    out: dict = {"units": len(sens.exact), "spearman": {}}
    for v in VARIANTS:
        per: dict[str, float] = {}
        pooled_s, pooled_e = [], []
        for c in sens.candidates:
            pairs = [(sens.scores[v][u][c], e[c]) for u, e in sens.exact.items() if c in e]
            if len(pairs) >= 2:
                per[c] = spearman([p[0] for p in pairs], [p[1] for p in pairs])
                pooled_s += [p[0] for p in pairs]
                pooled_e += [p[1] for p in pairs]
        per["pooled"] = spearman(pooled_s, pooled_e)
        out["spearman"][v] = per
    # how far the predicted KL is from the measured one (the planner adds predictions up)
    ratios = [sens.scores[sens.method][u][c] / e for u, per in sens.exact.items() for c, e in per.items() if e > 0]
    if ratios:
        ratios.sort()
        out["predicted_over_exact_median"] = round(ratios[len(ratios) // 2], 3)
    return out
