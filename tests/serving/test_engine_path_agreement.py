"""Path agreement catches what only the engine does: vLLM's CPU build runs an ``attn_head`` FP8
KV cache's per-head scales as their maximum, so a checkpoint whose heads' scales differ widely is
served with other numbers than it describes. quantkit's own path applies each head's scale."""
from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file, save_file

from engine_helpers import convert_with, quantkit, report, require_engine, small_recipe

WIDE = 1e3   # one head's V scale this many times the others': their values fall to the bottom of FP8's range


def _plant_wide_head_scales(ckpt) -> int:
    """Head 0's V scale x WIDE in every layer; returns how many tensors were changed."""
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"]
    changed = 0
    for shard in sorted(set(index.values())):
        tensors = load_file(ckpt / shard)
        hits = [k for k in tensors if k.endswith("self_attn.v_scale")]
        for k in hits:
            tensors[k] = tensors[k].clone()
            tensors[k][0] *= WIDE
        if hits:
            save_file(tensors, ckpt / shard, metadata={"format": "pt"})
            changed += len(hits)
    return changed


# W8A8 weights (the engine runs them fast on every CPU host, FP8 weights not on AMX hosts: docs/engine.md)
# under the per-head FP8 KV cache of the shipped fp8-dynamic-kv-fp8-head recipe
RECIPE = {"version": 1, "scheme": "W8A8", "ignore": ["lm_head"], "algorithm": {"name": "rtn"},
          "kv_cache": {"num_bits": 8, "type": "float", "strategy": "attn_head", "symmetric": True}}


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    require_engine()
    folder = tmp_path_factory.mktemp("kv")
    (folder / "w8a8-kv-head.yaml").write_text(json.dumps(RECIPE))
    ckpt = convert_with(str(folder / "w8a8-kv-head.yaml"), folder / "kv-head", "--num-samples", "8", "--max-seq-len", "256")
    assert _plant_wide_head_scales(ckpt) == 30   # SmolLM2: 30 layers
    return ckpt


def test_wide_per_head_kv_scales_are_a_path_agreement_reason(planted, tmp_path):
    # teacher-forced texts only: a few windows decide it
    recipe = small_recipe(tmp_path / "small.yaml", text_items=3, gen_prompts=0, extract_items=0)
    res = quantkit("eval", "--candidate", planted, "--suite", "numbers-en", "--max-len", "512",
                   "--recipe", recipe, "--engine", "vllm", "--out", tmp_path / "r")
    assert res.returncode == 0, res.stderr[-3000:]
    data = report(tmp_path / "r")
    assert data["engine"]["candidate"]["kv_cache_dtype"] == "fp8"
    path = [r for r in data["verdict"]["reasons"] if r["measure"].startswith("path_")]
    assert path and all(r["slice"] == "numbers-en" for r in path), data["verdict"]["reasons"]
    assert data["verdict"]["decision"] != "GO"
    assert "the engine computes something other than the checkpoint describes" in res.stdout
