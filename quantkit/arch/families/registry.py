"""The registry of family files: class name -> the ``ArchSpec`` fields the family sets."""

from __future__ import annotations

from typing import Any

FAMILY_FIELDS: dict[str, dict[str, Any]] = {}


def register_family(*class_names: str, **fields: Any) -> None:
    """Record ``fields`` for every class in ``class_names`` (set over the derived spec)."""
    for name in class_names:
        FAMILY_FIELDS[name] = dict(fields)


def family_fields(config) -> dict[str, Any]:
    """The fields a family file sets for ``config``'s architecture (none for most families)."""
    for name in getattr(config, "architectures", None) or _causal_lm_class(config):
        if name in FAMILY_FIELDS:
            return FAMILY_FIELDS[name]
    return {}


def _causal_lm_class(config) -> list[str]:
    """The causal-LM class transformers builds for a config that names no ``architectures`` (one
    built in memory rather than read from ``config.json``)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(getattr(config, "model_type", None))
    return [name] if isinstance(name, str) else []
