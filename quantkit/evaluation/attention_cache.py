"""The attention cache of a model as the memory account needs it, derived from the model itself.

A config says how many heads a layer caches; it does not say which layers attend (a hybrid's
linear-attention and state-space layers keep a fixed state, not a growing cache) or that an MLA
engine caches one latent vector instead of per-head keys and values. ``arch_for`` knows both.
"""

from __future__ import annotations

from pathlib import Path

from quantkit.arch.lookup import arch_for
from quantkit.errors import QuantkitError
from quantkit.serving.memory_account import AttentionCache


def attention_cache(model: str | Path | dict) -> AttentionCache | None:
    """The cache of the model in folder ``model`` (None for a config dict, or for a family whose
    structure cannot be derived: the account then counts every layer's heads, as the config says)."""
    if isinstance(model, dict):
        return None
    from transformers import AutoConfig

    path = Path(model)
    folder = path if path.is_dir() else path.parent
    try:
        config = AutoConfig.from_pretrained(folder)
        spec = arch_for(config)[1]
    except (QuantkitError, ValueError, OSError):
        return None
    layers = config.get_text_config().num_hidden_layers
    kv_layers = layers if spec.attention_layers is None else len(spec.attention_layers)
    latent = spec.kv_latent(config) if spec.kv_latent is not None else None
    if kv_layers == layers and latent is None:
        return None
    return AttentionCache(kv_layers, latent)
