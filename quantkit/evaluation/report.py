"""The report: JSON (the numbers), Markdown, and a self-contained HTML page with plots as
base64 PNG. Markdown and HTML render from the JSON dict itself, with numbers printed as
``format(v, ".6g")`` of values already rounded to 6 significant digits, so every number
shown reads back as exactly the JSON's value.
"""
from __future__ import annotations

import base64
import html
import io
import json
import math
import os
import re
import shutil
import tempfile
from pathlib import Path

SCHEMA_VERSION = 1
TABLE_MEASURES = ("tokens", "ppl_base", "ppl_cand", "ppl_increase", "kl_mean", "top1_agreement",
                  "focus_kl_mean", "focus_top1_agreement", "kl_worst_bucket", "gen_agreement",
                  "mc_accuracy_base", "mc_accuracy_cand", "extract_f1_base", "extract_f1_cand",
                  "code_pass_base", "code_pass_cand")


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


def fmt(v) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return format(v, ".6g")
    return str(v)


def to_json(result) -> dict:
    return _round({
        "schema_version": SCHEMA_VERSION,
        "decision": result.verdict.decision,
        "verdict": result.verdict.to_dict(),
        "meta": result.meta,
        "slices": result.slices,
        "public": result.public,
        "kl_by_position": result.buckets,
        "worst_examples": result.examples,
        "footprint": result.footprint,
        "module_errors": result.module_errors,
        "thresholds": result.thresholds.to_dict(),
    })


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
        axes[0].bar(names, [data["slices"][n]["kl_mean"] for n in names], color=colours)
        axes[0].set_title("mean KL(baseline || candidate) per token, nats")
        axes[1].bar(names, [data["slices"][n]["top1_agreement"] for n in names], color=colours)
        axes[1].set_ylim(0, 1)
        axes[1].set_title("top-1 agreement")
        for ax in axes:
            ax.tick_params(axis="x", rotation=40)
        out["slices"] = _png(fig)
    if data["kl_by_position"]:
        fig, ax = plt.subplots(figsize=(7, 3.6))
        for name, rows in data["kl_by_position"].items():
            rows = [r for r in rows if r["tokens"]]
            ax.plot([r["end"] for r in rows], [r["kl_mean"] for r in rows], marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context length (bucket end, tokens)")
        ax.set_ylabel("mean KL, nats")
        ax.set_title("KL by position")
        ax.legend()
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
    return out


# --- Markdown -----------------------------------------------------------------------------

def _columns(data: dict) -> list[str]:
    return [m for m in TABLE_MEASURES if any(v.get(m) is not None for v in data["slices"].values())]


def markdown(data: dict) -> str:
    v = data["verdict"]
    lines = [f"# quantkit evaluation: **{data['decision']}**", ""]
    m = data["meta"]
    lines += [f"Baseline `{m.get('baseline', '?')}`, candidate `{m.get('candidate', '?')}`, "
              f"max length {m['max_len']}, {fmt(m['seconds_total'])} s.", ""]
    if v["reasons"]:
        lines += ["## Reasons", ""] + [f"- **{r['level']}** {r['text']}" for r in v["reasons"]] + [""]
    cols = _columns(data)
    lines += ["## Slices", "", "| slice | verdict | " + " | ".join(cols) + " |",
              "|---|---|" + "---|" * len(cols)]
    for name, vals in data["slices"].items():
        lines.append(f"| {name} | {v['slices'][name]} | " + " | ".join(fmt(vals.get(c)) for c in cols) + " |")
    lines.append("")
    for name, rows in data["kl_by_position"].items():
        lines += [f"## KL by position: {name}", "", "| positions | tokens | mean KL |", "|---|---|---|"]
        lines += [f"| {r['start']}–{r['end']} | {r['tokens']} | {fmt(r['kl_mean'])} |" for r in rows] + [""]
    if data.get("footprint"):
        lines += ["## Deployment footprint", "", "| quantity | value |", "|---|---|"]
        lines += [f"| {k} | {fmt(val)} |" for k, val in data["footprint"].items()] + [""]
    if data["worst_examples"]:
        lines += ["## Worst examples of the slices that are not GO", ""]
        for name, exs in data["worst_examples"].items():
            lines += [f"### {name}", ""]
            for ex in exs:
                lines.append("- " + "; ".join(f"{k}: {fmt(val)!r}" if isinstance(val, str) else f"{k}: {fmt(val)}"
                                             for k, val in ex.items()))
            lines.append("")
    lines += ["## Thresholds", "", "| measure | REVIEW past | NO-GO past | better |", "|---|---|---|---|"]
    for k, t in data["thresholds"].items():
        if k != "slices":
            lines.append(f"| {k} | {fmt(t['review'])} | {fmt(t['nogo'])} | "
                         f"{'higher' if t['higher_is_better'] else 'lower'} |")
    return "\n".join(lines) + "\n"


# --- HTML ---------------------------------------------------------------------------------

def _cell(value, path: str) -> str:
    if value is None:
        return "<td>–</td>"
    return f'<td data-path="{html.escape(path)}">{html.escape(fmt(value))}</td>'


def render_html(data: dict, images: dict[str, str]) -> str:
    e = html.escape
    v = data["verdict"]
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>quantkit eval: {e(data['decision'])}</title>",
             "<style>body{font-family:sans-serif;max-width:1200px;margin:2em auto}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:3px 6px;font-size:13px}.GO{background:#c8e6c9}"
             ".REVIEW{background:#fff9c4}.NO-GO{background:#ffcdd2}pre{white-space:pre-wrap}</style></head><body>",
             f"<h1>quantkit evaluation: <span class='{e(data['decision'])}' id='decision'>{e(data['decision'])}</span></h1>",
             f"<p>Baseline <code>{e(str(data['meta'].get('baseline', '?')))}</code>, candidate "
             f"<code>{e(str(data['meta'].get('candidate', '?')))}</code>, max length "
             f"<span data-path='meta.max_len'>{data['meta']['max_len']}</span>.</p>"]
    if v["reasons"]:
        parts.append("<h2>Reasons</h2><ul>")
        for i, r in enumerate(v["reasons"]):
            parts.append(f"<li class='{e(r['level'])}'>{e(r['level'])} {e(r['slice'])}: {e(r['measure'])} "
                         f"<span data-path='verdict.reasons.{i}.value'>{fmt(r['value'])}</span> (limit "
                         f"<span data-path='verdict.reasons.{i}.limit'>{fmt(r['limit'])}</span>)</li>")
        parts.append("</ul>")
    cols = _columns(data)
    parts.append("<h2>Slices</h2><table id='slices'><tr><th>slice</th><th>verdict</th>"
                 + "".join(f"<th>{e(c)}</th>" for c in cols) + "</tr>")
    for name, vals in data["slices"].items():
        lv = v["slices"][name]
        parts.append(f"<tr><td>{e(name)}</td><td class='{e(lv)}'>{e(lv)}</td>"
                     + "".join(_cell(vals.get(c), f"slices.{name}.{c}") for c in cols) + "</tr>")
    parts.append("</table>")
    if "slices" in images:
        parts.append(f"<img alt='per-slice measures' src='data:image/png;base64,{images['slices']}'>")
    if data["kl_by_position"]:
        parts.append("<h2>KL by position</h2>")
        if "position" in images:
            parts.append(f"<img alt='KL by position' src='data:image/png;base64,{images['position']}'>")
        for name, rows in data["kl_by_position"].items():
            parts.append(f"<h3>{e(name)}</h3><table><tr><th>start</th><th>end</th><th>tokens</th><th>mean KL</th></tr>")
            for i, r in enumerate(rows):
                parts.append("<tr>" + "".join(_cell(r[k], f"kl_by_position.{name}.{i}.{k}")
                                              for k in ("start", "end", "tokens", "kl_mean")) + "</tr>")
            parts.append("</table>")
    if "modules" in images:
        parts.append(f"<h2>Per-module quantization error</h2><img alt='per-module error' "
                     f"src='data:image/png;base64,{images['modules']}'>")
    if data.get("footprint"):
        parts.append("<h2>Deployment footprint</h2><table id='footprint'>")
        parts += [f"<tr><th>{e(k)}</th>{_cell(val, f'footprint.{k}')}</tr>" for k, val in data["footprint"].items()]
        parts.append("</table>")
    if data["worst_examples"]:
        parts.append("<h2>Worst examples of the slices that are not GO</h2>")
        for name, exs in data["worst_examples"].items():
            parts.append(f"<h3>{e(name)}</h3>")
            for ex in exs:
                parts.append("<pre>" + e("\n".join(f"{k}: {fmt(val)}" for k, val in ex.items())) + "</pre>")
    parts.append("<h2>Thresholds</h2><table><tr><th>measure</th><th>REVIEW past</th><th>NO-GO past</th></tr>")
    for k, t in data["thresholds"].items():
        if k != "slices":
            parts.append(f"<tr><td>{e(k)}</td>{_cell(t['review'], f'thresholds.{k}.review')}"
                         f"{_cell(t['nogo'], f'thresholds.{k}.nogo')}</tr>")
    parts.append("</table></body></html>")
    return "\n".join(parts)


def save(result, out_dir: Path) -> Path:
    data = to_json(result)
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; a report folder is for reading
    try:
        (tmp / "report.json").write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        (tmp / "report.md").write_text(markdown(data), encoding="utf-8")
        (tmp / "report.html").write_text(render_html(data, plots(data)), encoding="utf-8")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir
