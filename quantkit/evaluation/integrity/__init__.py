"""The checkpoint's integrity: every quantized module decoded from the candidate's files and compared
with the baseline's weight (recorded transforms re-applied), plus the layout of every tensor.

>>> report = check_checkpoint("models/base", "out/ckpt-w4a16")     # doctest: +SKIP
>>> report.unloadable, report.seconds                               # doctest: +SKIP
(False, 2.4)
"""
from quantkit.evaluation.integrity.check import IntegrityReport, check_checkpoint, flagged_rows
from quantkit.evaluation.integrity.figures import ALLOWANCES, reconstruction

__all__ = ["ALLOWANCES", "IntegrityReport", "check_checkpoint", "flagged_rows", "reconstruction"]
