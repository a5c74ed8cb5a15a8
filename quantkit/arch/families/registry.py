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
    for name in getattr(config, "architectures", None) or []:
        if name in FAMILY_FIELDS:
            return FAMILY_FIELDS[name]
    return {}
