"""Per-family knowledge a trace cannot show, one small file per family, applied over the derived spec.

A file registers the Hugging Face class names it covers and the ``ArchSpec`` fields it sets;
everything else still comes from the model's own traced forward (``arch/derive.py``).
"""

from __future__ import annotations

from quantkit.arch.families.registry import FAMILY_FIELDS, family_fields

# the family files register themselves on import
from quantkit.arch.families import deepseek_v3, gpt_oss, llama4  # noqa: F401,E402

__all__ = ["FAMILY_FIELDS", "family_fields"]
