"""Sensitive-sample evaluation: candidate vs baseline on public and business slices,
a GO / REVIEW / NO-GO verdict with reasons, the report, and the deployment plan.

>>> from quantkit.evaluation import evaluate, plan           # doctest: +SKIP
>>> evaluate(base, cand, tok, max_len=4096).save("out/eval")  # doctest: +SKIP
"""
from quantkit.common.lazy import lazy_attributes
# the memory account lives with the serving engines (serving/memory_account.py); light, so eager
from quantkit.serving.memory_account import Footprint, plan
from quantkit.evaluation.verdict import Thresholds, Verdict, decide

# The rest is imported when first used (PEP 562): the command line registers this package's
# commands without loading transformers, which only a running evaluation needs.
_LAZY = {"EvalConfig": ".evaluator", "EvalResult": ".eval_result", "evaluate": ".evaluator",
         "Slice": ".slices", "SuiteOptions": ".slices", "load_suite": ".slices"}

__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, globals())

__all__ = ["evaluate", "EvalConfig", "EvalResult", "plan", "Footprint", "Slice", "SuiteOptions", "load_suite",
           "Thresholds", "Verdict", "decide"]
