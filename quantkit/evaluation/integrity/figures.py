"""How far one decoded module is from its reference weight, against what its scheme should give.

For a module with reference weight ``W`` (the baseline's, recorded transforms re-applied) and
decoded weight ``Ŵ`` (the checkpoint's packed tensors decoded as served), each part ``u`` (the
module, each output channel, each group) has an error and an expected error::

    d_u = Σ_u (Ŵ - W)²          x_u = Σ_u (R - W)²     R: W rounded to nearest on the
                                                           checkpoint's own grid (min-max ranges)
    excess_u = 10 log10(d_u / (x_u · typical_u)) - allowance       in dB; > 0: worse than expected

- Round to nearest (the log says so) leaves exactly ``x``: ``typical = 1``; the module's ``x``
  is the SQNR the conversion logged when there is one (the decoded weight gives it back to
  the digit). ``observer: mse`` only ever does better.
- GPTQ (or a quantizer the checkpoint does not name) trades weight error for output error:
  it moves error into the columns whose inputs are small, so a part's error is compared
  with what GPTQ typically did to its kind of part in this module: ``typical`` is the median
  over the module's rows of ``d_r / x_r`` for a row, and for a group ``(row r, group g)`` the
  larger of ``x_rg`` times the median over rows of ``d_rg / x_rg`` and the row's share of its
  error (``x_r · G / in``) times the median of ``d_rg`` over that share. A fault confined to
  some rows or groups does not move those medians; one over the whole module is the module
  figure's to catch (it is compared with round to nearest alone).
- ``allowance`` (``ALLOWANCES``): what is left of the quantizer's scatter after that.
- A checkpoint that quantkit wrote records what its quantizer left per output row
  (``pipeline/residuals.py``). Then each row's ``x_r`` is that record and ``typical = 1``
  (``RECORDED``: 1 dB): whatever GPTQ moved where, the decoded rows give the record back to
  rounding, and damage anywhere in a row, one group included, adds to it. Groups get no
  figure of their own there; the module's ``x`` is the sum of the rows.

A zeroed or doubled scale, shuffled codes or a swapped nibble order raise ``d`` to about the
part's own energy: the excess is about the part's round-to-nearest SQNR minus the allowance,
15-20 dB at 4 bits and 40 dB at 8 bits for round to nearest. Non-finite errors count as
``EXCESS_CAP_DB``. ``gain = <Ŵ, W> / <W, W>`` is 1 when the scales are right on average; a
scale off by a constant shows there first.

>>> from quantkit.config.scheme import QuantArgs
>>> from quantkit.numerics.primitives import quantize_weight, dequantize
>>> w = torch.randn(8, 64); args = QuantArgs(num_bits=4, group_size=32)
>>> q, s, z = quantize_weight(w, args)
>>> f = reconstruction(w, dequantize(q, s, z, args), args, "rtn")
>>> round(f.excess_db, 6), round(f.unit_excess_db, 6)             # round to nearest itself
(-1.0, -1.0)
>>> s[3, 1] *= 2                                                   # one group's scale doubled
>>> f = reconstruction(w, dequantize(q, s, z, args), args, "rtn")
>>> f.worst_unit, f.unit_excess_db > 10
('row 3, group 1', True)
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from quantkit.numerics.primitives import dequantize, quantize_weight
from quantkit.config.scheme import QuantArgs, fp4_kind
from quantkit.numerics.fp4_numerics import dequantize_fp4, quantize_fp4_weight

SHARE = 0.25            # a part's expected error is at least this share of its parent's, per element
FLOOR_DB = 70.0         # a module's expected SQNR counts as at most this (exact grids, zero weights)
EXCESS_CAP_DB = 200.0   # what a non-finite error counts as


@dataclass(frozen=True)
class Allowance:
    """What a quantizer may leave beyond round to nearest's error (after ``typical``), in dB."""

    db: float
    redistributes: bool     # compare parts with the module's typical inflation (the medians)
    unit_db: float | None = None   # for rows and groups, where it differs from the module's


