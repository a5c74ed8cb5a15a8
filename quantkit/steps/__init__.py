"""The step contract every quantizer and transform implements, and the registry a recipe names
them by. Importing ``quantkit.quantizers`` and ``quantkit.transforms`` fills the registry (each
folder's ``__init__`` imports its members); ``quantkit.recipe`` imports both."""

from quantkit.steps.base import (ALGORITHMS, Algorithm, LayerContext, QuantizedWeight, Step, Transform, TransformResult,
                                 build_algorithm, register_algorithm)

__all__ = ["ALGORITHMS", "Algorithm", "LayerContext", "QuantizedWeight", "Step", "Transform", "TransformResult",
           "build_algorithm", "register_algorithm"]
