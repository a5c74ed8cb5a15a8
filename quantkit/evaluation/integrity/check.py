"""The integrity pass: every tensor of a quantized checkpoint against the baseline, streamed unit by unit.

For each module that ``config.json``'s ``quantization_config`` says is quantized:

- **layout**: the tensors its format stores, with the shapes and dtypes ``compress_module``
  writes (derived by running it on meta tensors, so the format is described once);
- **values**: scales and static input scales finite and positive, codes on the grid (int
  codes in ``[qmin, qmax]``, FP8 codes not NaN), zero points on the grid, ``g_idx`` a valid
  group assignment;
- **reconstruction** (``figures.py``): the weight decoded from those tensors, as served,
  against the reference (``expected_weights.py``: the baseline, recorded transforms re-applied).

Every other tensor (norms, embeddings, ``ignore`` modules, biases) must equal its reference;
KV-cache scales (``k_scale``, ``v_scale``), when present, finite and positive. The baseline
and the candidate are read one streaming unit (a decoder layer) at a time through lazy
safetensors readers, so memory holds one layer of each.

The result is plain data (``IntegrityReport``): per-module figures, the problems found,
and the measures the verdict gates on (``verdict.DEFAULT_LIMITS``: ``recon_excess_db``,
``recon_unit_excess_db``, ``tensor_problems``, ``tensor_rel_error``).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from quantkit.errors import QuantkitError
from quantkit.formats.compressed_tensors import (parse_quantization_config,
                                                 scheme_for)
from quantkit.pipeline.rotated_source import recorded_rotation
from quantkit.config.scheme import QuantScheme
from quantkit.inputs.source import SafetensorsSource
from quantkit.evaluation.integrity.module_check import (ConversionRecord, check_module, positive_finite, problem,
                                                        quantizer_of, rel_error)
from quantkit.evaluation.integrity.expected_weights import Reference, read_quantization_log, unit_of
from quantkit.pipeline import build_skeleton, residuals

KV_SCALES = ("k_scale", "v_scale")
_SAME_MODEL = ("architectures", "num_hidden_layers", "hidden_size", "intermediate_size", "vocab_size")


@dataclass
class IntegrityReport:
    """What the pass found; ``to_dict()`` is the report's ``integrity`` section."""

    modules: dict[str, dict] = field(default_factory=dict)     # quantized module -> figures, problems
    tensors: dict[str, dict] = field(default_factory=dict)     # other tensors that differ or are missing
    fallback: dict[str, str] = field(default_factory=dict)     # unit -> why it was checked without reference
    transformed: list[str] = field(default_factory=list)       # units compared with transforms re-applied
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def unloadable(self) -> bool:
        """A layout problem (missing tensor, wrong shape or dtype): the checkpoint cannot be served."""
        return any(p["layout"] for d in (*self.modules.values(), *self.tensors.values()) for p in d["problems"])

    def measures(self) -> dict[str, dict[str, float]]:
        """``{"integrity:<name>": {measure: value}}`` for the verdict."""
        out: dict[str, dict[str, float]] = {}
        for name, m in {**self.modules, **self.tensors}.items():
            v = {"tensor_problems": float(len(m["problems"]))}
            for k in ("recon_excess_db", "recon_unit_excess_db", "recon_gain_error", "tensor_rel_error"):
                if m.get(k) is not None:
                    v[k] = m[k]
            out[f"integrity:{name}"] = v
        return out

    def to_dict(self) -> dict:
        return {"modules": self.modules, "tensors": self.tensors, "fallback": self.fallback,
                "transformed": self.transformed, "notes": self.notes, "seconds": self.seconds}


def _read_config(folder: Path) -> dict:
    path = Path(folder) / "config.json"
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise QuantkitError(f"{path}: cannot read ({type(e).__name__})") from None


def _check_same_model(base: dict, cand: dict, base_dir: Path, cand_dir: Path) -> None:
    for key in _SAME_MODEL:
        if base.get(key) != cand.get(key):
            raise QuantkitError(f"{cand_dir / 'config.json'}: {key} {cand.get(key)!r} differs from the baseline's "
                                f"{base.get(key)!r} ({base_dir / 'config.json'}): not a conversion of this baseline")


# -- the pass ------------------------------------------------------------------------------------
def _recorded_rows(cand_dir: Path, report: IntegrityReport) -> dict[str, torch.Tensor]:
    """The conversion's row errors (``pipeline/residuals.py``); none (and a note) when unreadable."""

    try:
        rows = residuals.load(cand_dir)
    except Exception as e:  # a damaged record is reported, never trusted: the checks fall back
        report.notes.append(f"{cand_dir / residuals.FOLDER}: unreadable ({str(e).splitlines()[0][:200]}); "
                            "rows compared with round to nearest and the quantizer's allowance")
        return {}
    if not rows:
        report.notes.append("no recorded row errors (written by another tool or an older quantkit): rows and groups compared "
                            "with round to nearest and the quantizer's allowance")
    return rows


