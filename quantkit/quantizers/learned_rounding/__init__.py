"""Learned rounding (Cheng et al., 2023, "Optimize Weight Rounding via Signed Gradient Descent
for the Quantization of LLMs"; AutoRound's algorithm).

Per decoder layer, every target weight's rounding offsets (one per element, in [-0.5, 0.5])
and each scale group's clip factors on its min and max (in [0.5, 1]) are learned together by
signed gradient descent, against the float layer's output on the calibration rows; the codes
are then written on the learned scales, the same checkpoint format as RTN's and GPTQ's. Every
number format comes from the format axis (``numerics/number_formats``: its differentiable
fake-quantization with a rounding offset and clip factors, its scales and codes). One concept
per module:

- ``signround``: the optimisation itself (the straight-through round, ``sign_sgd``), free of
  any model or format.
- ``block``: a decoder layer as a function of its target weights over its calibration rows.
- ``step``: ``LearnedRounding``, the registered quantizer (recipe options, presets).
"""

from quantkit.quantizers.learned_rounding.signround import (RoundingParams, SignRoundResult, SignRoundSettings,
                                                           sign_sgd)
from quantkit.quantizers.learned_rounding.step import PRESETS, LearnedRounding

__all__ = ["LearnedRounding", "PRESETS", "RoundingParams", "SignRoundResult", "SignRoundSettings", "sign_sgd"]
