"""A rotated conversion: the written checkpoint is the rotated model, read alike by quantkit.load
and transformers + compressed-tensors; a rotation the model cannot take is refused up front."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

import quantkit
from quantkit.errors import QuantkitError

from arch_configs import tiny_config
from model_factory import random_ids


def _source(arch: str, path, tie: bool = True, hidden: int | None = None):
    config = tiny_config(arch, kv_heads=2)
    config.tie_word_embeddings = tie
    if hidden is not None:
        config.hidden_size = hidden
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(1.0 if "norm" in name else 0.0, 0.3 if "norm" in name else 0.05)
            if p.ndim == 2 and "proj" in name:
                p[:, :2] *= 10.0   # outlier input channels
    model.save_pretrained(path)
    return path


def _logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor(ids)).logits


def _rel(a, b):
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "Qwen2ForCausalLM", "Phi3ForCausalLM"])
def test_a_rotated_checkpoint_computes_the_source_model(arch, tmp_path):
    import compressed_tensors  # noqa: F401
    src = _source(arch, tmp_path / "src")
    recipe = {"scheme": "W8A16", "steps": [{"rotate": {"seed": 1}}, "rtn"]}
    out = quantkit.quantize(src, recipe).save(tmp_path / "out")
    config = json.loads((out / "config.json").read_text())
    assert config["tie_word_embeddings"] is False
    with safe_open(out / "model.safetensors", "pt") as f, safe_open(src / "model.safetensors", "pt") as g:
        assert "lm_head.weight" in f.keys() and "lm_head.weight" not in g.keys()
        assert not torch.allclose(f.get_tensor("model.embed_tokens.weight"), g.get_tensor("model.embed_tokens.weight"))
        assert torch.equal(f.get_tensor("model.norm.weight"), torch.ones_like(g.get_tensor("model.norm.weight")))
    ids = random_ids(2, 12, vocab=128, seed=3)
    source = _logits(AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval(), ids)
    ours = _logits(quantkit.load(out, backend="torch"), ids)
    theirs = _logits(AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval(), ids)
    assert _rel(ours, theirs) <= 1e-4
    plain = quantkit.quantize(src, {"scheme": "W8A16"}).save(tmp_path / "plain")
    plain_error = _rel(_logits(quantkit.load(plain, backend="torch"), ids), source)
    # int8 weights of the same model: its error is int8's, not that of another model (about 1)
    assert _rel(ours, source) <= 2 * plain_error, (_rel(ours, source), plain_error)


def test_rotation_lowers_the_4_bit_error_on_outlier_channels(tmp_path):
    """The reason to rotate: the same W4 g16 RTN conversion with and without it, against the source."""
    src = _source("LlamaForCausalLM", tmp_path / "src", hidden=64)
    ids = random_ids(4, 16, vocab=128, seed=5)
    source = _logits(AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval(), ids)
    errors = {}
    for name, steps in {"plain": ["rtn"], "rotated": ["rotate", "rtn"]}.items():
        out = quantkit.quantize(src, {"scheme": "W4A16", "group_size": 16, "steps": steps}).save(tmp_path / name)
        errors[name] = _rel(_logits(quantkit.load(out, backend="torch"), ids), source)
    assert errors["rotated"] < 0.8 * errors["plain"], errors


def test_a_rotation_the_model_cannot_take_is_refused_before_any_layer(tmp_path):
    src = _source("Gemma3ForCausalLM", tmp_path / "gemma")
    with pytest.raises(QuantkitError, match=r"steps\[0\]\.rotate\.residual: its post-attention"):
        quantkit.quantize(src, {"scheme": "W8A16", "steps": ["rotate", "rtn"]})
    out = quantkit.quantize(src, {"scheme": "W8A16", "steps": [{"rotate": {"residual": False}}, "rtn"]})
    assert out is not None   # the head rotation alone applies to Gemma3
    with pytest.raises(QuantkitError, match=r"steps\[1\]: 'rotate' must be the first step"):
        quantkit.load_recipe({"scheme": "W4A16", "steps": ["awq", "rotate", "rtn"]})


def test_the_integrity_pass_reads_a_rotated_checkpoint_against_the_rotated_baseline(tmp_path):
    from quantkit.evaluation.integrity.check import check_checkpoint

    src = _source("LlamaForCausalLM", tmp_path / "src")
    out = quantkit.quantize(src, {"scheme": "W4A16", "group_size": 16, "steps": ["rotate", "rtn"]}).save(tmp_path / "out")
    report = check_checkpoint(src, out)
    assert not report.fallback and len(report.transformed) == 2
    assert report.tensors == {}, report.tensors   # embedding, final norm and head equal the turned baseline's
    assert all(not m["problems"] for m in report.modules.values())
    # a planted change in the rotated embedding is still caught
    from safetensors.torch import load_file, save_file
    tensors = load_file(out / "model.safetensors")
    tensors["model.embed_tokens.weight"][3, :4] += 0.5
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    assert "model.embed_tokens.weight" in check_checkpoint(src, out).tensors
