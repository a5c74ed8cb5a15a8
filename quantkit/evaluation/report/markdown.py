"""report.md: the text record of an evaluation. Its numbers are the JSON's to the digit
(``fmt``): it is the file that is diffed and searched; the HTML page is the one read at a glance."""
from __future__ import annotations

from quantkit.common.markdown_text import md_cell_code, md_code, md_row, md_text
from quantkit.evaluation.report.content import BUSINESS_COLUMNS, VARIANT_COLUMNS, business_lines, candidate_label, columns, engine_section, example_key, fmt, footprint_note, gates, gating_text, integrity_grid, integrity_text, layer_label, lm_rows, mixed_text, noise_line, not_gated_note, slice_notes, source_note, variants, warnings_of
from quantkit.evaluation.report.gating import margin_text, meaning, reason_interval, reason_margin, reason_sign
from quantkit.evaluation.report.words import WORDS


def reason_figure(v) -> str:
    """A reason's figure as the verdict's own text prints it (four significant digits)."""
    return fmt(v, ".4g")


def reason_line(r: dict, lang: str, show=reason_figure) -> str:
    """A breach as one line: slice, measure, value against its limit, by how much, what it says;
    figures as the verdict's English text prints them, in every language."""
    words = WORDS.bind(lang)
    over = margin_text(reason_margin(r), words, show)
    if lang == "en" and show is reason_figure:
        return r["text"] + words("aside", x=over)    # the verdict's own words, as report.json holds them
    said = meaning(r["measure"], lang)
    colon, over = words("colon"), words("aside", x=over)
    head = (f"{r['slice']}{colon}{r['measure']} {show(r['value'])} {reason_sign(r)} {show(r['limit'])}"
            + reason_interval(r, words, show))
    return head + over + (f"{colon}{said}" if said else "")


def markdown(data: dict, lang: str | None = None) -> str:
    """The Markdown report in ``lang`` (default: the one report.json's meta records, else English)."""
    lang = lang or data["meta"].get("lang") or "en"
    w = WORDS.bind(lang)
    v, m = data["verdict"], data["meta"]
    lines = [f"# {w('title')}{w('colon')}**{data['decision']}**", ""]
    lines += [w("summary", baseline=md_code(m.get('baseline', '?')), candidate=md_code(m.get('candidate', '?')),
                max_len=m['max_len'], source=md_text(source_note(m, w)), seconds=fmt(m['seconds_total'])), "",
              md_text(gating_text(data, w)), ""]
    if m.get("slices_skipped"):
        lines += [f"**{md_text(m['slices_skipped'])}**", ""]
    if v["reasons"]:
        lines += [f"## {w('reasons')}", ""] + [f"- **{r['level']}** {md_text(reason_line(r, lang))}"
                                               for r in v["reasons"]] + [""]
    if data.get("warnings"):
        lines += [f"## {w('warnings')}", ""] + [f"- {md_text(x)}" for x in warnings_of(data, w)] + [""]
    if v.get("within_noise"):
        lines += [f"## {w('within_noise')}", "", w("within_noise_note"), ""]
        lines += [f"- {md_text(noise_line(n, w, fmt))}" for n in v["within_noise"]] + [""]
    if v.get("informational"):
        lines += [f"## {w('informational')}", ""]
        lines += [f"- {r['level']} {md_text(reason_line(r, lang))}{w('colon')}{md_text(not_gated_note(r['note'], w))}"
                  for r in v["informational"]]
        lines.append("")
    lines += _engine_markdown(data, w) + _slices_markdown(data, w) + _positions_markdown(data, w)
    if data.get("footprint"):
        lines += [f"## {w('footprint')}", "", md_text(footprint_note(data["footprint"], w)), "",
                  f"| {w('th_quantity')} | {w('th_value')} |", "|---|---|"]
        lines += [f"| {md_cell_code(k)} | {md_text(w(('no', 'yes')[v]) if isinstance(v, bool) else fmt(v))} |"
                  for k, v in data["footprint"].items()] + [""]
    if data["worst_examples"]:
        lines += [f"## {w('worst')}", ""]
        for name, exs in data["worst_examples"].items():
            lines += [f"### {md_text(_named(data, name, w))}", ""]
            for ex in exs:   # the text as a code span: shown verbatim, its spaces kept
                said = (f"{example_key(k, w)}{w('colon')}{md_code(v) if isinstance(v, str) else fmt(v)}"
                        for k, v in ex.items())
                lines.append("- " + w("list_sep").join(said))
            lines.append("")
    if data.get("integrity"):
        lines += _integrity_markdown(data["integrity"], w)
    if data.get("mixed"):
        lines += [f"## {w('mixed')}", "", mixed_text(data["mixed"], w), "",
                  f"| {w('th_unit')} | {w('th_format')} | {w('th_predicted_kl')} |", "|---|---|---|"]
        lines += [md_row([r['unit'], r['format'], fmt(r['score'])]) for r in data["mixed"]["units"]] + [""]
    lines += [f"## {w('thresholds')}", "", f"| {w('th_measure')} | {w('th_review_past')} | {w('th_nogo_past')} | "
              f"{w('th_better')} |", "|---|---|---|---|"]
    for k, t in data["thresholds"].items():
        if k != "slices":
            lines.append(f"| {k} | {fmt(t['review'])} | {fmt(t['nogo'])} | "
                         f"{w('higher') if t['higher_is_better'] else w('lower')} |")
    return "\n".join(lines) + "\n"


