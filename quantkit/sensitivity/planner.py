"""The planner: one candidate format per unit, the least predicted damage within a budget.

A pure function over ``Sensitivity`` data. The budget is the size of the planned units'
weight tensors: average bits per weight (codes, scales in the checkpoint's dtype, zero
points, ``g_idx``: ``candidates.weight_bytes``) or total bytes. Damage is the sum of the
units' predicted KLs (the second-order picture: units' errors add).

Choosing one option per unit under a size limit is a multiple-choice knapsack. It is solved
by dynamic programming over the bytes above the cheapest plan, in ``RESOLUTION`` steps with
every option's extra size rounded **up** to a whole step, so a plan the table accepts never
exceeds the real budget (it may leave under a step per unit unspent). E.g. two units, W4
at 1 byte and W8 at 2, damage a: 0.3 / 0.01 and b: 0.1 / 0.05: with 3 bytes, ``a`` gets W8.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from quantkit.errors import QuantkitError
from quantkit.common.jsonio import dumps_strict
from quantkit.sensitivity.data import Sensitivity

RESOLUTION = 1 << 14
PLAN_KIND, PLAN_VERSION = "quantkit-plan", 1


@dataclass
class Plan:
    """Which candidate each unit gets, what that costs and the damage predicted for it."""

    choice: dict[str, str]          # unit -> candidate
    nbytes: int
    params: int
    predicted_kl: float
    budget: dict[str, float] = field(default_factory=dict)   # {"bits": ...} or {"bytes": ...}
    rule: str = "measured"          # or "uniform W4_G64", "first/last layers W8_CHANNEL", ...

    @property
    def bits_per_weight(self) -> float:
        return 8 * self.nbytes / max(self.params, 1)

    def by_candidate(self, sens: Sensitivity) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        units = {u.name: u for u in sens.units}
        for name, c in self.choice.items():
            row = out.setdefault(c, {"units": 0, "params": 0})
            row["units"] += 1
            row["params"] += units[name].params
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"kind": PLAN_KIND, "version": PLAN_VERSION, "rule": self.rule, "budget": self.budget,
                "bits_per_weight": round(self.bits_per_weight, 4), "nbytes": self.nbytes, "params": self.params,
                "predicted_kl": self.predicted_kl, "choice": self.choice}

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(dumps_strict(self.to_dict(), indent=1) + "\n", encoding="utf-8")
        return path

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "plan.json") -> "Plan":
        if not isinstance(d, dict) or d.get("kind") != PLAN_KIND or d.get("version") != PLAN_VERSION:
            raise QuantkitError(f"{where}: not a quantkit plan (kind '{PLAN_KIND}', version {PLAN_VERSION})")
        try:
            return cls(dict(d["choice"]), int(d["nbytes"]), int(d["params"]), float(d["predicted_kl"]),
                       dict(d.get("budget", {})), str(d.get("rule", "measured")))
        except (KeyError, TypeError, ValueError) as e:
            raise QuantkitError(f"{where}: malformed plan ({type(e).__name__}: {e})") from None

    @classmethod
    def load(cls, path: str | Path) -> "Plan":
        try:
            return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")), str(path))
        except FileNotFoundError:
            raise QuantkitError(f"{path}: plan file not found") from None
        except json.JSONDecodeError as e:
            raise QuantkitError(f"{path}: not JSON ({e})") from None


def capacity(sens: Sensitivity, budget_bits: float | None, budget_bytes: int | None) -> tuple[int, dict]:
    """The budget in bytes, and as it was given."""
    if (budget_bits is None) == (budget_bytes is None):
        raise QuantkitError("budget: give exactly one of bits per weight and bytes")
    if budget_bits is not None:
        if not budget_bits > 0:
            raise QuantkitError(f"budget: bits per weight must be > 0, got {budget_bits}")
        return math.floor(budget_bits * sens.params() / 8), {"bits": budget_bits}
    if budget_bytes <= 0:
        raise QuantkitError(f"budget: bytes must be > 0, got {budget_bytes}")
    return int(budget_bytes), {"bytes": int(budget_bytes)}


def plan(sens: Sensitivity, budget_bits: float | None = None, budget_bytes: int | None = None,
         candidates: list[str] | None = None) -> Plan:
    """The plan with the least predicted KL whose planned weights fit the budget.

    ``candidates`` restricts the choice to some of the sensitivity data's candidates.
    """
    cap, given = capacity(sens, budget_bits, budget_bytes)
    allowed = list(sens.candidates) if candidates is None else list(candidates)
    unknown = [c for c in allowed if c not in sens.candidates]
    if unknown:
        raise QuantkitError(f"plan: candidate '{unknown[0]}' is not in the sensitivity data "
                            f"(it has {', '.join(sens.candidates)})")
    options = []
    for u in sens.units:
        opts = [(c, sens.nbytes[u.name][c], sens.damage(u.name, c)) for c in allowed if c in sens.nbytes[u.name]]
        if not opts:
            raise QuantkitError(f"plan: no candidate fits {u.name} (of {', '.join(allowed)})")
        options.append(opts)
    floor = sum(min(b for _, b, _ in opts) for opts in options)
    if floor > cap:
        raise QuantkitError(f"budget: {_said(given)} is below the smallest plan of these candidates "
                            f"({8 * floor / sens.params():.4g} bits per weight, {floor} bytes)")
    spare = cap - floor
    step = max(1, math.ceil(spare / RESOLUTION))
    slots = spare // step
    choice_at = torch.zeros(len(options), slots + 1, dtype=torch.int16)
    best = torch.zeros(slots + 1, dtype=torch.float64)   # least damage of the units so far, per slots used
    for k, opts in enumerate(options):
        low = min(b for _, b, _ in opts)
        new = torch.full_like(best, math.inf)
        for j, (_, b, d) in enumerate(opts):
            need = math.ceil((b - low) / step)
            if need > slots:
                continue
            cand = torch.full_like(best, math.inf)
            cand[need:] = best[: slots + 1 - need] + d
            better = cand < new
            new = torch.where(better, cand, new)
            choice_at[k] = torch.where(better, torch.tensor(j, dtype=torch.int16), choice_at[k])
        best = new
    choice: dict[str, str] = {}
    at = slots
    for k in range(len(options) - 1, -1, -1):
        c, b, _ = options[k][int(choice_at[k, at])]
        low = min(bb for _, bb, _ in options[k])
        at -= math.ceil((b - low) / step)
        choice[sens.units[k].name] = c
    return evaluate_choice(sens, dict(reversed(list(choice.items()))), given)


def evaluate_choice(sens: Sensitivity, choice: dict[str, str], budget: dict | None = None,
                    rule: str = "measured") -> Plan:
    """A plan's size and predicted damage from its choice of candidate per unit."""
    nbytes = sum(sens.nbytes[u][c] for u, c in choice.items())
    damage = sum(sens.damage(u, c) for u, c in choice.items())
    return Plan(choice, nbytes, sens.params(), damage, dict(budget or {}), rule)


