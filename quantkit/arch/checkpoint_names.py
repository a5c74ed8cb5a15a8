"""The names a checkpoint stores tensors under, against the names of the model's modules.

transformers 5 renames some families' checkpoint keys when it loads them (Qwen2.5-VL's
``model.layers`` become ``model.language_model.layers``) and reverses the renaming when it saves.
quantkit works on module names and writes the source's own names back: the output then loads
wherever the source did. Only renamings are followed; keys a converter would merge (experts
stored fused on disk) keep their names, and the layout check refuses what has no place.
"""

from __future__ import annotations

from typing import Iterable

from torch import nn


def module_names(model: nn.Module, keys: Iterable[str]) -> dict[str, str]:
    """``{checkpoint key: module name}`` for the keys transformers renames when it loads ``model``
    (empty when it renames none)."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightRenaming, rename_source_key

    renamings = [t for t in get_model_conversion_mapping(model) if type(t) is WeightRenaming]
    if not renamings:
        return {}
    state = model.state_dict()
    out = {}
    for key in keys:
        renamed, _ = rename_source_key(key, renamings, [], model.base_model_prefix, state)
        if renamed != key and renamed in state:
            out[key] = renamed
    return out
