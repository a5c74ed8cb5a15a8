"""Transforms: steps that change the float model before it is quantized, with the same output
(smoothing scales folded into the producers, AWQ's searched scales). Registered like the
quantizers (``quantkit.steps``); ``fold.py`` folds scales, ``observe.py`` gathers the statistics
and sub-module replays the searches run on."""

from quantkit.transforms import awq, smoothquant

__all__ = ["awq", "smoothquant"]
