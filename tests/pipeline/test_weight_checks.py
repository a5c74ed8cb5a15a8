"""The weight checks' pure parts: non-finite counts and the layout comparisons."""

from __future__ import annotations

import pytest
import torch

from quantkit.errors import QuantkitError
from quantkit.pipeline import finite
from quantkit.pipeline.finite import FiniteSource, check_finite, nonfinite_counts
from quantkit.pipeline.layout import excess_layers, layer_index, tensor_fault, unplaced
from quantkit.inputs.source import StateDictSource


def test_nonfinite_counts_nan_and_inf_apart_across_chunks(monkeypatch):
    monkeypatch.setattr(finite, "CHUNK", 4)
    t = torch.zeros(3, 5)
    t[0, 1] = float("nan")
    t[2, 4] = float("inf")
    t[2, 3] = float("-inf")
    assert nonfinite_counts(t) == (1, 2)
    assert nonfinite_counts(torch.zeros(0)) == (0, 0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2])
def test_nonfinite_counts_every_stored_float_type(dtype):
    t = torch.tensor([1.0, float("nan"), 2.0]).to(dtype)
    assert nonfinite_counts(t) == (1, 0)


def test_check_finite_names_the_file_and_tensor_and_skips_integers():
    with pytest.raises(QuantkitError, match=r"^m/a\.safetensors: tensor 'w' has 1 NaN and 0 inf values"):
        check_finite(torch.tensor([float("nan"), 0.0]), "w", "m/a.safetensors")
    check_finite(torch.tensor([1, 2], dtype=torch.int8), "codes", "m/a.safetensors")


def test_finite_source_checks_what_it_reads_and_passes_the_rest_through():
    source = FiniteSource(StateDictSource({"ok": torch.ones(2), "bad": torch.tensor([float("inf")])}))
    assert torch.equal(source.get("ok"), torch.ones(2))
    assert "bad" in source and sorted(source.keys()) == ["bad", "ok"]
    with pytest.raises(QuantkitError, match="'bad' has 0 NaN and 1 inf"):
        source.get("bad")


def test_tensor_fault():
    weight = torch.empty(8, 4, device="meta")
    assert tensor_fault("w", weight, torch.bfloat16, (8, 4), "c.json") is None
    assert "dtype int8" in tensor_fault("w", weight, torch.int8, (8, 4), "c.json")
    assert "dtype I4" in tensor_fault("w", weight, "I4", (8, 4), "c.json")
    assert tensor_fault("w", weight, torch.float32, (4, 8), "c.json") == \
        "tensor 'w' has shape (4, 8) on disk, but c.json implies (8, 4)"
    assert tensor_fault("ids", torch.empty(3, dtype=torch.int64, device="meta"), torch.int32, (3,), "c") is None


def test_layer_indices_and_the_ones_past_the_count():
    keys = ["model.layers.0.a", "model.layers.3.a", "model.layers.10.b", "model.norm.weight", "model.layers.x.c"]
    assert [layer_index(k, "model.layers") for k in keys] == [0, 3, 10, None, None]
    assert excess_layers(keys, "model.layers", 3) == [3, 10]
    assert excess_layers(keys, "model.layers", 11) == []


def test_unplaced_keys_split_into_lost_and_computed_a_stored_buffer_is_neither():
    keys = ["model.layers.0.w", "model.layers.0.spare", "model.layers.0.self_attn.rotary_emb.inv_freq",
            "model.layers.0.buf", "lm_head.weight"]
    assert unplaced(keys, "model.layers", {"model.layers.0.w"}, {"model.layers.0.buf"}) == \
        (["model.layers.0.spare"], ["model.layers.0.self_attn.rotary_emb.inv_freq"])