def _said(given: dict) -> str:
    return f"{given['bits']} bits per weight" if "bits" in given else f"{given['bytes']} bytes"


# -- fixed rules, for comparison --------------------------------------------------------------
def uniform(sens: Sensitivity, cand: str) -> Plan:
    """Every unit in ``cand``."""
    misfit = [u.name for u in sens.units if cand not in sens.nbytes[u.name]]
    if misfit:
        raise QuantkitError(f"plan: {cand} does not fit {misfit[0]} ({len(misfit)} units)")
    return evaluate_choice(sens, {u.name: cand for u in sens.units}, rule=f"uniform {cand}")


def edge_layers(sens: Sensitivity, low: str, high: str, budget_bits: float | None = None,
                budget_bytes: int | None = None) -> Plan:
    """The fixed rule: the first and last layers in ``high``, the rest in ``low``, as many
    layers from both ends (first, last, second, second to last, ...) as fit the budget."""
    cap, given = capacity(sens, budget_bits, budget_bytes)
    layers = sorted({u.layer for u in sens.units})
    order = [x for pair in zip(layers, reversed(layers)) for x in pair][: len(layers)]
    order = list(dict.fromkeys(order))
    high_layers: set[int] = set()
    best = None
    for n in range(len(order) + 1):
        trial = set(order[:n])
        choice = {u.name: (high if u.layer in trial else low) for u in sens.units}
        p = evaluate_choice(sens, choice, given, rule=f"first/last layers {high}, rest {low}")
        if p.nbytes > cap:
            break
        best, high_layers = p, trial
    if best is None:
        raise QuantkitError(f"budget: {_said(given)} does not fit every unit in {low}")
    best.rule += f" ({len(high_layers)} layers)"
    return best

