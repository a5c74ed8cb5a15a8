"""GPTAQ: the solve against a float64 column-by-column reference of the asymmetric objective,
planted inputs where it must beat GPTQ, codes decoding to the written scales, the recipe option,
the float model's activations carried through the pipeline, and a checkpoint transformers reads."""

from __future__ import annotations

import pytest
import torch

import quantkit
from model_factory import random_ids
from quantkit.config.scheme import QuantArgs
from quantkit.errors import QuantkitError
from quantkit.numerics.fp4_numerics import FP4Weight, dequantize_fp4
from quantkit.numerics.primitives import calculate_qparams, dequantize, reduce_minmax
from quantkit.pipeline.passes import CalibrationPasses
from quantkit.quantizers.gptq import columns as columns_mod
from quantkit.quantizers.gptq import gptaq as gptaq_mod
from quantkit.quantizers.gptq import hessian as hessian_mod
from quantkit.quantizers.gptq import solve as solve_mod
from quantkit.quantizers.gptq.format_grid import solve_fp4
from quantkit.quantizers.gptq.gptaq import Asymmetry
from quantkit.quantizers.gptq.hessian import accumulate_asymmetry, accumulate_hessian
from quantkit.quantizers.gptq.solve import SolveSettings, solve
from quantkit.steps import build_algorithm


# -- data -------------------------------------------------------------------------------
def correlated_inputs(tokens: int, cols: int, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    """A quarter-rank signal plus a little noise, channels scaled over a decade: like LLM activations."""
    g = torch.Generator().manual_seed(seed)
    f64 = {"generator": g, "dtype": torch.float64}
    signal = torch.randn(tokens, cols // 4, **f64) @ (torch.randn(cols // 4, cols, **f64) / cols ** 0.5)
    channel_scale = torch.logspace(0, 1, cols, dtype=torch.float64)[torch.randperm(cols, generator=g)]
    return ((signal + 0.05 * torch.randn(tokens, cols, **f64)) * channel_scale).to(dtype)


def drifted(x: torch.Tensor, scale: float, seed: int = 7) -> torch.Tensor:
    """The float model's inputs of the same tokens: a fixed linear map of the quantized ones, so the
    float target ``W xf = (W M) x`` is reachable from ``x``."""
    g = torch.Generator().manual_seed(seed)
    cols = x.shape[1]
    M = torch.eye(cols, dtype=torch.float64) + scale * torch.randn(cols, cols, generator=g, dtype=torch.float64) / cols ** 0.5
    return (x.double() @ M.T).to(x.dtype)


def weight(rows: int, cols: int, seed: int = 1, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=g, dtype=torch.float64).to(dtype)


def statistics(x: torch.Tensor, xf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    H, n = accumulate_hessian(x, None, 0)
    return H, accumulate_asymmetry(xf, x, None, 0)


def target_error(W: torch.Tensor, Q: torch.Tensor, x: torch.Tensor, xf: torch.Tensor) -> float:
    """GPTAQ's objective: mean over tokens of ``||W xf - Q x||^2``."""
    return float((xf.double() @ W.double().T - x.double() @ Q.double().T).pow(2).mean())


# -- the slow, obviously-correct reference ----------------------------------------------------
def reference_gptaq(W, H, dXXT, args: QuantArgs, alpha: float, dampening_frac: float = 0.01):
    """The asymmetric objective one column at a time, in float64, inverses from scratch.

    Quantizing column ``j`` (value ``w``) spreads its error over the free columns ``F`` as GPTQ
    does, ``-(w - q) / Hinv_jj * Hinv_j,F``, then hands them the float target's share of ``w``,
    ``alpha * w * dXXT[j, F'] H_F'^-1`` for the columns ``F'`` still free after ``j``. Lazy groups
    are fixed at their first column, from their columns as they are then. Returns the
    dequantized weight in the original column order.
    """
    W, H, dXXT = W.double().clone(), H.double().clone(), dXXT.double().clone()
    rows, cols = W.shape
    dead = torch.diagonal(H) == 0
    H[dead, dead] = 1
    W[:, dead] = 0
    dXXT[:, dead] = 0
    dXXT[dead, :] = 0
    Hd = H + dampening_frac * torch.diagonal(H).mean() * torch.eye(cols, dtype=H.dtype)
    order = list(range(cols))
    if args.actorder:
        order = torch.argsort(torch.diagonal(H), descending=True, stable=True).tolist()
    col_args = QuantArgs(num_bits=args.num_bits, symmetric=args.symmetric, strategy="channel")
    G = args.group_size if args.strategy == "group" else cols   # channel: one group, fixed before any update
    fixed: dict[int, tuple] = {}
    Q = torch.zeros_like(W)
    for step, j in enumerate(order):
        g = j // G
        if g not in fixed:   # the group's qparams from its columns as they are now
            s, z = calculate_qparams(*reduce_minmax(W[:, g * G:(g + 1) * G], col_args), col_args, dtype=torch.float64)
            fixed[g] = s.reshape(-1), (0 if z is None else z.reshape(-1).double())
        s, z = fixed[g]
        w = W[:, j].clone()
        Q[:, j] = (torch.round(w / s + z).clamp(args.qmin, args.qmax) - z) * s
        free, later = order[step:], order[step + 1:]
        Hinv = torch.linalg.inv(Hd[free][:, free])
        W[:, free] -= ((w - Q[:, j]) / Hinv[0, 0])[:, None] * Hinv[0][None, :]
        if later:
            W[:, later] += alpha * w[:, None] * (dXXT[j, later] @ torch.linalg.inv(Hd[later][:, later]))[None, :]
    return Q


ARGS = {
    "channel-sym-w4": QuantArgs(num_bits=4, strategy="channel"),
    "group-sym-w4": QuantArgs(num_bits=4, group_size=16),
    "group-asym-w3": QuantArgs(num_bits=3, group_size=16, symmetric=False),
    "actorder-weight-channel": QuantArgs(num_bits=4, strategy="channel", actorder="weight"),
}


@pytest.fixture
def float64_solve(monkeypatch):
    for module in (hessian_mod, solve_mod, columns_mod, gptaq_mod):   # each module that reads the precision
        monkeypatch.setattr(module, "GPTQ_PRECISION", torch.float64)


# -- the statistics ---------------------------------------------------------------------------
def test_asymmetry_accumulated_in_batches_is_the_mean_over_all_tokens(float64_solve):
    x = correlated_inputs(300, 32, dtype=torch.float64)
    xf = drifted(x, 0.3)
    dXXT, n = None, 0
    for part_x, part_f in zip(x.split(70), xf.split(70)):
        dXXT = accumulate_asymmetry(part_f, part_x, dXXT, n)
        n += part_x.shape[0]
    assert torch.allclose(dXXT, 2 * (xf - x).T @ x / 300, rtol=1e-12, atol=1e-12)
    with pytest.raises(QuantkitError, match="not the same tokens"):
        accumulate_asymmetry(xf[:10], x[:11], None, 0)


# -- the solve ----------------------------------------------------------------------------
@pytest.mark.parametrize("block_size", [8, 64])
@pytest.mark.parametrize("alpha", [1.0, 0.25])
@pytest.mark.parametrize("name", list(ARGS))
def test_solve_matches_column_by_column_reference(name, alpha, block_size, float64_solve):
    args = ARGS[name]
    x = correlated_inputs(512, 64, dtype=torch.float64)
    x[:, 5] = 0   # a dead input column
    xf = drifted(x, 0.3)
    W = weight(24, 64, dtype=torch.float64)
    H, dXXT = statistics(x, xf)
    res = solve(W, H, args, SolveSettings(block_size=block_size), Asymmetry(dXXT, alpha))
    ref = reference_gptaq(W, H, dXXT, args, alpha)
    assert res.dead_columns == 1
    # lazy blocks, the Cholesky form of the correction: nothing but round-off
    assert torch.allclose(res.w_hat, ref, rtol=0, atol=1e-9), f"{(~torch.isclose(res.w_hat, ref)).sum()} differ"
    # the codes and qparams decode to the weight, in the original column order
    assert torch.equal(dequantize(res.q, res.scale, res.zero_point, args, res.g_idx), res.w_hat)


def test_zero_drift_is_gptq_bit_for_bit():
    args = QuantArgs(num_bits=4, group_size=32, actorder="weight")
    x = correlated_inputs(1024, 128)
    W = weight(48, 128)
    H, dXXT = statistics(x, x)
    plain = solve(W, H, args, SolveSettings(block_size=32))
    asym = solve(W, H, args, SolveSettings(block_size=32), Asymmetry(dXXT, 1.0))
    assert torch.equal(plain.q, asym.q) and torch.equal(plain.scale, asym.scale)


@pytest.mark.parametrize("name", ["group-sym-w4", "channel-sym-w4", "actorder-weight-channel"])
def test_beats_gptq_when_the_float_target_is_reachable(name):
    """The float model's inputs are a fixed linear map of the quantized ones: GPTQ rounds towards
    ``W``, whose outputs on ``x`` miss the target by the drift; GPTAQ moves towards ``W M``."""
    args = ARGS[name]
    x = correlated_inputs(6000, 128, seed=3)
    xf = drifted(x, 0.2)
    W = weight(64, 128, seed=4)
    H, dXXT = statistics(x[:3000], xf[:3000])
    held_x, held_f = x[3000:], xf[3000:]   # tokens neither statistic saw
    gptq = solve(W, H, args, SolveSettings())
    errors = {alpha: target_error(W, solve(W, H, args, SolveSettings(), Asymmetry(dXXT, alpha)).w_hat, held_x, held_f)
              for alpha in (0.25, 1.0)}
    gptq_error = target_error(W, gptq.w_hat, held_x, held_f)
    assert errors[1.0] < 0.5 * gptq_error, (errors, gptq_error)
    assert errors[0.25] < gptq_error


@pytest.mark.parametrize("kind,actorder", [("nvfp4", None), ("nvfp4", "weight"), ("mxfp4", None)])
def test_fp4_beats_gptq_and_decodes_to_its_scales(kind, actorder):
    x = correlated_inputs(4096, 128, seed=5)
    xf = drifted(x, 0.2)
    W = weight(64, 128, seed=6)
    H, dXXT = statistics(x[:2048], xf[:2048])
    settings = SolveSettings(block_size=64)
    gptq = solve_fp4(W, H, kind, settings, actorder)
    gptaq = solve_fp4(W, H, kind, settings, actorder, Asymmetry(dXXT, 1.0))
    held_x, held_f = x[2048:], xf[2048:]
    assert target_error(W, gptaq.w_hat, held_x, held_f) < 0.7 * target_error(W, gptq.w_hat, held_x, held_f)
    decoded = dequantize_fp4(FP4Weight(gptaq.q, gptaq.scale, gptaq.global_scale), kind, W.dtype)
    assert torch.equal(decoded, gptaq.w_hat)


# -- the recipe option ----------------------------------------------------------------------
@pytest.mark.parametrize("options,needle", [
    ({"gptaq": "yes"}, "gptaq"),
    ({"gptaq": True, "gptaq_alpha": 0}, "gptaq_alpha"),
    ({"gptaq": True, "gptaq_alpha": float("nan")}, "gptaq_alpha"),
    ({"gptaq_alpha": 0.5}, "gptaq_alpha: set only with gptaq: true"),
])
def test_bad_options_are_refused_by_name(options, needle):
    with pytest.raises(QuantkitError, match=needle):
        build_algorithm("gptq", options)


def test_off_by_default_and_asks_for_float_inputs_only_when_on():
    assert not build_algorithm("gptq", {}).needs_float_inputs
    assert build_algorithm("gptq", {"gptaq": True}).needs_float_inputs


@pytest.mark.parametrize("name,base", [("w4a16-gptaq", "w4a16-gptq"), ("nvfp4a16-gptaq", "nvfp4a16-gptq")])
def test_shipped_recipes_are_the_gptq_ones_with_gptaq_on(name, base):
    recipe, gptq = quantkit.load_recipe(name), quantkit.load_recipe(base)
    assert recipe.groups == gptq.groups and recipe.ignore == gptq.ignore
    options = recipe.to_dict()["steps"][-1]["gptq"]
    assert options.pop("gptaq") is True
    assert options == gptq.to_dict()["steps"][-1]["gptq"]


# -- through the pipeline -----------------------------------------------------------------------
RECIPE = {"scheme": "W4A16", "group_size": 32, "algorithm": {"name": "gptq", "gptaq": True}}


def test_float_pass_reads_the_float_models_hidden_states(tiny_llama, monkeypatch):
    """What the float pass runs each layer on is the float model's own hidden state of the same tokens."""
    from transformers import AutoModelForCausalLM

    ids = random_ids(4, 16, seed=2)
    seen: dict[int, list[torch.Tensor]] = {}
    run_float = CalibrationPasses.run_float

    def spy(self, layer, i):
        seen[i] = [self.float_hidden.get(j).clone() for j in range(self.count)]
        run_float(self, layer, i)

    monkeypatch.setattr(CalibrationPasses, "run_float", spy)
    quantkit.quantize(tiny_llama, RECIPE, calibration=ids)
    with torch.no_grad():
        states = AutoModelForCausalLM.from_pretrained(tiny_llama)(torch.tensor(ids), output_hidden_states=True).hidden_states
    assert sorted(seen) == [0, 1]
    for i, batches in seen.items():
        rows = torch.cat([b.reshape(-1, *b.shape[-2:]) for b in batches])
        assert rows.shape[0] == len(ids)
        for row in rows:   # each packed row is one sample (all of one length), in some order
            gap = min(float((row - s).abs().max()) for s in states[i])
            assert gap < 1e-5


@pytest.mark.parametrize("calibration", [{}, {"batch_tokens": 32}], ids=["lockstep", "per-sub-group"])
def test_checkpoint_reads_back_in_transformers(tiny_llama, tmp_path, calibration):
    """Both schedules (one lockstep pass; a pass per sub-group when the set does not fit one) write a
    checkpoint transformers reads to the logits quantkit computes, and not GPTQ's codes."""
    from transformers import AutoModelForCausalLM

    ids, probe = random_ids(4, 24, seed=3), torch.tensor(random_ids(2, 16, seed=4))
    recipe = {**RECIPE, "calibration": calibration} if calibration else RECIPE
    q = quantkit.quantize(tiny_llama, recipe, calibration=ids)
    path = q.save(tmp_path / "gptaq")
    with torch.no_grad():
        ours = quantkit.load(path)(probe).logits
        theirs = AutoModelForCausalLM.from_pretrained(path)(probe).logits
        ref = AutoModelForCausalLM.from_pretrained(tiny_llama)(probe).logits
    assert float((ours - theirs).norm() / theirs.norm()) < 1e-5
    assert float((theirs - ref).norm() / ref.norm()) < 0.5
    plain = {**recipe, "algorithm": {"name": "gptq"}}
    other = quantkit.quantize(tiny_llama, plain, calibration=ids).save(tmp_path / "gptq")
    from safetensors.torch import load_file

    ours_t, gptq_t = load_file(str(next(path.glob("*.safetensors")))), load_file(str(next(other.glob("*.safetensors"))))
    key = "model.layers.1.mlp.down_proj.weight_packed"
    assert not torch.equal(ours_t[key], gptq_t[key])


def test_offloaded_float_activations_give_the_same_checkpoint(tiny_llama, tmp_path):
    """With ``calibration.offload`` the float model's hidden states go to files of their own and
    come back bit for bit: the codes are those of the run that keeps them in memory."""
    from safetensors.torch import load_file

    ids = random_ids(4, 24, seed=3)
    tensors = {}
    for offload in (False, True):
        recipe = {**RECIPE, "calibration": {"batch_tokens": 32, "offload": offload}}
        path = quantkit.quantize(tiny_llama, recipe, calibration=ids).save(tmp_path / str(offload))
        tensors[offload] = load_file(str(next(path.glob("*.safetensors"))))
    assert tensors[True].keys() == tensors[False].keys()
    assert all(torch.equal(tensors[True][k], tensors[False][k]) for k in tensors[False])


def test_refused_on_mixture_of_experts_models(tmp_path):
    from moe_models import make_moe_dir

    folder = make_moe_dir(tmp_path / "moe", "Qwen3MoeForCausalLM")
    with pytest.raises(QuantkitError, match="algorithm.gptaq: not supported on mixture-of-experts"):
        quantkit.quantize(folder, RECIPE, calibration=random_ids(2, 16))
