"""Sensitive-sample evaluation: candidate vs baseline on public and business slices,
a GO / REVIEW / NO-GO verdict with reasons, the report, and the deployment plan.

>>> from quantkit.evaluation import evaluate, plan           # doctest: +SKIP
>>> evaluate(base, cand, tok, max_len=4096).save("out/eval")  # doctest: +SKIP
"""
from .api import EvalResult, evaluate
from .cli import evaluate_checkpoint, evaluate_paths
from .plan import Footprint, plan
from .slices import Slice, SuiteOptions, load_suite
from .verdict import Thresholds, Verdict, decide

__all__ = ["evaluate", "evaluate_paths", "evaluate_checkpoint", "EvalResult", "plan", "Footprint", "Slice", "SuiteOptions", "load_suite",
           "Thresholds", "Verdict", "decide"]
