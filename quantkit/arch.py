"""Architecture knowledge, in one table keyed by the Hugging Face class name.

Everything the pipeline and the algorithms need to know about a model family lives here:
where the decoder layers are, the true-sequential order of a layer's linears, which norm
feeds which linears (for smoothing/AWQ scales), and where the attention k/v projections are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .errors import QuantkitError

_LLAMA_SUBGROUPS = (
    ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    ("self_attn.o_proj",),
    ("mlp.gate_proj", "mlp.up_proj"),
    ("mlp.down_proj",),
)


@dataclass(frozen=True)
class SmoothMapping:
    """A place where per-channel scales fold away: ``smooth``'s outputs / s, ``balance``'s inputs * s.

    ``smooth`` is a norm (its weight, offset-aware, and bias are divided) or a producer
    linear (its output rows and bias are divided; ``rows(config)`` picks the rows of a fused
    producer, e.g. the v part of Phi3's ``qkv_proj``). ``parent`` is the smallest module
    holding every balance linear: AWQ's search loss is the error of its output. The fold
    checks that the shapes match. ``kv_heads(config) -> (kv heads, head_dim)`` marks the
    smooth channels as value heads: under grouped-query attention each value head feeds
    ``heads / kv_heads`` query heads' columns of ``o_proj``, so one scale per value channel
    multiplies all of its copies (attention is linear in the values).
    """

    smooth: str
    balance: tuple[str, ...]
    parent: str
    rows: Callable[[Any], tuple[int, int]] | None = None
    kv_heads: Callable[[Any], tuple[int, int]] | None = None


def _head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _kv_layout(config) -> tuple[int, int]:
    return config.num_key_value_heads, _head_dim(config)


_LLAMA_MAPPINGS = (
    SmoothMapping("input_layernorm", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), "self_attn"),
    SmoothMapping("self_attn.v_proj", ("self_attn.o_proj",), "self_attn.o_proj", kv_heads=_kv_layout),
    SmoothMapping("post_attention_layernorm", ("mlp.gate_proj", "mlp.up_proj"), "mlp"),
    SmoothMapping("mlp.up_proj", ("mlp.down_proj",), "mlp.down_proj"),
)


def _phi3_v_rows(config) -> tuple[int, int]:
    start = (config.num_attention_heads + config.num_key_value_heads) * _head_dim(config)
    return start, start + config.num_key_value_heads * _head_dim(config)


def _phi3_up_rows(config) -> tuple[int, int]:
    return config.intermediate_size, 2 * config.intermediate_size  # gate_up_proj: [gate; up]


# Linears that must share one quantization format: serving engines fuse them into one
# matrix (vLLM's qkv_proj and gate_up_proj) and refuse shards with different schemes.
_LLAMA_FUSED = (
    ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    ("mlp.gate_proj", "mlp.up_proj"),
)


@dataclass(frozen=True)
class ArchSpec:
    layers: str = "model.layers"
    subgroups: tuple[tuple[str, ...], ...] = _LLAMA_SUBGROUPS
    # linears of a decoder layer that a mixed-precision plan gives one format (see _LLAMA_FUSED);
    # every other target linear is planned on its own
    fused: tuple[tuple[str, ...], ...] = _LLAMA_FUSED
    # where smoothing / AWQ scales can be folded (SmoothMapping)
    smooth_mappings: tuple[SmoothMapping, ...] = _LLAMA_MAPPINGS
    attention: str = "self_attn"
    k_proj: str | None = "self_attn.k_proj"
    v_proj: str | None = "self_attn.v_proj"
    # RMSNorm computes x * (offset + weight): Gemma uses 1, so folded scales must account for it.
    norm_weight_offset: float = 0.0
    # Several calibration samples may share a row: the model builds a block-causal mask from
    # position ids that restart at 0 (transformers' packed-sequence masks), so each sample
    # attends only to itself. tests/test_packed_calibration.py checks it per architecture.
    packed_calibration: bool = True


_GEMMA3 = ArchSpec(
    smooth_mappings=(
        _LLAMA_MAPPINGS[0],
        _LLAMA_MAPPINGS[1],
        SmoothMapping("pre_feedforward_layernorm", ("mlp.gate_proj", "mlp.up_proj"), "mlp"),
        _LLAMA_MAPPINGS[3],
    ),
    norm_weight_offset=1.0,
)

# Phi3 fuses q/k/v into qkv_proj ([q; k; v] rows) and gate/up into gate_up_proj ([gate; up]).
_PHI3 = ArchSpec(
    subgroups=(("self_attn.qkv_proj",), ("self_attn.o_proj",), ("mlp.gate_up_proj",), ("mlp.down_proj",)),
    smooth_mappings=(
        SmoothMapping("input_layernorm", ("self_attn.qkv_proj",), "self_attn"),
        SmoothMapping("self_attn.qkv_proj", ("self_attn.o_proj",), "self_attn.o_proj", rows=_phi3_v_rows,
                      kv_heads=_kv_layout),
        SmoothMapping("post_attention_layernorm", ("mlp.gate_up_proj",), "mlp"),
        SmoothMapping("mlp.gate_up_proj", ("mlp.down_proj",), "mlp.down_proj", rows=_phi3_up_rows),
    ),
    fused=(),   # already one matrix each
    k_proj=None,
    v_proj=None,
)

ARCHITECTURES: dict[str, ArchSpec] = {
    "LlamaForCausalLM": ArchSpec(),
    "MistralForCausalLM": ArchSpec(),
    "Qwen2ForCausalLM": ArchSpec(),
    "Qwen3ForCausalLM": ArchSpec(),
    "Gemma3ForCausalLM": _GEMMA3,
    "Phi3ForCausalLM": _PHI3,
}


def arch_for(config, where: str = "config.json") -> tuple[str, ArchSpec]:
    """The architecture spec for a transformers config, or a one-line error."""
    names = list(getattr(config, "architectures", None) or [])
    for name in names:
        if name in ARCHITECTURES:
            return name, ARCHITECTURES[name]
    shown = names[0] if names else getattr(config, "model_type", "unknown")
    raise QuantkitError(
        f"{where}: unsupported architecture '{shown}' (supported: {', '.join(ARCHITECTURES)})"
    )
