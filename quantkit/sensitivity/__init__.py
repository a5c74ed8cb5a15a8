"""Measured sensitivity for mixed precision: which decoder linears a format damages, as data.

``sensitivity_search`` scores every unit (``units.py``) in every candidate format
(``candidates.py``) from one forward and backward of the float model (``scores.py``), and can
grade those scores against the exact one-at-a-time KL (``exact.py``, ``agreement.py``); the
result (``data.py``) is saved as ``sensitivity.json`` and planned from for any budget.
"""

from .candidates import CANDIDATES, DEFAULT_CANDIDATES, Candidate, bits_per_weight, candidate, candidates_from, weight_bytes
from .settings import MixedSettings

# The rest loads on first use: recipe.py imports this package for MixedSettings, and the
# search imports the pipeline, which imports recipe.py.
_LAZY = {"Sensitivity": ".data", "sensitivity_search": ".search", "SearchOptions": ".search", "DEFAULT_METHOD": ".search",
         "FormatUnit": ".units", "plan_units": ".units", "Plan": ".planner", "plan": ".planner",
         "planned_recipe": ".apply"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["CANDIDATES", "DEFAULT_CANDIDATES", "Candidate", "MixedSettings", "bits_per_weight", "candidate",
           "candidates_from", "weight_bytes", *_LAZY]
