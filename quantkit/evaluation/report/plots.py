"""The report's plots as base64 PNG, labelled in the report's language (``plot_language``: in
English where a Chinese report's machine has no Chinese font)."""
from __future__ import annotations

import base64
import io

import numpy as np

from quantkit.common.plotfonts import plot_language
from quantkit.evaluation.report.content import (integrity_grid, layer_label, layer_summary, position_lines,
                                                unit_and_kind)
from quantkit.evaluation.report.words import WORDS
from quantkit.sensitivity.sensitivity_report import frontier_png

COLOURS = {"GO": "#2e7d32", "REVIEW": "#f9a825", "NO-GO": "#c62828"}


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def plots(data: dict, lang: str = "en") -> tuple[dict[str, str], str]:
    """(name -> PNG, the language the plots are labelled in)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = {}
    with plot_language(lang) as drawn:
        words = WORDS.bind(drawn)
        if any(v.get("kl_mean") is not None for v in data["slices"].values()):
            out["slices"] = _slices_png(data, plt, words)
        if data["kl_by_position"]:
            out["position"] = _positions_png(data, plt, words)
        if data.get("module_errors"):
            out["modules"] = _modules_png(data["module_errors"], plt, words)
        if data.get("integrity") and data["integrity"]["modules"]:
            out.update(_integrity_heat_map(data["integrity"], plt, words))
        if data.get("mixed"):
            png = frontier_png(data["mixed"])
            if png:
                out["mixed"] = png
    return out, drawn


def _slices_png(data: dict, plt, words) -> str:
    names = [n for n, v in data["slices"].items() if v.get("kl_mean") is not None]
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    colours = [COLOURS[data["verdict"]["slices"][n]] for n in names]
    off = data["verdict"].get("not_gated", {})
    labels = [words("not_gated_label", name=n) if n in off else n for n in names]
    for ax, m in zip(axes, ("kl_mean", "top1_agreement")):
        bars = ax.bar(labels, [data["slices"][n].get(m) or 0.0 for n in names], color=colours)
        for bar, n in zip(bars, names):
            if n in off:  # measured and shown, but it does not gate: hatched and pale
                bar.set_alpha(0.45)
                bar.set_hatch("//")
    axes[0].set_title(words("plot_kl"))
    axes[1].set_ylim(0, 1)
    axes[1].set_title(words("plot_top1"))
    for ax in axes:
        ax.tick_params(axis="x", rotation=40)
        for label in ax.get_xticklabels():  # long names: anchor each label at its bar
            label.set_horizontalalignment("right")
            label.set_rotation_mode("anchor")
    return _png(fig)


def _positions_png(data: dict, plt, words) -> str:
    names = list(data["kl_by_position"])
    # at most two panels a row: the page is 1200 px wide and the image is scaled to fit it
    cols = min(2, len(names))
    rows = (len(names) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 3.6 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names):
        lowest = float("inf")
        for label, points in position_lines(data, name, words):
            points = [r for r in points if r["tokens"]]
            ax.plot([r["end"] for r in points], [r["kl_mean"] for r in points], marker="o", label=label)
            lowest = min([lowest] + [r["kl_mean"] for r in points])
        ax.set_xscale("log", base=2)
        if lowest > 0:   # weight-only and KV options can differ by orders of magnitude
            ax.set_yscale("log")
        ax.set_xlabel(words("plot_context"))
        ax.set_ylabel(words("plot_mean_kl"))
        ax.set_title(words("positions_of", name=name))
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(names):]:
        ax.set_visible(False)
    fig.tight_layout()
    return _png(fig)


def _modules_png(errors: dict[str, float], plt, words) -> str:
    """Per decoder layer, the spread of its modules' SQNR (worst, median, best), so a model of any
    depth reads as one line per statistic rather than one bar per module; a model whose module
    names carry no layer number gets one bar per module."""
    from matplotlib.ticker import MaxNLocator

    layers = layer_summary(errors)
    fig, ax = plt.subplots(figsize=(11, 3.2))
    if len(layers) >= 2:
        x = [r[0] for r in layers]
        ax.fill_between(x, [r[2] for r in layers], [r[4] for r in layers], alpha=0.25, label=words("plot_range"))
        ax.plot(x, [r[3] for r in layers], marker="o", label=words("plot_median"))
        ax.plot(x, [r[2] for r in layers], marker="v", linestyle="none", color="#c62828", label=words("plot_worst"))
        ax.set_xlabel(words("th_layer"))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(fontsize=8)
        ax.set_title(words("plot_layers"))
    else:
        names = list(errors)
        ax.bar(range(len(names)), [errors[n] for n in names])
        ax.set_xticks(range(len(names)), names, rotation=90, fontsize=6)
        ax.set_title(words("plot_modules"))
    ax.set_ylabel(words("plot_sqnr"))
    return _png(fig)


def _integrity_heat_map(integrity: dict, plt, words) -> dict[str, str]:
    layers, kinds, sqnr, excess = integrity_grid(integrity)
    if not layers:
        return {}
    fig, axes = plt.subplots(1, 2, figsize=(12, max(2.5, 0.22 * len(layers) + 1.6)))
    panels = ((sqnr, words("plot_sqnr_base"), "viridis", None, None),
              (excess, words("plot_excess"), "RdYlGn_r", -15, 15))
    for ax, (grid, title, cmap, lo, hi) in zip(axes, panels):
        a = np.array([[np.nan if v is None else v for v in row] for row in grid], dtype=float)
        im = ax.imshow(a, aspect="auto", cmap=cmap, vmin=lo, vmax=hi, interpolation="nearest")
        ax.set_xticks(range(len(kinds)), [k.rpartition(".")[2] if "*" not in k else k for k in kinds],
                      rotation=40, ha="right", fontsize=8)
        ax.set_yticks(range(len(layers)), [layer_label(u) for u in layers], fontsize=7)
        ax.set_ylabel(words("th_layer"))
        ax.set_title(title, fontsize=10)
        fig.colorbar(im, ax=ax, fraction=0.046)
    flagged = {(f["name"]) for f in integrity.get("flagged", []) if f["kind"] == "module"}
    for name in flagged:
        unit, kind = unit_and_kind(name)
        if unit in layers and kind in kinds:
            for ax in axes:
                ax.add_patch(plt.Rectangle((kinds.index(kind) - 0.5, layers.index(unit) - 0.5), 1, 1,
                                           fill=False, edgecolor="black", linewidth=2))
    return {"integrity": _png(fig)}
