"""The reconstruction figures of one module (quantkit/evaluation/integrity/figures.py), on tensors."""
import math

import pytest
import torch

from quantkit.evaluation.integrity.figures import ALLOWANCES, EXCESS_CAP_DB, reconstruction, rtn_reference
from quantkit.numerics.primitives import dequantize, quantize_weight
from quantkit.config.scheme import QuantArgs

G32 = QuantArgs(num_bits=4, group_size=32)
CHANNEL8 = QuantArgs(num_bits=8, strategy="channel")


def weight(seed=0, rows=64, cols=128):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=g) * torch.exp(torch.randn(1, cols, generator=g))


@pytest.mark.parametrize("args", [G32, CHANNEL8, QuantArgs(num_bits=8, type="float", strategy="tensor")])
def test_round_to_nearest_is_exactly_as_expected(args):
    w = weight()
    q, s, z = quantize_weight(w, args)
    f = reconstruction(w, dequantize(q, s, z, args), args, "rtn")
    assert f.excess_db == pytest.approx(-ALLOWANCES["rtn"].db) and f.unit_excess_db == pytest.approx(-1.0)
    assert f.sqnr_db == pytest.approx(f.expected_sqnr_db + 1.0) and f.expected_from == "rtn"
    assert abs(f.gain - 1) < 0.01 and f.non_finite == 0


def test_the_logged_sqnr_is_the_module_expectation():
    w = weight()
    w_hat = rtn_reference(w, G32)
    f = reconstruction(w, w_hat, G32, "rtn", logged_sqnr_db=reconstruction(w, w_hat, G32, "rtn").sqnr_db + 3)
    assert f.expected_from == "log" and f.excess_db == pytest.approx(3 - 1, abs=1e-6)


def test_one_doubled_group_is_found_where_it_is():
    w = weight()
    q, s, z = quantize_weight(w, G32)
    s[5, 2] *= 2
    f = reconstruction(w, dequantize(q, s, z, G32), G32, "rtn")
    assert f.worst_unit == "row 5, group 2" and f.unit_excess_db > 10 and f.excess_db < 0
    assert f.worst_unit_sqnr_db < f.worst_unit_expected_sqnr_db - 10


def test_gptq_like_error_in_some_columns_is_within_expectation():
    """GPTQ piles error into the columns whose inputs are small: every row, the same columns."""
    w = weight()
    w_hat = rtn_reference(w, G32)
    cols = torch.arange(w.shape[1]) % 32 < 6                   # a few columns of every group
    step = (w_hat - w).abs().mean()
    w_hat[:, cols] += 4 * step * torch.randn(w.shape[0], int(cols.sum()), generator=torch.Generator().manual_seed(1))
    assert reconstruction(w, w_hat, G32, "gptq").unit_excess_db < 0
    assert reconstruction(w, w_hat, G32, "rtn").unit_excess_db > 0      # not what round to nearest leaves
    w_bad = w_hat.clone()
    w_bad[7] = w_bad[7][torch.randperm(w.shape[1])]            # one row's codes shuffled
    f = reconstruction(w, w_bad, G32, "gptq")
    # without the conversion's record the row stands out, but inside GPTQ's wide unit allowance ...
    assert f.worst_unit.startswith("row 7") and -15 < f.unit_excess_db < 0
    # ... with it (what the quantizer left per row) it is far past any limit
    recorded = (w_hat - w).pow(2).sum(1)
    f = reconstruction(w, w_bad, G32, "gptq", logged_rows=recorded)
    assert f.expected_from == "rows" and f.worst_unit == "row 7" and f.unit_excess_db > 6
    assert reconstruction(w, w_hat, G32, "gptq", logged_rows=recorded).unit_excess_db == pytest.approx(-1.0, abs=1e-3)


def test_non_finite_values_count_as_the_cap():
    w = weight()
    w_hat = rtn_reference(w, CHANNEL8)
    w_hat[3, 4] = float("nan")
    f = reconstruction(w, w_hat, CHANNEL8, "gptq")
    assert f.non_finite == 1 and f.excess_db == EXCESS_CAP_DB and f.unit_excess_db == EXCESS_CAP_DB
    assert f.worst_unit == "row 3" and f.sqnr_db == -EXCESS_CAP_DB and math.isfinite(f.gain)


def test_zero_rows_and_groups_reconstruct_as_zero():
    w = weight()
    w[2] = 0
    w[4, :32] = 0
    f = reconstruction(w, rtn_reference(w, G32), G32, "gptq")
    assert f.unit_excess_db < 0
