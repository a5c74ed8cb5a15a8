"""What the Markdown and HTML reports both show, read from report.json's dict: numbers as a reader
reads them, the slice table's column groups, and the report's sentences, each in the report's
language (``words``: ``WORDS.bind(lang)``); the gating figures are in gating.py."""
from __future__ import annotations

import math
import re

from quantkit.evaluation.integrity.expected_weights import unit_of
from quantkit.evaluation.measures import table_columns
from quantkit.evaluation.report.words import WORDS, gating_source, length_source, said


def fmt(v, spec: str = ".6g") -> str:
    """A JSON value as the Markdown report prints it: every digit the JSON holds."""
    if v is None:
        return "–"
    if isinstance(v, float):
        return format(v, spec)
    return str(v)


def short(v) -> str:
    """A number at three significant digits for a reader (0.0351873 -> "0.0352"); at 100 and
    above, whole numbers (a perplexity of 1234.56 reads "1235", not "1.23e+03").

    >>> [short(x) for x in (0.0351873, 0.87654, 12.3456, 1234.56, -0.00012345, 7, None)]
    ['0.0352', '0.877', '12.3', '1235', '-0.000123', '7', '–']
    """
    if v is None:
        return "–"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, int) or not math.isfinite(v):
        return str(v)
    if abs(v) >= 100:
        return f"{v:.0f}"
    return format(v, ".3g")


# --- gating figures -----------------------------------------------------------------------


# --- the slice table's column groups ------------------------------------------------------

# the supporting columns' groups (the figures a gated measure is computed from); a column added
# later lands in "other" until it is named here
_GROUPS = (("group_perplexity", re.compile(r"^(tokens|ppl_)")),
           ("group_tasks", re.compile(r"^(mc_|extract_|code_)")),
           ("group_path", re.compile(r"^path_")))


def columns(data: dict) -> list[tuple[str, str, str]]:
    """(key, title, format) of the slice table's columns (measures/: ``table_columns``) that hold a value."""
    return [c for c in table_columns() if any(v.get(c[0]) is not None for v in data["slices"].values())]


def column_groups(data: dict) -> tuple[list[tuple[str, str, str]], list[tuple[str, list[tuple[str, str, str]]]]]:
    """The slice table's columns that are gated measures (they have a limit), then the supporting
    columns as (group's message id, its columns) for the groups that hold a value."""
    gated = [c for c in columns(data) if c[0] in data["thresholds"]]
    groups: dict[str, list] = {g: [] for g, _ in _GROUPS}
    groups["group_other"] = []
    for col in columns(data):
        if col not in gated:
            groups[next((g for g, pattern in _GROUPS if pattern.match(col[0])), "group_other")].append(col)
    return gated, [(g, cols) for g, cols in groups.items() if cols]


# --- sentences ----------------------------------------------------------------------------

def source_note(meta: dict, words) -> str:
    """Where the evaluated length came from, as an aside in the report's language."""
    source = meta.get("max_len_source")
    return words("aside", x=length_source(source, words)) if source else ""


def gating_text(data: dict, words) -> str:
    """One sentence: which languages gate the decision and where that came from."""
    g = (data["meta"].get("languages") or {})
    if not g.get("gating"):
        return words("gating_all_slices")
    return words("gating_languages", langs=", ".join(g["gating"]), source=gating_source(g.get("source"), words))


def gates(data: dict, name: str, words) -> str:
    """Whether slice ``name`` gates the decision, and if not, why (languages.py's words)."""
    off = data["verdict"].get("not_gated", {})
    return not_gated_note(off[name], words) if name in off else words("yes")


def not_gated_note(note: str, words) -> str:
    """languages.py's "not gated (source: languages)" in the report's language."""
    if words("yes") == "yes":
        return note
    why = re.fullmatch(r"not gated \((.*): (.*)\)", note)
    if not why:
        return words("not_gated")
    source = "model card" if why.group(1) == "model card languages" else why.group(1)
    return words("not_gated_why", source=gating_source(source, words), langs=why.group(2))


def noise_line(n: dict, words, show=short) -> str:
    lo, hi = n["interval"]
    key = "noise_prompts" if n.get("over") == "prompts" else "noise"
    return words(key, slice=n["slice"], measure=n["measure"], value=show(n["value"]), lo=show(lo), hi=show(hi),
                 level=n["limit_level"], limit=show(n["limit"]))


