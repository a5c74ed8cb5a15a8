"""Coverage report in three renderings of one manifest: Markdown, HTML (figures embedded as
base64 PNG, plotted series embedded as JSON beside them) and JSON for machines.
Counts and statistics only: no calibration text appears in a report.
"""

from __future__ import annotations

import html
import re
from typing import Any, Callable

from quantkit.calibration.coverage_plots import SERIES, figure_series, png_base64
from quantkit.common.i18n import DEFAULT_LANG, HTML_LANG, Catalog, reworded
from quantkit.common.jsonio import script_json
from quantkit.common.markdown_text import md_code, md_row, md_text
from quantkit.common.plotfonts import plot_language

REPORT_FORMAT = "quantkit-calibration-report"
REPORT_VERSION = 2

# the report's words in each language (quantkit.common.i18n); JSON keys and the user's task
# labels stay as they are
WORDS = Catalog({
    "title": ("Calibration coverage report", "校准集覆盖报告"),
    "counts": ("Counts", "计数"),
    "malformed": ("Malformed rows", "格式错误的行"),
    "figures": ("Figures", "图"),
    "tasks": ("Task types", "任务类型"),
    "buckets": ("Length buckets (tokens)", "长度分桶（token）"),
    "cells": ("Cells (task type x length bucket)", "单元（任务类型 × 长度分桶）"),
    "histogram": ("Token-length histogram", "token 长度直方图"),
    "warnings": ("Warnings", "警告"),
    "none": ("none", "无"),
    "figures_note": ("Figures: see report.html (traffic, distinct and sample shares per task type and length bucket, "
                     "token-length histogram).",
                     "图见 report.html（各任务类型与长度分桶的流量、不重复行与样本占比，以及 token 长度直方图）。"),
    "source": ("source: {name} ({format}, sha256 {sha})", "来源：{name}（{format}，sha256 {sha}）"),
    "tokenizer": ("tokenizer: {name}", "分词器：{name}"),
    "policy": ("policy: {policy}, seed {seed}, num_samples {num_samples}, max_len {max_len}, "
               "min_per_cell {min_per_cell}",
               "策略：{policy}，随机种子 {seed}，num_samples {num_samples}，max_len {max_len}，"
               "min_per_cell {min_per_cell}"),
    "task_types": ("task types: {tasks} (distinct rows)", "任务类型：{tasks}（不重复行）"),
    "languages": ("languages: source {source}; sample {sample}", "语言：来源 {source}；样本 {sample}"),
    "task_coverage": ("task types in the sample: {k} of the log's {n}, {effective} effective (narrow below {min})",
                      "样本中的任务类型：日志 {n} 种中的 {k} 种，有效任务类型数 {effective}（低于 {min} 为过窄）"),
    # table labels
    "count": ("count", "计数项"), "value": ("value", "数值"), "reason": ("reason", "原因"),
    "times": ("count", "次数"), "first_lines": ("first lines", "最先出现的行号"),
    "name": ("name", "名称"), "traffic rows": ("traffic rows", "流量行数"), "traffic share": ("traffic share", "流量占比"),
    "distinct rows": ("distinct rows", "不重复行数"), "distinct share": ("distinct share", "不重复占比"),
    "selected": ("selected", "选中"), "sample share": ("sample share", "样本占比"),
    "tokens": ("tokens", "token"), "traffic": ("traffic", "流量"), "distinct": ("distinct", "不重复"),
    "sample": ("sample", "样本"),
    "task": ("task", "任务"), "bucket": ("bucket", "长度分桶"), "traffic_rows": ("traffic_rows", "流量行数"),
    "traffic_share": ("traffic_share", "流量占比"), "distinct_rows": ("distinct_rows", "不重复行数"),
    "distinct_share": ("distinct_share", "不重复占比"), "target": ("target", "目标数"),
    "sample_share": ("sample_share", "样本占比"),
    # the counts
    "rows_read": ("rows read", "读取的行"), "malformed_rows": ("malformed (skipped)", "格式错误（已跳过）"),
    "valid": ("valid rows", "有效行"), "duplicates_exact": ("exact duplicates removed", "去除的完全重复行"),
    "dropped_too_long": ("dropped as too long", "因过长而丢弃"), "pool": ("distinct rows sampled from", "参与抽样的不重复行"),
    "duplicates_near": ("near duplicates skipped", "跳过的近似重复行"), "selected_count": ("samples selected", "选中的样本"),
    "truncated_source": ("distinct rows over max_len", "超过 max_len 的不重复行"),
    "truncated_selected": ("samples truncated to max_len", "截断到 max_len 的样本"),
    "tokens_selected": ("tokens in the sample", "样本中的 token 数"),
    # the figures
    "fig_tasks": ("Share per task type: traffic, distinct rows, sample", "各任务类型的占比：流量、不重复行、样本"),
    "fig_buckets": ("Share per length bucket (tokens): traffic, distinct rows, sample",
                    "各长度分桶（token）的占比：流量、不重复行、样本"),
    "fig_lengths": ("Token-length histogram (capped at max_len)", "token 长度直方图（以 max_len 为上限）"),
    "unit": ("% of rows", "占行数的百分比"),
    # where a row's task type came from (the manifest's task_source keys)
    "field": ("field", "字段"), "inferred": ("inferred", "推断"),
    # the coverage warnings (manifest.py's coverage_warnings), by their English pattern below
    "warn_thin": ("cell {task} x {bucket}: only {n} distinct rows (< {min}); collect more traffic of this kind",
                  "单元 {task} × {bucket}：只有 {n} 条不重复行（少于 {min}）；请收集更多这类流量"),
    "warn_drained": ("cell {task} x {bucket}: all {n} distinct rows drawn, its traffic share asked for {wanted} "
                     "(its requests repeat); the rest went to other cells",
                     "单元 {task} × {bucket}：{n} 条不重复行已全部抽取，按流量占比应抽 {wanted} 条（其请求有重复）；"
                     "其余名额分给了其他单元"),
    "warn_missing": ("cell {task} x {bucket}: not represented (num_samples too small for all cells)",
                     "单元 {task} × {bucket}：未被抽到（num_samples 太小，不足以覆盖所有单元）"),
    "warn_narrow": ("narrow calibration set: the sample covers {k} task {types} ({tasks}), {effective} effective "
                    "(< {min}); calibrated on one kind of text, a low-bit model can lose quality on every other "
                    "kind it serves: add traffic of its other tasks, and check the verdict on their slices (--calib)",
                    "校准集过窄：样本只覆盖 {k} 种任务类型（{tasks}），有效任务类型数 {effective}（低于 {min}）；"
                    "只用一类文本校准，低位宽模型在它服务的其他各类文本上都可能变差：请加入其他任务的流量，"
                    "并检查这些任务的切片的结论（--calib）"),
    "warn_short": ("selected {n} samples, fewer than the {asked} asked: the log has no more distinct rows",
                   "选中 {n} 条样本，少于要求的 {asked} 条：日志中没有更多不重复行"),
})

