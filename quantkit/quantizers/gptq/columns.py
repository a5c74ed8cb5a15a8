"""The column loop of the GPTQ solve, and the grid each column is rounded to.

Columns are visited in solve order (act-order permutes them). Within a block of
``block_size`` columns, quantizing column ``p`` to ``q_p`` moves the block's later columns by
``-(w_p - q_p) / U_pp * U_p,:`` (``U = chol(H^-1)^T``: row ``p`` of the inverse Hessian of the
columns still free, scaled); the columns after the block receive the block's errors in one
product when it ends.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from quantkit.numerics.number_formats import number_format
from quantkit.config.scheme import QuantArgs
from quantkit.quantizers.gptq.hessian import GPTQ_PRECISION


# =====================================================================================
# The grid each column is rounded to
# =====================================================================================
@dataclass(frozen=True)
class ColumnParams:
    """One column's qparams: in the solve's precision to round, in the weight's dtype to decode."""

    scale: torch.Tensor
    zero_point: torch.Tensor | None
    scale_out: torch.Tensor
    zero_point_out: torch.Tensor | None

    @classmethod
    def of(cls, scale: torch.Tensor, zero_point: torch.Tensor | None) -> ColumnParams:
        """From a column of the grid's ``scale`` (the weight's dtype) and int8 ``zero_point``."""
        if zero_point is None:
            return cls(scale.to(GPTQ_PRECISION), None, scale, None)
        return cls(scale.to(GPTQ_PRECISION), zero_point.to(GPTQ_PRECISION), scale, zero_point.to(scale.dtype))


@dataclass
class ColumnGrid:
    """The qparams of every column, in solve order.

    Channel and tensor grids, and static groups, are known before the solve. A lazy group's
    qparams are fixed when the solve reaches its first column (``fixed_at``), from the group's
    columns as updated so far; its scale and zero point are then written into ``scale`` and
    ``zero_point``.
    """

    scale: torch.Tensor                        # [rows, n_groups], [rows, 1] or [1]; the weight's dtype
    zero_point: torch.Tensor | None            # int8, scale's shape; None when symmetric
    col_args: QuantArgs                        # a group's qparams: channel qparams of its columns
    group_of_pos: list[int] | None = None      # per solve position; None: one grid for all columns
    members: torch.Tensor | None = None        # lazy groups: solve positions of each group's columns
    fixed_at: dict[int, int] = field(default_factory=dict)          # lazy groups: position -> group
    params: dict[int, ColumnParams] = field(default_factory=dict)   # per group (0 without groups)
    importance: torch.Tensor | None = None     # lazy groups: diag(H) per solve position (imatrix_mse)

    def column(self, p: int) -> ColumnParams:
        return self.params[0 if self.group_of_pos is None else self.group_of_pos[p]]

    def fix(self, g: int, columns: torch.Tensor) -> None:
        """Fix group ``g``'s qparams from its columns ``[group_size, rows]`` as they are now."""
        importance = None if self.importance is None else self.importance[self.members[g]]
        qp = number_format(self.col_args).scales(columns.T, importance=importance)
        s, z = qp.scale, qp.zero_point
        self.scale[:, g] = s[:, 0].to(self.scale.dtype)
        if self.zero_point is not None:
            self.zero_point[:, g] = z[:, 0]
        self.params[g] = ColumnParams.of(self.scale[:, g], None if self.zero_point is None else self.zero_point[:, g])


def column_groups(cols: int, args: QuantArgs, perm: torch.Tensor | None,
                  device: torch.device) -> torch.Tensor | None:
    """The group of each original column (None unless the strategy is "group").

    actorder "group": groups are consecutive runs of the activation order (g_idx).
    Otherwise (none, or actorder "weight"): contiguous runs of the original order.
    """
    if args.strategy != "group":
        return None
    if args.actorder == "group":
        invperm = torch.argsort(perm)
        return invperm // args.group_size
    return torch.arange(cols, device=device) // args.group_size


