"""GPTQ: the solve against a slow column-by-column reference, quality against RTN,
damping escalation, act-order, and the layer-level algorithm on a tiny hand-built layer."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from quantkit.steps import LayerContext, build_algorithm
from quantkit.quantizers.gptq import columns as columns_mod
from quantkit.numerics import gram as gram_mod
from quantkit.quantizers.gptq import hessian as hessian_mod
from quantkit.quantizers.gptq import solve as solve_mod
from quantkit.quantizers.gptq import GPTQ, accumulate_hessian, inverse_hessian_factor, gptq_quantize_weight
from quantkit.errors import QuantkitError
from quantkit.numerics.primitives import calculate_qparams, dequantize, reduce_minmax
from quantkit.numerics.primitives import quantize_weight as rtn_quantize_weight
from quantkit.config.scheme import PRESETS, QuantArgs, QuantScheme


# -- data -------------------------------------------------------------------------------
def correlated_inputs(tokens: int, cols: int, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    """Inputs with strongly correlated features and uneven channel scales, like LLM activations."""
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(cols, cols, generator=g, dtype=torch.float64) / cols ** 0.5
    x = torch.randn(tokens, cols // 4, generator=g, dtype=torch.float64) @ mix[: cols // 4]
    x = x + 0.05 * torch.randn(tokens, cols, generator=g, dtype=torch.float64)
    x = x * torch.logspace(0, 1, cols, dtype=torch.float64)[torch.randperm(cols, generator=g)]
    return x.to(dtype)


def weight(rows: int, cols: int, seed: int = 1, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=g, dtype=torch.float64).to(dtype)


def output_error(W: torch.Tensor, W_hat: torch.Tensor, X: torch.Tensor) -> float:
    return float(((W.double() - W_hat.double()) @ X.double().T).pow(2).mean())


# -- the slow, obviously-correct reference ----------------------------------------------------
def reference_gptq(W, H, args: QuantArgs, dampening_frac=0.01, static_groups=False):
    """Optimal-brain-surgeon quantization one column at a time, in float64, no tricks.

    At each step the inverse of the damped Hessian restricted to the columns still free is
    computed from scratch; the quantized column's error is spread over them with
    ``delta = -(w_p - q_p) / Hinv_pp * Hinv_p,:``. Group qparams are fixed when the first
    column of the group is reached, from the group's columns as they are then.
    Returns the dequantized weight in the original column order.
    """
    W = W.double().clone()
    H = H.double().clone()
    rows, cols = W.shape
    dead = torch.diagonal(H) == 0
    H[dead, dead] = 1
    W[:, dead] = 0
    Hd = H + dampening_frac * torch.diagonal(H).mean() * torch.eye(cols, dtype=H.dtype)
    order = list(range(cols))
    if args.actorder:
        order = torch.argsort(torch.diagonal(H), descending=True, stable=True).tolist()
    G = args.group_size

    def group_of(j):  # original column -> group id
        if args.strategy != "group":
            return 0
        if args.actorder == "group":
            return order.index(j) // G
        return j // G

    col_args = QuantArgs(num_bits=args.num_bits, symmetric=args.symmetric, strategy="channel")
    params = {}
    if args.strategy != "group":
        lo, hi = reduce_minmax(W, args)
        params = {0: calculate_qparams(lo, hi, args, dtype=torch.float64)}
    elif static_groups:
        for g in set(group_of(j) for j in range(cols)):
            cols_g = [j for j in range(cols) if group_of(j) == g]
            lo, hi = reduce_minmax(W[:, cols_g], col_args)
            params[g] = calculate_qparams(lo, hi, col_args, dtype=torch.float64)
    Q = torch.zeros_like(W)
    free = list(order)
    for j in order:
        g = group_of(j)
        if g not in params:
            cols_g = [k for k in range(cols) if group_of(k) == g]
            lo, hi = reduce_minmax(W[:, cols_g], col_args)
            params[g] = calculate_qparams(lo, hi, col_args, dtype=torch.float64)
        s, z = params[g]
        s = s.reshape(-1)
        v = W[:, j] / s + (0 if z is None else z.reshape(-1).double())
        c = torch.round(v).clamp(args.qmin, args.qmax)
        Q[:, j] = (c - (0 if z is None else z.reshape(-1).double())) * s
        Hinv = torch.linalg.inv(Hd[free][:, free])
        err = (W[:, j] - Q[:, j]) / Hinv[0, 0]
        W[:, free] -= err[:, None] * Hinv[0][None, :]
        free = free[1:]
    return Q


ARGS = {
    "channel-sym-w4": QuantArgs(num_bits=4, strategy="channel"),
    "group-sym-w4": QuantArgs(num_bits=4, group_size=16),
    "group-asym-w4": QuantArgs(num_bits=4, group_size=16, symmetric=False),
    "group-w3": QuantArgs(num_bits=3, group_size=32),
    "actorder-weight": QuantArgs(num_bits=4, group_size=16, actorder="weight"),
    "actorder-group": QuantArgs(num_bits=4, group_size=16, actorder="group"),
    "actorder-weight-channel": QuantArgs(num_bits=4, strategy="channel", actorder="weight"),
    "w8-channel": QuantArgs(num_bits=8, strategy="channel"),
}


@pytest.fixture
def float64_solve(monkeypatch):
    for module in (hessian_mod, solve_mod, columns_mod):   # each module that reads the precision
        monkeypatch.setattr(module, "GPTQ_PRECISION", torch.float64)


@pytest.mark.parametrize("static_groups", [False, True])
@pytest.mark.parametrize("name", list(ARGS))
def test_solve_matches_column_by_column_reference(name, static_groups, float64_solve):
    args = ARGS[name]
    X = correlated_inputs(512, 64, dtype=torch.float64)
    X[:, 5] = 0  # a dead input column
    W = weight(24, 64, dtype=torch.float64)
    H, _ = accumulate_hessian(X, None, 0)
    res = gptq_quantize_weight(W, H, args, block_size=16, static_groups=static_groups)
    ref = reference_gptq(W, H, args, static_groups=static_groups)
    assert res.dead_columns == 1
    # block-wise lazy updates and the Cholesky form change nothing but round-off
    assert torch.equal(res.w_hat, ref), f"{(res.w_hat != ref).sum()} of {ref.numel()} values differ"
    # the codes and qparams decode to the same weight, in original column order
    assert torch.equal(dequantize(res.q, res.scale, res.zero_point, args, res.g_idx), res.w_hat)


def test_solve_in_fp32_agrees_with_reference():
    args = QuantArgs(num_bits=4, group_size=32, actorder="group")
    X = correlated_inputs(2048, 128)
    W = weight(64, 128)
    H, _ = accumulate_hessian(X, None, 0)
    res = gptq_quantize_weight(W, H, args, block_size=32)
    ref = reference_gptq(W, H, args)
    agree = float(torch.isclose(res.w_hat.double(), ref, rtol=1e-5, atol=1e-6).double().mean())
    assert agree > 0.95  # a code flipped by round-off shifts the later columns a little
    assert output_error(W, res.w_hat, X) == pytest.approx(output_error(W, ref, X), rel=0.02)


@pytest.mark.parametrize("name", ["channel-sym-w4", "group-sym-w4", "group-asym-w4", "actorder-weight",
                                  "actorder-group", "w8-channel"])
def test_layer_output_error_below_rtn_on_correlated_inputs(name):
    args = ARGS[name]
    X = correlated_inputs(4096, 128, seed=3)
    W = weight(96, 128, seed=4)
    H, _ = accumulate_hessian(X[:2048], None, 0)
    res = gptq_quantize_weight(W, H, args)
    q, s, z = rtn_quantize_weight(W, args)
    held_out = X[2048:]  # tokens the Hessian never saw
    gptq_err = output_error(W, res.w_hat, held_out)
    rtn_err = output_error(W, dequantize(q, s, z, args), held_out)
    assert gptq_err < 0.75 * rtn_err, (gptq_err, rtn_err)
    assert float(res.row_loss.sum()) < 0.75 * float(res.row_rtn_loss.sum())


def test_actorder_no_worse_when_input_scales_are_uneven():
    X = correlated_inputs(4096, 128, seed=5)
    W = weight(96, 128, seed=6)
    H, _ = accumulate_hessian(X, None, 0)
    plain = gptq_quantize_weight(W, H, QuantArgs(num_bits=4, group_size=32))
    for actorder in ("weight", "group"):
        act = gptq_quantize_weight(W, H, QuantArgs(num_bits=4, group_size=32, actorder=actorder))
        assert float(act.row_loss.sum()) <= 1.02 * float(plain.row_loss.sum()), actorder


def test_actorder_layouts():
    X = correlated_inputs(1024, 64, seed=7)
    W = weight(16, 64, seed=8)
    H, _ = accumulate_hessian(X, None, 0)
    by_weight = gptq_quantize_weight(W, H, QuantArgs(num_bits=4, group_size=16, actorder="weight"))
    assert by_weight.g_idx is None and by_weight.scale.shape == (16, 4)
    by_group = gptq_quantize_weight(W, H, QuantArgs(num_bits=4, group_size=16, actorder="group"))
    g_idx = by_group.g_idx
    assert g_idx.dtype == torch.int32 and g_idx.shape == (64,)
    assert torch.bincount(g_idx.long()).tolist() == [16, 16, 16, 16]
    assert not torch.equal(g_idx.long(), torch.arange(64) // 16)  # really permuted
    # groups follow the activation order: group 0 holds the 16 largest diag(H) columns
    top = set(torch.argsort(torch.diagonal(H), descending=True)[:16].tolist())
    assert set(torch.nonzero(g_idx == 0).flatten().tolist()) == top


# -- damping and guards --------------------------------------------------------------------
def singular_hessian(cols: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    base = correlated_inputs(1024, cols // 2, seed=9)
    X = torch.cat([base, base], dim=1)  # every column duplicated: rank cols/2
    H, _ = accumulate_hessian(X, None, 0)
    return X, H


def test_singular_hessian_escalates_damping_and_reports_it():
    X, H = singular_hessian()
    W = weight(32, 64, seed=10)
    args = QuantArgs(num_bits=4, group_size=16)
    res = gptq_quantize_weight(W, H, args, dampening_frac=0.0, max_damping_retries=6)
    assert res.damping_retries >= 1 and res.damping > 0
    assert bool(torch.isfinite(res.w_hat).all())
    q, s, z = rtn_quantize_weight(W, args)
    rtn = dequantize(q, s, z, args)
    assert not torch.equal(res.w_hat, rtn)  # not a silent fall back to rounding
    assert output_error(W, res.w_hat, X) < 0.8 * output_error(W, rtn, X)


def test_damping_exhausted_raises_naming_the_key():
    _, H = singular_hessian()
    H = H - 0.5 * torch.diagonal(H).mean() * torch.eye(64)  # indefinite: damping must grow a lot
    with pytest.raises(QuantkitError, match="dampening_frac"):
        gptq_quantize_weight(weight(8, 64), H, QuantArgs(num_bits=4, group_size=16), max_damping_retries=1)
    res = gptq_quantize_weight(weight(8, 64), H, QuantArgs(num_bits=4, group_size=16), max_damping_retries=5)
    assert res.damping_retries >= 2


def test_non_finite_inputs_rejected():
    X = correlated_inputs(256, 32)
    H, _ = accumulate_hessian(X, None, 0)
    H[3, 4] = float("nan")
    with pytest.raises(QuantkitError, match="hessian"):
        gptq_quantize_weight(weight(8, 32), H, QuantArgs(num_bits=4, group_size=16))
    W = weight(8, 32)
    W[0, 0] = float("inf")
    with pytest.raises(QuantkitError, match="weight"):
        gptq_quantize_weight(W, accumulate_hessian(X, None, 0)[0], QuantArgs(num_bits=4, group_size=16))


def test_accumulate_hessian_is_running_mean():
    X = correlated_inputs(300, 16, dtype=torch.float64)
    H, n = None, 0
    for chunk in (X[:100].reshape(4, 25, 16), X[100:]):
        H, n = accumulate_hessian(chunk, H, n)
    assert n == 300
    torch.testing.assert_close(H.double(), 2 * X.T @ X / 300, rtol=1e-5, atol=1e-6)


def test_inverse_factor_records_no_retry_when_healthy():
    _, H = singular_hessian()
    inv = inverse_hessian_factor(H, 0.01, 3)
    assert inv.retries == 0 and inv.damping == 0.01


# -- the algorithm on a tiny layer ---------------------------------------------------------
class TinyLayer(nn.Module):
    """q/k/v read the same tensor, o reads their result, gate/up share, down reads the product."""

    def __init__(self, hidden=64, inter=128):
        super().__init__()
        torch.manual_seed(0)
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(hidden, hidden, bias=False) for _ in range(3))
        self.o_proj = nn.Linear(hidden, hidden, bias=False)
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x):
        h = x / x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
        a = torch.softmax(self.q_proj(h) @ self.k_proj(h).transpose(-1, -2) / 8, dim=-1) @ self.v_proj(h)
        x = x + self.o_proj(a)
        h = x / x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
        return x + self.down_proj(nn.functional.silu(self.gate_proj(h)) * self.up_proj(h))


SUBGROUPS = [["q_proj", "k_proj", "v_proj"], ["o_proj"], ["gate_proj", "up_proj"], ["down_proj"]]


def make_ctx(scheme: QuantScheme, samples: int = 6, seq: int = 48):
    layer = TinyLayer()
    inputs = [correlated_inputs(seq, 64, seed=20 + i).unsqueeze(0) for i in range(samples)]
    calls = []

    def run():
        calls.append(1)
        for x in inputs:
            layer(x)

    targets = {n: (getattr(layer, n), scheme) for group in SUBGROUPS for n in group}
    ctx = LayerContext(0, "model.layers.0", layer, targets, SUBGROUPS, run,
                       num_samples=samples, num_tokens=samples * seq)
    return ctx, layer, inputs, calls


def layer_error(reference: TinyLayer, quantized: TinyLayer, inputs) -> float:
    with torch.no_grad():
        return sum(float((reference(x) - quantized(x)).pow(2).mean()) for x in inputs)


@pytest.mark.parametrize("true_sequential", [True, False])
def test_algorithm_on_a_layer(true_sequential):
    scheme = QuantScheme(("Linear",), QuantArgs(num_bits=4, group_size=16))
    ctx, layer, inputs, calls = make_ctx(scheme)
    original = TinyLayer()
    algo = build_algorithm("gptq", {"true_sequential": true_sequential, "block_size": 32})
    assert type(algo).requires_calibration
    results = algo.quantize_layer(ctx)
    assert set(results) == set(ctx.targets)
    assert len(calls) == (4 if true_sequential else 1)
    for name, r in results.items():
        module = ctx.targets[name][0]
        # the layer now holds exactly the dequantized codes
        assert torch.equal(module.weight.data, dequantize(r.q, r.scale, r.zero_point, scheme.weights, r.g_idx))
        assert r.q.shape == module.weight.shape and r.scale.shape == (module.out_features, 4 if name != "down_proj" else 8)
        st = r.stats
        assert st["tokens"] == 6 * 48 and st["samples"] == 6 and st["damping_retries"] == 0
        assert st["loss"] < st["rtn_loss"]
        json.dumps(st)
    assert sorted(results["q_proj"].stats["hessian_shared_with"]) == ["k_proj", "v_proj"]
    assert results["up_proj"].stats["hessian_shared_with"] == ["gate_proj"]
    assert results["o_proj"].stats["hessian_shared_with"] == []

    # the whole layer's output error is below round-to-nearest's
    rtn_layer = TinyLayer()
    for name in ctx.targets:
        m = getattr(rtn_layer, name)
        q, s, z = rtn_quantize_weight(m.weight.data, scheme.weights)
        m.weight.data = dequantize(q, s, z, scheme.weights)
    assert layer_error(original, layer, inputs) < 0.8 * layer_error(original, rtn_layer, inputs)


def test_stacked_solve_equals_separate_solves():
    scheme = QuantScheme(("Linear",), QuantArgs(num_bits=4, group_size=16, actorder="group"))
    ctx, layer, inputs, _ = make_ctx(scheme)
    H, n = None, 0
    for x in inputs:
        h = x / x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
        H, n = accumulate_hessian(h, H, n)
    separate = {name: gptq_quantize_weight(getattr(layer, name).weight.data, H, scheme.weights)
                for name in ("q_proj", "k_proj", "v_proj")}
    results = GPTQ(true_sequential=True).quantize_layer(ctx)
    for name, res in separate.items():
        assert torch.equal(results[name].q, res.q)
        assert torch.equal(results[name].scale, res.scale)
        assert torch.equal(results[name].g_idx, res.g_idx)


@pytest.mark.parametrize("preset", ["W4A16", "W4A16_ASYM", "W8A16", "W8A8"])
def test_every_int_weight_preset(preset):
    scheme = PRESETS[preset]
    if scheme.weights.strategy == "group":
        scheme = QuantScheme(scheme.targets, QuantArgs(**{**scheme.weights.__dict__, "group_size": 32}),
                             scheme.input_activations)
    ctx, _, _, _ = make_ctx(scheme)
    results = GPTQ().quantize_layer(ctx)
    for name, r in results.items():
        assert r.stats["loss"] < r.stats["rtn_loss"], name
        assert (r.zero_point is None) == scheme.weights.symmetric


def test_options_validated_with_key_names():
    with pytest.raises(QuantkitError, match="unknown key 'blocksize'"):
        build_algorithm("gptq", {"blocksize": 64})
    with pytest.raises(QuantkitError, match="block_size"):
        build_algorithm("gptq", {"block_size": 0})
    with pytest.raises(QuantkitError, match="dampening_frac"):
        build_algorithm("gptq", {"dampening_frac": -1})
    with pytest.raises(QuantkitError, match="true_sequential"):
        build_algorithm("gptq", {"true_sequential": "yes"})


def test_float_weights_rejected():
    ctx, _, _, _ = make_ctx(PRESETS["FP8_DYNAMIC"])
    with pytest.raises(QuantkitError, match="weights.type"):
        GPTQ().quantize_layer(ctx)


# -- one pass: solve each linear in its pre-hook ---------------------------------------------
def make_single_pass_ctx(scheme: QuantScheme, layer: nn.Module, inputs: list[torch.Tensor]):
    """What the pipeline hands over when the calibration set fits one call: one batch."""
    batch = torch.cat(inputs)
    calls, outputs = [], []

    def run(propagate: bool = False, interleaved: bool = False):
        calls.append(propagate)
        with torch.no_grad():
            out = layer(batch)
        if propagate:
            outputs.append(out)

    targets = {n: (getattr(layer, n), scheme) for group in SUBGROUPS for n in group}
    ctx = LayerContext(0, "model.layers.0", layer, targets, SUBGROUPS, run, num_samples=len(inputs),
                       num_tokens=batch.shape[0] * batch.shape[1], single_pass=True)
    return ctx, calls, outputs


def make_rerun_ctx(scheme: QuantScheme, layer: nn.Module, inputs: list[torch.Tensor]):
    """The per-sub-group path over the same one batch ``make_single_pass_ctx`` runs: a layer
    pass per sub-group, nothing else different (not even the Hessians' summation order)."""
    batch = torch.cat(inputs)
    calls = []

    def run():
        calls.append(1)
        with torch.no_grad():
            layer(batch)

    targets = {n: (getattr(layer, n), scheme) for group in SUBGROUPS for n in group}
    ctx = LayerContext(0, "model.layers.0", layer, targets, SUBGROUPS, run, num_samples=len(inputs),
                       num_tokens=batch.shape[0] * batch.shape[1])
    return ctx, calls


@pytest.mark.parametrize("actorder", [None, "weight", "group"])
def test_single_pass_equals_true_sequential_reruns(actorder):
    """Solving each linear inside one forward pass gives what one pass per sub-group gives.

    Both see the same single batch, so every Hessian is summed in the same order and the
    results must be identical. (Over six batches against one they differ by summation order
    only, and on this tiny layer o_proj's small Hessian turns that into up to 21% of its codes
    and 5% of its loss, depending on the CPU's BLAS kernels: nothing a test can bound.)"""
    scheme = QuantScheme(("Linear",), QuantArgs(num_bits=4, group_size=16, actorder=actorder))
    _, _, inputs, _ = make_ctx(scheme)
    rerun_ctx, rerun_calls = make_rerun_ctx(scheme, TinyLayer(), inputs)
    rerun = GPTQ(true_sequential=True).quantize_layer(rerun_ctx)
    assert len(rerun_calls) == 4 and not rerun_ctx.propagated

    layer = TinyLayer()
    ctx, calls, outputs = make_single_pass_ctx(scheme, layer, inputs)
    one = GPTQ(true_sequential=True).quantize_layer(ctx)
    # one pass, and it is the propagation pass: its output is the quantized layer's output
    assert calls == [True] and ctx.propagated
    with torch.no_grad():
        assert torch.equal(outputs[0], layer(torch.cat(inputs)))
    for name in SUBGROUPS[0] + SUBGROUPS[1] + SUBGROUPS[2] + SUBGROUPS[3]:
        a, b = one[name], rerun[name]
        assert torch.equal(a.q, b.q) and torch.equal(a.scale, b.scale), name
        assert a.stats["loss"] == b.stats["loss"], name
        assert torch.equal(getattr(layer, name).weight.data,
                           a.dequantized(scheme.weights, torch.float32))
        assert a.stats["subgroup"] == b.stats["subgroup"]
        assert sorted(a.stats["hessian_shared_with"]) == sorted(b.stats["hessian_shared_with"])
        assert a.stats["tokens"] == b.stats["tokens"] == 6 * 48


class SkewedLayer(TinyLayer):
    """k_proj reads a different tensor from q_proj and v_proj: no shared Hessian for it."""

    def forward(self, x):
        h = x / x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
        a = torch.softmax(self.q_proj(h) @ self.k_proj(h * 1.5 + 0.1).transpose(-1, -2) / 8, dim=-1) @ self.v_proj(h)
        x = x + self.o_proj(a)
        h = x / x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
        return x + self.down_proj(nn.functional.silu(self.gate_proj(h)) * self.up_proj(h))


def test_single_pass_solves_a_linear_again_when_its_input_differs():
    scheme = QuantScheme(("Linear",), QuantArgs(num_bits=4, group_size=16))
    layer = SkewedLayer()
    w_k = layer.k_proj.weight.data.clone()
    inputs = [correlated_inputs(48, 64, seed=20 + i).unsqueeze(0) for i in range(6)]
    ctx, _, _ = make_single_pass_ctx(scheme, layer, inputs)
    results = GPTQ(true_sequential=True).quantize_layer(ctx)
    assert results["k_proj"].stats["hessian_shared_with"] == []
    assert sorted(results["q_proj"].stats["hessian_shared_with"]) == ["v_proj"]
    x = torch.cat(inputs)
    h = x / x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
    H, _ = accumulate_hessian(h * 1.5 + 0.1, None, 0)
    alone = gptq_quantize_weight(w_k, H, scheme.weights)
    assert torch.equal(results["k_proj"].q, alone.q)
    assert torch.equal(layer.k_proj.weight.data, results["k_proj"].dequantized(scheme.weights, torch.float32))


@pytest.mark.parametrize("cols", [gram_mod._GRAM_BLOCK + 5, 3 * gram_mod._GRAM_BLOCK + 17,
                                  gram_mod._WIDE_GRAM_COLUMNS + 3 * gram_mod._GRAM_BLOCK + 7])
def test_gram_is_the_exact_symmetric_product(cols):
    x = correlated_inputs(300, cols, seed=4)
    G = gram_mod.gram(x)
    torch.testing.assert_close(G, x.T @ x, rtol=1e-5, atol=1e-3)
    assert torch.equal(G, G.T)


@pytest.mark.parametrize("cols", [3 * gram_mod._GRAM_BLOCK + 17, gram_mod._WIDE_GRAM_COLUMNS + 3 * gram_mod._GRAM_BLOCK + 7])
def test_hessian_folds_in_place_to_the_running_mean_of_every_batch(cols):
    """Batches folded one by one (``beta * H + alpha * x^T x`` into ``H``'s own memory) give
    ``2/T * X^T X`` of all of them at once, exactly symmetric at every step."""
    batches = [correlated_inputs(n, cols, seed=s) for s, n in enumerate([200, 57, 300])]
    H, seen = None, 0
    for x in batches:
        H, seen = accumulate_hessian(x, H, seen)
        assert torch.equal(H, H.T)
    X = torch.cat(batches).double()
    assert seen == X.shape[0]
    torch.testing.assert_close(H.double(), 2 * X.T @ X / seen, rtol=1e-5, atol=1e-4)


def make_lockstep_ctx(scheme: QuantScheme, layer: nn.Module, inputs: list[torch.Tensor]):
    """The pipeline's lockstep pass: each input a calibration batch (``Interleaver``). Returns the
    context, the running batch (``current["batch"]``) and the keys each pausing batch waited at."""
    from quantkit.pipeline.interleave import Interleaver

    lockstep, current, paused = Interleaver(), {"batch": None}, []

    def run(propagate: bool = False, interleaved: bool = False):
        assert interleaved
        with torch.no_grad():
            lockstep.run([lambda x=x: layer(x) for x in inputs],
                         before=lambda j: current.__setitem__("batch", j))

    def sync(key, action, park=()):
        paused.append(key)
        lockstep.sync(key, action)

    targets = {n: (getattr(layer, n), scheme) for group in SUBGROUPS for n in group}
    ctx = LayerContext(0, "model.layers.0", layer, targets, SUBGROUPS, run, num_samples=len(inputs),
                       num_tokens=len(inputs) * inputs[0].shape[1], single_pass=True, num_batches=len(inputs),
                       sync=sync, batch_index=lambda: current["batch"])
    return ctx, current, paused


def test_one_pass_keeps_no_batch_input_alive_after_the_layer_is_done_with_it():
    """In lockstep every batch pauses at each sync point. The pass may keep what the layer's own
    frames hold, but not earlier inputs: holding each batch's input of every linear until the
    pass ended cost about 800 MiB on SmolLM2 (16 batches of 4096 tokens)."""
    import weakref

    scheme = QuantScheme(("Linear",), QuantArgs(num_bits=4, group_size=16))
    layer = TinyLayer()
    inputs = [correlated_inputs(48, 64, seed=40 + i).unsqueeze(0) for i in range(4)]
    ctx, current, _ = make_lockstep_ctx(scheme, layer, inputs)
    targets = ctx.targets
    q_inputs: dict[int, weakref.ref] = {}
    alive_at_down: list[int] = []
    # registered before GPTQ's own hooks, so they run first
    layer.q_proj.register_forward_pre_hook(lambda m, a: q_inputs.__setitem__(current["batch"], weakref.ref(a[0])))
    layer.down_proj.register_forward_pre_hook(
        lambda m, a: alive_at_down.append(current["batch"]) if q_inputs[current["batch"]]() is not None else None)
    results = GPTQ(true_sequential=True).quantize_layer(ctx)
    assert ctx.propagated and set(results) == set(targets)
    assert len(q_inputs) == len(inputs)
    # by down_proj the normed attention input is dead in the layer's frames: nothing else may hold it
    assert alive_at_down == []


def test_lockstep_pauses_only_where_a_solve_waits_for_every_batch():
    """k/v and up read the input q and gate were solved stacked on: the first batch confirms the
    stacked result and no batch waits there (a wait at up_proj kept every batch's act(gate)
    alive). The results are those of one batch holding all the tokens."""
    scheme = QuantScheme(("Linear",), QuantArgs(num_bits=4, group_size=16))
    inputs = [correlated_inputs(48, 64, seed=60 + i).unsqueeze(0) for i in range(4)]
    layer = TinyLayer()
    ctx, _, paused = make_lockstep_ctx(scheme, layer, inputs)
    results = GPTQ(true_sequential=True).quantize_layer(ctx)
    assert paused == [k for k in ("q_proj", "o_proj", "gate_proj", "down_proj") for _ in inputs]
    assert sorted(results["q_proj"].stats["hessian_shared_with"]) == ["k_proj", "v_proj"]
    assert sorted(results["up_proj"].stats["hessian_shared_with"]) == ["gate_proj"]
    alone_layer = TinyLayer()
    one, _, _ = make_single_pass_ctx(scheme, alone_layer, inputs)
    alone = GPTQ(true_sequential=True).quantize_layer(one)
    for name in results:
        # the same Hessians up to summation order (measured: losses within 0.3%, codes 0-1.6% apart:
        # a flipped code feeds every later column; on an AVX2 host at one thread o_proj's loss was
        # 2.3% apart, the flipped codes of q/k/v feeding its input)
        assert results[name].stats["loss"] == pytest.approx(alone[name].stats["loss"], rel=0.05), name
        assert (results[name].q != alone[name].q).float().mean() < 0.05, name
        assert torch.equal(getattr(layer, name).weight.data, results[name].dequantized(scheme.weights, torch.float32))

    # a linear that reads another tensor still waits for every batch, and is solved on its own
    skewed = SkewedLayer()
    ctx, _, paused = make_lockstep_ctx(scheme, skewed, inputs)
    results = GPTQ(true_sequential=True).quantize_layer(ctx)
    assert paused == [k for k in ("q_proj", "k_proj", "o_proj", "gate_proj", "down_proj") for _ in inputs]
    assert results["k_proj"].stats["hessian_shared_with"] == []


class SometimesSkewedLayer(TinyLayer):
    """k_proj reads q_proj's input in the batches ``shared`` names, another tensor in the rest."""

    def __init__(self, shared, current):
        super().__init__()
        self.shared, self.current = shared, current

    def forward(self, x):
        h = x / x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
        k_in = h if self.current["batch"] in self.shared else h * 1.5
        a = torch.softmax(self.q_proj(h) @ self.k_proj(k_in).transpose(-1, -2) / 8, dim=-1) @ self.v_proj(h)
        x = x + self.o_proj(a)
        h = x / x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
        return x + self.down_proj(nn.functional.silu(self.gate_proj(h)) * self.up_proj(h))


@pytest.mark.parametrize("shared", [{0}, {1, 2}], ids=["first-batch-shares", "later-batches-share"])
def test_lockstep_refuses_a_linear_that_shares_its_input_in_some_batches_only(shared):
    scheme = QuantScheme(("Linear",), QuantArgs(num_bits=4, group_size=16))
    inputs = [correlated_inputs(48, 64, seed=70 + i).unsqueeze(0) for i in range(3)]
    current: dict = {}
    layer = SometimesSkewedLayer(shared, current)
    ctx, running, _ = make_lockstep_ctx(scheme, layer, inputs)
    layer.current = running
    with pytest.raises(QuantkitError, match=r"k_proj: reads a shared input in some calibration batches"):
        GPTQ(true_sequential=True).quantize_layer(ctx)


class TwiceLayer(TinyLayer):
    def forward(self, x):
        return super().forward(x) + self.k_proj(x)


def test_lockstep_refuses_a_linear_called_twice_in_one_pass():
    scheme = QuantScheme(("Linear",), QuantArgs(num_bits=4, group_size=16))
    inputs = [correlated_inputs(48, 64, seed=80 + i).unsqueeze(0) for i in range(3)]
    ctx, _, _ = make_lockstep_ctx(scheme, TwiceLayer(), inputs)
    with pytest.raises(QuantkitError, match=r"k_proj: called twice in one layer pass"):
        GPTQ(true_sequential=True).quantize_layer(ctx)
