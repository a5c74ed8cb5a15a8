"""quantkit: post-training quantization for LLMs.

    >>> import quantkit
    >>> q = quantkit.quantize(None, "w8a16")        # None: the embedded SmolLM2-135M  # doctest: +SKIP
    >>> q.save("out/smollm2-w8a16")                                                    # doctest: +SKIP
    >>> model = quantkit.load("out/smollm2-w8a16")                                     # doctest: +SKIP
"""

__version__ = "0.1.0"

from quantkit.common.lazy import lazy_attributes
from quantkit.errors import QuantkitError

# Where each public name lives. They are imported when first used (PEP 562): the command line
# imports this package before anything else, and a command refusing a bad flag or file should
# not wait for torch and transformers to load first.
_LAZY = {"quantize": ".api", "ConvertOptions": ".api", "QuantizedModel": ".api", "quantize_model_free": ".api",
         "ModelFreeOptions": ".api", "convert_checkpoint": ".api", "ConvertRequest": ".api",
         "evaluate_paths": ".api", "evaluate_checkpoint": ".api", "deployment_plan": ".api", "PlanRequest": ".api",
         "load": ".runtime.loader", "Recipe": ".recipe",
         "load_recipe": ".recipe", "PRESETS": ".config.scheme", "QuantArgs": ".config.scheme", "QuantScheme": ".config.scheme"}


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, globals())

__all__ = ["quantize", "convert_checkpoint", "ConvertRequest", "evaluate_paths", "evaluate_checkpoint",
           "deployment_plan", "PlanRequest", "quantize_model_free", "ModelFreeOptions", "ConvertOptions", "load", "QuantizedModel", "Recipe", "load_recipe", "QuantArgs", "QuantScheme", "PRESETS", "QuantkitError", "__version__"]