def candidate_label(meta: dict, words) -> str:
    """The candidate's name in the KL-by-position plot and table: with ``--kv``, the option it runs."""
    if meta.get("candidate_label"):
        return meta["candidate_label"]
    kv = meta.get("kv") or []
    return words("candidate_kv", option=kv[0]["option"]) if kv else words("th_candidate")


def position_lines(data: dict, name: str, words) -> list[tuple[str, list[dict]]]:
    """The lines of a long slice's KL-by-position plot: the candidate, then each variant."""
    lines = [(candidate_label(data["meta"], words), data["kl_by_position"][name])]
    return lines + [(v, r["buckets"]) for v, r in variants(data, name).items() if r.get("buckets")]


VARIANT_COLUMNS = ("kl_mean", "top1_agreement", "kl_first_bucket", "kl_last_bucket", "kl_worst_bucket")


def variants(data: dict, name: str) -> dict[str, dict]:
    return (data.get("kl_by_position_variants") or {}).get(name, {})


def slice_notes(data: dict, name: str, words) -> list[str]:
    """What a long slice's texts covered, in the report's language."""
    return [said(n, words) for n in data["meta"].get("long_context_notes") or [] if n.startswith(f"{name}: ")]


def warnings_of(data: dict, words) -> list[str]:
    """The evaluation's warnings in the report's language."""
    return [said(x, words) for x in data.get("warnings") or []]


def example_key(key: str, words) -> str:
    """A worst example's key in the report's language (a measure's name as it is)."""
    return words(f"ex_{key}") if f"ex_{key}" in WORDS else key


def lm_rows(data: dict):
    """(task, metric, row) for the lm-eval table, in the JSON's order."""
    for task, metrics in (data.get("lm_eval") or {}).items():
        for metric, row in metrics.items():
            yield task, metric, row


BUSINESS_COLUMNS = ("rows", "in_calibration", "repeats", "evaluated", "without_reply", "scored_tokens", "stop",
                    "evidence")


def business_lines(data: dict, words) -> tuple[str, list[list]]:
    """The business rows' sentence and table (task, BUSINESS_COLUMNS, then the slice's kl_mean with
    its bootstrap interval over rows) from ``meta.business``."""
    b = data["meta"].get("business")
    if not b:
        return "", []
    check = b.get("checked_against")
    said = (words("business_checked", manifest=check["manifest"],
                  other="" if check.get("same_source") else words("business_other_log"))
            if check else words("business_unchecked"))
    head = words("business_head", log=b["log"], said=said)
    return head, [[t, *(c.get(k) for k in BUSINESS_COLUMNS), _with_interval(data["slices"].get(f"business:{t}"))]
                  for t, c in b["tasks"].items()]


def _with_interval(vals: dict | None) -> str:
    if not vals or vals.get("kl_mean") is None:
        return "–"
    ci = vals.get("kl_mean_ci")
    return fmt(vals["kl_mean"]) + (f" [{fmt(ci[0])}, {fmt(ci[1])}]" if ci else "")


def mixed_text(mixed: dict, words) -> str:
    """One sentence: the plan's size, its predicted and measured KL, the units per format."""
    p = mixed["plan"]
    budget = ", ".join(f"{k} {fmt(v)}" for k, v in (p.get("budget") or {}).items()) or words("none")
    shares = ", ".join(words("mixed_units", fmt=c, n=r["units"]) for c, r in mixed["by_candidate"].items())
    measured = ("" if mixed.get("measured_kl") is None else words("mixed_measured", kl=fmt(mixed["measured_kl"])))
    return words("mixed_text", bits=fmt(p["bits_per_weight"]), budget=budget, kl=fmt(p["predicted_kl"]),
                 method=mixed["method"], measured=measured, shares=shares)


def integrity_text(integrity: dict, words) -> str:
    """One sentence: what the integrity pass compared, in how long, and how much it flagged."""
    how = words("integrity_how", k=len(integrity["transformed"])) if integrity["transformed"] else ""
    return words("integrity_text", n=len(integrity["modules"]), how=how, s=f"{integrity['seconds']:.1f}",
                 flagged=len(integrity["flagged"]))


