"""Which tensors of a checkpoint a model-free conversion quantizes, told from their names alone.

No model is built, so nothing says which tensor is a Linear's weight: a tensor is a target when it
is a 2-D ``.weight`` whose module name matches the target rule (a regular expression, matched
from the start of the name as compressed-tensors matches ``re:`` targets). The default rule
takes every 2-D weight inside a decoder layer (``...layers.N.``, ``...h.N.``, ``...blocks.N.``)
except norms, routers and scalar gates (their outputs are a handful of expert logits or one
gate value: engines keep them in high precision) and anything inside a vision or audio tower.
Embeddings and the output head lie outside the decoder layers and stay as they are.

>>> rule = target_rule(None)
>>> [bool(rule.match(n)) for n in ("model.layers.0.self_attn.q_proj", "model.layers.0.mlp.gate",
...                                 "model.layers.3.input_layernorm", "model.visual.blocks.0.attn.qkv",
...                                 "model.embed_tokens", "lm_head", "model.layers.1.mlp.shared_expert_gate")]
[True, False, False, False, False, False, False]
>>> layer_unit("model.layers.12.mlp.down_proj.weight")
('model.layers', 12)
"""

from __future__ import annotations

import re

from quantkit.errors import QuantkitError

_TOWERS = r"vision_tower|vision_model|visual|vision|image_encoder|audio_tower|audio_model|multi_modal_projector|mm_projector"
#: The default target rule, over module names (a tensor's name without ``.weight``).
DEFAULT_TARGETS = (
    rf"^(?!(?:.*\.)?(?:{_TOWERS})\.)"           # not inside a vision or audio tower
    r"(?:.*?\.)?(?:layers|h|blocks)\.\d+\."     # inside a decoder layer
    r"(?!(?:.*\.)?[^.]*norm[^.]*$)"            # not a norm
    r"(?!(?:.*\.)?(?:gate|router|[^.]*_gate)$)"  # not a router or a scalar gate (gate_proj is a linear)
    r".+$"
)
# the first "<prefix>.<index>." a name holds: a tower's layers are units too (written in the same order)
_UNIT = re.compile(r"^(?P<prefix>(?:.*?\.)?(?:layers|h|blocks))\.(?P<index>\d+)\.")
_EMBEDDING = re.compile(r"(?:^|\.)(?:[^.]*embed[^.]*|wte|wpe)$")
_NORM = re.compile(r"(?:^|\.)[^.]*norm[^.]*$")


def target_rule(rule: str | None, flag: str = "--targets") -> re.Pattern:
    """The compiled target rule (``None``: ``DEFAULT_TARGETS``), or one line naming ``flag``."""
    if rule is None:
        return re.compile(DEFAULT_TARGETS)
    if not isinstance(rule, str) or not rule.strip():
        raise QuantkitError(f"{flag}: a regular expression over module names, got {rule!r}")
    try:
        return re.compile(rule)
    except re.error as e:
        raise QuantkitError(f"{flag}: {rule!r} is not a regular expression ({e})") from None


def module_of(key: str) -> str | None:
    """The module a 2-D candidate belongs to: ``key`` without ``.weight`` (None: not a weight)."""
    return key[: -len(".weight")] if key.endswith(".weight") else None


def layer_unit(key: str) -> tuple[str, int] | None:
    """``(layers prefix, index)`` of the layer holding ``key``, or None outside every layer."""
    m = _UNIT.match(key)
    return None if m is None else (m["prefix"], int(m["index"]))


def kept_linear(module: str) -> bool:
    """Whether a 2-D weight left unquantized belongs in the format's ``ignore`` list: any
    linear an engine would otherwise take as quantized; embeddings and norms are no linears."""
    return _EMBEDDING.search(module) is None and _NORM.search(module) is None