# Measured on the test model of tests/evaluation/test_integrity_faults.py (a 2-layer Llama, hidden
# 128, planted activation outliers x20 and norms spread by exp(N(0, 1)): where GPTQ moves the most
# error; 32 x 64 calibration tokens), clean checkpoints, dB over round to nearest before the allowance:
#
#   checkpoint                 module  worst row/group  |gain - 1|
#   RTN W4 g32, W8, FP8, +AWQ   0.00     0.00            <= 0.010
#   GPTQ W4 g32 (mse, act-order)  8.7    10.0             0.017
#   GPTQ W4 g32 act-order group   8.9     9.8             0.013
#   GPTQ W4 g32 plain / asym     10.1     7.2             0.010
#   GPTQ W8 channel               9.7     5.8             0.0004
#   AWQ + GPTQ W4                10.5    11.8             0.032
#   SmoothQuant + GPTQ W8         6.6     3.3             0.001
#
# so GPTQ's allowance is 15 dB (3.2 dB above the worst clean part), round to nearest's 1 dB (it is
# exact; min-max arithmetic on another device may round a tie differently). The planted faults
# of that test then stand above the allowance: every scale x2 +6 dB (module) and |gain - 1| 0.97
# on GPTQ W4, +19 / +23 dB on RTN W4, +29 dB on GPTQ W8; a shuffled run of 256 bytes of codes
# +3.2 to +10 dB on GPTQ W4, +23 dB on GPTQ W8, +26 dB on RTN W4. What GPTQ W4 cannot show is
# damage confined to one group of one row: it raises that group 9-14 dB, inside GPTQ's own scatter.
#
# A real checkpoint scatters more: GPTQ W4 g64 on SmolLM2 (the main job, 128 x 512 calibration
# tokens) put one group of layers.11.mlp.down_proj 21.2 dB over round to nearest after the medians
# (its modules: at most 6.3 dB); with 4 x 512 tokens, act-order "group" put one there 25.5 dB
# over (every shipped recipe on SmolLM2 and Gemma3, benchmarks/RESULTS.md). Rows and groups of
# GPTQ therefore get 28 dB. Checkpoints that quantkit writes carry the conversion's own row
# errors and are compared with those instead (``RECORDED``): these allowances are for
# checkpoints without that record (older ones, other tools).
#
# On models they were not measured on (tests/evaluation/test_integrity_unseen_models.py: a Llama of
# hidden 96 with other seeds, tiny Qwen3, Phi-3, Gemma 3 and Qwen3-MoE; 16 x 32 calibration
# tokens), without the record: the closest clean module is 1.1 dB under (AWQ + GPTQ W4 on that
# Llama; plain GPTQ W4 3.4 dB), every scale of one module x2 stands 5.9-7.0 dB over on GPTQ W4,
# and a permuted run of 256 bytes of codes is not always seen on GPTQ W4 (2.9 dB under on the Llama).
ALLOWANCES = {
    "rtn": Allowance(1.0, False),
    "gptq": Allowance(15.0, True, unit_db=28.0),
}
ALLOWANCES["unknown"] = ALLOWANCES["gptq"]
# With the conversion's own row errors recorded (pipeline/residuals.py) the decoded rows give them
# back to float rounding (the reference re-applies the same transforms in the same arithmetic);
# 1 dB, as for round to nearest, leaves room for decoding on other hardware.
RECORDED = Allowance(1.0, False)


@dataclass(frozen=True)
class ModuleFigures:
    """One module's reconstruction, JSON-ready (``dataclasses.asdict``)."""

    quantizer: str              # "rtn", "gptq" or "unknown": which ALLOWANCES entry applied
    sqnr_db: float              # reference vs decoded
    expected_sqnr_db: float     # the lowest SQNR the scheme and quantizer should give (allowance included)
    expected_from: str          # "rtn" (re-quantized here) or "log" (quantization_log.json)
    excess_db: float            # the whole module, beyond expected
    unit_excess_db: float       # its worst output channel or group, beyond expected
    worst_unit: str             # "row 17" or "row 17, group 3"
    worst_unit_sqnr_db: float
    worst_unit_expected_sqnr_db: float
    gain: float                 # <Ŵ, W> / <W, W>
    non_finite: int             # decoded values that are NaN or infinite


def rtn_reference(w: torch.Tensor, args: QuantArgs, g_idx: torch.Tensor | None = None) -> torch.Tensor:
    """``W`` rounded to nearest on ``args``'s grid with min-max ranges (float32)."""
    if fp4_kind(args) is not None:
        return dequantize_fp4(quantize_fp4_weight(w, fp4_kind(args)), fp4_kind(args))
    plain = dataclasses.replace(args, observer="minmax")
    q, scale, zp = quantize_weight(w, plain, g_idx)
    return dequantize(q, scale, zp, plain, g_idx, torch.float32)


def _db(num: float, den: float) -> float:
    """10 log10(num / den), within ±EXCESS_CAP_DB; a non-finite ``num`` is the cap."""
    if not math.isfinite(num):
        return EXCESS_CAP_DB
    if num <= 0:
        return -EXCESS_CAP_DB
    return max(-EXCESS_CAP_DB, min(EXCESS_CAP_DB, 10.0 * math.log10(num / max(den, 1e-300))))


