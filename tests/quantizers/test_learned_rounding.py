"""Learned rounding (quantizers/learned_rounding): the optimisation on its own, the grids'
differentiable form against their codes, a planted layer where it must beat round to nearest,
and a checkpoint transformers reads back."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from torch import nn

import quantkit
from model_factory import random_ids
from quantkit.config.scheme import PRESETS, QuantArgs, QuantScheme
from quantkit.errors import QuantkitError
from quantkit.quantizers.learned_rounding import SignRoundSettings, sign_sgd
from quantkit.quantizers.learned_rounding.block import BlockRows, joined, layer_output, masked_squared_error
from quantkit.numerics.number_formats import Clip, QParams, number_format
from quantkit.quantizers.rtn import rtn_weight
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


# -- the formats, as the quantizer uses them ------------------------------------------------
FORMATS = {"int2-g8": QuantArgs(num_bits=2, group_size=8), "int3-asym-g8": QuantArgs(num_bits=3, symmetric=False, group_size=8),
           "int4-g8": QuantArgs(num_bits=4, group_size=8), "int4-asym-channel": QuantArgs(num_bits=4, symmetric=False),
           "int8-g16": QuantArgs(num_bits=8, group_size=16),
           "nvfp4": PRESETS["NVFP4A16"].weights, "mxfp4": PRESETS["MXFP4A16"].weights}


@pytest.mark.parametrize("name", list(FORMATS))
def test_fake_quantization_is_the_codes_on_the_written_scales(name):
    """The optimisation's forward (fake-quantization with offsets and clip factors) is exactly
    the weight the codes written on the learned scales decode to."""
    args = FORMATS[name]
    fmt = number_format(args)
    g = torch.Generator().manual_seed(len(name))
    w = torch.randn(6, 64, generator=g)
    shape = fmt.scales(w, Clip(1.0, 1.0)).scale.shape
    v = torch.rand(6, 64, generator=g) - 0.5
    clip = Clip(0.5 + 0.5 * torch.rand(shape, generator=g), 0.5 + 0.5 * torch.rand(shape, generator=g))
    gs = fmt.global_scale(w)
    qp = fmt.scales(w, clip, gs)
    codes = fmt.quantize(w, qp, offset=v)
    assert torch.equal(fmt.fake_quantize(w, v, clip, gs), fmt.dequantize(codes, qp, dtype=w.dtype))
    # no offset, clip factors 1: round to nearest on min-max ranges, what RTN writes
    rtn = rtn_weight(w, args)
    qp = fmt.scales(w, Clip(1.0, 1.0), gs)
    assert torch.equal(fmt.quantize(w, qp), rtn.q) and torch.equal(qp.scale, rtn.scale)


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


def make_ctx(block: Block, inputs: list[torch.Tensor], scheme: QuantScheme,
             float_inputs: list[torch.Tensor] | None = None) -> LayerContext:
    """The block over ``inputs``; ``forward_float`` runs it over ``float_inputs`` (the float model's)."""
    def run(**_):
        for x in inputs:
            block(x)

    def run_float():
        for x in float_inputs:
            block(x)

    targets = {n: (getattr(block, n), scheme) for n in ("up_proj", "down_proj")}
    return LayerContext(0, "model.layers.0", block, targets, [["up_proj"], ["down_proj"]], run,
                        num_samples=sum(x.shape[0] for x in inputs), num_tokens=sum(x.shape[:2].numel() for x in inputs),
                        forward_float=run_float if float_inputs is not None else None)


def block_error(reference: Block, quantized: Block, inputs, float_inputs=None) -> float:
    """Mean squared error of ``quantized`` on ``inputs`` against ``reference`` on ``float_inputs``
    (the same inputs when None)."""
    pairs = list(zip(inputs, float_inputs or inputs))
    with torch.no_grad():
        return sum(float((reference(xf) - quantized(x)).pow(2).sum()) for x, xf in pairs) / sum(
            x.numel() for x in inputs)


@pytest.mark.parametrize("args", [QuantArgs(num_bits=4, group_size=16), QuantArgs(num_bits=3, symmetric=False, group_size=32),
                                  PRESETS["NVFP4A16"].weights, PRESETS["MXFP4A16"].weights],
                         ids=["w4-sym-g16", "w3-asym-g32", "nvfp4", "mxfp4"])
@pytest.mark.parametrize("amp", [False, True], ids=["float32", "bf16-autocast"])
def test_beats_round_to_nearest_on_the_block_output(args, amp):
    scheme = QuantScheme(("Linear",), args)
    inputs = [correlated_rows(2, 16, 64, seed=s) for s in range(2)]
    block, original, rtn = Block(), Block(), Block()
    ctx = make_ctx(block, inputs, scheme)
    # every row in every step: the first step's loss is round to nearest's on the whole set
    algo = build_algorithm("learned_rounding", {"iters": 40, "batch_size": 4, "float_target": False, "amp": amp,
                                                 "compile": False})
    assert not algo.needs_float_inputs
    results = algo.quantize_layer(ctx)
    for name, r in results.items():
        w = getattr(original, name).weight.data
        getattr(rtn, name).weight.data = rtn_weight(w, args).dequantized(args, torch.float32)
        decoded = r.dequantized(args, torch.float32)
        getattr(block, name).weight.data = decoded
        fmt = number_format(args)   # the codes decode to the written scales
        assert torch.equal(decoded, fmt.dequantize(r.q, QParams(r.scale, r.zero_point, r.global_scale), dtype=torch.float32))
        assert r.scale.shape == (w.shape[0], w.shape[1] // args.group_size)
        json.dumps(r.stats)
    st = results["up_proj"].stats
    rtn_error, learned_error = block_error(original, rtn, inputs), block_error(original, block, inputs)
    assert st["amp"] is amp
    # under autocast the loss the steps see is bfloat16's: its bookkeeping is checked in float32,
    # the gain in both (measured here in float32)
    if not amp:
        assert st["rtn_loss"] == pytest.approx(rtn_error, rel=1e-4)
        assert st["loss"] == pytest.approx(learned_error, rel=1e-4)
    else:
        assert st["rtn_loss"] == pytest.approx(rtn_error, rel=0.05)
    assert learned_error < 0.9 * rtn_error


def _imatrix(args: QuantArgs) -> QuantArgs:
    return dataclasses.replace(args, observer="imatrix_mse")


@pytest.mark.parametrize("args", [_imatrix(QuantArgs(num_bits=4, group_size=16)), _imatrix(PRESETS["NVFP4A16"].weights)],
                         ids=["w4-g16", "nvfp4"])
def test_learning_starts_from_the_observers_ranges(args):
    """With ``observer: imatrix_mse`` the first step is round to nearest on the ranges that
    observer picks from the same inputs (what RTN writes with it), not on min-max ranges; one
    step keeps it."""
    scheme = QuantScheme(("Linear",), args)
    inputs = [correlated_rows(2, 16, 64, seed=s) for s in range(2)]
    learned_block, rtn_block = Block(), Block()
    weights = {n: getattr(rtn_block, n).weight.detach().clone() for n in ("up_proj", "down_proj")}
    contexts = []
    for block in (learned_block, rtn_block):
        ctx = make_ctx(block, inputs, scheme)
        ctx.num_batches = len(inputs)   # a run with calibration data: the observer weighs the columns
        contexts.append(ctx)
    algo = build_algorithm("learned_rounding", {"iters": 1, "float_target": False, "amp": False, "compile": False})
    learned = algo.quantize_layer(contexts[0])
    rtn = build_algorithm("rtn").quantize_layer(contexts[1])
    minmax = dataclasses.replace(args, observer="minmax")
    for name, w in weights.items():
        assert torch.equal(learned[name].q, rtn[name].q) and torch.equal(learned[name].scale, rtn[name].scale), name
        assert not torch.equal(learned[name].scale, rtn_weight(w, minmax).scale), name


def test_the_float_target_is_the_float_models_output():
    """With the float model's inputs carried beside the quantized model's, the target is the float
    layer's output on them: the first step's loss is RTN's error against it, and learning lowers
    it below RTN's, also below what learning against the layer's own output on the quantized
    inputs reaches."""
    args = QuantArgs(num_bits=3, group_size=16)
    scheme = QuantScheme(("Linear",), args)
    float_inputs = [correlated_rows(2, 16, 64, seed=s) for s in range(2)]
    g = torch.Generator().manual_seed(9)
    inputs = [x + 0.2 * torch.randn(x.shape, generator=g) for x in float_inputs]   # earlier layers' error
    original, rtn = Block(), Block()
    for name in ("up_proj", "down_proj"):
        getattr(rtn, name).weight.data = rtn_weight(getattr(original, name).weight.data, args).dequantized(args, torch.float32)
    errors, first = {}, {}
    for float_target in (True, False):
        block = Block()
        algo = build_algorithm("learned_rounding", {"iters": 40, "batch_size": 4, "float_target": float_target,
                                                     "amp": False, "compile": False})
        assert algo.needs_float_inputs == float_target
        results = algo.quantize_layer(make_ctx(block, inputs, scheme, float_inputs))
        for name, r in results.items():
            getattr(block, name).weight.data = r.dequantized(args, torch.float32)
        errors[float_target] = block_error(original, block, inputs, float_inputs)
        first[float_target] = results["up_proj"].stats["rtn_loss"]
    rtn_error = block_error(original, rtn, inputs, float_inputs)
    assert first[True] == pytest.approx(rtn_error, rel=1e-4)
    assert first[False] == pytest.approx(block_error(original, rtn, inputs), rel=1e-4)
    assert errors[True] < errors[False] < rtn_error


def test_the_float_target_needs_the_float_models_inputs():
    scheme = QuantScheme(("Linear",), QuantArgs(num_bits=4, group_size=16))
    ctx = make_ctx(Block(), [correlated_rows(2, 8, 64, seed=0)], scheme)
    with pytest.raises(QuantkitError, match="float model's layer inputs"):
        build_algorithm("learned_rounding", {"iters": 1}).quantize_layer(ctx)


def test_a_layer_without_targets_still_moves_the_float_model_on():
    scheme = QuantScheme(("Linear",), QuantArgs(num_bits=4, group_size=16))
    float_passes = []
    ctx = make_ctx(Block(), [correlated_rows(1, 8, 64, seed=0)], scheme, [correlated_rows(1, 8, 64, seed=1)])
    ctx.targets = {}
    ctx.forward_float = lambda: float_passes.append(1)
    assert build_algorithm("learned_rounding").quantize_layer(ctx) == {} and float_passes == [1]


class Shifted(Block):
    """The block with a keyword argument: a per-row shift, or a tensor every row shares."""

    def forward(self, x, shift=None, mode="add"):
        y = super().forward(x)
        return y + shift if mode == "add" else y - shift


def test_calibration_batches_join_into_one_call_where_their_arguments_allow():
    """Rows cut alike from every batch join; a tensor equal in every batch is kept once; the joined
    call gives each row the error it had in its own batch. Batches that differ in anything
    else stay apart."""
    layer = Shifted()
    xs = [correlated_rows(n, 8, 64, seed=n) for n in (2, 3)]
    per_row = [torch.randn(n, 8, 64) for n in (2, 3)]
    shared = torch.randn(64)
    calls = [((x,), {"shift": s, "mode": "add"}) for x, s in zip(xs, per_row)]
    block = BlockRows(layer, calls, [torch.ones(n, 8, dtype=torch.bool) for n in (2, 3)],
                      [torch.zeros(n, 8, 64) for n in (2, 3)])
    one = joined(block)
    assert len(one.calls) == 1 and one.calls[0][0][0].shape[0] == 5 and one.rows == [(0, r) for r in range(5)]
    def error(b: BlockRows, call: int, rows: list[int]) -> torch.Tensor:
        args, kwargs, reference, keep = b.inputs(call, torch.tensor(rows))
        return masked_squared_error(layer_output(b.layer, {}, args, kwargs, b.amp), reference, keep)

    with torch.no_grad():
        apart = error(block, 0, [1]) + error(block, 1, [0, 2])
        together = error(one, 0, [1, 2, 4])
    torch.testing.assert_close(together, apart)
    kept_once = joined(BlockRows(layer, [((x,), {"shift": shared}) for x in xs], block.kept, block.reference))
    assert len(kept_once.calls) == 1 and kept_once.calls[0][1]["shift"] is shared
    differing = [((x,), {"shift": shared, "mode": m}) for x, m in zip(xs, ("add", "sub"))]
    assert len(joined(BlockRows(layer, differing, block.kept, block.reference)).calls) == 2
    other_shift = [((x,), {"shift": torch.randn(64)}) for x in xs]
    assert len(joined(BlockRows(layer, other_shift, block.kept, block.reference)).calls) == 2


@pytest.mark.parametrize("amp", [False, True], ids=["float32", "bf16-autocast"])
def test_the_compiled_step_learns_what_the_eager_one_does(amp):
    """torch.compile fuses the step, it does not change it: in float32 the same draws give losses
    equal to the eager run's up to the fused kernels' rounding, and the layer's figures say which
    ran."""
    scheme = QuantScheme(("Linear",), QuantArgs(num_bits=4, group_size=16))
    inputs = [correlated_rows(2, 16, 64, seed=s) for s in range(2)]
    stats = {}
    for compiled in (False, True):
        algo = build_algorithm("learned_rounding", {"iters": 8, "batch_size": 2, "float_target": False, "amp": amp,
                                                     "compile": compiled})
        stats[compiled] = algo.quantize_layer(make_ctx(Block(), inputs, scheme))["up_proj"].stats
    assert stats[True]["compiled"] is True and stats[False]["compiled"] is False
    assert "compile_fallback" not in stats[True]
    if not amp:
        for key in ("rtn_loss", "loss"):
            assert stats[True][key] == pytest.approx(stats[False][key], rel=1e-4), key
    else:   # bfloat16's rounding flips some gradients' signs: the paths part, both still learn
        assert stats[True]["rtn_loss"] == pytest.approx(stats[False]["rtn_loss"], rel=2e-2)
        assert all(st["loss"] < st["rtn_loss"] for st in stats.values())


def test_a_failing_compiler_leaves_the_run_eager_and_says_why(monkeypatch):
    from quantkit.quantizers.learned_rounding import step_error

    def broken():
        def fail(*args):
            raise torch._dynamo.exc.TorchDynamoException("no C++ compiler found")
        return fail

    monkeypatch.setattr(step_error, "compiled_step_error", broken)
    monkeypatch.setattr(step_error, "_failure", None)
    scheme = QuantScheme(("Linear",), QuantArgs(num_bits=4, group_size=16))
    inputs = [correlated_rows(2, 16, 64, seed=s) for s in range(2)]
    options = {"iters": 4, "batch_size": 2, "float_target": False, "amp": False}
    broken_run = build_algorithm("learned_rounding", {**options, "compile": True}).quantize_layer(
        make_ctx(Block(), inputs, scheme))
    eager_run = build_algorithm("learned_rounding", {**options, "compile": False}).quantize_layer(
        make_ctx(Block(), inputs, scheme))
    st = broken_run["up_proj"].stats
    assert st["compiled"] is False and "no C++ compiler found" in st["compile_fallback"]
    assert torch.equal(broken_run["up_proj"].q, eager_run["up_proj"].q)
    # the rest of the process stays eager without trying again
    again = build_algorithm("learned_rounding", {**options, "compile": True}).quantize_layer(
        make_ctx(Block(), inputs, scheme))["up_proj"].stats
    assert again["compiled"] is False and "no C++ compiler found" in again["compile_fallback"]


def test_rows_drawn_per_step_and_seed_repeat():
    scheme = QuantScheme(("Linear",), QuantArgs(num_bits=4, group_size=16))
    inputs = [correlated_rows(3, 8, 64, seed=s) for s in range(2)]

    def codes(seed: int):
        block = Block()
        out = build_algorithm("learned_rounding", {"iters": 6, "batch_size": 2, "seed": seed,
                                                   "float_target": False, "compile": False}).quantize_layer(
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
    assert build_algorithm("learned_rounding").amp is None and not build_algorithm("learned_rounding", {"amp": False}).amp


def test_amp_follows_the_hosts_native_bfloat16(monkeypatch):
    """The default reads the host's CPU flags: bfloat16 autocast where AMX or AVX-512 BF16 runs it."""
    from pathlib import Path

    from quantkit.quantizers.learned_rounding import step

    real = Path.read_text
    for flags, want in (("avx512f avx2", False), ("avx512f avx512_bf16", True), ("amx_bf16 amx_int8 amx_tile", True)):
        monkeypatch.setattr(Path, "read_text", lambda self, *a, _f=flags, **k: f"model name : x\nflags : {_f}\n"
                            if str(self) == "/proc/cpuinfo" else real(self, *a, **k))
        assert step.native_bf16(nn.Linear(2, 2)) is want, flags
    for bad, key in (({"iters": 0}, "iters"), ({"lr": -1.0}, "lr"), ({"preset": "best"}, "preset"),
                     ({"batch": 8}, "batch")):
        with pytest.raises(QuantkitError, match=key):
            build_algorithm("learned_rounding", bad)


# -- a model, written and read back -----------------------------------------------------------
READBACK = {"W4A16-g32": {"config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                "num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32}}}},
            "NVFP4A16": {"scheme": "NVFP4A16"}, "MXFP4A16": {"scheme": "MXFP4A16"}}


