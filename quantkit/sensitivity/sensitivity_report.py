"""The plan as a report section: which unit got which format and its score, and the frontier.

The frontier is the planner run over a range of budgets (cheap: a pure function of the
sensitivity data), beside the fixed rules (uniform W4 and W8, the first/last-layer rule);
its KL is the predicted one, with a measured point where the caller has one. The evaluation
report can show ``section(folder)``; it needs nothing but the checkpoint's ``plan.json`` and
``sensitivity.json``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quantkit.errors import QuantkitError
from quantkit.sensitivity.data import Sensitivity
from quantkit.sensitivity.mixed import PLAN_FILE, SENSITIVITY_FILE
from quantkit.sensitivity.planner import Plan, edge_layers, plan, uniform
import base64
import io


def frontier(sens: Sensitivity, low: str = "W4_G64", high: str = "W8_CHANNEL", steps: int = 12) -> dict[str, list[dict]]:
    """Predicted (bits per weight, KL) of the measured plans and the fixed rules, from ``low``'s
    size to ``high``'s."""
    lo, hi = uniform(sens, low), uniform(sens, high)
    out: dict[str, list[dict]] = {"measured": [], "first/last layers": [], "uniform": []}
    for p in (lo, hi):
        out["uniform"].append(_point(p))
    for k in range(steps + 1):
        bits = lo.bits_per_weight + (hi.bits_per_weight - lo.bits_per_weight) * k / steps
        edge = edge_layers(sens, low, high, budget_bits=bits)
        out["first/last layers"].append(_point(edge))
        out["measured"].append(_point(plan(sens, budget_bytes=edge.nbytes)))
    return out


def _point(p: Plan) -> dict[str, Any]:
    return {"bits": round(p.bits_per_weight, 4), "predicted_kl": p.predicted_kl, "rule": p.rule}


def section(folder: str | Path, measured_kl: float | None = None) -> dict[str, Any] | None:
    """What the report shows for a mixed checkpoint (None when it has no plan)."""
    folder = Path(folder)
    if not (folder / PLAN_FILE).exists():
        return None
    if not (folder / SENSITIVITY_FILE).exists():
        raise QuantkitError(f"{folder / PLAN_FILE}: no {SENSITIVITY_FILE} beside it")
    sens, p = Sensitivity.load(folder / SENSITIVITY_FILE), Plan.load(folder / PLAN_FILE)
    rows = [{"unit": u.name, "format": p.choice[u.name], "score": sens.damage(u.name, p.choice[u.name]),
             "params": u.params} for u in sens.units]
    try:
        front = frontier(sens)
    except QuantkitError:   # the candidates lack W4 g64 or W8: no frontier against the rules
        front = None
    return {"plan": p.to_dict(), "units": rows, "frontier": front, "measured_kl": measured_kl,
            "by_candidate": p.by_candidate(sens), "method": sens.method}


def markdown(data: dict[str, Any]) -> list[str]:
    p = data["plan"]
    shares = ", ".join(f"{c}: {r['units']} units" for c, r in data["by_candidate"].items())
    lines = ["## Mixed-precision plan", "",
             f"{p['bits_per_weight']:.3f} bits per planned weight (budget {p['budget']}), predicted KL "
             f"{p['predicted_kl']:.4g} nats per token ({data['method']} score); {shares}.", "",
             "| unit | format | predicted KL |", "|---|---|---|"]
    lines += [f"| {r['unit']} | {r['format']} | {r['score']:.3g} |" for r in data["units"]]
    return lines + [""]


def frontier_png(data: dict[str, Any]) -> str | None:
    """The size-vs-KL frontier as a base64 PNG (matplotlib), or None without one."""
    if not data.get("frontier"):
        return None

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, pts in data["frontier"].items():
        style = "o" if name == "uniform" else "-o"
        ax.plot([q["bits"] for q in pts], [q["predicted_kl"] for q in pts], style, label=name, markersize=3)
    p = data["plan"]
    ax.plot([p["bits_per_weight"]], [p["predicted_kl"]], "*", markersize=12, label="this plan (predicted)")
    if data.get("measured_kl") is not None:
        ax.plot([p["bits_per_weight"]], [data["measured_kl"]], "x", markersize=10, label="this plan (measured)")
    ax.set_xlabel("bits per planned weight")
    ax.set_ylabel("KL, nats per token")
    ax.set_yscale("log")
    ax.legend()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()
