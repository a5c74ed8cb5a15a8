"""The names a checkpoint stores tensors under, against the names of the model's modules.

transformers 5 renames some families' checkpoint keys when it loads them (Qwen2.5-VL's
``model.layers`` become ``model.language_model.layers``) and reverses the renaming when it saves.
quantkit works on module names and writes the source's own names back: the output then loads
wherever the source did. Only renamings are followed; keys a converter would merge keep their
names, and the layout check refuses what has no place. A renamed fused experts tensor (Granite 4's
``input_linear.weight``) has no parameter of the unfused model to land on, so the caller accepts
it by name and reads it per expert (``pipeline/fused_experts.py``).
"""

from __future__ import annotations

from typing import Callable, Iterable

from torch import nn


def module_names(model: nn.Module, keys: Iterable[str], also: Callable[[str], bool] | None = None) -> dict[str, str]:
    """``{checkpoint key: module name}`` for the keys transformers renames when it loads ``model``
    (empty when it renames none); a renamed key counts when the model has it, or ``also`` accepts
    it (a fused experts tensor the unfused model no longer holds)."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightRenaming, rename_source_key

    renamings = [t for t in get_model_conversion_mapping(model) if type(t) is WeightRenaming]
    if not renamings:
        return {}
    state = model.state_dict()
    out = {}
    for key in keys:
        renamed, _ = rename_source_key(key, renamings, [], model.base_model_prefix, state)
        if renamed != key and (renamed in state or (also is not None and also(renamed))):
            out[key] = renamed
    return out
