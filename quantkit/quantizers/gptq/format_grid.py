"""GPTQ on a number format's own grid (``NumberFormat.step``, ``round_to_grid``, ``grid_values``):
the same column loop, each column rounded to the nearest point of the format's grid (E2M1's is
not uniform) under its group's scale. Formats on the affine integer grid take ``solve.py``.

A global scale (the format's, when it has one) is fixed first, from the whole (stacked) weight
as it is before the solve; a group's scale is then fixed when the solve reaches the group's
first column, from its columns as updated so far (or from the original weight with
``static_groups``), and never changes after. Every group lies inside one lazy-update block
(``block_size`` a multiple of the group size), so its columns hold every update when the group
is fixed. Columns are visited in their
own order, or with ``actorder="weight"`` in order of decreasing ``diag(H)`` with every group's
scale fixed from the original weight before the solve (a column's group stays the one it has in
the weight, so formats that store no ``g_idx`` hold the result as they are). A group's scale comes
from the scheme's observer; ``imatrix_mse`` weighs its columns by ``diag(H)``.

Example:
    >>> from quantkit.config.scheme import QuantArgs
    >>> fmt = number_format(QuantArgs(num_bits=4, type="float", group_size=32))
    >>> W, X = torch.randn(32, 64), torch.randn(256, 64)
    >>> res = solve_fp4(W, X.T @ X / 256, fmt, SolveSettings(block_size=64))
    >>> bool(res.row_loss.sum() < res.row_rtn_loss.sum())
    True
"""

from __future__ import annotations

import torch

from quantkit.errors import QuantkitError
from quantkit.numerics.number_formats import NumberFormat, QParams, number_format
from quantkit.quantizers.gptq.gptaq import Asymmetry, correction, in_solve_order
from quantkit.quantizers.gptq.hessian import GPTQ_PRECISION
from quantkit.quantizers.gptq.solve import (GPTQResult, SolveSettings, _output_error, _without_dead_columns,
                                            inverse_hessian_factor)


