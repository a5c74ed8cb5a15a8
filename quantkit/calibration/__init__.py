"""Business-distribution calibration sampler.

Draws a calibration set from a user's own traffic log so that every (task type x length
bucket) cell is covered, and proves it with a manifest and a coverage report.

    >>> from quantkit.calibration import calibrate, load_calibration     # doctest: +SKIP
    >>> calibrate("logs.jsonl", "models/m", num_samples=512, max_len=4096, out="calib/")  # doctest: +SKIP
    >>> ids = load_calibration("calib/", tok, 512, 4096, seed=0)          # doctest: +SKIP
"""

from quantkit.calibration.allocate import allocate
from quantkit.calibration.calibration_set import CalibrationResult, calibrate, default_log_path, load_calibration
from quantkit.calibration.config import DEFAULT_LENGTH_EDGES, FieldMap, SamplerConfig
from quantkit.calibration.task_types import TASK_TYPES, infer_task

__all__ = [
    "CalibrationResult", "DEFAULT_LENGTH_EDGES", "FieldMap", "SamplerConfig", "TASK_TYPES",
    "allocate", "calibrate", "default_log_path", "infer_task", "load_calibration",
]
