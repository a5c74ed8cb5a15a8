"""Dematerialising a module frees every parameter, a tied head included."""

from __future__ import annotations

from transformers import LlamaConfig, LlamaForCausalLM

from quantkit.pipeline.onload import dematerialize


def test_a_tied_head_is_dematerialised_with_the_embedding():
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=True)
    model = LlamaForCausalLM(config)
    assert model.lm_head.weight is model.model.embed_tokens.weight   # tied: one Parameter, two names
    dematerialize(model)
    # before the fix the head kept the real embedding (108 MiB on SmolLM2) through the whole run
    real = [n for n, p in model.named_parameters(remove_duplicate=False) if not p.is_meta]
    assert real == []
    assert model.lm_head.weight.is_meta and model.model.embed_tokens.weight.is_meta
