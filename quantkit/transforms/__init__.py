"""Transforms: steps that change the float model before it is quantized, with the same output
(smoothing scales folded into the producers, AWQ's searched scales, Hadamard rotations). Registered like the
quantizers (``quantkit.steps``); ``fold.py`` folds scales, ``observe.py`` gathers the statistics
and sub-module replays the searches run on."""

from quantkit.transforms import awq, rotate, smoothquant

__all__ = ["awq", "rotate", "smoothquant"]
