"""DeepSeek-V3 and the families built on its multi-head latent attention (Kimi K2, GLM-4.7's MLA
models use the same class in transformers).

The trace finds its layers, sub-groups, shared experts, dense first layers and router by itself.
What it cannot see: transformers caches MLA's decompressed keys and values, while the engines
this is served on (vLLM, SGLang) cache the compressed latent (``kv_a_proj_with_mqa``'s output,
``kv_lora_rank`` + ``qk_rope_head_dim`` per token, one head). A ``[kv_heads, head_dim]`` KV scale
measured in transformers would describe a cache the engine never holds, so KV options are refused.
"""

from quantkit.arch.families.registry import register_family

def _latent(config) -> int:
    text = config.get_text_config()
    return text.kv_lora_rank + text.qk_rope_head_dim


register_family(
    "DeepseekV3ForCausalLM", "KimiK2ForCausalLM",
    attention=None,
    kv_latent=_latent,
    kv_cache_blocked=("multi-head latent attention: the serving engine caches the compressed latent "
                      "(kv_lora_rank + qk_rope_head_dim per token), not per-head keys and values, so a "
                      "per-head KV scale does not apply"),
)