def integrity_grid(data: dict) -> tuple[list[str], list[str], list[list[float | None]], list[list[float | None]]]:
    """The heat map's data: layers, module kinds, and per cell the module's SQNR and its worst
    part's excess over expected (dB; the worst of a kind's modules when several share a cell, e.g. experts)."""
    cells: dict[tuple[str, str], tuple[float, float]] = {}
    layers: list[str] = []
    kinds: list[str] = []
    for name, m in data["modules"].items():
        if "sqnr_db" not in m:
            continue
        unit, kind = unit_and_kind(name)
        layers += [] if unit in layers else [unit]
        kinds += [] if kind in kinds else [kind]
        excess = max(m["recon_excess_db"], m["recon_unit_excess_db"])
        old = cells.get((unit, kind))
        cells[(unit, kind)] = (m["sqnr_db"], excess) if old is None else (min(old[0], m["sqnr_db"]), max(old[1], excess))
    sqnr = [[cells.get((u, k), (None, None))[0] for k in kinds] for u in layers]
    excess = [[cells.get((u, k), (None, None))[1] for k in kinds] for u in layers]
    return layers, kinds, sqnr, excess


def unit_and_kind(name: str) -> tuple[str, str]:
    """A module's decoder layer (its unit) and its kind within the layer, experts' numbers as ``*``."""
    unit = unit_of(name + ".")
    return unit, re.sub(r"\.\d+\.", ".*.", name[len(unit) + 1:] if unit else name)


def layer_label(unit: str) -> str:
    return unit.rpartition(".")[2] if unit else "(outer)"


def layer_summary(module_errors: dict[str, float]) -> list[tuple[int, int, float, float, float]]:
    """(layer, modules, worst, median, best) SQNR in dB per decoder layer (``layers.N.`` in the
    module's name), in layer order: the per-layer chart's data. Modules outside the layers are left out."""
    by_layer: dict[int, list[float]] = {}
    for name, db in module_errors.items():
        m = re.search(r"layers\.(\d+)\.", name)
        if m and db is not None and math.isfinite(db):
            by_layer.setdefault(int(m.group(1)), []).append(db)
    out = []
    for layer in sorted(by_layer):
        vals = sorted(by_layer[layer])
        mid = len(vals) // 2
        median = vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2
        out.append((layer, len(vals), vals[0], median, vals[-1]))
    return out


def footprint_note(footprint: dict, words) -> str:
    """Which GPU the footprint is priced for: the one ``--gpu-mem`` named, or an assumed one, said so."""
    gib = footprint.get("gpu_mem_bytes")
    if not gib:
        return ""
    size = f"{gib / 2**30:g}"
    return words("footprint_assumed" if footprint.get("gpu_mem_assumed") else "footprint_named", gib=size)


ENGINE_SETTINGS = ("engine", "version", "device", "host", "dtype", "dtype_reason", "probe_step_s", "quantization",
                   "kv_cache_dtype", "max_model_len", "enable_prefix_caching", "enable_chunked_prefill", "url")


def _engine_row(record: dict) -> dict:
    """A server's record with the dtype's reason and the probe's step time as plain settings."""
    out = dict(record)
    if record.get("dtype_choice"):
        out["dtype_reason"] = record["dtype_choice"]["reason"]
    if record.get("probe"):
        out["probe_step_s"] = f"{record['probe']['step_s']:.3f} (budget {record['probe']['budget_step_s']:g})"
    return out


def engine_section(data: dict, words) -> tuple[str, list[str], list[list[str]]] | None:
    """The engine section of report.json's ``data``: a sentence (how KL was estimated, what the
    engine did not measure), and each server's settings as a table (header, rows); None when the
    evaluation ran in process."""
    eng = data.get("engine")
    if not eng:
        return None
    who = [w for w in ("baseline", "candidate") if w in eng]
    note = words("engine_note", kl=eng.get("kl", ""), tokens=eng.get("path_tokens"),
                 missing="; ".join(eng.get("not_measured") or [words("nothing")]))
    records = [_engine_row(eng[w]) for w in who]
    rows = [[key, *(str(r.get(key, "–")) for r in records)] for key in ENGINE_SETTINGS if any(key in r for r in records)]
    return note, [words("th_setting"), *(words(f"th_{w}") for w in who)], rows
