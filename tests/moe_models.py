"""Tiny random-initialised MoE models (Qwen3-MoE, Mixtral, Qwen2-MoE) saved as Hugging Face folders, for tests."""

from __future__ import annotations

from pathlib import Path

import torch

MOE_ARCHS = ("Qwen3MoeForCausalLM", "MixtralForCausalLM", "Qwen2MoeForCausalLM")
NUM_EXPERTS = 4


def moe_config(arch: str, num_layers: int = 2, experts: int = NUM_EXPERTS, top_k: int = 2):
    from transformers import MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig

    common = dict(vocab_size=256, hidden_size=64, num_hidden_layers=num_layers, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512, num_experts_per_tok=top_k,
                  tie_word_embeddings=False)
    if arch == "Qwen3MoeForCausalLM":
        return Qwen3MoeConfig(**common, head_dim=16, intermediate_size=128, moe_intermediate_size=64,
                              num_experts=experts, norm_topk_prob=True)
    if arch == "Qwen2MoeForCausalLM":   # with a shared expert beside the routed ones
        return Qwen2MoeConfig(**common, intermediate_size=128, moe_intermediate_size=64, num_experts=experts,
                              shared_expert_intermediate_size=64, norm_topk_prob=True)
    if arch == "MixtralForCausalLM":
        return MixtralConfig(**common, intermediate_size=64, num_local_experts=experts)
    raise AssertionError(f"no tiny MoE config for {arch}")


def make_moe_dir(path: Path, arch: str, starve: bool = False, seed: int = 0, **kw) -> Path:
    """Save a random MoE of ``arch`` (its weights N(0, 0.05), so quantization error shows).

    ``starve``: every token's hidden state is dominated by one channel of constant sign (a
    large embedding column) and each router reads only that channel, ranking experts 0, 1, ...
    in that order: under top-k routing the last ``experts - top_k`` experts never get a token.
    """
    from transformers import AutoModelForCausalLM

    cfg = moe_config(arch, **kw)
    cfg.architectures = [arch]
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                p.normal_(0, 0.05)
        if starve:
            model.model.embed_tokens.weight[:, 0] = 4.0
            for layer in model.model.layers:
                router = layer.mlp.gate.weight
                router.zero_()
                router[:, 0] = torch.linspace(2.0, -2.0, router.shape[0])
    model.save_pretrained(path)
    return path


def make_streamed_moe_dir(path: Path, cfg, shard_bytes: float = 200e6, seed: int = 0) -> Path:
    """Save a random model of ``cfg`` shard by shard under the checkpoint's own names (per-expert
    keys, as quantkit's skeleton lists them): never more than one shard in memory, so an MoE whose
    single layer is larger than a memory cap can be built beside it. Norms are ones, the rest
    N(0, 0.05)."""
    from model_factory import save_random_shards
    from quantkit.pipeline.onload import build_skeleton

    path.mkdir(parents=True)
    cfg.save_pretrained(path)
    shapes = {name: (tuple(p.shape), p.dtype) for name, p in build_skeleton(cfg).named_parameters()}
    save_random_shards(path, shapes, 0.05, shard_bytes, seed)
    return path
