"""quantkit: post-training quantization for LLMs.

    >>> import quantkit
    >>> q = quantkit.quantize(None, "w8a16")        # None: the embedded SmolLM2-135M
    >>> q.save("out/smollm2-w8a16")
    >>> model = quantkit.load("out/smollm2-w8a16")
"""

__version__ = "0.1.0"

from .api import QuantizedModel, quantize
from .errors import QuantkitError
from .loader import load
from .recipe import Recipe, load_recipe
from .scheme import PRESETS, QuantArgs, QuantScheme

__all__ = ["quantize", "load", "QuantizedModel", "Recipe", "load_recipe", "QuantArgs", "QuantScheme", "PRESETS", "QuantkitError", "__version__"]
