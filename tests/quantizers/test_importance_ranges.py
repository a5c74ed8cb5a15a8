"""Importance-weighted ranges (``observer: imatrix_mse``): each group's clip minimises the
activation-weighted squared error ``sum_j imp_j (w_ij - q(w_ij))^2``, for RTN (importance from
the calibration inputs) and for GPTQ's group scales (``diag(H)``), on every number format."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

import quantkit
from quantkit.config.scheme import QuantArgs
from quantkit.numerics.number_formats import number_format
from quantkit.quantizers.gptq import gptq_quantize_weight
from quantkit.quantizers.gptq.format_grid import solve_fp4
from quantkit.quantizers.gptq.solve import SolveSettings
from quantkit.recipe import Recipe

from model_factory import make_llama_dir, random_ids

FORMATS = {"int4-g16": dict(num_bits=4, group_size=16), "int4-g16-asym": dict(num_bits=4, group_size=16, symmetric=False),
           "nvfp4": dict(num_bits=4, type="float", group_size=16), "mxfp4": dict(num_bits=4, type="float", group_size=32)}


def planted(cols: int, rows: int = 64, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights whose groups each hold one outlier column of little importance and one ordinary
    column whose input is 1000x larger than the rest: clipping the outlier, or not, moves the
    important column's rounding error, which plain MSE weighs like any other."""
    g = torch.Generator().manual_seed(seed)
    w = torch.rand(rows, cols, generator=g) - 0.5
    w[:, 3::16] = 4.0 * torch.sign(torch.randn(rows, cols // 16, generator=g))      # outliers
    w[:, 9::16] = 0.6 + 0.8 * torch.rand(rows, cols // 16, generator=g)           # the important ones
    imp = torch.ones(cols)
    imp[9::16] = 1000.0
    return w, imp


def weighted_error(w: torch.Tensor, w_hat: torch.Tensor, imp: torch.Tensor) -> float:
    return float(((w - w_hat.float()) ** 2 * imp).sum())


def rounded(w: torch.Tensor, args: QuantArgs, imp: torch.Tensor | None) -> torch.Tensor:
    fmt = number_format(args)
    qp = fmt.scales(w, importance=imp)
    return fmt.dequantize(fmt.quantize(w, qp), qp)


@pytest.mark.parametrize("name", list(FORMATS))
def test_weighted_range_beats_plain_mse_by_construction(name):
    w, imp = planted(64)
    weighted = rounded(w, QuantArgs(**FORMATS[name], observer="imatrix_mse"), imp)
    plain = rounded(w, QuantArgs(**FORMATS[name], observer="imatrix_mse"), None)   # same candidates, imp = 1
    minmax = rounded(w, QuantArgs(**FORMATS[name]), None)
    assert weighted_error(w, weighted, imp) < 0.7 * weighted_error(w, plain, imp)
    assert weighted_error(w, weighted, imp) < 0.7 * weighted_error(w, minmax, imp)
    # and plain MSE is what it says: the least unweighted error of the three
    ones = torch.ones_like(imp)
    assert weighted_error(w, plain, ones) <= min(weighted_error(w, weighted, ones), weighted_error(w, minmax, ones))


def test_unweighted_imatrix_is_the_mse_search_widened():
    """Without importance, imatrix_mse searches the mse observer's clips and wider ones: its error
    is never above mse's, and below it where a group gains from a range wider than its own."""
    w, _ = planted(64)
    a = rounded(w, QuantArgs(num_bits=4, group_size=16, observer="imatrix_mse"), None)
    b = rounded(w, QuantArgs(num_bits=4, group_size=16, observer="mse"), None)
    ones = torch.ones(64)
    assert weighted_error(w, a, ones) <= weighted_error(w, b, ones) * (1 + 1e-6)
    # int4's largest code is 7 of the range's 7.5: a group whose maximum would be clipped to 7
    # keeps it at a range 7.5 / 7 wider
    g = torch.tensor([[0.0] * 15 + [7.0]])
    assert torch.allclose(rounded(g, QuantArgs(num_bits=4, group_size=16, observer="imatrix_mse"), None), g, atol=0.05)
    assert not torch.allclose(rounded(g, QuantArgs(num_bits=4, group_size=16, observer="mse"), None), g, atol=0.05)


@pytest.mark.parametrize("name", list(FORMATS))
def test_gptq_group_scales_weigh_columns_by_the_hessian(name):
    """With a diagonal Hessian GPTQ moves no column, so its output error is each group's
    importance-weighted rounding error: the weighted ranges must win, lazy and static groups alike."""
    w, imp = planted(64)
    H = torch.diag(imp)

    def loss(observer: str, static: bool) -> float:
        args = QuantArgs(**FORMATS[name], observer=observer)
        if number_format(args).affine:
            res = gptq_quantize_weight(w, H, args, block_size=32, dampening_frac=0.0, static_groups=static)
        else:
            res = solve_fp4(w, H, number_format(args), SolveSettings(block_size=32, dampening_frac=0.0,
                                                                     static_groups=static))
        return float(res.row_loss.sum())

    for static in (False, True):
        assert loss("imatrix_mse", static) < 0.7 * loss("minmax", static)


def test_recipe_with_weighted_ranges_needs_calibration():
    plain = Recipe.from_dict({"scheme": "W4A16"})
    weighted = Recipe.from_dict({"config_groups": {"g": {"targets": ["Linear"], "weights": {
        "num_bits": 4, "group_size": 32, "observer": "imatrix_mse"}}}, "ignore": ["lm_head"]})
    assert not plain.needs_calibration and weighted.needs_calibration
    with pytest.raises(quantkit.QuantkitError, match="observer"):
        Recipe.from_dict({"config_groups": {"g": {"targets": ["Linear"], "weights": {
            "num_bits": 4, "group_size": 32, "observer": "imatrix"}}}})


def _recipe(observer: str, algorithm: str, fp4: bool = False) -> dict:
    weights = {"num_bits": 4, "type": "float", "group_size": 16} if fp4 else {"num_bits": 4, "group_size": 32}
    return {"config_groups": {"g": {"targets": ["Linear"], "weights": {**weights, "observer": observer}}},
            "ignore": ["lm_head"], "algorithm": {"name": algorithm, **({"block_size": 32} if algorithm == "gptq" else {})}}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("imatrix")
    src = make_llama_dir(root / "src", hidden=64, intermediate=128, seed=3)
    calib = random_ids(4, 32, seed=2)
    cases = {f"{alg}-{fmt}-{obs}": _recipe(obs, alg, fmt == "nvfp4") for alg in ("rtn", "gptq")
             for fmt in ("int", "nvfp4") for obs in ("mse", "imatrix_mse")}
    return {name: quantkit.quantize(src, r, calibration=calib).save(root / name) for name, r in cases.items()}


def _tensors(folder, suffix):
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as h:
            out.update({k: h.get_tensor(k) for k in h.keys() if k.endswith(suffix)})
    return out


@pytest.mark.parametrize("alg", ["rtn", "gptq"])
@pytest.mark.parametrize("fmt", ["int", "nvfp4"])
def test_checkpoint_reads_back_with_transformers_on_its_written_scales(checkpoints, alg, fmt):
    """transformers (compressed-tensors) reads the checkpoint; every decoded int weight is an
    integer multiple of its written group scale, within the code range; and the weighted ranges
    chose other scales than plain MSE did."""
    out = checkpoints[f"{alg}-{fmt}-imatrix_mse"]
    config = json.loads((out / "config.json").read_text())["quantization_config"]
    assert config["config_groups"]["g"]["weights"]["observer"] == "imatrix_mse"
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32 if fmt == "int" else torch.bfloat16)
    with torch.no_grad():
        logits = model(torch.tensor(random_ids(1, 12, seed=9))).logits
    assert bool(torch.isfinite(logits).all())
    scales = _tensors(out, ".weight_scale")
    assert scales
    if fmt == "int":
        for key, scale in scales.items():
            module = model.get_submodule(key[: -len(".weight_scale")])
            steps = module.weight.detach().float() / scale.float().repeat_interleave(32, dim=1)
            assert torch.allclose(steps, steps.round(), atol=1e-3), key
            assert float(steps.round().min()) >= -8 and float(steps.round().max()) <= 7
    baseline = _tensors(checkpoints[f"{alg}-{fmt}-mse"], ".weight_scale")
    differ = sum(not torch.equal(scales[k].view(torch.uint8), baseline[k].view(torch.uint8)) for k in scales)
    assert differ > 0
    assert math.isfinite(float(logits.float().abs().max()))
