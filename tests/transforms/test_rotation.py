"""Rotations fold into the weights without changing the float model, on every architecture."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from arch_configs import tiny_config
from quantkit.arch.table import ARCHITECTURES
from quantkit.numerics.hadamard import hadamard, hadamard_base
from quantkit.transforms.hadamard_rotations import Rotations, rotate_model, rotation_problem

DENSE = ["LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Gemma3ForCausalLM",
         "Phi3ForCausalLM"]


def _model(arch: str, hidden: int | None = None, seed: int = 0):
    config = tiny_config(arch)
    if hidden is not None:
        config.hidden_size = hidden
    config.architectures = [arch]
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0.0, 0.3 if p.dim() > 1 else 0.5)   # norms and biases far from their defaults
            if p.dim() > 1 and "proj" in name:
                p[:, :3] *= 8.0   # outlier input channels
    return model


def _layers(model):
    return list(getattr(model, model.base_model_prefix).layers)


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.mark.parametrize("arch", DENSE + ["Qwen3MoeForCausalLM", "MixtralForCausalLM"])
def test_rotation_keeps_the_float_model(arch):
    spec = ARCHITECTURES[arch]
    model = _model(arch)
    ids = torch.randint(0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
    before = _logits(model, ids)
    rotations = Rotations(residual=not spec.residual_rotation_blocked, heads=True, seed=3)
    assert rotation_problem(model.config, spec, rotations) is None
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    rotate_model(model, spec, _layers(model), rotations)
    after = _logits(model, ids)
    scale = before.abs().max()
    assert (after - before).abs().max() <= 1e-4 * scale, (after - before).abs().max()
    changed = [k for k, v in model.state_dict().items() if k in weights and not torch.equal(v, weights[k])]
    assert any("o_proj" in k for k in changed)   # the head rotation turned o_proj's columns
    if rotations.residual:
        assert any("embed_tokens" in k for k in changed) and any("down_proj" in k for k in changed)


def test_residual_rotation_is_refused_where_it_cannot_fold():
    for arch in ("Gemma3ForCausalLM", "Qwen2MoeForCausalLM", "MixtralForCausalLM"):
        config = tiny_config(arch)
        option, reason = rotation_problem(config, ARCHITECTURES[arch], Rotations())
        assert option == "residual" and reason
    assert rotation_problem(tiny_config("Gemma3ForCausalLM"), ARCHITECTURES["Gemma3ForCausalLM"],
                            Rotations(residual=False)) is None


def test_sizes_without_a_hadamard_matrix_are_refused():
    spec = ARCHITECTURES["LlamaForCausalLM"]
    config = tiny_config("LlamaForCausalLM")
    config.hidden_size, config.head_dim = 172, 43   # 172 = 43 x 4: no Paley order over a prime
    option, reason = rotation_problem(config, spec, Rotations(heads=False))
    assert option == "residual" and "172" in reason
    option, reason = rotation_problem(config, spec, Rotations(residual=False))
    assert option == "heads" and "43" in reason


def test_a_hidden_size_that_is_not_a_power_of_two():
    """48 = 12 x 4 (Paley I over 11) and head_dim 12: the non-Sylvester part of the construction."""
    spec = ARCHITECTURES["LlamaForCausalLM"]
    model = _model("LlamaForCausalLM", hidden=48)
    ids = torch.randint(0, model.config.vocab_size, (1, 10), generator=torch.Generator().manual_seed(2))
    before = _logits(model, ids)
    rotate_model(model, spec, _layers(model), Rotations(seed=0))
    assert (_logits(model, ids) - before).abs().max() <= 1e-4 * before.abs().max()


@pytest.mark.parametrize("n", [1, 2, 12, 20, 28, 36, 48, 64, 76, 108, 148, 576, 640])
def test_hadamard_is_orthogonal_with_unit_entries(n):
    assert hadamard_base(n) is not None
    for seed in (None, 5):
        h = hadamard(n, seed)
        assert torch.allclose(h @ h.T, torch.eye(n, dtype=torch.float64), atol=1e-10)
        assert torch.equal((h * n ** 0.5).round().abs(), torch.ones(n, n, dtype=torch.float64))


def test_rotation_spreads_an_outlier_channel():
    """Why it pays: a weight with one large input column quantizes with less error once turned."""
    from quantkit.config.scheme import preset
    from quantkit.numerics.primitives import dequantize, quantize_weight

    args = preset("W4A16").weights

    def fake_quantize(x):
        codes, scale, zp = quantize_weight(x, args)
        return dequantize(codes, scale, zp, args, None, x.dtype)

    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 256, generator=g, dtype=torch.float64)
    w[:, 7] *= 30.0
    q = hadamard(256, seed=0)
    err_plain = (fake_quantize(w.float()).double() - w).norm()
    turned = w @ q
    err_turned = ((fake_quantize(turned.float()).double() - turned) @ q.T).norm()
    assert err_turned < 0.7 * err_plain, (err_turned, err_plain)


def test_a_rotated_checkpoint_loads_in_transformers_with_the_same_logits(tmp_path):
    """The untied LM head is written and read back; transformers computes the rotated model's logits."""
    spec = ARCHITECTURES["LlamaForCausalLM"]
    config = tiny_config("LlamaForCausalLM")
    config.tie_word_embeddings = True
    config.architectures = ["LlamaForCausalLM"]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    ids = torch.randint(0, config.vocab_size, (1, 9), generator=torch.Generator().manual_seed(4))
    before = _logits(model, ids)
    rotate_model(model, spec, _layers(model), Rotations())
    assert model.get_output_embeddings().weight.data_ptr() != model.get_input_embeddings().weight.data_ptr()
    model.save_pretrained(tmp_path)
    back = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert back.config.tie_word_embeddings is False
    assert (_logits(back, ids) - before).abs().max() <= 1e-4 * before.abs().max()
