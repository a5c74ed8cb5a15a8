"""The number-format axis: one contract (``base.py``), one file per format, one registry.

``number_format(args)`` gives the format a weight's ``QuantArgs`` name; importing this package
registers every format.
"""

from quantkit.numerics.number_formats import fp8, integer, mxfp4, nvfp4  # noqa: F401  (each registers itself)
from quantkit.numerics.number_formats.base import (CLIP_GRID, CLIP_GROW_GRID, CLIP_MAX_GROW, CLIP_MAX_SHRINK, FORMATS,
                                                   Clip, NumberFormat, QParams, clip_candidates, format_name,
                                                   importance_clip, number_format, register_format, straight_through)

__all__ = ["CLIP_GRID", "CLIP_GROW_GRID", "CLIP_MAX_GROW", "CLIP_MAX_SHRINK", "FORMATS", "Clip", "NumberFormat",
           "QParams", "clip_candidates", "format_name", "importance_clip", "number_format", "register_format",
           "straight_through"]
