"""report.html: the page read at a glance. The decision first, then one line per slice, its worst
reason (the others folded below), each gated figure beside its limit and its margin, in the slice
table too; numbers at three significant digits (``short``), each number
cell carrying the JSON's exact value in ``data-value`` and its JSON path in ``data-path``; the
slice table holds the gated measures, the figures they come from fold into ``<details>``; every
table and image fits a 1280 px window."""
from __future__ import annotations

import html

from quantkit.common.i18n import HTML_LANG
from quantkit.evaluation.report.content import BUSINESS_COLUMNS, VARIANT_COLUMNS, business_lines, candidate_label, column_groups, engine_section, example_key, fmt, footprint_note, gates, gating_text, integrity_text, lm_rows, mixed_text, noise_line, not_gated_note, short, slice_notes, source_note, variants, warnings_of
from quantkit.evaluation.report.gating import gated_figures, headline_figures, margin_text, meaning, reason_interval, reason_margin, reason_sign, worst_per_slice
from quantkit.evaluation.report.words import WORDS

e = html.escape

STYLE = ("body{font-family:sans-serif;max-width:1200px;margin:1.5em auto;padding:0 1em;overflow-wrap:anywhere}"
         "table{border-collapse:collapse;margin:0.4em 0}td,th{border:1px solid #ccc;padding:3px 6px;font-size:13px}"
         "td[data-value]{text-align:right;font-variant-numeric:tabular-nums}th{background:#f4f4f4}"
         ".wide{max-width:100%;overflow-x:auto}img{max-width:100%;height:auto}"
         ".GO{background:#c8e6c9}.REVIEW{background:#fff9c4}.NO-GO{background:#ffcdd2}"
         "#decision{padding:0 0.3em}#reasons li,#informational li{margin:0.2em 0}"
         "details{margin:0.5em 0}summary{cursor:pointer;font-weight:bold}pre{white-space:pre-wrap}"
         # a header breaks between words only ("languag/e" at 1280 px otherwise): body's overflow-wrap
         # would let it break anywhere, and keep-all keeps a Chinese word whole ("语/言"); a measure
         # name breaks after its underscores (``_th``)
         "th{word-break:keep-all;overflow-wrap:normal;hyphens:none}"
         "td.GO,td.REVIEW,td.NO-GO,td.ungated,.limit{white-space:nowrap}.limit{color:#555}"
         ".ungated{background:#eee;color:#555}")


def _cell(value, path: str) -> str:
    if value is None:
        return "<td>–</td>"
    return f'<td data-path="{e(path)}" data-value="{e(fmt(value))}">{e(short(value))}</td>'


def _judged_cell(value, path: str, figure) -> str:
    """A gated figure's cell: the value, then the limit that judges it (``Gated``), as "0.31 > 0.1"."""
    if value is None or figure is None:
        return _cell(value, path)
    return (f'<td data-path="{e(path)}" data-value="{e(fmt(value))}">{e(short(value))} '
            f"<small class='limit'>{e(figure.sign)} {e(short(figure.limit))}</small></td>")


def _span(value, path: str) -> str:
    return f'<span data-path="{e(path)}" data-value="{e(fmt(value))}">{e(short(value))}</span>'


def _th(text: str) -> str:
    """A header cell; a measure name may break after its underscores rather than widen the table."""
    return "<th>" + e(text).replace("_", "_<wbr>") + "</th>"


def _table(table_id: str | None, header: list[str], rows: list[str]) -> str:
    ident = f" id='{table_id}'" if table_id else ""
    return (f"<div class='wide'><table{ident}><tr>" + "".join(_th(h) for h in header) + "</tr>"
            + "".join(rows) + "</table></div>")


def _image(images: dict[str, str], key: str, alt: str) -> str:
    return f"<img alt='{e(alt)}' src='data:image/png;base64,{images[key]}'>" if key in images else ""