# the coverage warnings as manifest.py writes them (report.json keeps them in English) -> their message id
_WARNINGS = (
    (re.compile(r"narrow calibration set: the sample covers (?P<k>\d+) task (?P<types>types?) \((?P<tasks>.*)\), "
                r"(?P<effective>[\d.]+) effective \(< (?P<min>[\d.]+)\); calibrated on one kind of text, a low-bit "
                r"model can lose quality on every other kind it serves: add traffic of its other tasks, and check "
                r"the verdict on their slices \(--calib\)"), "warn_narrow"),
    (re.compile(r"cell (?P<task>.+) x (?P<bucket>\S+): only (?P<n>\d+) distinct rows \(< (?P<min>\d+)\); "
                r"collect more traffic of this kind"), "warn_thin"),
    (re.compile(r"cell (?P<task>.+) x (?P<bucket>\S+): all (?P<n>\d+) distinct rows drawn, its traffic share "
                r"asked for (?P<wanted>\d+) \(its requests repeat\); the rest went to other cells"), "warn_drained"),
    (re.compile(r"cell (?P<task>.+) x (?P<bucket>\S+): not represented \(num_samples too small for all cells\)"),
     "warn_missing"),
    (re.compile(r"selected (?P<n>\d+) samples, fewer than the (?P<asked>\d+) asked: the log has no more distinct "
                r"rows"), "warn_short"),
)


def warning_text(warning: str, w) -> str:
    """A coverage warning in the report's language (one this file does not know, as it is)."""
    return reworded(warning, _WARNINGS, w)

