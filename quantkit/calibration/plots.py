"""Coverage figures: the plotted series come from the manifest and nothing else, so a report's
pictures and its numbers cannot disagree (tests compare the embedded series to the manifest).
"""

from __future__ import annotations

import base64
import io
from typing import Any


def figure_series(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Name -> {title, labels, source, sample, unit}; shares in percent of rows."""
    hist = manifest["length_histogram"]
    lows = [0] + hist["edges"][:-1]
    src_total, smp_total = sum(hist["source"]) or 1, sum(hist["sample"]) or 1
    return {
        "tasks": {
            "title": "Share per task type: source vs sample",
            "labels": [t["name"] for t in manifest["tasks"]],
            "source": [_pct(t["source_share"]) for t in manifest["tasks"]],
            "sample": [_pct(t["sample_share"]) for t in manifest["tasks"]],
            "unit": "% of rows",
        },
        "buckets": {
            "title": "Share per length bucket (tokens): source vs sample",
            "labels": [b["name"] for b in manifest["buckets"]],
            "source": [_pct(b["source_share"]) for b in manifest["buckets"]],
            "sample": [_pct(b["sample_share"]) for b in manifest["buckets"]],
            "unit": "% of rows",
        },
        "lengths": {
            "title": "Token-length histogram (capped at max_len)",
            "labels": [f"{lo + 1}-{hi}" for lo, hi in zip(lows, hist["edges"])],
            "source": [round(100 * c / src_total, 4) for c in hist["source"]],
            "sample": [round(100 * c / smp_total, 4) for c in hist["sample"]],
            "unit": "% of rows",
        },
    }


def _pct(share: float) -> float:
    return round(100 * share, 4)


def render_png(series: dict[str, Any]) -> bytes:
    """A grouped bar chart of one series. PNG metadata carries no version or date, so the bytes
    depend only on the data."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    labels = series["labels"]
    width = max(6.0, 0.55 * len(labels) + 2.0)
    fig = Figure(figsize=(width, 3.6), dpi=90)
    ax = fig.add_subplot(1, 1, 1)
    xs = range(len(labels))
    ax.bar([x - 0.2 for x in xs], series["source"], width=0.4, label="source", color="#8da0cb")
    ax.bar([x + 0.2 for x in xs], series["sample"], width=0.4, label="sample", color="#fc8d62")
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
