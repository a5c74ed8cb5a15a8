"""Every measure the verdict gates on, one ``Measure`` record each (base.py), registered in the
order the thresholds are reported."""
from . import teacher_forced, generation, tasks, external  # noqa: F401  (registration order)
from .base import GO, MEASURES, NOGO, RANK, REVIEW, Limit, Measure, measure, measure_values, register, table_columns

__all__ = ["GO", "MEASURES", "NOGO", "RANK", "REVIEW", "Limit", "Measure", "measure", "measure_values",
           "register", "table_columns"]