def solve_fp4(W_in: torch.Tensor, H_in: torch.Tensor, fmt: NumberFormat | str, settings: SolveSettings,
              actorder: str | None = None, asymmetry: Asymmetry | None = None) -> GPTQResult:
    """GPTQ-quantize ``W_in`` ``[rows, cols]`` to the format ``fmt`` (or a name that fixes one)
    against the Hessian ``H_in``.

    The result's ``q`` holds the format's codes, ``scale`` its group scales and ``global_scale``
    its global scale (None without one); ``row_rtn_loss`` is round-to-nearest's under the same
    global scale.
    ``actorder``: None (columns in their order) or ``"weight"`` (see the module docstring).
    ``asymmetry``: GPTAQ's correction (``quantizers/gptq/gptaq.py``), None for GPTQ.
    """
    fmt = number_format(fmt) if isinstance(fmt, str) else fmt
    G = fmt.group_size
    _check(W_in, H_in, G, settings)
    if actorder not in (None, "weight"):
        raise QuantkitError(f"weights.actorder: FP4 GPTQ takes 'weight' or none, got {actorder!r} "
                            "('group' needs a g_idx, which the FP4 formats do not store)")
    out_dtype = W_in.dtype
    gs = fmt.global_scale(W_in)
    H_obj = H_in.to(GPTQ_PRECISION)
    importance = torch.diagonal(H_obj)   # each column's mean squared input, for imatrix_mse
    dead = torch.diagonal(H_obj) == 0 if asymmetry is not None else None
    W, H, n_dead = _without_dead_columns(W_in.to(GPTQ_PRECISION).clone(), H_obj.clone())
    static = fmt.scales(W_in, global_scale=gs, importance=importance).scale if settings.static_groups or actorder \
        else None
    perm = None
    if actorder:
        perm = torch.argsort(torch.diagonal(H), descending=True, stable=True)
        W, H = W[:, perm], H[perm][:, perm]
    inv = inverse_hessian_factor(H, settings.dampening_frac, settings.max_damping_retries)
    del H
    P = correction(in_solve_order(asymmetry, dead, perm), inv.U, asymmetry.alpha) if asymmetry is not None else None
    Wt = W.T.contiguous()
    codes_t = torch.empty(Wt.shape, dtype=torch.uint8, device=Wt.device)
    Q_t = torch.empty(Wt.shape, dtype=GPTQ_PRECISION, device=Wt.device)
    scales = []
    # with act-order, each visited column's step: its own group's, from the scales fixed above
    steps = None if perm is None else fmt.step(QParams(static, None, gs)).to(GPTQ_PRECISION)[:, perm // G]
    for i1 in range(0, Wt.shape[0], settings.block_size):
        i2 = min(i1 + settings.block_size, Wt.shape[0])
        Err1, W1 = _fp4_block(Wt, (inv.U, P), (i1, i2), (fmt, gs, static, out_dtype, steps, importance),
                              (codes_t, Q_t, scales))
        Wt[i2:].addmm_(inv.U[i1:i2, i2:].T, Err1, alpha=-1.0)
        if P is not None:   # GPTAQ: each column's correction, from the value it was rounded from
            Wt[i2:].addmm_(P[i1:i2, i2:].T, W1)
    if perm is not None:   # back to the weight's column order
        order = torch.argsort(perm)
        codes_t, Q_t = codes_t[order], Q_t[order]
    scale = static if perm is not None else torch.stack(scales, dim=1)
    Q = Q_t.T.contiguous()
    if not bool(torch.isfinite(Q).all()):
        raise QuantkitError("weight: GPTQ produced NaN or Inf (check the calibration inputs)")
    losses = _fp4_health(W_in, Q, H_obj, fmt, gs)
    return GPTQResult(q=codes_t.T.contiguous(), scale=scale, zero_point=None, g_idx=None, w_hat=Q.to(out_dtype),
                      row_loss=losses[0], row_rtn_loss=losses[1], row_energy=losses[2], damping=inv.damping,
                      damping_retries=inv.retries, dead_columns=n_dead, global_scale=gs)


def _fp4_block(Wt: torch.Tensor, factors: tuple, span: tuple[int, int], grid: tuple,
               out: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """Columns ``span`` of ``Wt`` (``[cols, rows]``) rounded one by one, each error (and GPTAQ's
    correction ``P``, when given) moving the block's later columns; returns the block's scaled
    errors and the values its columns were rounded from, for the columns after it."""
    (U, P), (i1, i2), (fmt, gs, static, out_dtype, steps, importance), (codes_t, Q_t, scales) = \
        factors, span, grid, out
    G = fmt.group_size
    W1 = Wt[i1:i2].clone()
    Err1 = torch.zeros_like(W1)
    U1 = U[i1:i2, i1:i2]
    P1 = P[i1:i2, i1:i2] if P is not None else None
    step = None
    for i in range(i2 - i1):
        p = i1 + i
        if steps is not None:   # act-order: the column's group's step, fixed before the solve
            step = steps[:, p]
        elif p % G == 0:   # the group's first column: its scale is fixed now, from its columns as they are
            if static is not None:
                s = static[:, p // G]
            else:
                s = fmt.scales(W1[i:i + G].T.to(out_dtype), global_scale=gs,
                               importance=importance[p:p + G]).scale[:, 0]
            scales.append(s)
            step = fmt.step(QParams(s, None, gs)).to(GPTQ_PRECISION)
        w = W1[i]
        c = fmt.round_to_grid(w / step)
        q = fmt.grid_values(c).to(GPTQ_PRECISION) * step
        codes_t[p], Q_t[p] = c, q
        err = Err1[i]
        torch.sub(w, q, out=err)
        err /= U1[i, i]
        W1[i + 1:].addr_(U1[i, i + 1:], err, alpha=-1.0)
        if P1 is not None:
            W1[i + 1:].addr_(P1[i, i + 1:], w)
    return Err1, W1


def _check(W: torch.Tensor, H: torch.Tensor, G: int, settings: SolveSettings) -> None:
    cols = W.shape[1]
    if H.shape != (cols, cols):
        raise QuantkitError(f"hessian: shape {tuple(H.shape)} does not match in_features {cols}")
    if cols % G:
        raise QuantkitError(f"weights.group_size: {G} does not divide in_features {cols}")
    if settings.block_size % G:
        # a group split between blocks would be fixed before the block's updates reach its last columns
        raise QuantkitError(f"block_size: FP4 GPTQ needs a multiple of the group size {G}, got {settings.block_size}")
    if not bool(torch.isfinite(W).all()):
        raise QuantkitError("weight: contains NaN or Inf")
    if not bool(torch.isfinite(H).all()):
        raise QuantkitError("hessian: calibration inputs produced NaN or Inf")


def _fp4_health(W_in: torch.Tensor, Q: torch.Tensor, H: torch.Tensor, fmt: NumberFormat,
                gs: torch.Tensor | None) -> list[torch.Tensor]:
    """Per row: the output error of ``Q``, that of round-to-nearest under the same global scale,
    and the output's energy (means over the calibration tokens)."""
    qp = fmt.scales(W_in, global_scale=gs, importance=torch.diagonal(H))
    rtn = fmt.dequantize(fmt.quantize(W_in, qp), qp).to(GPTQ_PRECISION)
    W = W_in.to(GPTQ_PRECISION)
    deltas = torch.cat([W - Q, W - rtn, W])
    return list(_output_error(deltas, H).split(W.shape[0]))

