"""The families whose knowledge cannot all be derived, keyed by the Hugging Face class name.

Where the decoder layers are, the true-sequential order of a layer's linears, which norm feeds
which linears: ``derive.py`` finds these for any model. An entry here adds what a trace cannot
show (a value head's fold into ``o_proj`` under grouped-query attention, a fused producer's rows,
the residual writers a rotation turns, MoE checkpoint names, packed-row masks checked by
tests/pipeline/test_packed_calibration.py). Every entry is checked against its own derivation in the tests.
"""

from __future__ import annotations

from quantkit.arch.spec import _LLAMA_FUSED, _LLAMA_MAPPINGS, _LLAMA_SUBGROUPS, ArchSpec, MoESpec, SmoothMapping, \
    _head_dim, _kv_layout

def _phi3_v_rows(config) -> tuple[int, int]:
    start = (config.num_attention_heads + config.num_key_value_heads) * _head_dim(config)
    return start, start + config.num_key_value_heads * _head_dim(config)


def _phi3_up_rows(config) -> tuple[int, int]:
    return config.intermediate_size, 2 * config.intermediate_size  # gate_up_proj: [gate; up]


_GEMMA3 = ArchSpec(
    smooth_mappings=(
        _LLAMA_MAPPINGS[0],
        _LLAMA_MAPPINGS[1],
        SmoothMapping("pre_feedforward_layernorm", ("mlp.gate_proj", "mlp.up_proj"), "mlp"),
        _LLAMA_MAPPINGS[3],
    ),
    norm_weight_offset=1.0,
    residual_rotation_blocked=("its post-attention and post-feedforward norms scale what o_proj and down_proj "
                               "write before the residual add, so a residual rotation cannot fold into the weights"),
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

# Attention as in Llama; the MLP is a sparse MoE block. AWQ / SmoothQuant fold into the attention
# mappings only: the post-attention norm also feeds the router, whose columns no mapping balances.
_MOE_ATTENTION = _LLAMA_SUBGROUPS[:2]
_MOE_ROTATION = "the router and every expert read the post-attention norm; quantkit rotates dense MLPs only"
_QWEN3_MOE = ArchSpec(subgroups=_MOE_ATTENTION, fused=_LLAMA_FUSED[:1], smooth_mappings=_LLAMA_MAPPINGS[:2],
                      moe=MoESpec(), residual_rotation_blocked=_MOE_ROTATION)
# Qwen2-MoE adds a shared expert (a dense MLP beside the routed experts, scaled by a sigmoid gate)
_QWEN2_MOE = ArchSpec(subgroups=_MOE_ATTENTION + (("mlp.shared_expert.gate_proj", "mlp.shared_expert.up_proj"),
                                                  ("mlp.shared_expert.down_proj",)),
                      fused=_LLAMA_FUSED[:1], smooth_mappings=_LLAMA_MAPPINGS[:2],
                      moe=MoESpec(keep=("shared_expert_gate",)), residual_rotation_blocked=_MOE_ROTATION)
_MIXTRAL = ArchSpec(subgroups=_MOE_ATTENTION, fused=_LLAMA_FUSED[:1], smooth_mappings=_LLAMA_MAPPINGS[:2],
                    moe=MoESpec(checkpoint_block="block_sparse_moe", linears=("w1", "w3", "w2")),
                    residual_rotation_blocked=_MOE_ROTATION)

ARCHITECTURES: dict[str, ArchSpec] = {
    "LlamaForCausalLM": ArchSpec(),
    "MistralForCausalLM": ArchSpec(),
    "Qwen2ForCausalLM": ArchSpec(),
    "Qwen3ForCausalLM": ArchSpec(),
    "Gemma3ForCausalLM": _GEMMA3,
    "Phi3ForCausalLM": _PHI3,
    "Qwen2MoeForCausalLM": _QWEN2_MOE,
    "Qwen3MoeForCausalLM": _QWEN3_MOE,
    "MixtralForCausalLM": _MIXTRAL,
}


def named_entry(config) -> tuple[str, ArchSpec] | None:
    """``(class name, spec)`` when one of the config's ``architectures`` is in the table."""
    for name in getattr(config, "architectures", None) or []:
        if name in ARCHITECTURES:
            return name, ARCHITECTURES[name]
    return None
