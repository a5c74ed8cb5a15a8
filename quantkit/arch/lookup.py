"""The architecture of any model: the table's entry where it names the class, else derived.

Every part of quantkit asks here (``arch_for``); none keeps knowledge of projections of its own.
"""

from __future__ import annotations

from dataclasses import replace

from quantkit.arch.derive import derive_spec
from quantkit.arch.families import family_fields
from quantkit.arch.meta import traceable_model
from quantkit.arch.spec import ArchSpec
from quantkit.arch.table import named_entry
from quantkit.errors import QuantkitError

# A derivation traces the whole model once; conversions, loads and evaluations ask again.
_DERIVED: dict[str, ArchSpec] = {}


def arch_for(config, where: str = "config.json") -> tuple[str, ArchSpec]:
    """``(class name, spec)`` for a transformers config: named in the table, or derived from the
    model it describes (a one-line ``QuantkitError`` naming ``where`` when it cannot be)."""
    found = named_entry(config)
    if found is not None:
        return found
    names = list(getattr(config, "architectures", None) or [])
    shown = names[0] if names else getattr(config, "model_type", "unknown")
    key = config.to_json_string(use_diff=False)
    if key not in _DERIVED:
        try:
            model = traceable_model(config)
        except Exception as e:  # transformers' own refusal: it names what is wrong with the config
            raise QuantkitError(f"{where}: transformers cannot build '{shown}' ({type(e).__name__}: "
                                f"{str(e).splitlines()[0][:200] if str(e) else ''})") from None
        fields = family_fields(config)
        _DERIVED[key] = replace(derive_spec(model, config, fields.get("moe")), **fields)
    return shown, _DERIVED[key]
