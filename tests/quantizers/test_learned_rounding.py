"""Learned rounding (quantizers/learned_rounding): the optimisation on its own, the grids'
differentiable form against their codes, a planted layer where it must beat round to nearest,
and a checkpoint transformers reads back."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import quantkit
from model_factory import random_ids
from quantkit.config.scheme import QuantArgs, QuantScheme
from quantkit.errors import QuantkitError
from quantkit.numerics.primitives import quantize_weight as rtn_quantize_weight
from quantkit.numerics.primitives import dequantize
from quantkit.quantizers.learned_rounding import SignRoundSettings, sign_sgd
from quantkit.quantizers.learned_rounding.grid import Clip, grid_for
from quantkit.steps import LayerContext, build_algorithm


# -- the optimisation -----------------------------------------------------------------------
def test_sign_sgd_keeps_the_best_step_and_its_steps_add_up_to_the_decayed_rate():
    target = torch.tensor([0.2, -0.9])
    p = torch.zeros(2, requires_grad=True)
    res = sign_sgd([p], lambda step: (p - target).pow(2).sum(), SignRoundSettings(iters=100, lr=0.01))
    assert res.first_loss == pytest.approx(0.85)
    assert res.best_loss < 1e-4 + 0.4 ** 2 and res.best_step > 0
    # the far coordinate's loss fell at every step, so the best is the last one evaluated: it
    # moved by the rate of every step before it, sum of 0.01 * (1 - t / 100) for t < 99 = 0.5049
    assert res.best_step == 99
    assert float(p[1].detach()) == pytest.approx(-0.5049, abs=1e-5) and abs(float(p[0].detach()) - 0.2) < 0.01


# -- the grids --------------------------------------------------------------------------------
@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("group_size", [8, None])
def test_fake_quantization_is_the_codes_on_the_written_scales(bits, symmetric, group_size):
    args = QuantArgs(num_bits=bits, symmetric=symmetric, group_size=group_size)
    grid = grid_for(args)
    g = torch.Generator().manual_seed(bits)
    w = torch.randn(6, 32, generator=g)
    groups = 32 // group_size if group_size else 1
    v = torch.rand(6, 32, generator=g) - 0.5
    clip = Clip(0.5 + 0.5 * torch.rand(6, groups, generator=g), 0.5 + 0.5 * torch.rand(6, groups, generator=g))
    qp = grid.scales(w, clip)
    codes = grid.quantize(w, qp, offset=v)
    assert codes.dtype == torch.int8 and int(codes.min()) >= args.qmin and int(codes.max()) <= args.qmax
    assert torch.equal(grid.fake_quantize(w, v, clip), dequantize(codes, qp.scale, qp.zero_point, args))
    # no offset and no clip: round to nearest, RTN's own codes and scales
    q, scale, zp = rtn_quantize_weight(w, args)
    qp = grid.scales(w)
    assert torch.equal(grid.quantize(w, qp), q) and torch.equal(qp.scale, scale)


def test_gradients_reach_the_offsets_and_both_clip_factors():
    grid = grid_for(QuantArgs(num_bits=4, symmetric=False, group_size=8))
    w = torch.randn(4, 16)
    v = torch.zeros(4, 16, requires_grad=True)
    lo, hi = torch.ones(4, 2, requires_grad=True), torch.ones(4, 2, requires_grad=True)
    grid.fake_quantize(w, v, Clip(hi, lo)).pow(2).sum().backward()
    assert all(t.grad is not None and t.grad.abs().sum() > 0 for t in (v, lo, hi))


def test_other_grids_are_refused_by_name():
    with pytest.raises(QuantkitError, match="strategy 'block'"):
        grid_for(QuantArgs(num_bits=8, type="float", strategy="block", block_structure=(64, 64)))


# -- a planted layer --------------------------------------------------------------------------
class Block(nn.Module):
    """A residual MLP block whose inputs are strongly correlated: rounding errors add up in its output."""

    def __init__(self, hidden: int = 64, inter: int = 128):
        super().__init__()
        torch.manual_seed(0)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x):
        return x + self.down_proj(nn.functional.silu(self.up_proj(x)))


def correlated_rows(rows: int, seq: int, cols: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(rows * seq, cols // 8, generator=g) @ torch.randn(cols // 8, cols, generator=g)
    return (base + 0.1 * torch.randn(rows * seq, cols, generator=g)).reshape(rows, seq, cols)


def make_ctx(block: Block, inputs: list[torch.Tensor], scheme: QuantScheme) -> LayerContext:
    def run(**_):
        for x in inputs:
            block(x)

    targets = {n: (getattr(block, n), scheme) for n in ("up_proj", "down_proj")}
    return LayerContext(0, "model.layers.0", block, targets, [["up_proj"], ["down_proj"]], run,
                        num_samples=sum(x.shape[0] for x in inputs), num_tokens=sum(x.shape[:2].numel() for x in inputs))


def block_error(reference: Block, quantized: Block, inputs) -> float:
    with torch.no_grad():
        return sum(float((reference(x) - quantized(x)).pow(2).sum()) for x in inputs) / sum(
            reference(x).numel() for x in inputs)


@pytest.mark.parametrize("args", [QuantArgs(num_bits=4, group_size=16), QuantArgs(num_bits=3, symmetric=False,
                                                                                   group_size=32)],
                         ids=["w4-sym-g16", "w3-asym-g32"])
def test_beats_round_to_nearest_on_the_block_output(args):
    scheme = QuantScheme(("Linear",), args)
    inputs = [correlated_rows(2, 16, 64, seed=s) for s in range(2)]
    block, original, rtn = Block(), Block(), Block()
    ctx = make_ctx(block, inputs, scheme)
    # every row in every step: the first step's loss is round to nearest's on the whole set
    algo = build_algorithm("learned_rounding", {"iters": 40, "batch_size": 4})
    results = algo.quantize_layer(ctx)
    for name, r in results.items():
        w = getattr(original, name).weight.data
        q, s, z = rtn_quantize_weight(w, args)
        getattr(rtn, name).weight.data = dequantize(q, s, z, args)
        decoded = r.dequantized(args, torch.float32)
        getattr(block, name).weight.data = decoded
        assert torch.equal(decoded, dequantize(r.q, r.scale, r.zero_point, args))   # codes on the written scales
        assert r.scale.shape == (w.shape[0], w.shape[1] // args.group_size)
        json.dumps(r.stats)
    st = results["up_proj"].stats
    rtn_error, learned_error = block_error(original, rtn, inputs), block_error(original, block, inputs)
    assert st["rtn_loss"] == pytest.approx(rtn_error, rel=1e-4)
    assert st["loss"] == pytest.approx(learned_error, rel=1e-4)
    assert learned_error < 0.9 * rtn_error


def test_rows_drawn_per_step_and_seed_repeat():
    scheme = QuantScheme(("Linear",), QuantArgs(num_bits=4, group_size=16))
    inputs = [correlated_rows(3, 8, 64, seed=s) for s in range(2)]

    def codes(seed: int):
        block = Block()
        out = build_algorithm("learned_rounding", {"iters": 6, "batch_size": 2, "seed": seed}).quantize_layer(
            make_ctx(block, inputs, scheme))
        return out["up_proj"].q, out["up_proj"].stats

    (a, st), (b, _) = codes(0), codes(0)
    assert torch.equal(a, b) and st["rows"] == 6 and st["batch_size"] == 2


def test_options_and_presets():
    assert build_algorithm("learned_rounding").settings == SignRoundSettings(200, None, 8, True, 0)
    assert build_algorithm("learned_rounding").settings.step_size == pytest.approx(0.005)
    assert build_algorithm("learned_rounding", {"preset": "fast"}).settings == SignRoundSettings(50, 5e-3, 8, True, 0)
    assert build_algorithm("learned_rounding", {"preset": "fast", "iters": 20}).settings.step_size == pytest.approx(0.05)
    assert not build_algorithm("learned_rounding", {"minmax_tuning": False}).settings.minmax
    for bad, key in (({"iters": 0}, "iters"), ({"lr": -1.0}, "lr"), ({"preset": "best"}, "preset"),
                     ({"batch": 8}, "batch")):
        with pytest.raises(QuantkitError, match=key):
            build_algorithm("learned_rounding", bad)


# -- a model, written and read back -----------------------------------------------------------
@pytest.fixture(scope="module")
def learned_w4(tiny_llama, tmp_path_factory):
    recipe = {"config_groups": {"group_0": {"targets": ["Linear"], "weights": {
        "num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32}}},
        "ignore": ["lm_head"], "algorithm": {"name": "learned_rounding", "iters": 4, "batch_size": 2}}
    return quantkit.quantize(tiny_llama, recipe, calibration=random_ids(4, 32)).save(
        tmp_path_factory.mktemp("learned") / "w4")


def test_transformers_reads_the_checkpoint_back(learned_w4):
    from transformers import AutoModelForCausalLM

    config = json.loads((learned_w4 / "config.json").read_text())["quantization_config"]
    assert config["format"] == "pack-quantized"
    theirs = AutoModelForCausalLM.from_pretrained(learned_w4, dtype=torch.float32)
    ours = quantkit.load(learned_w4)
    ids = torch.tensor(random_ids(2, 16, seed=3))
    with torch.no_grad():
        a, b = ours(ids).logits, theirs(ids).logits
    assert float((a - b).norm() / b.norm()) <= 1e-5
    log = json.loads((learned_w4 / "quantization_log.json").read_text())
    assert "learned_rounding" in json.dumps(log)