def _quantized_modules(config, groups, ignore) -> dict[str, tuple[nn.Linear, QuantScheme]]:

    out = {}
    for name, m in build_skeleton(config).named_modules():
        if isinstance(m, nn.Linear):
            s = scheme_for(name, "Linear", groups, ignore)
            if s is not None and s.weights is not None:
                out[name] = (m, s)
    return out


def _natural(unit: str):
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", unit)]


def check_checkpoint(base_dir: str | Path, cand_dir: str | Path, use_record: bool = True) -> IntegrityReport:
    """Check the quantized checkpoint ``cand_dir`` against the model folder ``base_dir``.

    ``use_record=False`` ignores the conversion's row record (to see what the allowances alone say).

    >>> r = check_checkpoint("models/smollm2", "out/smollm2-w8a16")                 # doctest: +SKIP
    >>> [n for n, m in r.modules.items() if m["recon_unit_excess_db"] > 12]          # doctest: +SKIP
    ['model.layers.15.self_attn.q_proj']
    """
    from transformers import AutoConfig

    t0 = time.perf_counter()
    base_dir, cand_dir = Path(base_dir), Path(cand_dir)
    cand_cfg = _read_config(cand_dir)
    qc = cand_cfg.get("quantization_config")
    if not isinstance(qc, dict):
        raise QuantkitError(f"{cand_dir / 'config.json'}: no quantization_config (not a quantized checkpoint)")
    groups, ignore = parse_quantization_config(qc, str(cand_dir / "config.json"))
    _check_same_model(_read_config(base_dir), cand_cfg, base_dir, cand_dir)
    try:
        config = AutoConfig.from_pretrained(base_dir)
    except ValueError as e:
        raise QuantkitError(f"{base_dir / 'config.json'}: {str(e).splitlines()[0]}") from None
    base, cand = SafetensorsSource(base_dir), SafetensorsSource(cand_dir)
    log = read_quantization_log(cand_dir)
    # a rotated conversion's embedding, final norm and LM head are the baseline's, turned
    base = recorded_rotation(config, base, (log or {}).get("recipe"))
    stats = {n: s for n, s in ((log or {}).get("modules") or {}).items() if isinstance(s, dict)}
    quantized = _quantized_modules(config, groups, ignore)
    report = IntegrityReport()
    rows = _recorded_rows(cand_dir, report) if use_record else {}

    def targets_of(layer: nn.Module, prefix: str):
        return {n: (m, s) for n, m in layer.named_modules() if (s := quantized.get(prefix + n, (None, None))[1])}

    reference = Reference(config, base, cand_dir, log, targets_of)
    units: dict[str, list[str]] = {}
    for k in base.keys():
        units.setdefault(unit_of(k), []).append(k)
    for name in quantized:
        units.setdefault(unit_of(name + "."), [])
    cand_by_unit: dict[str, list[str]] = {}
    for k in cand.keys():
        cand_by_unit.setdefault(unit_of(k), []).append(k)
    run = _Pass(quantized, base, cand, reference, stats, rows, bool(getattr(config, "tie_word_embeddings", False)),
                report)
    for unit in sorted(units, key=_natural):
        _check_unit(run, unit, units[unit], cand_by_unit.get(unit, []))
        base.release()
        cand.release()
    report.fallback = dict(reference.fallback)
    report.transformed = list(reference.transformed)
    report.seconds = time.perf_counter() - t0
    return report


@dataclass(frozen=True)
class _Pass:
    """What every unit's check reads, and the report it fills."""

    quantized: dict[str, tuple[nn.Linear, QuantScheme]]
    base: SafetensorsSource
    cand: SafetensorsSource
    reference: Reference
    stats: dict            # module -> its quantization_log.json entry
    rows: dict[str, torch.Tensor]   # module -> the conversion's row errors
    tied: bool             # lm_head shares the embedding (a checkpoint need not store it)
    report: IntegrityReport


