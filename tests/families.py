"""Tiny random models of families quantkit's architecture table does not name, built from
transformers' own config classes (tests and the families benchmark)."""

from __future__ import annotations

from pathlib import Path

import torch

# Widths divide every group size the recipes use (64, 128) wherever a linear reads them.
TEXT = dict(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False)
_MOE = dict(moe_intermediate_size=128, num_experts_per_tok=2)

# family -> (transformers config class, its arguments beyond TEXT)
FAMILIES: dict[str, tuple[str, dict]] = {
    # named in the brief
    "DeepSeek-V3": ("DeepseekV3Config", dict(_MOE, n_routed_experts=4, first_k_dense_replace=1, kv_lora_rank=64,
                                             q_lora_rank=64, qk_rope_head_dim=32, qk_nope_head_dim=32,
                                             v_head_dim=64, n_group=1, topk_group=1, head_dim=32,
                                             num_key_value_heads=4,   # MLA: one latent read by every head
                                             topk_method="noaux_tc")),   # as DeepSeek-V3's own config.json says
    "GLM-4.5": ("Glm4MoeConfig", dict(_MOE, n_routed_experts=4, first_k_dense_replace=1, n_group=1, topk_group=1,
                                      head_dim=32)),
    "Qwen3-Next": ("Qwen3NextConfig", dict(_MOE, num_experts=4, shared_expert_intermediate_size=128, head_dim=32,
                                           linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=32,
                                           linear_value_head_dim=32, num_hidden_layers=4)),
    "gpt-oss": ("GptOssConfig", dict(num_local_experts=4, num_experts_per_tok=2, head_dim=32)),
    "Llama 4 (text)": ("Llama4TextConfig", dict(num_local_experts=4, num_experts_per_tok=1, intermediate_size_mlp=256,
                                                head_dim=32)),
    "Granite 4 (Mamba hybrid)": ("GraniteMoeHybridConfig", dict(num_local_experts=4, num_experts_per_tok=2,
                                                                shared_intermediate_size=256, mamba_d_state=16,
                                                                mamba_n_heads=8, mamba_d_head=32, mamba_expand=2,
                                                                layer_types=["mamba", "attention"])),
    # named nowhere in quantkit
    "OLMo 2": ("Olmo2Config", {}),
    "Granite 3": ("GraniteConfig", {}),
    "Command R (Cohere)": ("CohereConfig", {}),
    "StarCoder2": ("Starcoder2Config", {}),
    "EXAONE 4": ("Exaone4Config", dict(head_dim=32)),
    "SmolLM3": ("SmolLM3Config", {}),
    "Helium": ("HeliumConfig", dict(head_dim=32)),
    "GLM-4": ("Glm4Config", dict(head_dim=32)),
}

# the vision-language wrappers: (config class, text arguments, vision arguments, other arguments)
_VISION = dict(depth=2, hidden_size=64, intermediate_size=128, num_heads=2, out_hidden_size=128)
VISION_FAMILIES: dict[str, tuple[str, dict, dict, dict]] = {
    "Qwen2.5-VL": ("Qwen2_5_VLConfig", dict(rope_scaling={"type": "mrope", "mrope_section": [4, 6, 6]}),
                   dict(_VISION, patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=56,
                        fullatt_block_indexes=[1]),
                   dict(image_token_id=250, video_token_id=251, vision_start_token_id=252, vision_end_token_id=253)),
    "Qwen3-VL": ("Qwen3VLConfig", dict(head_dim=32, rope_scaling={"rope_type": "default", "mrope_section": [4, 6, 6],
                                                                   "mrope_interleaved": True}),
                 dict(_VISION, deepstack_visual_indexes=[0]), {}),
    "Llama 4 (multimodal)": ("Llama4Config", dict(num_local_experts=4, num_experts_per_tok=1, intermediate_size_mlp=256,
                                                  head_dim=32),
                             dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                                  image_size=28, patch_size=14, vision_output_dim=128, projector_input_dim=128,
                                  projector_output_dim=128),
                             dict(architectures=["Llama4ForConditionalGeneration"])),
    "Gemma 3 (multimodal)": ("Gemma3Config", dict(head_dim=32),
                             dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                                  image_size=28, patch_size=14), dict(mm_tokens_per_image=4)),
}


def family_config(family: str):
    """The tiny config of ``family`` (a key of FAMILIES or VISION_FAMILIES)."""
    import transformers

    if family in VISION_FAMILIES:
        cls, text, vision, other = VISION_FAMILIES[family]
        return getattr(transformers, cls)(text_config={**TEXT, **text}, vision_config=vision, **other)
    cls, extra = FAMILIES[family]
    return getattr(transformers, cls)(**{**TEXT, "pad_token_id": 0, **extra})


def make_family_dir(family: str, path: Path, seed: int = 0) -> Path:
    """A random ``family`` model saved as a Hugging Face folder (weights N(0, 0.05): error visible)."""
    return save_random(family_config(family), path, seed)


def save_random(config, path: Path, seed: int = 0) -> Path:
    """The model ``config`` describes, weights N(0, 0.05) (convolutions as initialised), saved to ``path``."""
    from quantkit.arch.meta import auto_class

    torch.manual_seed(seed)
    model = auto_class(config).from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2 and "conv" not in name:
                p.normal_(0, 0.05)
    model.save_pretrained(path, safe_serialization=True)
    return path
