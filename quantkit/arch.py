"""Architecture knowledge, in one table keyed by the Hugging Face class name.

Everything the pipeline and the algorithms need to know about a model family lives here:
where the decoder layers are, the true-sequential order of a layer's linears, which norm
feeds which linears (for smoothing/AWQ scales), and where the attention k/v projections are.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import QuantkitError

_LLAMA_SUBGROUPS = (
    ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    ("self_attn.o_proj",),
    ("mlp.gate_proj", "mlp.up_proj"),
    ("mlp.down_proj",),
)


@dataclass(frozen=True)
class ArchSpec:
    layers: str = "model.layers"
    subgroups: tuple[tuple[str, ...], ...] = _LLAMA_SUBGROUPS
    # (norm or producer, linears it feeds): where smoothing scales can be folded.
    smooth_mappings: tuple[tuple[str, tuple[str, ...]], ...] = (
        ("input_layernorm", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
        ("self_attn.v_proj", ("self_attn.o_proj",)),
        ("post_attention_layernorm", ("mlp.gate_proj", "mlp.up_proj")),
        ("mlp.up_proj", ("mlp.down_proj",)),
    )
    attention: str = "self_attn"
    k_proj: str = "self_attn.k_proj"
    v_proj: str = "self_attn.v_proj"
    # RMSNorm computes x * (offset + weight): Gemma uses 1, so folded scales must account for it.
    norm_weight_offset: float = 0.0
    # Several calibration samples may share a row: the model builds a block-causal mask from
    # position ids that restart at 0 (transformers' packed-sequence masks), so each sample
    # attends only to itself. tests/test_packed_calibration.py checks it per architecture.
    packed_calibration: bool = True


_GEMMA3 = ArchSpec(
    smooth_mappings=(
        ("input_layernorm", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
        ("self_attn.v_proj", ("self_attn.o_proj",)),
        ("pre_feedforward_layernorm", ("mlp.gate_proj", "mlp.up_proj")),
        ("mlp.up_proj", ("mlp.down_proj",)),
    ),
    norm_weight_offset=1.0,
)

ARCHITECTURES: dict[str, ArchSpec] = {
    "LlamaForCausalLM": ArchSpec(),
    "MistralForCausalLM": ArchSpec(),
    "Qwen2ForCausalLM": ArchSpec(),
    "Qwen3ForCausalLM": ArchSpec(),
    "Gemma3ForCausalLM": _GEMMA3,
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
