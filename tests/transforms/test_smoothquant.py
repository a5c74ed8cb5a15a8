"""SmoothQuant: the scale formula, and smoothing that helps W8A8 where activations have outliers."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

import quantkit
from quantkit.transforms.smoothquant import fake_quantize_input, smoothing_scales
from quantkit.config.scheme import QuantArgs

from model_factory import make_outlier_llama_dir, random_ids


def test_smoothing_scales_by_hand():
    act = torch.tensor([4.0, 1.0, 9.0])
    w = [torch.tensor([[1.0, -4.0, 1.0]]), torch.tensor([[-2.0, 1.0, 0.25]])]   # column max 2, 4, 1
    s = smoothing_scales(act, w, alpha=0.5)
    assert torch.allclose(s, torch.tensor([2.0 / 2.0 ** 0.5, 1.0 / 2.0, 3.0]))
    assert torch.allclose(smoothing_scales(act, w, alpha=1.0), act)


def test_per_token_input_rounding_matches_int8_grid():
    x = torch.tensor([[0.5, -1.27, 0.01], [100.0, 3.0, -50.0]])
    y = fake_quantize_input(x, QuantArgs(num_bits=8, strategy="token", dynamic=True), None)
    step = x.abs().amax(-1, keepdim=True) / 127
    assert torch.allclose(y / step, (x / step).round()) and (y - x).abs().max() <= step.max() / 2 + 1e-6


@pytest.fixture(scope="module")
def outlier_llama(tmp_path_factory):
    """A tiny Llama whose norms put a few channels two orders of magnitude above the rest."""
    return make_outlier_llama_dir(tmp_path_factory.mktemp("outlier") / "llama", outliers=4, factor=60.0, seed=4)


def _kl(src, out):
    ids = torch.tensor(random_ids(4, 48, seed=11))
    with torch.no_grad():
        p = torch.log_softmax(AutoModelForCausalLM.from_pretrained(src)(ids).logits, -1)
        q = torch.log_softmax(quantkit.load(out, backend="torch")(ids).logits, -1)
    return float((p.exp() * (p - q)).sum(-1).mean())


def test_smoothing_lowers_w8a8_error_and_records_the_alpha(outlier_llama, tmp_path):
    calib = random_ids(16, 64, seed=1)
    plain = quantkit.quantize(outlier_llama, {"scheme": "W8A8", "steps": ["rtn"]}, calibration=calib)
    grid = [0.2, 0.5, 0.8]
    sq = quantkit.quantize(outlier_llama, {"scheme": "W8A8", "steps": [{"smoothquant": {"alphas": grid}}, "rtn"]},
                           calibration=calib)
    kl_plain, kl_sq = _kl(outlier_llama, plain.save(tmp_path / "plain")), _kl(outlier_llama, sq.save(tmp_path / "sq"))
    assert kl_sq < 0.7 * kl_plain, (kl_sq, kl_plain)
    found = json.loads((tmp_path / "sq" / "quantization_log.json").read_text())["transforms"]["model.layers.0"]
    info = found["0.smoothquant"]["input_layernorm"]
    assert info["alpha"] in grid and info["loss"] < info["loss_unsmoothed"]
    assert info["act_max_after"] < info["act_max_before"] / 4
