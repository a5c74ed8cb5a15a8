"""The load test's report: ``report.json`` (the data), ``report.md`` and ``report.html`` (with
plots), staged and renamed into place like every quantkit output; an incomplete run says so at
the top of all three."""
from __future__ import annotations

import base64
import html
import io
import shutil
import tempfile
from pathlib import Path

from quantkit.common.jsonio import dumps_strict
from quantkit.common.markdown import md_row
from quantkit.common.outputs import OutputPolicy, ordinary_permissions

LATENCY_COLUMNS = (("ttft_ms", "TTFT ms"), ("tpot_ms", "TPOT ms"), ("itl_ms", "ITL ms"), ("e2e_ms", "E2E ms"))


def sig(x, digits: int = 3) -> str:
    """``x`` at ``digits`` significant digits; '-' for None.

    >>> sig(1234.5), sig(0.0351873), sig(None), sig(12)
    ('1234', '0.0352', '-', '12')
    """
    if x is None:
        return "-"
    if isinstance(x, int) or (abs(x) >= 10 ** (digits - 1)):
        return f"{x:.0f}"
    return f"{x:.{digits}g}"


def _pcts(d: dict | None) -> str:
    return "-" if not d else " / ".join(sig(d[k]) for k in ("p50", "p90", "p99"))


def step_rows(ramp: dict) -> tuple[list[str], list[list[str]]]:
    """The steps table: one row a step, latencies as P50 / P90 / P99."""
    head = ["concurrency", "requests", "errors", "req/s", "output tok/s", "goodput req/s",
            *(f"{label} P50 / P90 / P99" for _, label in LATENCY_COLUMNS)]
    rows = [[str(s["concurrency"]), str(s["requests"]), str(s["errors"]), sig(s["requests_per_s"]),
             sig(s["output_tokens_per_s"]), sig(s["goodput_rps"]), *(_pcts(s.get(k)) for k, _ in LATENCY_COLUMNS)]
            for s in ramp["steps"]]
    return head, rows


def length_rows(data: dict) -> tuple[list[str], list[list[str]]]:
    """Per direction: the log's quantiles, the fit's (and its error), and the tokens the server
    counted for the requests sent (per ramp; without those too long for the served context)."""
    ramps = [r for r in data["ramps"] if any((r.get("sent") or {}).values())]
    head = ["direction", "rows", "mu", "sigma", *(f"{q} log / fit (error)" for q in ("P50", "P90", "P99")),
            *(f"{r['role']} sent P50 / P90 / P99" for r in ramps)]
    rows = []
    for name, s in data["lengths"].items():
        cells = [f"{sig(s[q]['empirical'])} / {sig(s[q]['fitted'])} ({s[q]['error'] * 100:+.1f}%)"
                 if s[q]["error"] is not None else "-" for q in ("p50", "p90", "p99")]
        rows.append([name, str(s["n"]), sig(s["mu"]), sig(s["sigma"]), *cells,
                     *(_pcts(r["sent"].get(name)) for r in ramps)])
    return head, rows


def summary_lines(data: dict) -> list[str]:
    """The findings at the top: per model its knee, recommendation, best goodput and why it
    stopped; the speedup; an incomplete run first of all."""
    out = []
    if not data["complete"]:
        out.append("INCOMPLETE: the run ended early; the steps below are the ones that completed.")
    for r in data["ramps"]:
        knee = r["knee"]
        out.append(f"{r['role']}: knee at concurrency {knee}, run at {r['recommended_concurrency']}"
                   if knee else f"{r['role']}: no knee found")
        out[-1] += (f"; best goodput {sig(r['best_goodput_rps'])} req/s; stopped: {r['stopped'] or 'not stopped'}"
                    + ("" if r["complete"] else " (incomplete)"))
        eng = r.get("engine") or {}
        if eng.get("predicted_concurrency") is not None:
            out.append(f"{r['role']}: the memory account predicts {eng['predicted_concurrency']} requests at "
                       f"{data['max_model_len']} tokens; the engine allocated room for "
                       f"{sig(eng.get('max_concurrency'))} (max_num_seqs {eng['launch_config']['max_num_seqs']})")
        if eng.get("too_long_for_context"):
            out.append(f"{r['role']}: {eng['too_long_for_context']} drawn requests exceeded the served context "
                       f"({data['max_model_len']} tokens) and were not sent")
    sp = data.get("speedup")
    if sp:
        out.append(f"speedup of the candidate: {sig(sp['output_tokens_per_s_at_knee'])}x output tokens/s at the "
                   f"knee, {sig(sp['goodput'])}x best goodput under the SLO")
    return out


def markdown(data: dict) -> str:
    slo = ", ".join(f"{k.removesuffix('_ms')} <= {sig(v)} ms" for k, v in data["slo"].items())
    lines = ["# Load test", "", *(f"- {x}" for x in summary_lines(data)), "", f"SLO: {slo}.", ""]
    for r in data["ramps"]:
        head, rows = step_rows(r)
        lines += [f"## Steps: {r['role']}", "", f"Load generator: {r.get('tool') or '-'}.", "",
                  md_row(head), md_row(["---"] * len(head)), *(md_row(x) for x in rows), ""]
    head, rows = length_rows(data)
    lines += ["## Lengths: the log and the fit", "", md_row(head), md_row(["---"] * len(head)),
              *(md_row(x) for x in rows), ""]
    return "\n".join(lines)


def plots(data: dict) -> dict[str, str]:
    """Base64 PNGs: throughput and goodput, latency percentiles, lengths (log against fit)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    out = {}
    fig = Figure(figsize=(9, 3.2), dpi=90)
    ax1, ax2 = fig.subplots(1, 2)
    for r in data["ramps"]:
        cs = [s["concurrency"] for s in r["steps"]]
        ax1.plot(cs, [s["output_tokens_per_s"] for s in r["steps"]], marker="o", label=f"{r['role']} output tok/s")
        ax2.plot(cs, [s["goodput_rps"] for s in r["steps"]], marker="o", label=f"{r['role']} goodput req/s")
    for ax, title in ((ax1, "Output throughput"), (ax2, "Goodput under the SLO")):
        _concurrency_axis(ax, title)
    out["throughput"] = _png(fig)
    fig = Figure(figsize=(9, 3.2), dpi=90)
    axes = fig.subplots(1, 2)
    for ax, key, title in ((axes[0], "tpot_ms", "TPOT ms"), (axes[1], "ttft_ms", "TTFT ms")):
        for r in data["ramps"]:
            cs = [s["concurrency"] for s in r["steps"] if s.get(key)]
            for q, style in (("p50", "-"), ("p99", "--")):
                ax.plot(cs, [s[key][q] for s in r["steps"] if s.get(key)], style, marker="o", label=f"{r['role']} {q}")
        _concurrency_axis(ax, title)
    out["latency"] = _png(fig)
    fig = Figure(figsize=(9, 3.2), dpi=90)
    for ax, (name, s) in zip(fig.subplots(1, 2), data["lengths"].items()):
        ax.plot(s["curve"]["empirical"], s["curve"]["q"], marker=".", label="log")
        ax.plot(s["curve"]["fitted"], s["curve"]["q"], label="log-normal fit")
        ax.set_xscale("log")
        ax.set_xlabel(f"{name} tokens")
        ax.set_ylabel("quantile")
        ax.set_title(f"{name.capitalize()} lengths", fontsize=10)
        ax.legend(fontsize=7)
    out["lengths"] = _png(fig)
    return out


def _concurrency_axis(ax, title: str) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrency")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)


def _png(fig) -> str:
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return base64.b64encode(buf.getvalue()).decode()


def _table(head: list[str], rows: list[list[str]]) -> str:
    e = html.escape
    return ("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in rows) + "</table>")


STYLE = ("body{font-family:system-ui,sans-serif;max-width:1180px;margin:1em auto;padding:0 1em}"
         "table{border-collapse:collapse;font-size:13px;margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 6px;"
         "text-align:right}th{background:#f3f3f3}img{max-width:100%}.bad{color:#b00020;font-weight:bold}")


def render_html(data: dict, images: dict[str, str]) -> str:
    e = html.escape
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>quantkit load test</title>",
             f"<style>{STYLE}</style></head><body><h1>Load test</h1><ul>"]
    for line in summary_lines(data):
        cls = " class='bad'" if line.startswith("INCOMPLETE") else ""
        parts.append(f"<li{cls}>{e(line)}</li>")
    parts.append("</ul>")
    for r in data["ramps"]:
        parts += [f"<h2>Steps: {e(r['role'])}</h2>", _table(*step_rows(r))]
    parts += ["<h2>Throughput, goodput and latency against concurrency</h2>",
              f"<img alt='throughput' src='data:image/png;base64,{images['throughput']}'>",
              f"<img alt='latency' src='data:image/png;base64,{images['latency']}'>",
              "<h2>Lengths: the log and the fit</h2>", _table(*length_rows(data)),
              f"<img alt='lengths' src='data:image/png;base64,{images['lengths']}'>", "</body></html>"]
    return "".join(parts)


def save(data: dict, out_dir: Path, policy: OutputPolicy, overwrite: bool = False) -> Path:
    """The three reports, staged beside ``out_dir`` and renamed into place under ``policy``."""
    out_dir = Path(out_dir)
    policy.check(out_dir, overwrite)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        (tmp / "report.json").write_text(dumps_strict(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        (tmp / "report.md").write_text(markdown(data), encoding="utf-8")
        (tmp / "report.html").write_text(render_html(data, plots(data)), encoding="utf-8")
        policy.stamp(tmp)
        ordinary_permissions(tmp)
        policy.replace(tmp, out_dir, overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir
