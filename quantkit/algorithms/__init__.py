"""Quantization algorithms. Each module registers itself in ``ALGORITHMS`` when imported."""

from .base import (ALGORITHMS, Algorithm, LayerContext, QuantizedWeight, Step, Transform, TransformResult,
                   build_algorithm, register_algorithm)

# The built-in algorithms; an optional one that fails to import does not break the others.
_BUILTIN = ("rtn", "gptq", "awq", "smoothquant")


def ensure_registered() -> None:
    import importlib

    for mod in _BUILTIN:
        try:
            importlib.import_module(f"{__name__}.{mod}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{mod}":
                raise


__all__ = ["ALGORITHMS", "Algorithm", "LayerContext", "QuantizedWeight", "Step", "Transform", "TransformResult",
           "build_algorithm", "register_algorithm"]
