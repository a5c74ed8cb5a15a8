"""The Python API: every workflow the command line runs, callable without it.

- ``quantize(model_or_path, recipe) -> QuantizedModel`` and ``sensitivity(...)`` for a training
  pipeline;
- ``convert_checkpoint(ConvertRequest(...))``: ``quantkit convert`` whole (the conversion, its
  evaluation and model card, ``--budget go``'s search, the torchrun launch), its verdict a value;
- ``evaluate_paths`` / ``evaluate_checkpoint``: ``quantkit eval``;
- ``deployment_plan(PlanRequest(...))``: ``quantkit plan``.

Thin on purpose: the work is in ``quantkit.workflows``; this module is the stable place to
import it from.
"""

from quantkit.workflows.convert import ConversionInterrupted, ConvertOptions, convert, quantize
from quantkit.workflows.convert_checkpoint import ConvertOutcome, ConvertRequest, Reporters, convert_checkpoint
from quantkit.workflows.deployment_plan import DeploymentPlan, PlanRequest, deployment_plan
from quantkit.workflows.evaluate import Evaluated, PathsOptions, evaluate_checkpoint, evaluate_paths
from quantkit.workflows.measure_sensitivity import sensitivity
from quantkit.workflows.model_free import ModelFreeOptions, quantize_model_free
from quantkit.workflows.quantized_model import QuantizedModel

__all__ = ['ConversionInterrupted', 'ConvertOptions', 'ConvertOutcome', 'ConvertRequest', 'DeploymentPlan',
           'Evaluated', 'ModelFreeOptions', 'PathsOptions', 'PlanRequest', 'QuantizedModel', 'Reporters', 'convert',
           'convert_checkpoint', 'deployment_plan', 'evaluate_checkpoint', 'evaluate_paths', 'quantize',
           'quantize_model_free', 'sensitivity']
