"""Coverage report in three renderings of one manifest: Markdown, HTML (figures embedded as
base64 PNG, plotted series embedded as JSON beside them) and JSON for machines.
Counts and statistics only: no calibration text appears in a report.
"""

from __future__ import annotations

import html
from typing import Any, Callable

from quantkit.calibration.plots import figure_series, png_base64
from quantkit.common.jsonio import dumps_strict
from quantkit.common.markdown import md_code, md_row, md_text

REPORT_FORMAT = "quantkit-calibration-report"
REPORT_VERSION = 2

_COUNT_LABELS = (
    ("rows_read", "rows read"), ("malformed", "malformed (skipped)"), ("valid", "valid rows"),
    ("duplicates_exact", "exact duplicates removed"), ("dropped_too_long", "dropped as too long"),
    ("pool", "distinct rows sampled from"), ("duplicates_near", "near duplicates skipped"),
    ("selected", "samples selected"), ("truncated_source", "distinct rows over max_len"),
    ("truncated_selected", "samples truncated to max_len"), ("tokens_selected", "tokens in the sample"),
)
# traffic counts repeats (the server's view), distinct is what can be drawn, sample what was
_CELL_COLUMNS = ("task", "bucket", "traffic_rows", "traffic_share", "distinct_rows", "distinct_share",
                 "target", "selected", "sample_share")


def report_json(manifest: dict[str, Any]) -> dict[str, Any]:
    keys = ("source", "counts", "malformed", "task_source", "tasks", "buckets", "cells",
            "length_histogram", "languages", "warnings")
    out = {"format": REPORT_FORMAT, "version": REPORT_VERSION, "policy": manifest["config"]["policy"],
           "seed": manifest["config"]["seed"], "max_len": manifest["config"]["max_len"]}
    out.update({k: manifest[k] for k in keys})
    out["figures"] = figure_series(manifest)
    return out


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def _cell_value(row: dict[str, Any], col: str) -> str:
    return _pct(row[col]) if col.endswith("_share") else str(row[col])


def _summary_lines(manifest: dict[str, Any], code: Callable[[object], str],
                   text: Callable[[object], str]) -> list[str]:
    """The report's opening lines; the user's names and paths through ``code`` (shown verbatim)
    and everything else through ``text``: each format's escaping."""
    src, cfg = manifest["source"], manifest["config"]
    return [f"source: {code(src['name'])} ({text(src['format'])}, sha256 {code(src['sha256'][:16])})",
            f"tokenizer: {code(manifest['tokenizer']['name_or_path'])}",
            text(f"policy: {cfg['policy']}, seed {cfg['seed']}, num_samples {cfg['num_samples']}, "
                 f"max_len {cfg['max_len']}, min_per_cell {cfg['min_per_cell']}"),
            text(f"task types: {_kv(manifest['task_source']['source'])} (distinct rows)"),
            text(f"languages: source {_kv(manifest['languages']['source'])}; "
                 f"sample {_kv(manifest['languages']['sample'])}")]


def _html_text(value: object) -> str:
    return html.escape(str(value))


def _kv(d: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in d.items()) or "none"


def _marginal_rows(items: list[dict[str, Any]]) -> list[list[str]]:
    return [[i["name"], str(i["traffic_rows"]), _pct(i["traffic_share"]), str(i["distinct_rows"]),
             _pct(i["distinct_share"]), str(i["selected"]), _pct(i["sample_share"])] for i in items]


_MARGINAL_HEAD = ["name", "traffic rows", "traffic share", "distinct rows", "distinct share", "selected",
                  "sample share"]


