"""The ``rotate`` step: hadamard_rotations.py's Hadamard rotations as the first step of a recipe's chain.

Inside each decoder layer the step folds the rotations into the layer before the other steps
search on it; the residual rotation's parts outside the layers (embedding, final norm, LM head)
are the pipeline's to write (pipeline/rotated_source.py), from the same matrices. No search:
the matrices follow from the sizes and ``seed``, so a resumed or data-parallel run folds the same;
the result records the signs (``transforms/layer-*.safetensors``), from which ``apply`` builds them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from quantkit.errors import QuantkitError

from quantkit.steps.base import LayerContext, Transform, TransformResult, register_algorithm
from quantkit.transforms.hadamard_rotations import Rotations, matrices_of, rotate_layer, rotation_signs


@register_algorithm("rotate")
@dataclass
class Rotate(Transform):
    """Randomised Hadamard rotations folded into the weights (transforms/hadamard_rotations.py)."""

    requires_calibration: ClassVar[bool] = False
    must_be_first: ClassVar[bool] = True

    residual: bool = True       # the residual stream (embedding, norms' readers, o_proj/down_proj rows, LM head)
    heads: bool = True          # each value head (v_proj rows, o_proj columns)
    seed: int | None = 0        # random signs of the Hadamard matrices; null for plain ones

    def __post_init__(self) -> None:
        if self.seed is not None and not 0 <= self.seed < 2**63:   # what torch.Generator takes
            raise QuantkitError(f"seed: must be in [0, 2^63), or null, got {str(self.seed)[:30]}")

    @property
    def rotations(self) -> Rotations:
        return Rotations(self.residual, self.heads, self.seed)

    def search(self, ctx: LayerContext) -> TransformResult:
        found = rotation_signs(ctx.config, self.rotations)
        return TransformResult({f"signs.{k}": v.to(torch.int8) for k, v in found.items()},
                               {"residual": self.residual, "heads": self.heads, "seed": self.seed})

    def apply(self, ctx: LayerContext, result: TransformResult) -> None:
        q, h = matrices_of({k.removeprefix("signs."): v for k, v in result.tensors.items()})
        rotate_layer(ctx.layer, ctx.arch, ctx.config, q, h)
