"""The sensitivity search's result as data: ``sensitivity.json`` beside the checkpoint.

Everything a plan needs, for any budget, without the model: the units, each candidate's
format and exact size per unit, and the predicted damage (nats of KL per token) of quantizing
each unit in each format. A later ``convert --sensitivity FILE --budget B`` plans from it
again; nothing here depends on the budget.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantkit.errors import QuantkitError
from quantkit.common.outputs import OutputPolicy
from quantkit.common.jsonio import dumps_strict
from quantkit.config.scheme import QuantArgs
from quantkit.sensitivity.units import FormatUnit

KIND = "quantkit-sensitivity"
VERSION = 1


@dataclass
class Sensitivity:
    """Per unit and candidate: bytes in the checkpoint and the predicted KL of that choice.

    ``scores[variant][unit][candidate]``; ``method`` names the variant plans use. A candidate
    missing from a unit's ``nbytes`` does not fit it (a group size that does not divide its
    width). ``exact`` holds the one-at-a-time KL where it was measured.
    """

    model: dict[str, Any]                           # architecture, dtype (sizes are counted in it), name
    candidates: dict[str, QuantArgs | None]         # name -> weights (None: kept in the model's dtype)
    units: list[FormatUnit]
    nbytes: dict[str, dict[str, int]]               # unit -> candidate -> bytes
    scores: dict[str, dict[str, dict[str, float]]]  # variant -> unit -> candidate -> predicted KL
    method: str
    calibration: dict[str, Any] = field(default_factory=dict)
    exact: dict[str, dict[str, float]] = field(default_factory=dict)
    agreement: dict[str, Any] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    def damage(self, unit: str, cand: str) -> float:
        """The predicted KL of ``unit`` in ``cand`` under ``method`` (0 for a kept unit)."""
        if self.candidates[cand] is None:
            return 0.0
        return self.scores[self.method][unit][cand]

    def params(self) -> int:
        return sum(u.params for u in self.units)

    def ranking(self, cand: str) -> list[tuple[str, float]]:
        """Units from the most to the least damaged by ``cand``."""
        rows = [(u.name, self.damage(u.name, cand)) for u in self.units if cand in self.nbytes[u.name]]
        return sorted(rows, key=lambda r: -r[1])

    # -- JSON -------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": KIND, "version": VERSION, "model": self.model, "method": self.method,
            "candidates": {n: (None if a is None else a.to_dict()) for n, a in self.candidates.items()},
            "units": [u.to_dict() for u in self.units], "nbytes": self.nbytes, "scores": self.scores,
            "calibration": self.calibration, "exact": self.exact, "agreement": self.agreement,
            "seconds": self.seconds,
        }

    def save(self, path: str | Path, overwrite: bool = False, policy: "OutputPolicy | None" = None) -> Path:
        """Write the JSON file ``path``: an existing file is replaced only with ``overwrite`` and only
        when it is an earlier sensitivity file (``quantkit.common.outputs``)."""
        data = (dumps_strict(self.to_dict(), indent=1) + "\n").encode("utf-8")
        return (policy or OutputPolicy("sensitivity")).write_file(Path(path), data, overwrite)

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "sensitivity.json") -> "Sensitivity":
        if not isinstance(d, dict) or d.get("kind") != KIND:
            raise QuantkitError(f"{where}: not a quantkit sensitivity file (kind is not '{KIND}')")
        if d.get("version") != VERSION:
            raise QuantkitError(f"{where}: sensitivity format version {d.get('version')!r}, this quantkit reads {VERSION}")
        try:
            cands = {n: (None if a is None else QuantArgs.from_dict(_ct_args(a), f"candidates.{n}"))
                     for n, a in d["candidates"].items()}
            sens = cls(d["model"], cands, [FormatUnit.from_dict(u) for u in d["units"]],
                       {u: {c: int(b) for c, b in per.items()} for u, per in d["nbytes"].items()},
                       d["scores"], d["method"], d.get("calibration", {}), d.get("exact", {}),
                       d.get("agreement", {}), d.get("seconds", {}))
        except (KeyError, TypeError, ValueError) as e:
            raise QuantkitError(f"{where}: malformed sensitivity data ({type(e).__name__}: {e})") from None
        if sens.method not in sens.scores:
            raise QuantkitError(f"{where}: method '{sens.method}' has no scores")
        return sens

    @classmethod
    def load(cls, path: str | Path) -> "Sensitivity":
        path = Path(path)
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise QuantkitError(f"{path}: sensitivity file not found") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise QuantkitError(f"{path}: not JSON ({e})") from None
        return cls.from_dict(d, str(path))


def _ct_args(d: dict[str, Any]) -> dict[str, Any]:
    """QuantArgs' own fields from its compressed-tensors form (which adds block_structure, ...)."""
    keep = {"num_bits", "type", "symmetric", "strategy", "group_size", "dynamic", "actorder", "observer"}
    return {k: v for k, v in d.items() if k in keep and v is not None}