def report_markdown(manifest: dict[str, Any]) -> str:
    def table(head: list[str], rows: list[list[str]]) -> list[str]:
        return [md_row(head), "|" + "---|" * len(head)] + [md_row(r) for r in rows] + [""]

    out = ["# Calibration coverage report", ""] + [f"- {line}" for line in _summary_lines(manifest, md_code, md_text)] + [""]
    out += ["## Counts", ""] + table(["count", "value"], [[label, str(manifest["counts"][k])]
                                                          for k, label in _COUNT_LABELS])
    out += ["## Malformed rows", ""]
    out += table(["reason", "count", "first lines"],
                 [[r, str(d["count"]), ", ".join(map(str, d["first_lines"]))]
                  for r, d in manifest["malformed"].items()]) if manifest["malformed"] else ["none", ""]
    out += ["## Task types", ""] + table(_MARGINAL_HEAD, _marginal_rows(manifest["tasks"]))
    out += ["## Length buckets (tokens)", ""] + table(_MARGINAL_HEAD, _marginal_rows(manifest["buckets"]))
    out += ["## Cells (task type x length bucket)", ""]
    out += table(list(_CELL_COLUMNS), [[_cell_value(c, k) for k in _CELL_COLUMNS] for c in manifest["cells"]])
    hist = manifest["length_histogram"]
    lows = [0] + hist["edges"][:-1]
    out += ["## Token-length histogram", ""]
    out += table(["tokens", "traffic", "distinct", "sample"],
                 [[f"{lo + 1}-{hi}", str(r), str(d), str(t)] for lo, hi, r, d, t in
                  zip(lows, hist["edges"], hist["traffic"], hist["distinct"], hist["sample"])])
    out += ["## Warnings", ""] + ([f"- {md_text(w)}" for w in manifest["warnings"]] or ["none"]) + [""]
    out += ["Figures: see report.html (traffic, distinct and sample shares per task type and length bucket, "
            "token-length histogram).", ""]
    return "\n".join(out)


def _html_table(head: list[str], rows: list[list[str]], css: str) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in r) + "</tr>" for r in rows)
    return f'<table class="{css}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


def report_html(manifest: dict[str, Any]) -> str:
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             "<title>Calibration coverage report</title>",
             "<style>body{font-family:sans-serif;max-width:70em;margin:auto}table{border-collapse:collapse;"
             "margin:0.5em 0}td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}"
             ".warn{color:#a40}</style></head><body>",
             "<h1>Calibration coverage report</h1><ul>"]
    parts += [f"<li>{line}</li>" for line in _summary_lines(manifest, _html_text, _html_text)]
    parts.append("</ul><h2>Counts</h2>")
    parts.append(_html_table(["count", "value"], [[label, str(manifest["counts"][k])]
                                                   for k, label in _COUNT_LABELS], "counts"))
    parts.append("<h2>Malformed rows</h2>")
    parts.append(_html_table(["reason", "count", "first lines"],
                             [[r, str(d["count"]), ", ".join(map(str, d["first_lines"]))]
                              for r, d in manifest["malformed"].items()], "malformed"))
    parts.append("<h2>Figures</h2>")
    for name, series in figure_series(manifest).items():
        # Script content is not HTML-decoded by browsers: only "</" needs guarding.
        data = dumps_strict(series, ensure_ascii=False, sort_keys=True).replace("</", "<\\/")
        parts.append(f'<figure id="figure-{name}"><img alt="{html.escape(series["title"])}" '
                     f'src="data:image/png;base64,{png_base64(series)}">'
                     f"<figcaption>{html.escape(series['title'])}</figcaption>"
                     f'<script type="application/json" class="figure-data" data-figure="{name}">'
                     f"{data}</script></figure>")
    parts.append("<h2>Task types</h2>" + _html_table(_MARGINAL_HEAD, _marginal_rows(manifest["tasks"]), "tasks"))
    parts.append("<h2>Length buckets (tokens)</h2>" +
                 _html_table(_MARGINAL_HEAD, _marginal_rows(manifest["buckets"]), "buckets"))
    parts.append("<h2>Cells (task type x length bucket)</h2>" +
                 _html_table(list(_CELL_COLUMNS), [[_cell_value(c, k) for k in _CELL_COLUMNS]
                                                   for c in manifest["cells"]], "cells"))
    parts.append("<h2>Warnings</h2><ul>")
    parts += [f'<li class="warn">{html.escape(w)}</li>' for w in manifest["warnings"]] or ["<li>none</li>"]
    parts.append("</ul></body></html>")
    return "\n".join(parts) + "\n"
