"""Measured sensitivity for mixed precision: which decoder linears a format damages, as data.

``sensitivity_search`` scores every unit (``units.py``) in every candidate format
(``candidates.py``) from one forward and backward of the float model (``scores.py``), and can
grade those scores against the exact one-at-a-time KL (``exact.py``, ``agreement.py``); the
result (``data.py``) is saved as ``sensitivity.json`` and planned from for any budget.
"""

from .candidates import CANDIDATES, DEFAULT_CANDIDATES, Candidate, bits_per_weight, candidate, candidates_from, weight_bytes
from .data import Sensitivity
from .search import DEFAULT_METHOD, sensitivity_search
from .units import FormatUnit, plan_units

__all__ = ["CANDIDATES", "DEFAULT_CANDIDATES", "DEFAULT_METHOD", "Candidate", "FormatUnit", "Sensitivity",
           "bits_per_weight", "candidate", "candidates_from", "plan_units", "sensitivity_search", "weight_bytes"]
