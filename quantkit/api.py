"""The Python API a training pipeline calls: ``quantize(model_or_path, recipe) -> QuantizedModel``,
``sensitivity(...)``. Thin on purpose: the work is in ``quantkit.workflows``; this module is the
stable place to import it from."""

from quantkit.workflows.convert import ConversionInterrupted, ConvertOptions, QuantizedModel, convert, quantize, sensitivity
from quantkit.workflows.model_free import ModelFreeOptions, quantize_model_free

__all__ = ['ConversionInterrupted', 'ConvertOptions', 'ModelFreeOptions', 'QuantizedModel', 'convert', 'quantize',
           'quantize_model_free', 'sensitivity']
