"""Every measure the verdict gates on, one ``Measure`` record each (base.py), registered in the
order the thresholds are reported."""
from quantkit.evaluation.measures import teacher_forced, generation, tasks, labels, external, path  # noqa: F401  (registration order)
from quantkit.evaluation.measures.base import (GO, MEASURES, NOGO, RANK, REVIEW, Limit, Measure, forced_summary, measure,
                                               measure_values, register, table_columns)

__all__ = ["GO", "MEASURES", "NOGO", "RANK", "REVIEW", "Limit", "Measure", "forced_summary", "measure", "measure_values",
           "register", "table_columns"]