# count key -> its label's message id, in the report's order
_COUNT_LABELS = (
    ("rows_read", "rows_read"), ("malformed", "malformed_rows"), ("valid", "valid"),
    ("duplicates_exact", "duplicates_exact"), ("dropped_too_long", "dropped_too_long"), ("pool", "pool"),
    ("duplicates_near", "duplicates_near"), ("selected", "selected_count"), ("truncated_source", "truncated_source"),
    ("truncated_selected", "truncated_selected"), ("tokens_selected", "tokens_selected"),
)
# traffic counts repeats (the server's view), distinct is what can be drawn, sample what was
_CELL_COLUMNS = ("task", "bucket", "traffic_rows", "traffic_share", "distinct_rows", "distinct_share",
                 "target", "selected", "sample_share")


def report_json(manifest: dict[str, Any]) -> dict[str, Any]:
    keys = ("source", "counts", "malformed", "task_source", "tasks", "buckets", "cells",
            "length_histogram", "task_coverage", "languages", "warnings")
    out = {"format": REPORT_FORMAT, "version": REPORT_VERSION, "policy": manifest["config"]["policy"],
           "seed": manifest["config"]["seed"], "max_len": manifest["config"]["max_len"]}
    out.update({k: manifest.get(k) for k in keys})   # task_coverage: none in manifests written before it
    out["figures"] = figure_series(manifest)
    return out


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def _cell_value(row: dict[str, Any], col: str) -> str:
    return _pct(row[col]) if col.endswith("_share") else str(row[col])


def _summary_lines(manifest: dict[str, Any], code: Callable[[object], str],
                   text: Callable[[object], str], w) -> list[str]:
    """The report's opening lines; the user's names and paths through ``code`` (shown verbatim)
    and everything else through ``text``: each format's escaping."""
    src, cfg, cover = manifest["source"], manifest["config"], manifest.get("task_coverage")
    lines = [w("source", name=code(src["name"]), format=text(src["format"]), sha=code(src["sha256"][:16])),
            w("tokenizer", name=code(manifest["tokenizer"]["name_or_path"])),
            text(w("policy", **{k: cfg[k] for k in ("policy", "seed", "num_samples", "max_len", "min_per_cell")})),
            text(w("task_types", tasks=_kv(manifest["task_source"]["source"], w))),
            text(w("languages", source=_kv(manifest["languages"]["source"], w),
                   sample=_kv(manifest["languages"]["sample"], w)))]
    if cover:
        lines.append(text(w("task_coverage", k=cover["task_types"], n=cover["log_task_types"],
                            effective=f"{cover['effective_task_types']:.2f}", min=f"{cover['narrow_below']:g}")))
    return lines


def _html_text(value: object) -> str:
    return html.escape(str(value))


def _kv(d: dict[str, int], w) -> str:
    return ", ".join(f"{w(k) if k in WORDS else k} {v}" for k, v in d.items()) or w("none")


def _marginal_rows(items: list[dict[str, Any]]) -> list[list[str]]:
    return [[i["name"], str(i["traffic_rows"]), _pct(i["traffic_share"]), str(i["distinct_rows"]),
             _pct(i["distinct_share"]), str(i["selected"]), _pct(i["sample_share"])] for i in items]


_MARGINAL_HEAD = ("name", "traffic rows", "traffic share", "distinct rows", "distinct share", "selected",
                  "sample share")


def _tables(manifest: dict[str, Any], w) -> dict[str, tuple[list[str], list[list[str]]]]:
    """Section -> (header, rows) of the report's tables, in the report's language."""
    hist = manifest["length_histogram"]
    lows = [0] + hist["edges"][:-1]
    marginal = [w(h) for h in _MARGINAL_HEAD]
    return {
        "counts": ([w("count"), w("value")], [[w(label), str(manifest["counts"][k])] for k, label in _COUNT_LABELS]),
        "malformed": ([w("reason"), w("times"), w("first_lines")],
                      [[r, str(d["count"]), ", ".join(map(str, d["first_lines"]))]
                       for r, d in manifest["malformed"].items()]),
        "tasks": (marginal, _marginal_rows(manifest["tasks"])),
        "buckets": (marginal, _marginal_rows(manifest["buckets"])),
        "cells": ([w(k) for k in _CELL_COLUMNS], [[_cell_value(c, k) for k in _CELL_COLUMNS] for c in manifest["cells"]]),
        "histogram": ([w("tokens"), w("traffic"), w("distinct"), w("sample")],
                      [[f"{lo + 1}-{hi}", str(r), str(d), str(t)] for lo, hi, r, d, t in
                       zip(lows, hist["edges"], hist["traffic"], hist["distinct"], hist["sample"])]),
    }


