"""Coverage figures: the plotted series come from the manifest and nothing else, so a report's
pictures and its numbers cannot disagree (tests compare the embedded series to the manifest).
"""

from __future__ import annotations

import base64
import io
from typing import Any


SERIES = ("traffic", "distinct", "sample")  # bars per label, in this order
_COLOURS = {"traffic": "#8da0cb", "distinct": "#66c2a5", "sample": "#fc8d62"}


def figure_series(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Name -> {title, labels, traffic, distinct, sample, unit}: shares in percent of the log's rows
    (repeats counted), of its distinct rows, and of the sample."""
    hist = manifest["length_histogram"]
    lows = [0] + hist["edges"][:-1]

    def marginal(items: list[dict[str, Any]], title: str) -> dict[str, Any]:
        return {"title": title, "labels": [t["name"] for t in items], "unit": "% of rows",
                **{k: [_pct(t[f"{k}_share"]) for t in items] for k in SERIES}}

    return {
        "tasks": marginal(manifest["tasks"], "Share per task type: traffic, distinct rows, sample"),
        "buckets": marginal(manifest["buckets"], "Share per length bucket (tokens): traffic, distinct rows, sample"),
        "lengths": {
            "title": "Token-length histogram (capped at max_len)",
            "labels": [f"{lo + 1}-{hi}" for lo, hi in zip(lows, hist["edges"])],
            **{k: [round(100 * c / (sum(hist[k]) or 1), 4) for c in hist[k]] for k in SERIES},
            "unit": "% of rows",
        },
    }


def _pct(share: float) -> float:
    return round(100 * share, 4)


def render_png(series: dict[str, Any]) -> bytes:
    """A grouped bar chart of one series (its ``legend``, when given, names the bars in the
    report's language). PNG metadata carries no version or date, so the bytes depend only on the data."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    labels = series["labels"]
    width = max(6.0, 0.55 * len(labels) + 2.0)
    fig = Figure(figsize=(width, 3.6), dpi=90)
    ax = fig.add_subplot(1, 1, 1)
    xs = range(len(labels))
    bar = 0.8 / len(SERIES)
    legend = series.get("legend") or SERIES
    for j, (name, label) in enumerate(zip(SERIES, legend)):
        ax.bar([x + (j - (len(SERIES) - 1) / 2) * bar for x in xs], series[name], width=bar, label=label,
               color=_COLOURS[name])
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels, rotation=35, ha="right", fontsize=8)
    ax.set_ylabel(series["unit"])
    ax.set_title(series["title"], fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def png_base64(series: dict[str, Any]) -> str:
    return base64.b64encode(render_png(series)).decode("ascii")
