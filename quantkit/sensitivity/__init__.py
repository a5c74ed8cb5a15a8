"""Measured sensitivity for mixed precision: which decoder linears a format damages, as data.

``sensitivity_search`` scores every unit (``units.py``) in every candidate format
(``config/candidates.py``) from one forward and backward of the float model (``scores.py``), and can
grade those scores against the exact one-at-a-time KL (``exact.py``, ``agreement.py``); the
result (``data.py``) is saved as ``sensitivity.json`` and planned from for any budget.
"""

from quantkit.config.candidates import CANDIDATES, DEFAULT_CANDIDATES, Candidate, bits_per_weight, candidate, candidates_from, weight_bytes
from quantkit.config.mixed_section import MixedSettings
from quantkit.sensitivity.plan_groups import planned_recipe
from quantkit.sensitivity.data import Sensitivity
from quantkit.sensitivity.planner import Plan, plan
from quantkit.sensitivity.search import DEFAULT_METHOD, SearchOptions, sensitivity_search
from quantkit.sensitivity.units import FormatUnit, plan_units

__all__ = ["CANDIDATES", "DEFAULT_CANDIDATES", "Candidate", "MixedSettings", "bits_per_weight", "candidate",
           "candidates_from", "weight_bytes", "Sensitivity", "sensitivity_search", "SearchOptions",
           "DEFAULT_METHOD", "FormatUnit", "plan_units", "Plan", "plan", "planned_recipe"]
