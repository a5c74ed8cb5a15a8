"""The memory account's attention cache, derived from the model: a hybrid's attending layers only,
and MLA's latent in place of per-head K and V (tiny random models from transformers' config classes)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from families import family_config, make_family_dir  # noqa: E402

from quantkit.evaluation.attention_cache import attention_cache  # noqa: E402
from quantkit.serving.memory_account import plan  # noqa: E402


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return {f: make_family_dir(f, tmp_path_factory.mktemp("f") / "m") for f in ("Qwen3-Next", "DeepSeek-V3", "OLMo 2")}


def test_a_hybrid_caches_only_in_the_layers_its_config_calls_full_attention(folders):
    """The trace finds the attending layers; the config's own layer_types, read independently, agree."""
    config = family_config("Qwen3-Next")
    full = sum(t == "full_attention" for t in config.layer_types)
    assert 0 < full < config.num_hidden_layers
    cache = attention_cache(folders["Qwen3-Next"])
    assert cache is not None and cache.kv_layers == full and cache.latent is None
    fp = plan(folders["Qwen3-Next"], kv="fp16", cache=cache)
    assert fp.kv_bytes_per_token == 2 * full * config.num_key_value_heads * config.head_dim * 2
    every = plan(folders["Qwen3-Next"], kv="fp16")   # the config's count alone: every layer
    assert every.kv_bytes_per_token == fp.kv_bytes_per_token * config.num_hidden_layers // full


def test_mla_caches_one_latent_per_token_and_layer(folders):
    config = family_config("DeepSeek-V3")
    cache = attention_cache(folders["DeepSeek-V3"])
    assert cache is not None and cache.latent == config.kv_lora_rank + config.qk_rope_head_dim
    fp = plan(folders["DeepSeek-V3"], kv="fp16", cache=cache)
    assert fp.kv_bytes_per_token == config.num_hidden_layers * (config.kv_lora_rank + config.qk_rope_head_dim) * 2


def test_a_plain_decoder_keeps_the_configs_count(folders):
    assert attention_cache(folders["OLMo 2"]) is None