def _excess(d: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    out = 10.0 * torch.log10((d / expected.clamp_min(1e-300)).clamp_min(1e-300))
    out = torch.where(torch.isfinite(d), out, torch.full_like(out, EXCESS_CAP_DB))
    return out.clamp(-EXCESS_CAP_DB, EXCESS_CAP_DB)


def _typical(ratio: torch.Tensor, dim: int | None, least: float) -> torch.Tensor:
    """Median inflation (a non-finite ratio counts as large), at least ``least``."""
    r = torch.nan_to_num(ratio, nan=float("inf"))
    med = r.median() if dim is None else r.median(dim=dim).values
    return med.clamp(min=least, max=1e300)


def _group_sums(t: torch.Tensor, args: QuantArgs, g_idx: torch.Tensor | None) -> torch.Tensor:
    out, cols = t.shape
    if g_idx is None:
        return t.view(out, cols // args.group_size, args.group_size).sum(-1, dtype=torch.float64)
    idx = g_idx.long().to(t.device).expand(out, cols)
    return torch.zeros(out, cols // args.group_size, dtype=torch.float64, device=t.device).scatter_add_(1, idx, t.double())


def reconstruction(ref: torch.Tensor, decoded: torch.Tensor, args: QuantArgs, quantizer: str = "unknown",
                   g_idx: torch.Tensor | None = None, logged_sqnr_db: float | None = None,
                   logged_rows: torch.Tensor | None = None) -> ModuleFigures:
    """The figures of one module (see the module docstring).

    ``logged_rows``: the conversion's own error per output row (``pipeline.residuals``); when
    given, every row is compared with it (``RECORDED``) instead of with round to nearest."""
    w, w_hat = ref.float(), decoded.float()
    out, cols = w.shape
    recorded = logged_rows is not None and tuple(logged_rows.shape) == (out,)
    allow = RECORDED if recorded else ALLOWANCES.get(quantizer, ALLOWANCES["unknown"])
    non_finite = int((~torch.isfinite(w_hat)).sum())
    d = (w_hat - w).pow_(2)
    p = w.pow(2)
    d_row, p_row = (t.sum(1, dtype=torch.float64) for t in (d, p))
    if recorded:
        x_row = logged_rows.double().clamp_min(0)
        # groups need no figure of their own: any damage to a group adds to its row's error
        x = None
    else:
        x = (rtn_reference(w, args, g_idx) - w).pow_(2)
        x_row = x.sum(1, dtype=torch.float64)
    D, X, P = float(d_row.sum()), float(x_row.sum()), float(p_row.sum())
    expected_from = "rows" if recorded else "rtn"
    if logged_sqnr_db is not None and P > 0 and not recorded:
        X, expected_from = P / 10 ** (logged_sqnr_db / 10), "log"
    X = max(X, P * 10 ** (-FLOOR_DB / 10))
    if recorded:   # exact rows (zero error) compare with the floor, not with zero
        x_row = torch.maximum(x_row, p_row * 10 ** (-FLOOR_DB / 10))
    k = 10 ** (allow.db / 10)
    k_unit = 10 ** ((allow.db if allow.unit_db is None else allow.unit_db) / 10)

    share = SHARE if allow.redistributes else 10 ** (-FLOOR_DB / 10)
    row_base = torch.clamp(x_row, min=share * X / out)
    row_exp = row_base * (float(_typical(d_row / row_base, None, 1.0)) if allow.redistributes else 1.0) * k_unit
    row_exc = _excess(d_row, row_exp)
    worst = int(row_exc.argmax())
    best = (float(row_exc[worst]), f"row {worst}", float(d_row[worst]), float(row_exp[worst]), float(p_row[worst]))
    if args.strategy in ("group", "tensor_group") and x is not None:
        d_g, x_g, p_g = (_group_sums(t, args, g_idx) for t in (d, x, p))
        part = (row_base * args.group_size / cols)[:, None]          # the row's share of its error, per group
        if allow.redistributes:
            own = x_g.clamp_min(1e-300)
            g_exp = torch.maximum(own * _typical(d_g / own, 0, 1.0), part * _typical(d_g / part, 0, SHARE))
        else:
            g_exp = torch.maximum(x_g, part * share)
        g_exp = g_exp * k_unit
        g_exc = _excess(d_g, g_exp)
        r, g = divmod(int(g_exc.argmax()), g_exc.shape[1])
        if float(g_exc[r, g]) >= best[0]:
            best = (float(g_exc[r, g]), f"row {r}, group {g}", float(d_g[r, g]), float(g_exp[r, g]), float(p_g[r, g]))
    unit_excess, unit, unit_d, unit_x, unit_p = best
    dot = float((torch.nan_to_num(w_hat) * w).sum(dtype=torch.float64))
    return ModuleFigures(
        quantizer=quantizer if quantizer in ALLOWANCES else "unknown",
        sqnr_db=-_db(D, P), expected_sqnr_db=-_db(X * k, P), expected_from=expected_from,
        excess_db=_db(D, X * k), unit_excess_db=unit_excess, worst_unit=unit,
        worst_unit_sqnr_db=-_db(unit_d, unit_p), worst_unit_expected_sqnr_db=-_db(unit_x, unit_p),
        gain=dot / P if P > 0 else 1.0, non_finite=non_finite)