def render_html(data: dict, images: dict[str, str], lang: str | None = None, plots_lang: str | None = None) -> str:
    """The self-contained page in ``lang`` (default: the one report.json's meta records, else English);
    ``plots_lang``: the language the plots were labelled in, when it is not ``lang``."""
    lang = lang or data["meta"].get("lang") or "en"
    w = WORDS.bind(lang)
    parts = _head(data, w, lang) + _reasons(data, w, lang) + _gating(data, w) + _notices(data, w, lang)
    parts += _slices(data, images, w) + _positions(data, images, w) + _appendix(data, images, w)
    if plots_lang and plots_lang != lang and images:
        parts.append(f"<p id='plot_language'>{e(w('no_cjk_font'))}</p>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _head(data: dict, w, lang: str) -> list[str]:
    m, decision = data["meta"], e(data["decision"])
    summary = w("summary_html", baseline=f"<code>{e(str(m.get('baseline', '?')))}</code>",
                candidate=f"<code>{e(str(m.get('candidate', '?')))}</code>",
                max_len=f"<span data-path='meta.max_len'>{m['max_len']}</span>", source=e(source_note(m, w)))
    parts = [f"<!doctype html><html lang='{HTML_LANG[lang]}'><head><meta charset='utf-8'>"
             f"<meta name='viewport' content='width=device-width'><title>{e(w('title'))}: {decision}</title>"
             f"<style>{STYLE}</style></head><body>",
             f"<h1>{e(w('title') + w('colon'))}<span class='{decision}' id='decision'>{decision}</span></h1>",
             f"<p>{summary}</p>", f"<p id='gating_languages'>{e(gating_text(data, w))}</p>"]
    if m.get("slices_skipped"):
        parts.append(f"<p id='slices_skipped'><b>{e(m['slices_skipped'])}</b></p>")
    return parts


def _reason_item(r: dict, key: str, i: int, w, lang: str, more: str = "") -> str:
    colon = w("colon")
    over = margin_text(reason_margin(r), w)
    said = meaning(r["measure"], lang)
    note = f"{colon}{e(not_gated_note(r['note'], w))}" if r.get("note") else ""
    return (f"<li class='{e(r['level'])}'><b>{e(r['level'])}</b> {e(r['slice'])}{colon}{e(r['measure'])} "
            f"{_span(r['value'], f'verdict.{key}.{i}.value')} {reason_sign(r)} "
            f"{_span(r['limit'], f'verdict.{key}.{i}.limit')}{e(reason_interval(r, w))}{e(w('aside', x=over))}"
            f"{e(colon + said) if said else ''}"
            f"{note}{e(more)}</li>")


def _grouped(reasons: list[dict], key: str, w, lang: str) -> str:
    """The reasons one line per slice, its worst first (``worst_per_slice``), the slice's other
    reasons folded into one ``<details>`` below the list: the first screen holds the decision and
    a line per slice, however many measures a slice breaks."""
    groups = worst_per_slice(reasons)
    shown = "".join(_reason_item(reasons[g[0]], key, g[0], w, lang, w("more_reasons", n=len(g) - 1) if g[1:] else "")
                    for g in groups)
    rest = [i for g in groups for i in g[1:]]
    folded = (f"<details id='{key}_rest'><summary>{e(w('other_reasons', n=len(rest)))}</summary><ul>"
              + "".join(_reason_item(reasons[i], key, i, w, lang) for i in rest) + "</ul></details>") if rest else ""
    return f"<ul id='{key}'>{shown}</ul>{folded}"


def _reasons(data: dict, w, lang: str) -> list[str]:
    v = data["verdict"]
    parts = [f"<h2>{e(w('reasons'))}</h2>"]
    if v.get("reasons"):
        parts.append(_grouped(v["reasons"], "reasons", w, lang))
        return parts
    parts.append(f"<p id='reasons'>{e(w('no_reasons'))}</p>")
    figures = headline_figures(gated_figures(data))
    if figures:
        f = figures[0]
        line = (f"{f.slice}{w('colon')}{f.measure} {short(f.value)} {f.sign} {short(f.limit)}"
                + w("aside", x=margin_text(f.margin, w)))
        parts.append(f"<p id='closest'>{e(w('closest', line=line))}</p>")
    return parts


def _figure_row(f) -> str:
    over = "" if f.interval is None else f" ({short(f.interval[0])}-{short(f.interval[1])})"
    return (f"<tr><td>{e(f.slice)}</td><td>{e(f.measure)}</td><td data-value='{e(fmt(f.value))}'>{e(short(f.value))}"
            f"{e(over)}</td><td>{f.sign} {e(short(f.limit))}</td><td data-value='{e(fmt(f.margin))}'>{e(short(f.margin))}</td>"
            f"<td class='{e(f.level)}'>{e(f.level)}</td></tr>")


def _gating(data: dict, w) -> list[str]:
    figures = gated_figures(data)
    if not figures:
        return []
    header = [w(k) for k in ("th_slice", "th_measure", "th_value", "th_limit", "th_margin", "th_level")]
    return [f"<h2>{e(w('gating'))}</h2><p>{e(w('gating_note'))}</p>",
            _table("gating", header, [_figure_row(f) for f in headline_figures(figures)]),
            f"<details><summary>{e(w('gating_all', n=len(figures)))}</summary>",
            _table("gating_all", header, [_figure_row(f) for f in figures]), "</details>"]


def _notices(data: dict, w, lang: str) -> list[str]:
    v, parts = data["verdict"], []
    if data.get("warnings"):
        parts.append(f"<h2>{e(w('warnings'))}</h2><ul id='warnings'>"
                     + "".join(f"<li class='REVIEW'>{e(x)}</li>" for x in warnings_of(data, w)) + "</ul>")
    if v.get("within_noise"):
        parts.append(f"<h2>{e(w('within_noise'))}</h2><p>{e(w('within_noise_note'))}</p><ul id='within_noise'>"
                     + "".join(f"<li>{e(noise_line(n, w))}</li>" for n in v["within_noise"]) + "</ul>")
    if v.get("informational"):
        parts.append(f"<h2>{e(w('informational'))}</h2>" + _grouped(v["informational"], "informational", w, lang))
    return parts


def _slices(data: dict, images: dict[str, str], w) -> list[str]:
    v = data["verdict"]
    gated, groups = column_groups(data)
    langs = data.get("languages") or {}
    judged = {(f.slice, f.measure): f for f in gated_figures(data)}
    off = v.get("not_gated", {})
    rows = [f"<tr><td>{e(name)}</td><td>{e(langs.get(name) or '–')}</td>"
            f"<td class='{'ungated' if name in off else e(v['slices'][name])}'>"
            f"{e(v['slices'][name])}</td><td>{e(gates(data, name, w))}</td>"
            + "".join(_judged_cell(vals.get(c), f"slices.{name}.{c}", judged.get((name, c))) for c, _, _ in gated)
            + "</tr>" for name, vals in data["slices"].items()]
    parts = [f"<h2>{e(w('slices'))}</h2>",
             _table("slices", [w("th_slice"), w("th_language"), w("th_verdict"), w("th_gates"),
                               *(t for _, t, _ in gated)], rows)]
    for group, cols in groups:
        rows = [f"<tr><td>{e(name)}</td>" + "".join(_cell(vals.get(c), f"slices.{name}.{c}") for c, _, _ in cols)
                + "</tr>" for name, vals in data["slices"].items() if any(vals.get(c) is not None for c, _, _ in cols)]
        titles = [w("th_tokens") if c == "tokens" else t for c, t, _ in cols]
        parts += [f"<details><summary>{e(w(group))}</summary>",
                  _table(f"slices-{group.removeprefix('group_')}", [w("th_slice"), *titles], rows),
                  "</details>"]
    head, business = business_lines(data, w)
    if business:
        header = [w("th_task"), *(w(c) for c in BUSINESS_COLUMNS), w("business_kl")]
        parts += [f"<h2>{e(w('business'))}</h2><p>{e(head)}</p>",
                  _table("business", header, ["<tr>" + "".join(f"<td>{e(str(x))}</td>" for x in r) + "</tr>"
                                              for r in business])]
    if data.get("lm_eval"):
        rows = [f"<tr><td>{e(t)}</td><td>{e(mt)}</td>"
                + "".join(_cell(r.get(k), f"lm_eval.{t}.{mt}.{k}") for k in ("base", "cand", "drop"))
                + f"<td class='{e(v['slices'].get(f'lm-eval:{t}', '–'))}'>{e(v['slices'].get(f'lm-eval:{t}', '–'))}</td></tr>"
                for t, mt, r in lm_rows(data)]
        parts += [f"<h2>{e(w('lm_eval'))}</h2>",
                  _table("lm_eval", [w(k) for k in ("th_task", "th_metric", "th_baseline", "th_candidate", "th_drop",
                                                     "th_verdict")], rows)]
    parts.append(_image(images, "slices", w("alt_slices")))
    return parts


def _named(data: dict, name: str, w) -> str:
    return w("not_gated_label", name=name) if name in data["verdict"].get("not_gated", {}) else name


def _positions(data: dict, images: dict[str, str], w) -> list[str]:
    if not data["kl_by_position"]:
        return []
    parts = [f"<h2>{e(w('positions'))}</h2>", _image(images, "position", w("alt_positions"))]
    label = candidate_label(data["meta"], w)
    for name, rows in data["kl_by_position"].items():
        others = variants(data, name)
        parts.append(f"<details><summary>{e(_named(data, name, w))}</summary>"
                     + "".join(f"<p>{e(n)}</p>" for n in slice_notes(data, name, w)))
        body = ["<tr>" + "".join(_cell(r[k], f"kl_by_position.{name}.{i}.{k}") for k in ("start", "end", "tokens",
                                                                                        "kl_mean"))
                + "".join(_cell(x["buckets"][i]["kl_mean"], f"kl_by_position_variants.{name}.{vn}.buckets.{i}.kl_mean")
                          for vn, x in others.items()) + "</tr>" for i, r in enumerate(rows)]
        parts.append(_table(None, [w("th_start"), w("th_end"), w("th_tokens"), label, *others], body))
        if others:
            body = [f"<tr><td>{e(vn)}</td>" + "".join(_cell(x.get(c), f"kl_by_position_variants.{name}.{vn}.{c}")
                                                      for c in VARIANT_COLUMNS)
                    + f"<td class='{e(x['level'])}'>{e(x['level'])}</td></tr>" for vn, x in others.items()]
            parts += [f"<p>{e(w('variants_note'))}</p>",
                      _table(None, [w("th_variant"), *VARIANT_COLUMNS, w("th_would_be")], body)]
        parts.append("</details>")
    return parts


def _appendix(data: dict, images: dict[str, str], w) -> list[str]:
    """Per-module error, integrity, the mixed-precision plan, the engine, the footprint, the worst
    examples, the thresholds."""
    parts = []
    if "modules" in images:
        parts.append(f"<h2>{e(w('modules'))}</h2>" + _image(images, "modules", w("alt_modules")))
    if data.get("integrity"):
        parts += _integrity(data["integrity"], images, w)
    if data.get("mixed"):
        rows = [f"<tr><td>{e(r['unit'])}</td><td>{e(r['format'])}</td>{_cell(r['score'], f'mixed.units.{i}.score')}</tr>"
                for i, r in enumerate(data["mixed"]["units"])]
        parts += [f"<h2>{e(w('mixed'))}</h2><p id='mixed'>{e(mixed_text(data['mixed'], w))}</p>",
                  _image(images, "mixed", w("alt_mixed")), f"<details><summary>{e(w('details'))}</summary>",
                  _table("mixed_units", [w("th_unit"), w("th_format"), w("th_predicted_kl")], rows), "</details>"]
    engine = engine_section(data, w)
    if engine:
        note, header, rows = engine
        parts += [f"<h2>{e(w('engine'))}</h2><p>{e(note)}</p>",
                  _table("engine", header, ["<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>"
                                            for row in rows])]
    if data.get("footprint"):
        parts += [f"<h2>{e(w('footprint'))}</h2><p id='footprint_gpu'>{e(footprint_note(data['footprint'], w))}</p>",
                  _table("footprint", [w("th_quantity"), w("th_value")],
                         [f"<tr><td><code>{e(k)}</code></td>"
                          + (f"<td>{e(w(('no', 'yes')[val]))}</td>" if isinstance(val, bool)
                             else _cell(val, f'footprint.{k}'))
                          + "</tr>" for k, val in data["footprint"].items()])]
    if data["worst_examples"]:
        parts.append(f"<h2>{e(w('worst'))}</h2>")
        for name, exs in data["worst_examples"].items():
            parts.append(f"<details><summary>{e(_named(data, name, w))}</summary>"
                         + "".join("<pre>" + e("\n".join(f"{example_key(k, w)}{w('colon')}{short(val)}" for k, val in ex.items()))
                                   + "</pre>"
                                   for ex in exs) + "</details>")
    rows = [f"<tr><td>{e(k)}</td>{_cell(t['review'], f'thresholds.{k}.review')}{_cell(t['nogo'], f'thresholds.{k}.nogo')}"
            f"<td>{e(w('higher') if t['higher_is_better'] else w('lower'))}</td></tr>"
            for k, t in data["thresholds"].items() if k != "slices"]
    parts += [f"<h2>{e(w('thresholds'))}</h2><details><summary>{e(w('details'))}</summary>",
              _table("thresholds", [w("th_measure"), w("th_review_past"), w("th_nogo_past"), w("th_better")], rows),
              "</details>"]
    return parts


INTEGRITY_COLUMNS = ("sqnr_db", "expected_sqnr_db", "recon_excess_db", "recon_unit_excess_db", "gain",
                     "tensor_rel_error")


def _integrity(integrity: dict, images: dict[str, str], w) -> list[str]:
    parts = [f"<h2>{e(w('integrity'))}</h2><p id='integrity'>{e(integrity_text(integrity, w))}</p>"]
    if integrity["flagged"]:
        rows = [f"<tr><td>{e(f['name'])}</td><td class='{e(f['level'])}'>{e(f['level'])}</td>"
                + "".join(_cell(f.get(c), f"integrity.flagged.{i}.{c}") for c in INTEGRITY_COLUMNS)
                + f"<td>{e(f['summary'])}</td></tr>" for i, f in enumerate(integrity["flagged"])]
        parts.append(_table("integrity_flagged", [w("th_module"), w("th_level"), *INTEGRITY_COLUMNS, w("th_finding")],
                            rows))
    if integrity["fallback"]:
        parts.append(f"<p>{e(w('fallback'))}</p><ul>"
                     + "".join(f"<li>{e(unit)}: {e(why)}</li>" for unit, why in integrity["fallback"].items()) + "</ul>")
    parts.append(_image(images, "integrity", w("alt_integrity")))
    return parts