def _check_unit(run: _Pass, unit: str, base_keys: list[str], cand_keys: list[str]) -> None:
    mods = {n: v for n, v in run.quantized.items() if unit_of(n + ".") == unit}
    ref = run.reference.tensors(unit, base_keys)
    seen = _check_quantized(run, mods, cand_keys, ref)
    seen |= _check_baseline_tensors(run, mods, base_keys, cand_keys, ref)
    for k in cand_keys:
        if k in seen:
            continue
        owner, _, leaf = k.rpartition(".")
        if leaf in KV_SCALES:
            problems = positive_finite(leaf, run.cand.get(k))
            if problems:
                run.report.tensors[k] = {"problems": problems}
        else:
            run.report.notes.append(f"{k}: a tensor the baseline does not have (not checked)")


def _check_quantized(run: _Pass, mods: dict[str, tuple[nn.Linear, QuantScheme]], cand_keys: list[str],
                     ref: dict | None) -> set[str]:
    """Check the unit's quantized modules ``mods``; return the checkpoint's keys they own."""
    by_module: dict[str, dict[str, torch.Tensor]] = {n: {} for n in mods}
    seen = set()
    for k in cand_keys:
        owner, _, leaf = k.rpartition(".")
        if owner in by_module:
            by_module[owner][leaf] = run.cand.get(k)
            seen.add(k)
    for name, (lin, scheme) in mods.items():
        module_ref = None if ref is None else {leaf: ref[f"{name}.{leaf}"] for leaf in ("weight", "bias")
                                               if f"{name}.{leaf}" in ref}
        stats = run.stats.get(name)
        record = ConversionRecord(quantizer_of(stats), (stats or {}).get("sqnr_db"), run.rows.get(name))
        entry = check_module(by_module[name], module_ref, scheme, (lin.out_features, lin.in_features),
                             lin.bias is not None, record)
        if ref is not None and f"{name}.weight" not in ref:
            entry["problems"].append(problem("the baseline has no weight for this module", layout=True))
        run.report.modules[name] = entry
    return seen


def _check_baseline_tensors(run: _Pass, mods: dict, base_keys: list[str], cand_keys: list[str],
                            ref: dict | None) -> set[str]:
    """Every baseline tensor the unit's quantized modules ``mods`` do not own must equal its reference;
    return those keys."""
    owned = {f"{n}.{leaf}" for n in mods for leaf in ("weight", "bias")}
    cand_set = set(cand_keys)
    seen = set()
    for k in base_keys:
        if k in owned:
            continue
        seen.add(k)
        if k not in cand_set:
            if not (run.tied and k == "lm_head.weight"):
                run.report.tensors[k] = {"problems": [problem("missing from the checkpoint", layout=True)]}
            continue
        if ref is None:
            continue
        t, r = run.cand.get(k), ref[k]
        if tuple(t.shape) != tuple(r.shape):
            run.report.tensors[k] = {"problems": [problem(f"shape {list(t.shape)}, baseline {list(r.shape)}",
                                                           layout=True)]}
            continue
        err = rel_error(t, r)
        if err > 0:
            run.report.tensors[k] = {"problems": [], "tensor_rel_error": err}
    return seen


# -- what a reader is shown -------------------------------------------------------------------------
def flagged_rows(data: dict, levels: dict[str, str]) -> list[dict]:
    """The flagged modules and tensors of a report's ``integrity`` section, worst first, each with
    its level (``levels``: the verdict's per-slice levels) and a one-line summary."""
    rows = []
    for kind in ("modules", "tensors"):
        for name, m in data[kind].items():
            level = levels.get(f"integrity:{name}")
            if level is None or level == "GO":
                continue
            row = {"name": name, "kind": kind[:-1], "level": level, "summary": _summary(m),
                   "problems": [p["text"] for p in m["problems"]]}
            row.update({k: m[k] for k in ("sqnr_db", "expected_sqnr_db", "recon_excess_db", "recon_unit_excess_db",
                                          "worst_unit", "gain", "tensor_rel_error", "quantizer") if k in m})
            rows.append(row)
    rank = {"NO-GO": 0, "REVIEW": 1}
    return sorted(rows, key=lambda r: (rank.get(r["level"], 2), -r.get("recon_unit_excess_db", 0.0)))


def _summary(m: dict) -> str:
    parts = [p["text"] for p in m["problems"]]
    if "sqnr_db" in m:
        parts.append(f"SQNR {m['sqnr_db']:.1f} dB, expected >= {m['expected_sqnr_db']:.1f} dB ({m['quantizer']}); "
                     f"worst {m['worst_unit']}: {m['worst_unit_sqnr_db']:.1f} dB, expected >= "
                     f"{m['worst_unit_expected_sqnr_db']:.1f}; gain {m['gain']:.4f}")
    if m.get("tensor_rel_error"):
        parts.append(f"relative error {m['tensor_rel_error']:.3g} vs the baseline")
    return "; ".join(parts)