def qparams_before_solve(W: torch.Tensor, args: QuantArgs, group_of_col: torch.Tensor | None,
                         static_groups: bool, out_dtype: torch.dtype,
                         importance: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Scale and zero point known before the solve: channel/tensor from the original weight,
    static groups; lazy groups' entries stay zero until the solve fixes them. ``importance``:
    ``diag(H)`` per column, for the ``imatrix_mse`` observer."""
    fmt = number_format(args)
    if args.strategy != "group":
        qp = fmt.scales(W, importance=importance)
        return qp.scale.to(out_dtype), qp.zero_point
    rows, cols = W.shape
    n_groups = cols // args.group_size
    scale = torch.zeros(rows, n_groups, dtype=out_dtype, device=W.device)
    zp = None if args.symmetric else torch.zeros(rows, n_groups, dtype=torch.int8, device=W.device)
    if static_groups:
        qp = fmt.scales(W, g_idx=group_of_col if args.actorder == "group" else None, importance=importance)
        scale.copy_(qp.scale.to(out_dtype))
        if zp is not None:
            zp.copy_(qp.zero_point)
    return scale, zp


def column_grid(scale: torch.Tensor, zp: torch.Tensor | None, args: QuantArgs,
                group_of_pos: torch.Tensor | None, static_groups: bool,
                importance: torch.Tensor | None = None) -> ColumnGrid:
    """The grid over ``qparams_before_solve``'s ``scale`` and ``zp`` (``group_of_pos``: each solve
    position's group, None without groups; ``importance``: ``diag(H)`` in solve order, which lazy
    groups weigh their columns by under ``imatrix_mse``)."""
    col_args = dataclasses.replace(args, strategy="channel", group_size=None, actorder=None)
    if group_of_pos is None:
        grid = ColumnGrid(scale, zp, col_args)
        grid.params[0] = ColumnParams.of(scale.reshape(-1), None if zp is None else zp.reshape(-1))
        return grid
    grid = ColumnGrid(scale, zp, col_args, group_of_pos.tolist())
    if static_groups:
        grid.params = {g: ColumnParams.of(scale[:, g], None if zp is None else zp[:, g])
                       for g in range(scale.shape[1])}
    else:
        # positions (in solve order) of each group's columns; a group is fixed at its first
        grid.members = torch.argsort(group_of_pos, stable=True).reshape(-1, args.group_size)
        grid.fixed_at = {p: g for g, p in enumerate(grid.members[:, 0].tolist())}
        grid.importance = importance if args.observer == "imatrix_mse" else None
    return grid


# =====================================================================================
# The column loop
# =====================================================================================
@dataclass
class ColumnLoop:
    """The column loop's operands, in solve order (act-order permutes the columns).

    The loop works on ``W^T`` ``[cols, rows]``: one column of ``W`` is a contiguous row, and the
    rank-1 updates touch one contiguous block of memory.
    """

    Wt: torch.Tensor          # W^T, updated in place by the error propagation
    U: torch.Tensor           # chol(H^-1)^T, upper [cols, cols]
    grid: ColumnGrid
    qmin: float
    qmax: float
    block_size: int
    P: torch.Tensor | None = None   # GPTAQ's correction [cols, cols] (quantizers/gptq/gptaq.py); None: GPTQ
    codes_t: torch.Tensor = field(init=False)    # int8 codes [cols, rows]
    Q_t: torch.Tensor = field(init=False)        # the values they decode to [cols, rows], GPTQ_PRECISION

    def __post_init__(self) -> None:
        self.codes_t = torch.empty(self.Wt.shape, dtype=torch.int8, device=self.Wt.device)
        self.Q_t = torch.empty(self.Wt.shape, dtype=GPTQ_PRECISION, device=self.Wt.device)


def column_loop(loop: ColumnLoop) -> None:
    """Quantize ``loop.Wt`` column by column, writing ``loop.codes_t`` and ``loop.Q_t``.

    Within a block, each column's scaled error ``(w_p - q_p) / U_pp`` moves the block's later
    columns at once (a rank-1 update); the columns after the block receive the block's errors
    in one product when it ends (the lazy batch update).
    """
    cols = loop.Wt.shape[0]
    for i1 in range(0, cols, loop.block_size):
        i2 = min(i1 + loop.block_size, cols)
        Err1, W1 = _solve_block(loop, i1, i2)
        loop.Wt[i2:].addmm_(loop.U[i1:i2, i2:].T, Err1, alpha=-1.0)
        if loop.P is not None:   # GPTAQ: each column's correction, from the value it was rounded from
            loop.Wt[i2:].addmm_(loop.P[i1:i2, i2:].T, W1)


def _solve_block(loop: ColumnLoop, i1: int, i2: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize columns ``i1:i2``; returns their scaled errors ``Err1`` ``[i2 - i1, rows]`` and the
    values ``W1`` they were rounded from (a column is not updated after its turn)."""
    W1 = loop.Wt[i1:i2].clone()
    Err1 = torch.zeros_like(W1)
    U1 = loop.U[i1:i2, i1:i2]
    P1 = loop.P[i1:i2, i1:i2] if loop.P is not None else None
    for i in range(i2 - i1):
        p = i1 + i
        if p in loop.grid.fixed_at:
            _fix_group(loop, loop.grid.fixed_at[p], W1, Err1[:i], i1, i2)
        w = W1[i]
        c, q = _round_column(w, loop.grid.column(p), loop.qmin, loop.qmax)
        loop.codes_t[p] = c
        loop.Q_t[p] = q
        err = Err1[i]
        torch.sub(w, q, out=err)
        err /= U1[i, i]
        W1[i + 1:].addr_(U1[i, i + 1:], err, alpha=-1.0)
        if P1 is not None:
            W1[i + 1:].addr_(P1[i, i + 1:], w)
    return Err1, W1


def _fix_group(loop: ColumnLoop, g: int, W1: torch.Tensor, Err_done: torch.Tensor, i1: int, i2: int) -> None:
    """Fix group ``g`` from its columns as updated so far: those in the block from ``W1``, those
    after it from ``Wt`` with the block's pending updates (``Err_done``: the errors so far) added."""
    mem = loop.grid.members[g]
    current = loop.Wt[mem]
    in_block = mem < i2
    current[in_block] = W1[mem[in_block] - i1]
    later = ~in_block
    done = Err_done.shape[0]
    if done > 0 and bool(later.any()):
        current[later] -= loop.U[i1:i1 + done][:, mem[later]].T @ Err_done
        if loop.P is not None:   # GPTAQ's pending corrections too
            current[later] += loop.P[i1:i1 + done][:, mem[later]].T @ W1[:done]
    loop.grid.fix(g, current)


def _round_column(w: torch.Tensor, params: ColumnParams, qmin: float, qmax: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The codes of one column, and the values they decode to in the weight's dtype, held in
    ``GPTQ_PRECISION``: the error propagated is the one the quantized model will see."""
    v = w / params.scale
    if params.zero_point is not None:
        v += params.zero_point
    c = v.round_().clamp_(qmin, qmax)
    s, z = params.scale_out, params.zero_point_out
    if s.dtype == GPTQ_PRECISION:
        return c, (c - z) * s if z is not None else c * s
    cq = c.to(s.dtype)
    return c, ((cq - z) * s if z is not None else cq * s).to(GPTQ_PRECISION)
