"""GPTQ on the FP4 grids: round-to-nearest when the Hessian couples no columns, better than it
when inputs are correlated, and the format's constraints refused by name."""

from __future__ import annotations

import pytest
import torch

from quantkit.errors import QuantkitError
from quantkit.numerics.fp4_numerics import dequantize_fp4, quantize_fp4_weight
from quantkit.quantizers.gptq.format_grid import solve_fp4
from quantkit.quantizers.gptq.solve import SolveSettings


def _correlated_inputs(n: int, cols: int, seed: int, sample_seed: int) -> torch.Tensor:
    """Inputs of one distribution (``seed``: its mixing matrix), ``sample_seed``: which draw."""
    mix = torch.randn(cols, cols, generator=torch.Generator().manual_seed(seed)) / cols ** 0.5 + torch.eye(cols)
    return torch.randn(n, cols, generator=torch.Generator().manual_seed(sample_seed)) @ mix


@pytest.mark.parametrize("kind", ["nvfp4", "mxfp4"])
def test_uncoupled_hessian_is_round_to_nearest(kind):
    """With H = I no error moves to another column: codes, group scales and NVFP4's global scale
    are exactly RTN's (the grid, the scales and their order are the solve's own)."""
    W = torch.randn(48, 128, generator=torch.Generator().manual_seed(0)) * 0.05
    res = solve_fp4(W, torch.eye(128), kind, SolveSettings(block_size=64, dampening_frac=0.0))
    rtn = quantize_fp4_weight(W, kind)
    assert torch.equal(res.q, rtn.codes)
    assert torch.equal(res.scale.view(torch.uint8), rtn.scale.view(torch.uint8))
    assert (res.global_scale is None) == (kind == "mxfp4")
    if kind == "nvfp4":
        assert torch.equal(res.global_scale, rtn.global_scale)


@pytest.mark.parametrize("kind", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("seed", [1, 2])
def test_correlated_inputs_beat_round_to_nearest(kind, seed):
    W = torch.randn(64, 256, generator=torch.Generator().manual_seed(seed)) * 0.05
    X = _correlated_inputs(2048, 256, seed, 0)
    res = solve_fp4(W, X.T @ X / X.shape[0], kind, SolveSettings(block_size=128))
    # the output error on held-out inputs from the same distribution, not the calibration ones
    X_test = _correlated_inputs(2048, 256, seed, 1)
    rtn = quantize_fp4_weight(W, kind)
    err_gptq = (X_test @ (W - res.w_hat).T).pow(2).mean()
    err_rtn = (X_test @ (W - dequantize_fp4(rtn, kind)).T).pow(2).mean()
    assert err_gptq < 0.8 * err_rtn
    assert float(res.row_loss.sum()) < float(res.row_rtn_loss.sum())


def test_block_size_must_hold_whole_groups():
    with pytest.raises(QuantkitError, match="block_size: FP4 GPTQ needs a multiple of the group size 32"):
        solve_fp4(torch.randn(8, 64), torch.eye(64), "mxfp4", SolveSettings(block_size=48))


@pytest.mark.parametrize("kind", ["nvfp4", "mxfp4"])
def test_act_order_keeps_each_columns_group_and_its_scale(kind):
    """``actorder="weight"``: every group's scale is the original weight's (RTN's), fixed before
    the solve; the codes decode to the result under those scales in the weight's column order."""
    W = torch.randn(32, 128, generator=torch.Generator().manual_seed(3)) * 0.05
    X = _correlated_inputs(1024, 128, 3, 0) * torch.linspace(0.2, 3.0, 128)   # importance rising
    res = solve_fp4(W, X.T @ X / X.shape[0], kind, SolveSettings(block_size=64), actorder="weight")
    rtn = quantize_fp4_weight(W, kind)
    assert torch.equal(res.scale.view(torch.uint8), rtn.scale.view(torch.uint8))
    decoded = dequantize_fp4(type(rtn)(res.q, res.scale, res.global_scale), kind)
    torch.testing.assert_close(decoded.float(), res.w_hat.float())
    assert float(res.row_loss.sum()) < float(res.row_rtn_loss.sum())


@pytest.mark.parametrize("kind", ["nvfp4", "mxfp4"])
def test_act_order_beats_column_order_when_the_important_inputs_come_last(kind):
    """Inputs whose scale rises along the columns: in their own order the loudest columns are
    rounded last, with nothing left to take their error; act-order rounds them first. On held-out
    inputs of the same distribution its output error is lower."""
    W = torch.randn(64, 256, generator=torch.Generator().manual_seed(5)) * 0.05
    loud = torch.linspace(0.1, 4.0, 256)
    X = _correlated_inputs(4096, 256, 5, 0) * loud
    H = X.T @ X / X.shape[0]
    plain = solve_fp4(W, H, kind, SolveSettings(block_size=128))
    ordered = solve_fp4(W, H, kind, SolveSettings(block_size=128), actorder="weight")
    X_test = _correlated_inputs(4096, 256, 5, 1) * loud
    err = {k: float((X_test @ (W - r.w_hat).T).pow(2).mean()) for k, r in (("plain", plain), ("ordered", ordered))}
    assert err["ordered"] < err["plain"]


def test_act_order_group_is_refused():
    with pytest.raises(QuantkitError, match="weights.actorder: FP4 GPTQ takes 'weight' or none"):
        solve_fp4(torch.randn(8, 64), torch.eye(64), "mxfp4", SolveSettings(block_size=64), actorder="group")