@pytest.fixture(scope="module")
def learned(tiny_llama, tmp_path_factory):
    """A bfloat16 model (the dtype compressed-tensors decompresses FP4 to) by learned rounding."""
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("learned")
    AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.bfloat16).save_pretrained(root / "bf16")
    algorithm = {"name": "learned_rounding", "iters": 4, "batch_size": 2}
    return {name: quantkit.quantize(root / "bf16", {**r, "ignore": ["lm_head"], "algorithm": algorithm},
                                    calibration=random_ids(4, 32)).save(root / name)
            for name, r in READBACK.items()}


@pytest.mark.parametrize("name", list(READBACK))
def test_transformers_reads_the_checkpoint_back(learned, name):
    from transformers import AutoModelForCausalLM

    path = learned[name]
    config = json.loads((path / "config.json").read_text())["quantization_config"]
    assert config["format"] == {"W4A16-g32": "pack-quantized", "NVFP4A16": "nvfp4-pack-quantized",
                                "MXFP4A16": "mxfp4-pack-quantized"}[name]
    theirs = AutoModelForCausalLM.from_pretrained(path)
    ours = quantkit.load(path)
    ids = torch.tensor(random_ids(2, 16, seed=3))
    with torch.no_grad():
        a, b = ours(ids).logits.float(), theirs(ids).logits.float()
    assert float((a - b).norm() / b.norm()) <= 1e-6
    log = json.loads((path / "quantization_log.json").read_text())
    assert "learned_rounding" in json.dumps(log)