def report_markdown(manifest: dict[str, Any], lang: str = DEFAULT_LANG) -> str:
    w = WORDS.bind(lang)

    def table(head: list[str], rows: list[list[str]]) -> list[str]:
        return [md_row(head), "|" + "---|" * len(head)] + [md_row(r) for r in rows] + [""]

    tables = _tables(manifest, w)
    out = [f"# {w('title')}", ""] + [f"- {line}" for line in _summary_lines(manifest, md_code, md_text, w)] + [""]
    for section in ("counts", "malformed", "tasks", "buckets", "cells", "histogram"):
        head, rows = tables[section]
        out += [f"## {w(section)}", ""] + (table(head, rows) if rows else [w("none"), ""])
    out += [f"## {w('warnings')}", ""] + ([f"- {md_text(warning_text(x, w))}" for x in manifest["warnings"]] or [w("none")]) + [""]
    out += [w("figures_note"), ""]
    return "\n".join(out)


def _html_table(head: list[str], rows: list[list[str]], css: str) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in r) + "</tr>" for r in rows)
    return f'<div class="wide"><table class="{css}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table></div>'


def _figures_html(manifest: dict[str, Any], lang: str) -> list[str]:
    """Each figure as a PNG labelled in ``lang`` (in English where the machine has no font for
    it), with its plotted series embedded as JSON (the manifest's words: the figure's data)."""
    parts = []
    with plot_language(lang) as drawn:
        w, shown = WORDS.bind(lang), WORDS.bind(drawn)
        for name, series in figure_series(manifest).items():
            labelled = {**series, "title": shown(f"fig_{name}"), "unit": shown("unit"),
                        "legend": [shown(k) for k in SERIES]}
            data = script_json(series, ensure_ascii=False, sort_keys=True)
            parts.append(f'<figure id="figure-{name}"><img alt="{html.escape(w(f"fig_{name}"))}" '
                         f'src="data:image/png;base64,{png_base64(labelled)}">'
                         f"<figcaption>{html.escape(w(f'fig_{name}'))}</figcaption>"
                         f'<script type="application/json" class="figure-data" data-figure="{name}">'
                         f"{data}</script></figure>")
    return parts


_STYLE = ("body{font-family:sans-serif;max-width:70em;margin:auto;padding:0 1em;overflow-wrap:anywhere}"
          "table{border-collapse:collapse;margin:0.5em 0}td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}"
          ".wide{max-width:100%;overflow-x:auto}img{max-width:100%;height:auto}.warn{color:#a40}"
          # a header breaks between words only, a Chinese one kept whole (body's overflow-wrap breaks anywhere)
          "th{word-break:keep-all;overflow-wrap:normal;hyphens:none}")


def report_html(manifest: dict[str, Any], lang: str = DEFAULT_LANG) -> str:
    w = WORDS.bind(lang)
    tables = _tables(manifest, w)
    parts = ["<!DOCTYPE html>", f'<html lang="{HTML_LANG[lang]}"><head><meta charset="utf-8">',
             f"<title>{html.escape(w('title'))}</title>", f"<style>{_STYLE}</style></head><body>",
             f"<h1>{html.escape(w('title'))}</h1><ul>"]
    parts += [f"<li>{line}</li>" for line in _summary_lines(manifest, _html_text, _html_text, w)]
    parts.append("</ul>")
    for section in ("counts", "malformed"):
        parts.append(f"<h2>{html.escape(w(section))}</h2>" + _html_table(*tables[section], section))
    parts.append(f"<h2>{html.escape(w('figures'))}</h2>")
    parts += _figures_html(manifest, lang)
    for section in ("tasks", "buckets", "cells"):
        parts.append(f"<h2>{html.escape(w(section))}</h2>" + _html_table(*tables[section], section))
    parts.append(f"<h2>{html.escape(w('warnings'))}</h2><ul>")
    parts += [f'<li class="warn">{html.escape(warning_text(x, w))}</li>' for x in manifest["warnings"]] or [f"<li>{w('none')}</li>"]
    parts.append("</ul></body></html>")
    return "\n".join(parts) + "\n"
