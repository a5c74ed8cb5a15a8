"""Plan units: the architecture table's fused linears share one unit; ignore stays ignored."""

from __future__ import annotations

from transformers import AutoConfig

from quantkit.recipe import load_recipe
from quantkit.sensitivity import plan_units


def test_llama_units_fuse_qkv_and_gate_up_in_layer_order(tiny_llama):
    units, dtype = plan_units(AutoConfig.from_pretrained(tiny_llama), load_recipe("w4a16-g64"))
    assert [u.name for u in units[:4]] == [
        "model.layers.0.self_attn.q_proj+k_proj+v_proj", "model.layers.0.self_attn.o_proj",
        "model.layers.0.mlp.gate_proj+up_proj", "model.layers.0.mlp.down_proj"]
    assert len(units) == 8 and [u.layer for u in units] == [0] * 4 + [1] * 4
    qkv = units[0]
    assert qkv.members == tuple(f"model.layers.0.self_attn.{p}_proj" for p in "qkv")
    assert qkv.shapes == ((64, 64), (32, 64), (32, 64)) and qkv.params == 64 * 128   # 4 heads, 2 KV heads of 16
    assert str(dtype) == "torch.float32"


def test_ignored_linears_leave_their_unit(tiny_llama):
    recipe = load_recipe({"scheme": "W8A16", "ignore": ["model.layers.1.self_attn.k_proj", "re:.*down_proj"]})
    names = [u.name for u in plan_units(AutoConfig.from_pretrained(tiny_llama), recipe)[0]]
    assert "model.layers.1.self_attn.q_proj+v_proj" in names
    assert not any("down_proj" in n or ("k_proj" in n and ".layers.1." in n) for n in names)
    assert len(names) == 6   # each layer: q/k/v (q+v in layer 1), o, gate+up
