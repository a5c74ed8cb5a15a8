"""The report: JSON (the numbers), Markdown (markdown.py) and a self-contained HTML page with
plots as base64 PNG (html.py, plots.py), in English or Chinese (words.py). Markdown and HTML
render from the JSON dict itself, whose values are rounded to 6 significant digits: Markdown
prints them whole (a reason's figures as the verdict's own text does, at four, in both languages),
the HTML page at three significant digits with the whole value in each
cell's ``data-value``, so every number shown reads back as the JSON's value. report.json is the
same in every language but for ``meta.lang``.
"""
from __future__ import annotations

import math
import shutil
import tempfile
from pathlib import Path

from quantkit.common.crashpoints import kill_point
from quantkit.common.i18n import DEFAULT_LANG, check_lang
from quantkit.common.jsonio import dumps_strict, nonfinite_warning
from quantkit.common.outputs import OutputPolicy, ordinary_permissions
from quantkit.errors import QuantkitError
from quantkit.evaluation.integrity import flagged_rows
from quantkit.evaluation.report.content import fmt, integrity_grid, mixed_text, short
from quantkit.evaluation.report.html import render_html
from quantkit.evaluation.report.markdown import markdown
from quantkit.evaluation.report.plots import plots
from quantkit.sensitivity.sensitivity_report import section

__all__ = ["SCHEMA_VERSION", "fmt", "integrity_grid", "markdown", "mixed_text", "plots", "render_html", "save",
           "short", "to_json"]

SCHEMA_VERSION = 2    # 2: the engine's record at the top level ("engine"), not under "meta"


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
        "engine": result.engine,
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
    """A mixed-precision candidate's plan (``sensitivity/sensitivity_report.py``): each unit's format and
    score, the size-vs-KL frontier, and the measured point, the mean KL of the gated slices."""
    folder = result.meta.get("candidate")
    if not folder:
        return None

    gated = [v["kl_mean"] for n, v in result.slices.items()
             if v.get("kl_mean") is not None and n not in result.verdict.not_gated]
    return section(folder, measured_kl=sum(gated) / len(gated) if gated else None)


def _integrity(result) -> dict | None:
    if result.integrity is None:
        return None
    return {**result.integrity, "flagged": flagged_rows(result.integrity, result.verdict.slices)}


def save(result, out_dir: Path, policy: OutputPolicy | None = None, overwrite: bool = False,
         lang: str = DEFAULT_LANG) -> Path:
    """The three reports, staged beside ``out_dir`` and renamed into place under ``policy``
    (outputs.py: an existing folder is replaced only with ``overwrite`` and only when it is an
    earlier report). ``lang``: the language of report.md and report.html, recorded as ``meta.lang``."""
    check_lang(lang, "lang")
    policy = policy or OutputPolicy("eval")
    out_dir = Path(out_dir)
    policy.check(out_dir, overwrite)
    data = to_json(result)
    data["meta"] = {**data["meta"], "lang": lang}
    message = nonfinite_warning(data, "report.json")
    if message is not None:   # in all three files (report.json has null there) and the command's output
        result.warnings.append(message)
        data["warnings"] = [*data["warnings"], message]
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        (tmp / "report.json").write_text(dumps_strict(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        kill_point("report:writing", partial=tmp / "report.json")
        (tmp / "report.md").write_text(markdown(data, lang), encoding="utf-8")
        images, plots_lang = plots(data, lang)
        (tmp / "report.html").write_text(render_html(data, images, lang, plots_lang), encoding="utf-8")
        policy.stamp(tmp)
        ordinary_permissions(tmp)  # mkdtemp makes it private; a report folder is for reading
        policy.replace(tmp, out_dir, overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir
