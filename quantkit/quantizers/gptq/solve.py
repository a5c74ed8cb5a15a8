"""The GPTQ solve: one weight against one Hessian, column by column (Frantar et al., 2022).

For a linear with weight ``W`` ``[rows, cols]`` and Hessian ``H`` of its inputs, quantizing column
``p`` to ``q_p`` and moving the remaining columns by the optimal brain-surgeon update

    delta = -(w_p - q_p) / [H^-1]_pp * [H^-1]_p,:

keeps the layer-output error minimal. ``U = chol(H^-1)^T`` (upper) carries all the ``H^-1`` rows
that the column order needs, so no inverse is updated inside the loop; updates to columns beyond
the current block are applied lazily, once per block (``block_size``).

Example:
    >>> x, W = torch.randn(16, 128), torch.randn(32, 128)     # 16 tokens into a 128 -> 32 linear
    >>> H = 2 * x.T @ x / 16
    >>> res = gptq_quantize_weight(W, H, QuantArgs(num_bits=4, group_size=64))
    >>> res.q.shape, res.scale.shape            # codes [out, in], scales [out, in // 64]
    (torch.Size([32, 128]), torch.Size([32, 2]))
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch

from quantkit.errors import QuantkitError
from quantkit.numerics.primitives import dequantize, quantize_weight as rtn_quantize_weight
from quantkit.config.scheme import QuantArgs
from quantkit.quantizers.gptq.columns import ColumnLoop, column_grid, column_groups, column_loop, qparams_before_solve
from quantkit.quantizers.gptq.gptaq import Asymmetry, correction, in_solve_order
from quantkit.quantizers.gptq.hessian import GPTQ_PRECISION

#: Damping fraction tried first on a retry when the user asked for none.
_FIRST_RETRY_DAMPING = 1e-3
_DAMPING_GROWTH = 10.0


@dataclass(frozen=True)
class SolveSettings:
    """How the solve runs (``GPTQ``'s recipe options of the same names)."""

    block_size: int = 128
    dampening_frac: float = 0.01
    max_damping_retries: int = 5
    static_groups: bool = False


# =====================================================================================
# Inverse-Hessian factor with damping escalation
# =====================================================================================
@dataclass
class InverseHessian:
    """``U`` with ``U^T U = (H + damping * mean(diag H) * I)^-1``, and how it was obtained."""

    U: torch.Tensor
    damping: float
    retries: int


def inverse_hessian_factor(H: torch.Tensor, dampening_frac: float, max_retries: int) -> InverseHessian:
    """Upper Cholesky factor of the damped inverse Hessian, escalating damping on failure.

    A factorisation fails when Cholesky reports a non-positive pivot, when a factor is not
    finite, or when the smallest pivot is below half the damping added: in exact
    arithmetic every pivot of ``H + lambda * I`` is at least ``lambda``, so a smaller one
    means round-off has swamped the damping (a numerically singular ``H``). On failure the
    damping grows tenfold; after ``max_retries`` failed retries a ``QuantkitError`` is
    raised — the solve never falls back to plain rounding.
    """
    n = H.shape[0]
    mean_diag = float(torch.diagonal(H).mean())
    # With no damping requested, pivots below round-off level (n * eps * mean) count as zero.
    floor = n * torch.finfo(H.dtype).eps
    damping = float(dampening_frac)
    tried: list[float] = []
    for attempt in range(max_retries + 1):
        tried.append(damping)
        Hd = H.clone()
        Hd.diagonal().add_(damping * mean_diag)
        L, info = torch.linalg.cholesky_ex(Hd)
        del Hd   # n x n matrices alive at once are the solve's peak (16 MiB each at n = 2048)
        pivots_ok = int(info) == 0 and bool(torch.isfinite(L).all())
        if pivots_ok:
            min_pivot = float(torch.diagonal(L).pow(2).min())
            pivots_ok = min_pivot >= max(0.5 * damping, floor) * mean_diag
        if pivots_ok:
            Hinv = torch.cholesky_inverse(L)
            del L
            U, info = torch.linalg.cholesky_ex(Hinv, upper=True)
            if int(info) == 0 and bool(torch.isfinite(U).all()):
                return InverseHessian(U, damping, attempt)
        damping = max(damping * _DAMPING_GROWTH, _FIRST_RETRY_DAMPING)
    raise QuantkitError(
        f"dampening_frac: Hessian not positive definite even with {max_retries} damping retries "
        f"(tried {', '.join(f'{d:g}' for d in tried)}); check the calibration data or raise max_damping_retries"
    )


# =====================================================================================
# The solve
# =====================================================================================
@dataclass
class GPTQResult:
    """Codes and qparams in the original column order, the dequantized weight, and health."""

    q: torch.Tensor                      # int8 codes [rows, cols]
    scale: torch.Tensor                  # [1], [rows, 1] or [rows, n_groups], W's dtype
    zero_point: torch.Tensor | None      # int8, scale's shape; None when symmetric
    g_idx: torch.Tensor | None           # int32 [cols], only for actorder "group"
    w_hat: torch.Tensor                  # dequantized weight, W's dtype
    row_loss: torch.Tensor               # per row: mean over tokens of (w - w_hat) . x, squared
    row_rtn_loss: torch.Tensor           # the same for round-to-nearest on the same grid
    row_energy: torch.Tensor             # per row: mean over tokens of (w . x)^2
    damping: float
    damping_retries: int
    dead_columns: int
    global_scale: torch.Tensor | None = None   # the format's, when it has one (gptq/format_grid.py): fixed first


def gptq_quantize_weight(
    W: torch.Tensor,
    H: torch.Tensor,
    args: QuantArgs,
    *,
    block_size: int = 128,
    dampening_frac: float = 0.01,
    max_damping_retries: int = 5,
    static_groups: bool = False,
) -> GPTQResult:
    """GPTQ-quantize ``W`` ``[rows, cols]`` against Hessian ``H`` ``[cols, cols]``.

    - Columns are visited in order of decreasing ``diag(H)`` when ``args.actorder`` is set.
    - Channel and tensor qparams come from the original weight. Group qparams are fixed
      when the solve reaches the group's first column, from the group's columns as
      updated so far (exactly, including updates pending in the lazy block), or from the
      original weight when ``static_groups``.
    - Dead columns (``H_jj == 0``: inputs always zero) are zeroed and excluded from the
      objective.
    - Raises ``QuantkitError`` on NaN/Inf inputs or when no damping up to
      ``dampening_frac * 10**max_damping_retries`` makes ``H`` factorisable.
    """
    return solve(W, H, args, SolveSettings(block_size, dampening_frac, max_damping_retries, static_groups))


def solve(W_in: torch.Tensor, H_in: torch.Tensor, args: QuantArgs, settings: SolveSettings,
          asymmetry: Asymmetry | None = None) -> GPTQResult:
    """``gptq_quantize_weight`` with its options as one ``SolveSettings``; with ``asymmetry``, GPTAQ's
    solve (``quantizers/gptq/gptaq.py``: the float model's output as the target)."""
    _check_inputs(W_in, H_in, args)
    out_dtype = W_in.dtype
    H_obj = H_in.to(GPTQ_PRECISION)
    dead = torch.diagonal(H_obj) == 0 if asymmetry is not None else None
    W, H, n_dead = _without_dead_columns(W_in.to(GPTQ_PRECISION).clone(), H_obj.clone())

    perm = torch.argsort(torch.diagonal(H), descending=True, stable=True) if args.actorder else None
    group_of_col = column_groups(W.shape[1], args, perm, W.device)
    scale, zp = qparams_before_solve(W, args, group_of_col, settings.static_groups, out_dtype, torch.diagonal(H))
    group_of_pos = group_of_col
    if perm is not None:
        W = W[:, perm]
        H = H[perm]
        H = H[:, perm]   # the unpermuted copy freed first: one n x n matrix less at once
        group_of_pos = group_of_col[perm] if group_of_col is not None else None
    grid = column_grid(scale, zp, args, group_of_pos, settings.static_groups, torch.diagonal(H).clone())

    inv = inverse_hessian_factor(H, settings.dampening_frac, settings.max_damping_retries)
    del H
    loop = ColumnLoop(W.T.contiguous(), inv.U, grid, float(args.qmin), float(args.qmax), settings.block_size)
    if asymmetry is not None:
        loop.P = correction(in_solve_order(asymmetry, dead, perm), inv.U, asymmetry.alpha)
    damping, retries = inv.damping, inv.retries
    del W, inv
    with _one_thread(loop.Wt.device):
        column_loop(loop)
    codes_t, Q_t = loop.codes_t, loop.Q_t
    del loop
    codes, Q = _original_order(codes_t, Q_t, perm)
    del codes_t, Q_t
    if not (bool(torch.isfinite(Q).all()) and bool(torch.isfinite(scale.float()).all())):
        raise QuantkitError("weight: GPTQ produced NaN or Inf (check the calibration inputs)")
    row_loss, row_rtn_loss, row_energy = _health(W_in, Q, H_obj, args)
    return GPTQResult(
        q=codes, scale=scale, zero_point=zp,
        g_idx=group_of_col.to(torch.int32) if args.actorder == "group" else None, w_hat=Q.to(out_dtype),
        row_loss=row_loss, row_rtn_loss=row_rtn_loss, row_energy=row_energy,
        damping=damping, damping_retries=retries, dead_columns=n_dead,
    )


def _check_inputs(W: torch.Tensor, H: torch.Tensor, args: QuantArgs) -> None:
    if args.type != "int":
        raise QuantkitError(f"weights.type: GPTQ quantizes integer weights, got {args.type!r}")
    cols = W.shape[1]
    if H.shape != (cols, cols):
        raise QuantkitError(f"hessian: shape {tuple(H.shape)} does not match in_features {cols}")
    args.check_width(cols, "weights.group_size")
    if not bool(torch.isfinite(W).all()):
        raise QuantkitError("weight: contains NaN or Inf")
    if not bool(torch.isfinite(H).all()):
        raise QuantkitError("hessian: calibration inputs produced NaN or Inf")


def _without_dead_columns(W: torch.Tensor, H: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Zero the columns no input reaches (``H_jj == 0``) and give them a unit pivot, in place."""
    dead = torch.diagonal(H) == 0
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    return W, H, int(dead.sum())


def _original_order(codes_t: torch.Tensor, Q_t: torch.Tensor,
                    perm: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    codes = codes_t.T.contiguous()
    Q = Q_t.T.contiguous()
    if perm is not None:
        invperm = torch.argsort(perm)
        codes = codes[:, invperm]
        Q = Q[:, invperm]
    return codes, Q


def _health(W_in: torch.Tensor, Q: torch.Tensor, H: torch.Tensor, args: QuantArgs) -> list[torch.Tensor]:
    """Per row: the output error of ``Q``, that of round-to-nearest on the same grid, and the
    output's energy (each a mean over the calibration tokens)."""
    out_dtype, rows = W_in.dtype, W_in.shape[0]
    W_in = W_in.to(GPTQ_PRECISION)
    with _one_thread(W_in.device):  # the range search is many small operations
        rtn_q, rtn_s, rtn_z = rtn_quantize_weight(W_in.to(out_dtype), args)
    # one product for the three health figures (one GEMM runs faster than three small ones), its
    # operands written straight into it: no separate copies of the deltas at the solve's peak
    deltas = torch.empty(3 * rows, W_in.shape[1], dtype=GPTQ_PRECISION, device=W_in.device)
    torch.sub(W_in, Q, out=deltas[:rows])
    torch.sub(W_in, dequantize(rtn_q, rtn_s, rtn_z, args).to(GPTQ_PRECISION), out=deltas[rows:2 * rows])
    deltas[2 * rows:] = W_in
    return list(_output_error(deltas, H).split(rows))


def _output_error(delta: torch.Tensor, H: torch.Tensor) -> torch.Tensor:
    """Per row ``delta H delta^T / 2``: the mean over tokens of the squared output error."""
    product = delta @ H
    return product.mul_(delta).sum(dim=1) / 2   # in place: one [rows, cols] matrix less at the solve's peak


@contextmanager
def _one_thread(device: torch.device):
    """Solve on one CPU thread: the column loop's ops are a few thousand elements each, and
    on a loaded machine OpenMP synchronisation costs far more than it saves (measured on
    2 shared cores: 10-30x the CPU time for the loop and for ``cholesky_inverse``)."""
    if device.type != "cpu":
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(old)
