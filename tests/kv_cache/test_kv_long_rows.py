"""``kv_cache: {long_rows, long_len}``: the calibration source's longest rows are added in full,
so the KV observer (and every layer) sees long contexts; a warning when the source has none."""

import json

import pytest
import torch
from model_factory import make_llama_dir, random_ids, save_byte_tokenizer
from safetensors.torch import load_file
from test_kv_cache_checkpoint import _post_rope_kv

import quantkit
from quantkit.errors import QuantkitError
from quantkit.kv_cache.long_rows import long_rows
from quantkit.recipe import Recipe

SHORT = 24


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    path = make_llama_dir(tmp_path_factory.mktemp("long") / "src", heads=4, kv_heads=2, vocab=260)
    return save_byte_tokenizer(path)


def _k_scale(ckpt, layer=0):
    return load_file(ckpt / "model.safetensors")[f"model.layers.{layer}.self_attn.k_scale"]


def test_the_longest_rows_reach_the_kv_observer_whole(src, tmp_path):
    rows = [r[:n] for r, n in zip(random_ids(4, 240, seed=2), (60, 240, 90, 240))]
    # attention left unquantized: layer 0's K is the float model's, exactly
    recipe = {"config_groups": {"g": {"targets": ["re:.*mlp\\.down_proj$"], "weights": {"num_bits": 8}}},
              "calibration": {"max_seq_len": SHORT},
              "kv_cache": {"strategy": "attn_head", "long_rows": 1, "long_len": 200}}
    with_long = quantkit.quantize(str(src), recipe, calibration=rows)
    assert not with_long.warnings
    short = [r[:SHORT] for r in rows]
    want = _post_rope_kv(src, short + [rows[1][:200]])[0][0]   # the first of the two longest, cut to 200
    torch.testing.assert_close(_k_scale(with_long.save(tmp_path / "a")).flatten(), want / 448, rtol=1e-5, atol=0)
    del recipe["kv_cache"]["long_rows"]
    plain = _k_scale(quantkit.quantize(str(src), recipe, calibration=rows).save(tmp_path / "b")).flatten()
    torch.testing.assert_close(plain, _post_rope_kv(src, short)[0][0] / 448, rtol=1e-5, atol=0)
    assert not torch.equal(plain, want / 448)


def test_longest_rows_of_a_log_and_a_warning_when_none_is_long(src, tmp_path):
    from transformers import AutoTokenizer

    log = tmp_path / "log.jsonl"
    texts = ["short one", "x" * 300, "a medium length row " * 4, "y" * 150]
    log.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    tok = AutoTokenizer.from_pretrained(src)
    said = []
    got = long_rows(log, 2, 200, lambda: tok, said.append)
    assert [len(r) for r in got] == [200, 150 + (len(tok("y")["input_ids"]) - 1)]
    assert said == []
    long_rows(log, 1, 1000, lambda: tok, said.append)
    assert said and said[0].startswith("kv_cache.long_rows: the calibration source's longest row has 30")
    assert "under long_len 1000" in said[0]


def test_recipe_keys_are_checked():
    r = Recipe.from_dict({"scheme": "FP8_DYNAMIC", "kv_cache": {"long_rows": 4}})
    assert (r.kv_cache.long_rows, r.kv_cache.long_len) == (4, 4096)
    assert "long_rows" not in r.kv_cache.to_dict()   # compressed-tensors' form stays its own
    with pytest.raises(QuantkitError, match=r"^recipe: kv_cache\.long_rows:"):
        Recipe.from_dict({"scheme": "FP8_DYNAMIC", "kv_cache": {"long_rows": -1}})
    with pytest.raises(QuantkitError, match=r"^recipe: kv_cache\.long_len:"):
        Recipe.from_dict({"scheme": "FP8_DYNAMIC", "kv_cache": {"long_len": 4}})
