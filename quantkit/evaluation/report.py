"""The report: JSON (the numbers), Markdown, and a self-contained HTML page with plots as
base64 PNG. Markdown and HTML render from the JSON dict itself, with numbers printed as
``format(v, ".6g")`` of values already rounded to 6 significant digits, so every number
shown reads back as exactly the JSON's value.
"""
from __future__ import annotations

import base64
import html
import io
import math
import re
import shutil
import tempfile
from pathlib import Path

from quantkit.errors import QuantkitError
from quantkit.common.jsonio import dumps_strict, nonfinite_warning
from quantkit.common.markdown import md_code, md_row, md_text
from quantkit.common.crashpoints import kill_point
from quantkit.common.outputs import OutputPolicy, ordinary_permissions
from quantkit.evaluation.measures import table_columns
from quantkit.evaluation.verdict import noise_text
from quantkit.sensitivity.report import frontier_png, section
from quantkit.evaluation.integrity import flagged_rows
from quantkit.evaluation.integrity.reference import unit_of
import numpy as np

SCHEMA_VERSION = 1


def _round(x):
    if isinstance(x, bool) or x is None:
        return x
    if isinstance(x, float):
        return x if not math.isfinite(x) else float(format(x, ".6g"))
    if isinstance(x, dict):
        return {str(k): _round(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_round(v) for v in x]
    return x


def fmt(v, spec: str = ".6g") -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return format(v, spec)
    return str(v)


def to_json(result) -> dict:
    warnings = list(result.warnings)
    try:
        mixed = _mixed(result)
    except QuantkitError as e:   # a plan.json without its sensitivity.json: the rest still reports
        mixed = None
        warnings.append(f"mixed-precision plan not shown: {e}")
    return _round({
        "schema_version": SCHEMA_VERSION,
        "decision": result.verdict.decision,
        "verdict": result.verdict.to_dict(),
        "meta": result.meta,
        "slices": result.slices,
        "public": result.public,
        "languages": result.languages,
        "lm_eval": result.lm_eval,
        "kl_by_position": result.buckets,
        "kl_by_position_variants": result.variants,
        "worst_examples": result.examples,
        "footprint": result.footprint,
        "module_errors": result.module_errors,
        "integrity": _integrity(result),
        "mixed": mixed,
        "thresholds": result.thresholds.to_dict(),
        "warnings": warnings,
    })


def _mixed(result) -> dict | None:
    """A mixed-precision candidate's plan (``sensitivity/report.py``): each unit's format and
    score, the size-vs-KL frontier, and the measured point, the mean KL of the gated slices."""
    folder = result.meta.get("candidate")
    if not folder:
        return None

    gated = [v["kl_mean"] for n, v in result.slices.items()
             if v.get("kl_mean") is not None and n not in result.verdict.not_gated]
    return section(folder, measured_kl=sum(gated) / len(gated) if gated else None)


def mixed_text(mixed: dict) -> str:
    """One sentence: the plan's size, its predicted and measured KL, the units per format."""
    p = mixed["plan"]
    budget = ", ".join(f"{k} {fmt(v)}" for k, v in (p.get("budget") or {}).items()) or "none"
    shares = ", ".join(f"{c} {r['units']} units" for c, r in mixed["by_candidate"].items())
    measured = ("" if mixed.get("measured_kl") is None else
                f"; measured mean KL over the gated slices {fmt(mixed['measured_kl'])}")
    return (f"{fmt(p['bits_per_weight'])} bits per planned weight (budget: {budget}), predicted KL "
            f"{fmt(p['predicted_kl'])} nats per token ({mixed['method']} score){measured}; {shares}.")


def _integrity(result) -> dict | None:
    if result.integrity is None:
        return None
    return {**result.integrity, "flagged": flagged_rows(result.integrity, result.verdict.slices)}


def integrity_grid(data: dict) -> tuple[list[str], list[str], list[list[float | None]], list[list[float | None]]]:
    """The heat map's data: layers, module kinds, and per cell the module's SQNR and its worst
    part's excess over expected (dB; the worst of a kind's modules when several share a cell, e.g. experts)."""

    cells: dict[tuple[str, str], tuple[float, float]] = {}
    layers: list[str] = []
    kinds: list[str] = []
    for name, m in data["modules"].items():
        if "sqnr_db" not in m:
            continue
        unit = unit_of(name + ".")
        kind = re.sub(r"\.\d+\.", ".*.", name[len(unit) + 1:] if unit else name)
        layers += [] if unit in layers else [unit]
        kinds += [] if kind in kinds else [kind]
        excess = max(m["recon_excess_db"], m["recon_unit_excess_db"])
        old = cells.get((unit, kind))
        cells[(unit, kind)] = (m["sqnr_db"], excess) if old is None else (min(old[0], m["sqnr_db"]), max(old[1], excess))
    sqnr = [[cells.get((u, k), (None, None))[0] for k in kinds] for u in layers]
    excess = [[cells.get((u, k), (None, None))[1] for k in kinds] for u in layers]
    return layers, kinds, sqnr, excess


def _layer_label(unit: str) -> str:
    return unit.rpartition(".")[2] if unit else "(outer)"


# --- plots --------------------------------------------------------------------------------

COLOURS = {"GO": "#2e7d32", "REVIEW": "#f9a825", "NO-GO": "#c62828"}


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def plots(data: dict) -> dict[str, str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = {}
    names = [n for n, v in data["slices"].items() if v.get("kl_mean") is not None]
    if names:
        fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
        colours = [COLOURS[data["verdict"]["slices"][n]] for n in names]
        off = data["verdict"].get("not_gated", {})
        labels = [f"{n} (not gated)" if n in off else n for n in names]
        for ax, m in zip(axes, ("kl_mean", "top1_agreement")):
            bars = ax.bar(labels, [data["slices"][n][m] for n in names], color=colours)
            for bar, n in zip(bars, names):
                if n in off:  # measured and shown, but it does not gate: hatched and pale
                    bar.set_alpha(0.45)
                    bar.set_hatch("//")
        axes[0].set_title("mean KL(baseline || candidate) per token, nats")
        axes[1].set_ylim(0, 1)
        axes[1].set_title("top-1 agreement")
        for ax in axes:
            ax.tick_params(axis="x", rotation=40)
            for label in ax.get_xticklabels():  # long names: anchor each label at its bar
                label.set_horizontalalignment("right")
                label.set_rotation_mode("anchor")
        out["slices"] = _png(fig)
    if data["kl_by_position"]:
        names = list(data["kl_by_position"])
        fig, axes = plt.subplots(1, len(names), figsize=(7 * len(names), 3.6), squeeze=False)
        for ax, name in zip(axes[0], names):
            lowest = float("inf")
            for label, rows in position_lines(data, name):
                rows = [r for r in rows if r["tokens"]]
                ax.plot([r["end"] for r in rows], [r["kl_mean"] for r in rows], marker="o", label=label)
                lowest = min([lowest] + [r["kl_mean"] for r in rows])
            ax.set_xscale("log", base=2)
            if lowest > 0:   # weight-only and KV options can differ by orders of magnitude
                ax.set_yscale("log")
            ax.set_xlabel("context length (bucket end, tokens)")
            ax.set_ylabel("mean KL, nats")
            ax.set_title(f"KL by position: {name}")
            ax.legend(fontsize=8)
        out["position"] = _png(fig)
    if data.get("module_errors"):
        errs = data["module_errors"]
        names = list(errs)
        fig, ax = plt.subplots(figsize=(11, 3.2))
        ax.bar(range(len(errs)), list(errs.values()), width=1.0)
        if len(names) <= 40:
            ax.set_xticks(range(len(names)), names, rotation=90, fontsize=6)
        else:  # one tick per decoder layer start, every few layers
            starts = {}
            for i, n in enumerate(names):
                m = re.search(r"layers\.(\d+)\.", n)
                if m and int(m.group(1)) not in starts:
                    starts[int(m.group(1))] = i
            step = max(1, len(starts) // 15)
            ticks = [(i, f"L{k}") for k, i in sorted(starts.items()) if k % step == 0]
            ax.set_xticks([i for i, _ in ticks], [t for _, t in ticks], fontsize=8)
            ax.set_xlabel("module, in layer order")
        ax.set_ylabel("SQNR, dB (lower = more error)")
        ax.set_title("per-module quantization error (as recorded by the algorithm)")
        out["modules"] = _png(fig)
    if data.get("integrity") and data["integrity"]["modules"]:
        out.update(_integrity_heat_map(data["integrity"], plt))
    if data.get("mixed"):

        png = frontier_png(data["mixed"])
        if png:
            out["mixed"] = png
    return out


def _integrity_heat_map(integrity: dict, plt) -> dict[str, str]:

    layers, kinds, sqnr, excess = integrity_grid(integrity)
    if not layers:
        return {}
    fig, axes = plt.subplots(1, 2, figsize=(12, max(2.5, 0.22 * len(layers) + 1.6)))
    panels = ((sqnr, "SQNR vs the baseline, dB", "viridis", None, None),
              (excess, "worst part's excess over expected, dB (> 0: flagged)", "RdYlGn_r", -15, 15))
    for ax, (grid, title, cmap, lo, hi) in zip(axes, panels):
        a = np.array([[np.nan if v is None else v for v in row] for row in grid], dtype=float)
        im = ax.imshow(a, aspect="auto", cmap=cmap, vmin=lo, vmax=hi, interpolation="nearest")
        ax.set_xticks(range(len(kinds)), [k.rpartition(".")[2] if "*" not in k else k for k in kinds],
                      rotation=40, ha="right", fontsize=8)
        ax.set_yticks(range(len(layers)), [_layer_label(u) for u in layers], fontsize=7)
        ax.set_ylabel("layer")
        ax.set_title(title, fontsize=10)
        fig.colorbar(im, ax=ax, fraction=0.046)
    flagged = {(f["name"]) for f in integrity.get("flagged", []) if f["kind"] == "module"}
    for name in flagged:
        unit = unit_of(name + ".")
        kind = re.sub(r"\.\d+\.", ".*.", name[len(unit) + 1:] if unit else name)
        if unit in layers and kind in kinds:
            for ax in axes:
                ax.add_patch(plt.Rectangle((kinds.index(kind) - 0.5, layers.index(unit) - 0.5), 1, 1,
                                           fill=False, edgecolor="black", linewidth=2))
    return {"integrity": _png(fig)}


# --- Markdown -----------------------------------------------------------------------------

def _source(meta: dict) -> str:
    return f" ({meta['max_len_source']})" if meta.get("max_len_source") else ""


def candidate_label(meta: dict) -> str:
    """The candidate's name in the KL-by-position plot and table: with ``--kv``, the option it runs."""
    if meta.get("candidate_label"):
        return meta["candidate_label"]
    kv = meta.get("kv") or []
    return f"candidate (kv {kv[0]['option']})" if kv else "candidate"


def position_lines(data: dict, name: str) -> list[tuple[str, list[dict]]]:
    """The lines of a long slice's KL-by-position plot: the candidate, then each variant."""
    lines = [(candidate_label(data["meta"]), data["kl_by_position"][name])]
    variants = (data.get("kl_by_position_variants") or {}).get(name, {})
    return lines + [(v, r["buckets"]) for v, r in variants.items() if r.get("buckets")]


VARIANT_COLUMNS = ("kl_mean", "top1_agreement", "kl_first_bucket", "kl_last_bucket", "kl_worst_bucket")


def _variants(data: dict, name: str) -> dict[str, dict]:
    return (data.get("kl_by_position_variants") or {}).get(name, {})


def _slice_notes(data: dict, name: str) -> list[str]:
    return [n for n in data["meta"].get("long_context_notes") or [] if n.startswith(f"{name}: ")]


def _columns(data: dict) -> list[tuple[str, str, str]]:
    """(key, title, format) of the slice table's columns (measures/: ``table_columns``) that hold a value."""
    return [c for c in table_columns() if any(v.get(c[0]) is not None for v in data["slices"].values())]


def gating_text(data: dict) -> str:
    """One sentence: which languages gate the decision and where that came from."""
    g = (data["meta"].get("languages") or {})
    if not g.get("gating"):
        return "Every slice gates the decision (no language restriction)."
    src = {"model card": "the baseline's model card, README.md", "--languages": "--languages",
           "eval.languages": "the recipe's eval.languages"}.get(g.get("source"), str(g.get("source")))
    return (f"Languages that gate the decision: {', '.join(g['gating'])} (from {src}). Slices in other "
            "languages are measured and shown with their would-be level but do not change the decision; "
            "business slices and lm-eval tasks always gate.")


def _gates(data: dict, name: str) -> str:
    return data["verdict"].get("not_gated", {}).get(name, "yes")


def _lm_rows(data: dict):
    """(task, metric, row) for the lm-eval table, in the JSON's order."""
    for task, metrics in (data.get("lm_eval") or {}).items():
        for metric, row in metrics.items():
            yield task, metric, row


BUSINESS_COLUMNS = ("rows", "in_calibration", "repeats", "evaluated", "without_reply", "scored_tokens", "stop",
                    "evidence")
BUSINESS_KL = "kl_mean [95% interval over rows]"


def business_lines(data: dict) -> tuple[str, list[list]]:
    """The business rows' sentence and table (task, BUSINESS_COLUMNS, then the slice's kl_mean with
    its bootstrap interval over rows) from ``meta.business``."""
    b = data["meta"].get("business")
    if not b:
        return "", []
    check = b.get("checked_against")
    said = (f"rows whose content is in the calibration sample ({check['manifest']}"
            f"{'' if check.get('same_source') else ', drawn from another log'}) are left out (in_calibration)"
            if check else "not checked against a calibration sample (--calib-sample)")
    head = (f"Business rows from {b['log']}: {said}; repeats of a row already taken are left out; "
            f"chat rows score their assistant turns only (without_reply: rows with none, their turns scored).")
    return head, [[t, *(c.get(k) for k in BUSINESS_COLUMNS), _with_interval(data["slices"].get(f"business:{t}"))]
                  for t, c in b["tasks"].items()]


def _with_interval(values: dict | None, measure: str = "kl_mean") -> str:
    if not values or values.get(measure) is None:
        return "–"
    ci = values.get(f"{measure}_ci")
    return fmt(values[measure]) + (f" [{fmt(ci[0])}, {fmt(ci[1])}]" if ci else "")


ENGINE_SETTINGS = ("engine", "version", "device", "dtype", "quantization", "kv_cache_dtype", "max_model_len",
                   "enable_prefix_caching", "enable_chunked_prefill", "url")


def engine_section(meta: dict) -> tuple[str, list[str], list[list[str]]] | None:
    """The engine section: a sentence (how KL was estimated, what the engine did not measure), and
    each server's settings as a table (header, rows); None when the evaluation ran in process."""
    eng = meta.get("engine")
    if not eng:
        return None
    who = [w for w in ("baseline", "candidate") if w in eng]
    note = (f"Both models were scored inside the serving engine. KL {eng.get('kl', '')}. Path agreement: the "
            f"candidate's figures in the engine beside quantkit's own path on up to {eng.get('path_tokens')} tokens a "
            f"slice. Not measured in the engine: {'; '.join(eng.get('not_measured') or ['nothing'])}.")
    rows = [[key, *(str(eng[w].get(key, "–")) for w in who)] for key in ENGINE_SETTINGS
            if any(key in eng[w] for w in who)]
    return note, ["setting", *who], rows


def _engine_markdown(meta: dict) -> list[str]:
    engine = engine_section(meta)
    if not engine:
        return []
    note, header, rows = engine
    return ["## Served by the engine", "", md_text(note), "", md_row(header), "|---" * len(header) + "|",
            *(md_row(r) for r in rows), ""]


def markdown(data: dict) -> str:
    v = data["verdict"]
    lines = [f"# quantkit evaluation: **{data['decision']}**", ""]
    m = data["meta"]
    lines += [f"Baseline {md_code(m.get('baseline', '?'))}, candidate {md_code(m.get('candidate', '?'))}, "
              f"max length {m['max_len']}{md_text(_source(m))}, {fmt(m['seconds_total'])} s.", "",
              md_text(gating_text(data)), ""]
    if m.get("slices_skipped"):
        lines += [f"**{md_text(m['slices_skipped'])}**", ""]
    if data.get("warnings"):
        lines += ["## Warnings", ""] + [f"- **warning**: {md_text(w)}" for w in data["warnings"]] + [""]
    if v["reasons"]:
        lines += ["## Reasons", ""] + [f"- **{r['level']}** {md_text(r['text'])}" for r in v["reasons"]] + [""]
    if v.get("within_noise"):
        lines += ["## Within noise of a limit (information only)", "",
                  "With other rows of the same traffic these levels could differ (bootstrap over rows):", ""]
        lines += [f"- {md_text(noise_text(n))}" for n in v["within_noise"]] + [""]
    if v.get("informational"):
        lines += ["## Not gated (information only)", ""]
        lines += [f"- {r['level']} {md_text(r['text'])}: {md_text(r['note'])}" for r in v["informational"]] + [""]
    lines += _engine_markdown(m)
    cols = _columns(data)
    lines += ["## Slices", "", "| slice | language | verdict | gates | " + " | ".join(t for _, t, _ in cols) + " |",
              "|---|---|---|---|" + "---|" * len(cols)]
    for name, vals in data["slices"].items():
        cells = [name, (data.get('languages') or {}).get(name) or '–', v['slices'][name], _gates(data, name)]
        lines.append(md_row([*cells, *(fmt(vals.get(c), spec) for c, _, spec in cols)]))
    lines.append("")
    head, rows = business_lines(data)
    if rows:
        lines += ["## Business rows", "", md_text(head), "", "| task | " + " | ".join(BUSINESS_COLUMNS) + " | " +
                  BUSINESS_KL + " |", "|---|" + "---|" * (len(BUSINESS_COLUMNS) + 1)]
        lines += [md_row(r) for r in rows] + [""]
    if data.get("lm_eval"):
        lines += ["## lm-eval tasks", "", "| task | metric | baseline | candidate | drop | verdict |",
                  "|---|---|---|---|---|---|"]
        lines += [md_row([t, mt, fmt(r['base']), fmt(r['cand']), fmt(r['drop']), v['slices'].get(f'lm-eval:{t}', '–')])
                  for t, mt, r in _lm_rows(data)] + [""]
    for name, rows in data["kl_by_position"].items():
        note = f" ({_gates(data, name)})" if name in v.get("not_gated", {}) else ""
        variants = _variants(data, name)
        label = candidate_label(m)
        lines += [f"## KL by position: {md_text(name + note)}", ""] + [md_text(n) for n in _slice_notes(data, name)] + [""]
        lines += [md_row(["positions", "tokens", label, *variants]), "|---|---|" + "---|" * (1 + len(variants))]
        for i, r in enumerate(rows):
            others = [fmt(x["buckets"][i]["kl_mean"]) for x in variants.values()]
            lines.append(f"| {r['start']}–{r['end']} | {r['tokens']} | " + " | ".join([fmt(r["kl_mean"]), *others]) + " |")
        lines.append("")
        if variants:
            lines += ["Variants of the candidate on the same windows (information: they do not change the decision):",
                      "", "| variant | " + " | ".join(VARIANT_COLUMNS) + " | would-be level |",
                      "|---|" + "---|" * (len(VARIANT_COLUMNS) + 1)]
            lines += [md_row([vn, *(fmt(x.get(c)) for c in VARIANT_COLUMNS), x['level']])
                      for vn, x in variants.items()] + [""]
    if data.get("footprint"):
        lines += ["## Deployment footprint", "", "| quantity | value |", "|---|---|"]
        lines += [md_row([k, fmt(val)]) for k, val in data["footprint"].items()] + [""]
    if data["worst_examples"]:
        lines += ["## Worst examples of the slices that are not GO", ""]
        for name, exs in data["worst_examples"].items():
            note = f" ({_gates(data, name)})" if name in v.get("not_gated", {}) else ""
            lines += [f"### {md_text(name + note)}", ""]
            for ex in exs:
                lines.append("- " + md_text("; ".join(f"{k}: {fmt(val)!r}" if isinstance(val, str) else f"{k}: {fmt(val)}"
                                                      for k, val in ex.items())))
            lines.append("")
    if data.get("integrity"):
        lines += _integrity_markdown(data["integrity"])
    if data.get("mixed"):
        lines += ["## Mixed-precision plan", "", mixed_text(data["mixed"]), "",
                  "| unit | format | predicted KL |", "|---|---|---|"]
        lines += [md_row([r['unit'], r['format'], fmt(r['score'])]) for r in data["mixed"]["units"]] + [""]
    lines += ["## Thresholds", "", "| measure | REVIEW past | NO-GO past | better |", "|---|---|---|---|"]
    for k, t in data["thresholds"].items():
        if k != "slices":
            lines.append(f"| {k} | {fmt(t['review'])} | {fmt(t['nogo'])} | "
                         f"{'higher' if t['higher_is_better'] else 'lower'} |")
    return "\n".join(lines) + "\n"


def integrity_text(integrity: dict) -> str:
    """One sentence: what the integrity pass compared, in how long, and how much it flagged."""
    n = len(integrity["modules"])
    how = (f", the recorded transforms re-applied on {len(integrity['transformed'])} layers"
           if integrity["transformed"] else "")
    return (f"{n} quantized modules decoded from the candidate's files (the tensors that serve) and compared "
            f"with the baseline's weights{how}; every other tensor compared with the baseline; "
            f"{fmt(integrity['seconds'])} s. {len(integrity['flagged'])} flagged.")


def _integrity_markdown(integrity: dict) -> list[str]:
    lines = ["## Checkpoint integrity", "", integrity_text(integrity), ""]
    if integrity["flagged"]:
        lines += ["| module or tensor | level | finding |", "|---|---|---|"]
        lines += [md_row([f['name'], f['level'], f['summary']]) for f in integrity["flagged"]] + [""]
    if integrity["fallback"]:
        lines += ["Checked from the checkpoint alone (layout, finite positive scales, codes on the grid; "
                  "no reference to compare with):", ""]
        lines += [f"- {md_text(unit)}: {md_text(why)}" for unit, why in integrity["fallback"].items()] + [""]
    layers, kinds, _, excess = integrity_grid(integrity)
    if layers:
        lines += ["Worst part's excess over expected error, dB (> 0 is flagged), layer x module kind:", "",
                  "| layer | " + " | ".join(kinds) + " |", "|---|" + "---|" * len(kinds)]
        lines += [f"| {_layer_label(u)} | " + " | ".join(fmt(v) for v in row) + " |" for u, row in zip(layers, excess)]
        lines.append("")
    if integrity["notes"]:
        lines += [f"- note: {md_text(n)}" for n in integrity["notes"][:10]] + [""]
    return lines


# --- HTML ---------------------------------------------------------------------------------

def _cell(value, path: str, spec: str = ".6g") -> str:
    if value is None:
        return "<td>–</td>"
    return f'<td data-path="{html.escape(path)}">{html.escape(fmt(value, spec))}</td>'


def render_html(data: dict, images: dict[str, str]) -> str:
    """The self-contained page: every number in a ``data-path`` cell reads back as the JSON's value."""
    parts = _html_head(data) + _html_verdict(data) + _html_slices(data, images) + _html_positions(data, images)
    parts += _html_appendix(data, images)
    parts.append("</table></body></html>")
    return "\n".join(parts)


def _html_head(data: dict) -> list[str]:
    e = html.escape
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>quantkit eval: {e(data['decision'])}</title>",
             "<style>body{font-family:sans-serif;max-width:1200px;margin:2em auto}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:3px 6px;font-size:13px}.GO{background:#c8e6c9}"
             ".REVIEW{background:#fff9c4}.NO-GO{background:#ffcdd2}pre{white-space:pre-wrap}</style></head><body>",
             f"<h1>quantkit evaluation: <span class='{e(data['decision'])}' id='decision'>{e(data['decision'])}</span></h1>",
             f"<p>Baseline <code>{e(str(data['meta'].get('baseline', '?')))}</code>, candidate "
             f"<code>{e(str(data['meta'].get('candidate', '?')))}</code>, max length "
             f"<span data-path='meta.max_len'>{data['meta']['max_len']}</span>{e(_source(data['meta']))}.</p>",
             f"<p id='gating'>{e(gating_text(data))}</p>"]
    if data["meta"].get("slices_skipped"):
        parts.append(f"<p id='slices_skipped'><b>{e(data['meta']['slices_skipped'])}</b></p>")
    return parts


def _html_verdict(data: dict) -> list[str]:
    e, v, parts = html.escape, data["verdict"], []
    if data.get("warnings"):
        parts.append("<h2>Warnings</h2><ul id='warnings'>"
                     + "".join(f"<li class='REVIEW'>{e(w)}</li>" for w in data["warnings"]) + "</ul>")
    if v.get("within_noise"):
        parts.append("<h2>Within noise of a limit (information only)</h2><ul id='within_noise'>"
                     + "".join(f"<li>{e(noise_text(n))}</li>" for n in v["within_noise"]) + "</ul>")
    for key, title in (("reasons", "Reasons"), ("informational", "Not gated (information only)")):
        if not v.get(key):
            continue
        parts.append(f"<h2>{title}</h2><ul id='{key}'>")
        for i, r in enumerate(v[key]):
            note = f": {e(r['note'])}" if r.get("note") else ""
            parts.append(f"<li class='{e(r['level'])}'>{e(r['level'])} {e(r['slice'])}: {e(r['measure'])} "
                         f"<span data-path='verdict.{key}.{i}.value'>{fmt(r['value'])}</span> (limit "
                         f"<span data-path='verdict.{key}.{i}.limit'>{fmt(r['limit'])}</span>){note}</li>")
        parts.append("</ul>")
    return parts


def _html_slices(data: dict, images: dict[str, str]) -> list[str]:
    e, v, parts = html.escape, data["verdict"], []
    cols = _columns(data)
    parts.append("<h2>Slices</h2><table id='slices'><tr><th>slice</th><th>language</th><th>verdict</th>"
                 "<th>gates</th>" + "".join(f"<th>{e(t)}</th>" for _, t, _ in cols) + "</tr>")
    for name, vals in data["slices"].items():
        lv = v["slices"][name]
        parts.append(f"<tr><td>{e(name)}</td><td>{e((data.get('languages') or {}).get(name) or '–')}</td>"
                     f"<td class='{e(lv)}'>{e(lv)}</td><td>{e(_gates(data, name))}</td>"
                     + "".join(_cell(vals.get(c), f"slices.{name}.{c}", spec) for c, _, spec in cols) + "</tr>")
    parts.append("</table>")
    head, rows = business_lines(data)
    if rows:
        parts.append(f"<h2>Business rows</h2><p>{e(head)}</p><table id='business'><tr><th>task</th>"
                     + "".join(f"<th>{e(c)}</th>" for c in (*BUSINESS_COLUMNS, BUSINESS_KL)) + "</tr>")
        parts += ["<tr>" + "".join(f"<td>{e(str(x))}</td>" for x in r) + "</tr>" for r in rows]
        parts.append("</table>")
    if data.get("lm_eval"):
        parts.append("<h2>lm-eval tasks</h2><table id='lm_eval'><tr><th>task</th><th>metric</th><th>baseline</th>"
                     "<th>candidate</th><th>drop</th><th>verdict</th></tr>")
        for t, mt, r in _lm_rows(data):
            lv = v["slices"].get(f"lm-eval:{t}", "–")
            parts.append(f"<tr><td>{e(t)}</td><td>{e(mt)}</td>"
                         + "".join(_cell(r.get(k), f"lm_eval.{t}.{mt}.{k}") for k in ("base", "cand", "drop"))
                         + f"<td class='{e(lv)}'>{e(lv)}</td></tr>")
        parts.append("</table>")
    if "slices" in images:
        parts.append(f"<img alt='per-slice measures' src='data:image/png;base64,{images['slices']}'>")
    return parts


def _html_positions(data: dict, images: dict[str, str]) -> list[str]:
    e, v, parts = html.escape, data["verdict"], []
    if not data["kl_by_position"]:
        return parts
    parts.append("<h2>KL by position</h2>")
    if "position" in images:
        parts.append(f"<img alt='KL by position' src='data:image/png;base64,{images['position']}'>")
    label = candidate_label(data["meta"])
    for name, rows in data["kl_by_position"].items():
        note = f" ({_gates(data, name)})" if name in v.get("not_gated", {}) else ""
        variants = _variants(data, name)
        parts.append(f"<h3>{e(name + note)}</h3>" + "".join(f"<p>{e(n)}</p>" for n in _slice_notes(data, name)))
        parts.append("<table><tr><th>start</th><th>end</th><th>tokens</th>"
                     + "".join(f"<th>{e(x)}</th>" for x in (label, *variants)) + "</tr>")
        for i, r in enumerate(rows):
            parts.append("<tr>" + "".join(_cell(r[k], f"kl_by_position.{name}.{i}.{k}")
                                          for k in ("start", "end", "tokens", "kl_mean"))
                         + "".join(_cell(x["buckets"][i]["kl_mean"],
                                         f"kl_by_position_variants.{name}.{vn}.buckets.{i}.kl_mean")
                                   for vn, x in variants.items()) + "</tr>")
        parts.append("</table>")
        if variants:
            parts.append("<p>Variants of the candidate on the same windows (information: they do not change "
                         "the decision):</p><table><tr><th>variant</th>"
                         + "".join(f"<th>{e(c)}</th>" for c in VARIANT_COLUMNS) + "<th>would-be level</th></tr>")
            for vn, x in variants.items():
                parts.append(f"<tr><td>{e(vn)}</td>"
                             + "".join(_cell(x.get(c), f"kl_by_position_variants.{name}.{vn}.{c}")
                                       for c in VARIANT_COLUMNS)
                             + f"<td class='{e(x['level'])}'>{e(x['level'])}</td></tr>")
            parts.append("</table>")
    return parts


def _html_appendix(data: dict, images: dict[str, str]) -> list[str]:
    """Per-module error, integrity, the mixed-precision plan, the footprint, the worst examples, the
    thresholds (the last table is closed by the caller)."""
    e, v, parts = html.escape, data["verdict"], []
    if "modules" in images:
        parts.append(f"<h2>Per-module quantization error</h2><img alt='per-module error' "
                     f"src='data:image/png;base64,{images['modules']}'>")
    if data.get("integrity"):
        parts += _integrity_html(data["integrity"], images)
    if data.get("mixed"):
        parts.append(f"<h2>Mixed-precision plan</h2><p id='mixed'>{e(mixed_text(data['mixed']))}</p>")
        if "mixed" in images:
            parts.append(f"<img alt='size against KL' src='data:image/png;base64,{images['mixed']}'>")
        parts.append("<table id='mixed_units'><tr><th>unit</th><th>format</th><th>predicted KL</th></tr>")
        parts += [f"<tr><td>{e(r['unit'])}</td><td>{e(r['format'])}</td>{_cell(r['score'], f'mixed.units.{i}.score')}</tr>"
                  for i, r in enumerate(data["mixed"]["units"])]
        parts.append("</table>")
    engine = engine_section(data["meta"])
    if engine:
        e, (note, header, rows) = html.escape, engine
        parts.append(f"<h2>Served by the engine</h2><p>{e(note)}</p><table id='engine'><tr>"
                     + "".join(f"<th>{e(w)}</th>" for w in header) + "</tr>")
        parts += ["<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in rows]
        parts.append("</table>")
    if data.get("footprint"):
        parts.append("<h2>Deployment footprint</h2><table id='footprint'>")
        parts += [f"<tr><th>{e(k)}</th>{_cell(val, f'footprint.{k}')}</tr>" for k, val in data["footprint"].items()]
        parts.append("</table>")
    if data["worst_examples"]:
        parts.append("<h2>Worst examples of the slices that are not GO</h2>")
        for name, exs in data["worst_examples"].items():
            note = f" ({_gates(data, name)})" if name in v.get("not_gated", {}) else ""
            parts.append(f"<h3>{e(name + note)}</h3>")
            for ex in exs:
                parts.append("<pre>" + e("\n".join(f"{k}: {fmt(val)}" for k, val in ex.items())) + "</pre>")
    parts.append("<h2>Thresholds</h2><table><tr><th>measure</th><th>REVIEW past</th><th>NO-GO past</th></tr>")
    for k, t in data["thresholds"].items():
        if k != "slices":
            parts.append(f"<tr><td>{e(k)}</td>{_cell(t['review'], f'thresholds.{k}.review')}"
                         f"{_cell(t['nogo'], f'thresholds.{k}.nogo')}</tr>")
    return parts
    return "\n".join(parts)


INTEGRITY_COLUMNS = ("sqnr_db", "expected_sqnr_db", "recon_excess_db", "recon_unit_excess_db", "gain",
                     "tensor_rel_error")


def _integrity_html(integrity: dict, images: dict[str, str]) -> list[str]:
    e = html.escape
    parts = [f"<h2>Checkpoint integrity</h2><p id='integrity'>{e(integrity_text(integrity))}</p>"]
    if integrity["flagged"]:
        parts.append("<table id='integrity_flagged'><tr><th>module or tensor</th><th>level</th>"
                     + "".join(f"<th>{e(c)}</th>" for c in INTEGRITY_COLUMNS) + "<th>finding</th></tr>")
        for i, f in enumerate(integrity["flagged"]):
            parts.append(f"<tr><td>{e(f['name'])}</td><td class='{e(f['level'])}'>{e(f['level'])}</td>"
                         + "".join(_cell(f.get(c), f"integrity.flagged.{i}.{c}") for c in INTEGRITY_COLUMNS)
                         + f"<td>{e(f['summary'])}</td></tr>")
        parts.append("</table>")
    if integrity["fallback"]:
        parts.append("<p>Checked from the checkpoint alone (layout, finite positive scales, codes on the grid; "
                     "no reference to compare with):</p><ul>")
        parts += [f"<li>{e(unit)}: {e(why)}</li>" for unit, why in integrity["fallback"].items()]
        parts.append("</ul>")
    if "integrity" in images:
        parts.append(f"<img alt='integrity heat map' src='data:image/png;base64,{images['integrity']}'>")
    return parts


def save(result, out_dir: Path, policy: OutputPolicy | None = None, overwrite: bool = False) -> Path:
    """The three reports, staged beside ``out_dir`` and renamed into place under ``policy``
    (outputs.py: an existing folder is replaced only with ``overwrite`` and only when it is an
    earlier report)."""
    policy = policy or OutputPolicy("eval")
    out_dir = Path(out_dir)
    policy.check(out_dir, overwrite)
    data = to_json(result)
    message = nonfinite_warning(data, "report.json")
    if message is not None:   # in all three files (report.json has null there) and the command's output
        result.warnings.append(message)
        data["warnings"] = [*data["warnings"], message]
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        (tmp / "report.json").write_text(dumps_strict(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        kill_point("report:writing", partial=tmp / "report.json")
        (tmp / "report.md").write_text(markdown(data), encoding="utf-8")
        (tmp / "report.html").write_text(render_html(data, plots(data)), encoding="utf-8")
        policy.stamp(tmp)
        ordinary_permissions(tmp)  # mkdtemp makes it private; a report folder is for reading
        policy.replace(tmp, out_dir, overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir
