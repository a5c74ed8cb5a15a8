"""The load test's report: ``report.json`` (the data), ``report.md`` and ``report.html`` (with
plots), staged and renamed into place like every quantkit output; an incomplete run says so at
the top of all three. The words are in English or Chinese (``lang``); report.json is the same in
both but for ``lang``."""
from __future__ import annotations

import base64
import html
import io
import shutil
import tempfile
from pathlib import Path

from quantkit.common.i18n import DEFAULT_LANG, HTML_LANG, Catalog, Words
from quantkit.common.jsonio import dumps_strict
from quantkit.common.markdown_text import md_row, md_text
from quantkit.common.outputs import OutputPolicy, ordinary_permissions
from quantkit.common.plotfonts import plot_language

WORDS = Catalog({
    "title": ("Load test", "负载测试"),
    "incomplete": ("INCOMPLETE: the run ended early; the steps below are the ones that completed.",
                   "未完成：运行提前结束；下面只列出已完成的阶梯。"),
    "knee": ("{role}: knee at concurrency {knee}, run at {rec}", "{role}：拐点在并发 {knee}，建议按 {rec} 运行"),
    "no_knee": ("{role}: no knee found", "{role}：未找到拐点"),
    "ramp_tail": ("; best goodput {goodput} req/s; stopped: {stopped}", "；最佳有效吞吐 {goodput} 请求/秒；停止原因：{stopped}"),
    "not_stopped": ("not stopped", "未停止"),
    "ramp_incomplete": (" (incomplete)", "（未完成）"),
    "predicted": ("{role}: the memory account predicts {pred} requests at {len} tokens; the engine allocated room for "
                  "{eng} (max_num_seqs {seqs})",
                  "{role}：显存账本预测 {len} token 的请求可容纳 {pred} 个；引擎实际分配的 KV 缓存可容纳 {eng} 个"
                  "（max_num_seqs {seqs}）"),
    "served_as": ("{role}: served in {dtype} on {host} ({reason}); probe {step} s a step (budget {budget} s)",
                  "{role}：以 {dtype} 运行于 {host}；探测请求每步 {step} 秒（上限 {budget} 秒）"),
    "too_long": ("{role}: {n} drawn requests exceeded the served context ({len} tokens) and were not sent",
                 "{role}：抽取的请求中有 {n} 个超过服务上下文（{len} token），未发送"),
    "speedup": ("speedup of the candidate: {knee}x output tokens/s at the knee, {goodput}x best goodput under the SLO",
                "候选模型的加速比：拐点处输出吞吐 {knee} 倍，SLO 下最佳有效吞吐 {goodput} 倍"),
    "slo": ("SLO: {terms}.", "延迟目标（SLO）：{terms}。"),
    "steps": ("Steps: {role}", "阶梯：{role}"),
    "tool": ("Load generator: {tool}.", "负载生成工具：{tool}。"),
    "lengths": ("Lengths: the log and the fit", "长度：日志与拟合"),
    "plots": ("Throughput, goodput and latency against concurrency", "吞吐、有效吞吐与延迟随并发的变化"),
    "concurrency": ("concurrency", "并发"),
    "requests": ("requests", "请求数"),
    "errors": ("errors", "错误"),
    "rps": ("req/s", "请求/秒"),
    "tps": ("output tok/s", "输出 token/秒"),
    "goodput": ("goodput req/s", "有效吞吐 请求/秒"),
    "direction": ("direction", "方向"),
    "rows": ("rows", "行数"),
    "log_fit": ("{q} log / fit (error)", "{q} 日志 / 拟合（误差）"),
    "sent": ("{role} sent P50 / P90 / P99", "{role} 实际发送 P50 / P90 / P99"),
    "prompt": ("prompt", "提示"),
    "output": ("output", "输出"),
    "baseline": ("baseline", "基线"),
    "candidate": ("candidate", "候选"),
    "throughput_title": ("Output throughput", "输出吞吐"),
    "goodput_title": ("Goodput under the SLO", "SLO 下的有效吞吐"),
    "lengths_title": ("{name} lengths", "{name}长度"),
    "tokens": ("{name} tokens", "{name} token 数"),
    "quantile": ("quantile", "分位"),
    "fit": ("log-normal fit", "对数正态拟合"),
    "log": ("log", "日志"),
    "no_cjk_font": ("The plots are labelled in English: this machine has no font with Chinese glyphs.",
                    "本机没有中文字体，图中标注为英文。"),
})

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


def step_rows(ramp: dict, w: Words = WORDS.bind(DEFAULT_LANG)) -> tuple[list[str], list[list[str]]]:
    """The steps table: one row a step, latencies as P50 / P90 / P99."""
    head = [w("concurrency"), w("requests"), w("errors"), w("rps"), w("tps"), w("goodput"),
            *(f"{label} P50 / P90 / P99" for _, label in LATENCY_COLUMNS)]
    rows = [[str(s["concurrency"]), str(s["requests"]), str(s["errors"]), sig(s["requests_per_s"]),
             sig(s["output_tokens_per_s"]), sig(s["goodput_rps"]), *(_pcts(s.get(k)) for k, _ in LATENCY_COLUMNS)]
            for s in ramp["steps"]]
    return head, rows


def length_rows(data: dict, w: Words = WORDS.bind(DEFAULT_LANG)) -> tuple[list[str], list[list[str]]]:
    """Per direction: the log's quantiles, the fit's (and its error), and the tokens the server
    counted for the requests sent (per ramp; without those too long for the served context)."""
    ramps = [r for r in data["ramps"] if any((r.get("sent") or {}).values())]
    head = [w("direction"), w("rows"), "mu", "sigma", *(w("log_fit", q=q) for q in ("P50", "P90", "P99")),
            *(w("sent", role=w(r["role"])) for r in ramps)]
    rows = []
    for name, s in data["lengths"].items():
        cells = [f"{sig(s[q]['empirical'])} / {sig(s[q]['fitted'])} ({s[q]['error'] * 100:+.1f}%)"
                 if s[q]["error"] is not None else "-" for q in ("p50", "p90", "p99")]
        rows.append([w(name), str(s["n"]), sig(s["mu"]), sig(s["sigma"]), *cells,
                     *(_pcts(r["sent"].get(name)) for r in ramps)])
    return head, rows


def summary_lines(data: dict, w: Words = WORDS.bind(DEFAULT_LANG)) -> list[str]:
    """The findings at the top: per model its knee, recommendation, best goodput and why it
    stopped; the speedup; an incomplete run first of all."""
    out = [w("incomplete")] if not data["complete"] else []
    for r in data["ramps"]:
        role = w(r["role"])
        knee = r["knee"]
        out.append(w("knee", role=role, knee=knee, rec=r["recommended_concurrency"]) if knee else
                   w("no_knee", role=role))
        out[-1] += (w("ramp_tail", goodput=sig(r["best_goodput_rps"]), stopped=r["stopped"] or w("not_stopped"))
                    + ("" if r["complete"] else w("ramp_incomplete")))
        eng = r.get("engine") or {}
        if eng.get("dtype_choice") and eng.get("probe"):
            out.append(w("served_as", role=role, dtype=eng["dtype_choice"]["dtype"], host=eng.get("host", "-"),
                         reason=eng["dtype_choice"]["reason"], step=sig(eng["probe"]["step_s"]),
                         budget=sig(eng["probe"]["budget_step_s"])))
        if eng.get("predicted_concurrency") is not None:
            out.append(w("predicted", role=role, pred=eng["predicted_concurrency"], len=data["max_model_len"],
                         eng=sig(eng.get("max_concurrency")), seqs=eng["launch_config"]["max_num_seqs"]))
        if eng.get("too_long_for_context"):
            out.append(w("too_long", role=role, n=eng["too_long_for_context"], len=data["max_model_len"]))
    sp = data.get("speedup")
    if sp:
        out.append(w("speedup", knee=sig(sp["output_tokens_per_s_at_knee"]), goodput=sig(sp["goodput"])))
    return out


def markdown(data: dict, lang: str = DEFAULT_LANG) -> str:
    w = WORDS.bind(lang)
    slo = ", ".join(f"{k.removesuffix('_ms')} <= {sig(v)} ms" for k, v in data["slo"].items())
    # the summary quotes what servers said (why a ramp stopped) and names hosts: text, never markup
    lines = [f"# {w('title')}", "", *(f"- {md_text(x)}" for x in summary_lines(data, w)), "", w("slo", terms=slo), ""]
    for r in data["ramps"]:
        head, rows = step_rows(r, w)
        lines += [f"## {w('steps', role=w(r['role']))}", "", md_text(w("tool", tool=r.get("tool") or "-")), "",
                  md_row(head), md_row(["---"] * len(head)), *(md_row(x) for x in rows), ""]
    head, rows = length_rows(data, w)
    lines += [f"## {w('lengths')}", "", md_row(head), md_row(["---"] * len(head)),
              *(md_row(x) for x in rows), ""]
    return "\n".join(lines)


def plots(data: dict, lang: str = DEFAULT_LANG) -> tuple[dict[str, str], str]:
    """Base64 PNGs (throughput and goodput, latency percentiles, lengths against the fit) and the
    language they are labelled in (English where a Chinese font is missing)."""
    with plot_language(lang) as drawn:
        w = WORDS.bind(drawn)
        return {"throughput": _throughput_png(data, w), "latency": _latency_png(data, w),
                "lengths": _lengths_png(data, w)}, drawn


def _figure():
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    return Figure(figsize=(9, 3.2), dpi=90)


def _throughput_png(data: dict, w: Words) -> str:
    fig = _figure()
    ax1, ax2 = fig.subplots(1, 2)
    for r in data["ramps"]:
        cs = [s["concurrency"] for s in r["steps"]]
        ax1.plot(cs, [s["output_tokens_per_s"] for s in r["steps"]], marker="o", label=w(r["role"]))
        ax2.plot(cs, [s["goodput_rps"] for s in r["steps"]], marker="o", label=w(r["role"]))
    _concurrency_axis(ax1, w("throughput_title") + " (" + w("tps") + ")", w)
    _concurrency_axis(ax2, w("goodput_title") + " (" + w("rps") + ")", w)
    return _png(fig)


def _latency_png(data: dict, w: Words) -> str:
    fig = _figure()
    for ax, key, title in zip(fig.subplots(1, 2), ("tpot_ms", "ttft_ms"), ("TPOT ms", "TTFT ms")):
        for r in data["ramps"]:
            cs = [s["concurrency"] for s in r["steps"] if s.get(key)]
            for q, style in (("p50", "-"), ("p99", "--")):
                ax.plot(cs, [s[key][q] for s in r["steps"] if s.get(key)], style, marker="o",
                        label=f"{w(r['role'])} {q.upper()}")
        _concurrency_axis(ax, title, w)
    return _png(fig)


def _lengths_png(data: dict, w: Words) -> str:
    fig = _figure()
    for ax, (name, s) in zip(fig.subplots(1, 2), data["lengths"].items()):
        ax.plot(s["curve"]["empirical"], s["curve"]["q"], marker=".", label=w("log"))
        ax.plot(s["curve"]["fitted"], s["curve"]["q"], label=w("fit"))
        ax.set_xscale("log")
        ax.set_xlabel(w("tokens", name=w(name)))
        ax.set_ylabel(w("quantile"))
        ax.set_title(w("lengths_title", name=w(name)), fontsize=10)
        ax.legend(fontsize=7)
    return _png(fig)


def _concurrency_axis(ax, title: str, w: Words) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xlabel(w("concurrency"))
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
         "table{border-collapse:collapse;font-size:12px;margin:.5em 0;max-width:100%}td,th{border:1px solid #ccc;padding:2px 6px;"
         "text-align:right}th{background:#f3f3f3}img{max-width:100%}.bad{color:#b00020;font-weight:bold}")


def render_html(data: dict, lang: str = DEFAULT_LANG) -> str:
    e, w = html.escape, WORDS.bind(lang)
    images, drawn = plots(data, lang)
    parts = [f"<!doctype html><html lang='{HTML_LANG[lang]}'><head><meta charset='utf-8'>"
             f"<meta name='viewport' content='width=device-width'><title>quantkit {e(w('title'))}</title>",
             f"<style>{STYLE}</style></head><body><h1>{e(w('title'))}</h1><ul>"]
    for line in summary_lines(data, w):
        cls = " class='bad'" if line == w("incomplete") else ""
        parts.append(f"<li{cls}>{e(line)}</li>")
    parts.append("</ul>")
    for r in data["ramps"]:
        parts += [f"<h2>{e(w('steps', role=w(r['role'])))}</h2>", _table(*step_rows(r, w))]
    parts += [f"<h2>{e(w('plots'))}</h2>",
              *([f"<p>{e(w('no_cjk_font'))}</p>"] if drawn != lang else []),
              f"<img alt='throughput' src='data:image/png;base64,{images['throughput']}'>",
              f"<img alt='latency' src='data:image/png;base64,{images['latency']}'>",
              f"<h2>{e(w('lengths'))}</h2>", _table(*length_rows(data, w)),
              f"<img alt='lengths' src='data:image/png;base64,{images['lengths']}'>", "</body></html>"]
    return "".join(parts)


def save(data: dict, out_dir: Path, policy: OutputPolicy, overwrite: bool = False, lang: str = DEFAULT_LANG) -> Path:
    """The three reports, staged beside ``out_dir`` and renamed into place under ``policy``."""
    out_dir, data = Path(out_dir), {**data, "lang": lang}
    policy.check(out_dir, overwrite)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        (tmp / "report.json").write_text(dumps_strict(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        (tmp / "report.md").write_text(markdown(data, lang), encoding="utf-8")
        (tmp / "report.html").write_text(render_html(data, lang), encoding="utf-8")
        policy.stamp(tmp)
        ordinary_permissions(tmp)
        policy.replace(tmp, out_dir, overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir
