"""Folding scales into every mapping of every architecture leaves the float model unchanged."""

from __future__ import annotations

import pytest
import torch

from quantkit.transforms.fold import fold_scales, mapping_applies, smooth_channels
from quantkit.arch.table import ARCHITECTURES

from arch_configs import tiny_config


def _model(arch: str, kv_heads: int):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, kv_heads), dtype=torch.float32).eval()
    assert type(model).__name__ == arch
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # away from init (zeros for Gemma, ones elsewhere): the offset must matter
                p.normal_(0.0, 0.3)
            elif p.ndim == 1:   # biases (Qwen2's q/k/v)
                p.normal_(0.0, 0.1)
    return model


def _fold_everywhere(model, arch: str, offset: float) -> int:
    spec = ARCHITECTURES[arch]
    g = torch.Generator().manual_seed(1)
    folded = 0
    for layer in model.get_submodule(spec.layers):
        for m in spec.smooth_mappings:
            if not mapping_applies(layer, m, model.config):
                continue
            _, rows = smooth_channels(layer, m, model.config)
            width = rows.stop - rows.start              # one scale per smooth channel
            s = torch.exp(torch.empty(width).uniform_(-1.0, 1.0, generator=g))
            fold_scales(layer, m, s, model.config, norm_offset=offset)
            folded += 1
    return folded


def _hidden(model, ids):
    with torch.no_grad():
        return model.model(input_ids=ids, use_cache=False).last_hidden_state


def _rel(a, b) -> float:
    return float((a - b).norm() / a.norm())


@pytest.mark.parametrize("kv_heads", [4, 2], ids=["mha", "gqa"])
@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_folding_random_scales_keeps_the_layer_output(arch, kv_heads):
    model = _model(arch, kv_heads)
    ids = torch.randint(1, 128, (2, 12), generator=torch.Generator().manual_seed(2))
    before = _hidden(model, ids)
    folded = _fold_everywhere(model, arch, ARCHITECTURES[arch].norm_weight_offset)
    mappings = len(ARCHITECTURES[arch].smooth_mappings)
    # every mapping folds, v -> o_proj under GQA too (one scale per value channel, on all its copies)
    assert folded == model.config.num_hidden_layers * mappings
    assert _rel(before, _hidden(model, ids)) <= 1e-5


@pytest.mark.parametrize("arch", [a for a, s in ARCHITECTURES.items() if s.norm_weight_offset])
def test_ignoring_the_norm_offset_breaks_the_model(arch):
    model = _model(arch, 2)
    ids = torch.randint(1, 128, (2, 12), generator=torch.Generator().manual_seed(2))
    before = _hidden(model, ids)
    _fold_everywhere(model, arch, 0.0)
    assert _rel(before, _hidden(model, ids)) > 1e-2


def test_a_mapping_whose_shapes_differ_is_refused():
    import dataclasses

    from quantkit.errors import QuantkitError

    model = _model("LlamaForCausalLM", 2)
    layer, v_to_o = model.model.layers[0], ARCHITECTURES["LlamaForCausalLM"].smooth_mappings[1]
    assert mapping_applies(layer, v_to_o, model.config)
    untied = dataclasses.replace(v_to_o, kv_heads=None)     # not known to be value heads
    assert not mapping_applies(layer, untied, model.config)
    with pytest.raises(QuantkitError, match="channel counts differ"):
        fold_scales(layer, untied, torch.ones(32), model.config)


def test_gqa_value_scales_reach_every_copy_in_o_proj():
    """A value channel's scale multiplies the o_proj columns of every query head that reads it."""
    from quantkit.transforms.fold import tie_of

    model = _model("LlamaForCausalLM", 2)       # 4 heads, 2 KV heads: each value head read twice
    layer, v_to_o = model.model.layers[0], ARCHITECTURES["LlamaForCausalLM"].smooth_mappings[1]
    tie = tie_of(layer, v_to_o, model.config)
    hd = model.config.hidden_size // model.config.num_attention_heads
    assert (tie.repeat, tie.kv_heads, tie.head_dim) == (2, 2, hd)
    s = torch.arange(1.0, 2 * hd + 1)
    cols = tie.expand(s)
    for h in range(4):                          # query head h reads value head h // 2
        assert torch.equal(cols[h * hd:(h + 1) * hd], s[(h // 2) * hd:(h // 2 + 1) * hd])
    assert torch.equal(tie.reduce(cols), s) and torch.equal(tie.reduce(cols, "amax"), s)