def _named(data: dict, name: str, w) -> str:
    """A slice's name in a heading, marked when it does not gate."""
    if name not in data["verdict"].get("not_gated", {}):
        return name
    return f"{name} ({gates(data, name, w)})" if w("yes") == "yes" else w("not_gated_label", name=name)


def _slices_markdown(data: dict, w) -> list[str]:
    v, cols = data["verdict"], columns(data)
    lines = [f"## {w('slices')}", "", f"| {w('th_slice')} | {w('th_language')} | {w('th_verdict')} | {w('th_gates')} | "
             + " | ".join(w("th_tokens") if c == "tokens" else t for c, t, _ in cols) + " |",
             "|---|---|---|---|" + "---|" * len(cols)]
    for name, vals in data["slices"].items():
        cells = [name, (data.get('languages') or {}).get(name) or '–', v['slices'][name], gates(data, name, w)]
        lines.append(md_row([*cells, *(fmt(vals.get(c), spec) for c, _, spec in cols)]))
    lines.append("")
    head, rows = business_lines(data, w)
    if rows:
        lines += [f"## {w('business')}", "", md_text(head), "", md_row([w("th_task"), *(w(c) for c in BUSINESS_COLUMNS), w("business_kl")]),
                  "|---|" + "---|" * (len(BUSINESS_COLUMNS) + 1)]
        lines += [md_row(r) for r in rows] + [""]
    if data.get("lm_eval"):
        lines += [f"## {w('lm_eval')}", "", md_row([w(k) for k in ("th_task", "th_metric", "th_baseline", "th_candidate",
                                                                    "th_drop", "th_verdict")]), "|---|---|---|---|---|---|"]
        lines += [md_row([t, mt, fmt(r['base']), fmt(r['cand']), fmt(r['drop']), v['slices'].get(f'lm-eval:{t}', '–')])
                  for t, mt, r in lm_rows(data)] + [""]
    return lines


def _positions_markdown(data: dict, w) -> list[str]:
    lines = []
    for name, rows in data["kl_by_position"].items():
        others = variants(data, name)
        lines += [f"## {w('positions_of', name=md_text(_named(data, name, w)))}", ""]
        notes = slice_notes(data, name, w)
        lines += [md_text(n) for n in notes] + ([""] if notes else [])
        lines += [md_row([w("th_positions"), w("th_tokens"), candidate_label(data["meta"], w), *others]),
                  "|---|---|" + "---|" * (1 + len(others))]
        for i, r in enumerate(rows):
            shown = [fmt(x["buckets"][i]["kl_mean"]) for x in others.values()]
            lines.append(f"| {r['start']}–{r['end']} | {r['tokens']} | " + " | ".join([fmt(r["kl_mean"]), *shown]) + " |")
        lines.append("")
        if others:
            lines += [w("variants_note"), "", md_row([w("th_variant"), *VARIANT_COLUMNS, w("th_would_be")]),
                      "|---|" + "---|" * (len(VARIANT_COLUMNS) + 1)]
            lines += [md_row([vn, *(fmt(x.get(c)) for c in VARIANT_COLUMNS), x['level']])
                      for vn, x in others.items()] + [""]
    return lines


def _engine_markdown(data: dict, w) -> list[str]:
    engine = engine_section(data, w)
    if not engine:
        return []
    note, header, rows = engine
    return [f"## {w('engine')}", "", md_text(note), "", md_row(header), "|---" * len(header) + "|",
            *(md_row(r) for r in rows), ""]


def _integrity_markdown(integrity: dict, w) -> list[str]:
    lines = [f"## {w('integrity')}", "", integrity_text(integrity, w), ""]
    if integrity["flagged"]:
        lines += [md_row([w("th_module"), w("th_level"), w("th_finding")]), "|---|---|---|"]
        lines += [md_row([f['name'], f['level'], f['summary']]) for f in integrity["flagged"]] + [""]
    if integrity["fallback"]:
        lines += [w("fallback"), ""]
        lines += [f"- {md_text(unit)}: {md_text(why)}" for unit, why in integrity["fallback"].items()] + [""]
    lines += _excess_markdown(integrity, w)
    if integrity["notes"]:
        lines += [f"- {w('note')}: {md_text(n)}" for n in integrity["notes"][:10]] + [""]
    return lines


def _excess_markdown(integrity: dict, w) -> list[str]:
    """What the integrity pass found, per layer and module kind: one sentence for the worst part,
    and the grid of excess over expected (dB) only for the layers where a part is past it (> 0).
    A clean checkpoint's grid would be a page of the allowance's own figure: it is left out."""
    layers, kinds, _, excess = integrity_grid(integrity)
    cells = [(v, u, k) for u, row in zip(layers, excess) for k, v in zip(kinds, row) if v is not None]
    if not cells:
        return []
    worst, unit, kind = max(cells, key=lambda c: c[0])
    where = {"layer": layer_label(unit), "kind": kind, "db": f"{worst:.1f}"}
    if worst <= 0:
        same = all(v == worst for v, _, _ in cells)   # every part gives back what was recorded
        return [w("excess_same" if same else "excess_clean", **where), ""]
    bad = [(u, row) for u, row in zip(layers, excess) if any(v is not None and v > 0 for v in row)]
    lines = [w("excess_found", n=len(bad), **where), "",
             f"| {w('th_layer')} | " + " | ".join(kinds) + " |", "|---|" + "---|" * len(kinds)]
    lines += [f"| {layer_label(u)} | " + " | ".join("–" if v is None else f"{v:.1f}" for v in row) + " |"
              for u, row in bad]
    return lines + [""]
