"""A tiny random-initialisable config for every architecture in quantkit's table (tests only)."""

from __future__ import annotations


def tiny_config(arch: str, kv_heads: int = 2):
    from transformers import (Gemma3TextConfig, LlamaConfig, MistralConfig, MixtralConfig, Phi3Config, Qwen2Config,
                              Qwen2MoeConfig, Qwen3Config, Qwen3MoeConfig)

    common = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=256)
    if arch == "LlamaForCausalLM":
        return LlamaConfig(**common)
    if arch == "MistralForCausalLM":
        return MistralConfig(**common, sliding_window=6)
    if arch == "Qwen2ForCausalLM":
        return Qwen2Config(**common)
    if arch == "Qwen3ForCausalLM":
        return Qwen3Config(**common, head_dim=8)
    if arch == "Gemma3ForCausalLM":
        return Gemma3TextConfig(**common, head_dim=8, sliding_window=6,
                                layer_types=["sliding_attention", "full_attention"])
    if arch == "Phi3ForCausalLM":
        return Phi3Config(**common, pad_token_id=0)
    if arch == "Qwen2MoeForCausalLM":
        return Qwen2MoeConfig(**common, moe_intermediate_size=32, shared_expert_intermediate_size=64, num_experts=4,
                              num_experts_per_tok=2)
    if arch == "Qwen3MoeForCausalLM":
        return Qwen3MoeConfig(**common, head_dim=8, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2)
    if arch == "MixtralForCausalLM":
        return MixtralConfig(**common, num_local_experts=4, num_experts_per_tok=2)
    raise AssertionError(f"no tiny config for {arch}: add one when adding an architecture")
