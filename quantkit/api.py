"""The Python API: every workflow the command line runs, callable without it.

- ``quantize(model_or_path, recipe) -> QuantizedModel`` and ``sensitivity(...)`` for a training
  pipeline;
- ``convert_checkpoint(ConvertRequest(...))``: ``quantkit convert`` whole (the conversion, its
  evaluation and model card, ``--budget go``'s search, the torchrun launch), its verdict a value;
- ``evaluate_to_folder(EvalRequest(...), PathsOptions(...))``: ``quantkit eval`` (``evaluate_paths``
  without the report, ``evaluate_checkpoint`` as convert runs it);
- ``deployment_plan(PlanRequest(...))``: ``quantkit plan``;
- ``measure_sensitivity(SensitivityRequest(...))``: ``quantkit sensitivity``;
- ``calibrate(log, model, SamplerConfig(...), out=...)``: ``quantkit calibrate``;
- ``loadtest_to_folder(LoadtestOptions(...), lang)``: ``quantkit loadtest``;
- ``inspect_checkpoint(folder)``: ``quantkit inspect``.

Thin on purpose: the work is in ``quantkit.workflows``; this module is the stable place to
import it from.
"""

from quantkit.calibration import SamplerConfig, calibrate
from quantkit.runtime.checkpoint_info import inspect_checkpoint
from quantkit.workflows.convert import ConversionInterrupted, ConvertOptions, convert, quantize
from quantkit.workflows.convert_checkpoint import ConvertOutcome, ConvertRequest, Reporters, convert_checkpoint
from quantkit.workflows.deployment_plan import DeploymentPlan, PlanRequest, deployment_plan
from quantkit.workflows.evaluate import (EvalRequest, Evaluated, PathsOptions, evaluate_checkpoint, evaluate_paths,
                                        evaluate_to_folder)
from quantkit.workflows.loadtest import LoadtestOptions, loadtest_to_folder
from quantkit.workflows.measure_sensitivity import SensitivityRequest, measure_sensitivity, sensitivity
from quantkit.workflows.model_free import ModelFreeOptions, quantize_model_free
from quantkit.workflows.quantized_model import QuantizedModel

__all__ = ['ConversionInterrupted', 'ConvertOptions', 'ConvertOutcome', 'ConvertRequest', 'DeploymentPlan',
           'EvalRequest', 'Evaluated', 'LoadtestOptions', 'ModelFreeOptions', 'PathsOptions', 'PlanRequest', 'QuantizedModel',
           'Reporters', 'SamplerConfig', 'SensitivityRequest', 'calibrate', 'convert', 'convert_checkpoint',
           'deployment_plan', 'evaluate_checkpoint', 'evaluate_paths', 'evaluate_to_folder',
           'inspect_checkpoint', 'loadtest_to_folder',
           'measure_sensitivity', 'quantize', 'quantize_model_free', 'sensitivity']
