"""GPTQ (Frantar et al., 2022, "GPTQ: Accurate Post-Training Quantization for GPTs").

For a linear with weight ``W`` ``[rows, cols]`` and calibration inputs ``x``, GPTQ minimises
the layer-output error ``||W x - Q x||^2`` column by column. With the Hessian of that
objective, ``H = 2/T * sum_t x_t x_t^T``, quantizing column ``p`` to ``q_p`` and moving the
remaining columns by the optimal brain-surgeon update

    delta = -(w_p - q_p) / [H^-1]_pp * [H^-1]_p,:

keeps the output error minimal. ``U = chol(H^-1)^T`` (upper) carries all the ``H^-1`` rows
that the column order needs, so no inverse is updated inside the loop; updates to columns
beyond the current block are applied lazily, once per block (``block_size``).

The solve below is pure functions over tensors (no model knowledge):
``accumulate_hessian`` and ``gptq_quantize_weight``. ``GPTQ`` (the registered algorithm) runs the
layer with hooks to collect Hessians, one per distinct input tensor, and solves the linears
that share an input together (their rows are independent given ``H``).

Example:
    >>> x, linear = torch.randn(16, 128), nn.Linear(128, 32)     # 16 tokens into a 128 -> 32 linear
    >>> H, n = accumulate_hessian(x, None, 0)
    >>> res = gptq_quantize_weight(linear.weight.data, H, QuantArgs(num_bits=4, group_size=64))
    >>> res.q.shape, res.scale.shape            # codes [out, in], scales [out, in // 64]
    (torch.Size([32, 128]), torch.Size([32, 2]))
"""

from __future__ import annotations

import dataclasses
import math
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from ..distributed import merge_mean
from ..errors import QuantkitError
from ..primitives import quantize_weight as rtn_quantize_weight
from ..primitives import dequantize, weight_qparams
from ..scheme import QuantArgs
from .base import Algorithm, LayerContext, QuantizedWeight, register_algorithm

#: Precision of Hessians and of the solve, whatever the model's dtype.
GPTQ_PRECISION = torch.float32

#: Damping fraction tried first on a retry when the user asked for none.
_FIRST_RETRY_DAMPING = 1e-3
_DAMPING_GROWTH = 10.0


# =====================================================================================
# Hessian
# =====================================================================================
def accumulate_hessian(x: torch.Tensor, H: torch.Tensor | None, num_tokens: int) -> tuple[torch.Tensor, int]:
    """Fold inputs ``x`` ``[..., cols]`` into the running mean ``H = 2/T * sum_t x_t x_t^T``.

    Returns the updated ``H`` (``GPTQ_PRECISION``, updated in place when given) and the new
    token count ``T``. The running mean keeps the entries O(|x|^2) however many tokens
    are seen, so fp32 holds them without overflow.
    """
    x = x.reshape(-1, x.shape[-1]).to(GPTQ_PRECISION)
    new = x.shape[0]
    if H is None:
        H = torch.zeros(x.shape[1], x.shape[1], dtype=GPTQ_PRECISION, device=x.device)
    total = num_tokens + new
    if total == 0:
        return H, 0
    fold_gram(H, x, num_tokens / total, 2.0 / total)
    return H, total


#: Column block of ``gram``: its products stay large enough for the BLAS to run at full speed.
_GRAM_BLOCK = 128
#: From this many columns the blocks are twice as wide: 1536 columns (SmolLM2's down_proj),
#: 4096 tokens, 2 threads: 12% less time than 128 (interleaved, median of 25); at 576 columns
#: 256 is no faster (benchmarks/RESULTS.md).
_WIDE_GRAM_COLUMNS = 1024


def fold_gram(H: torch.Tensor, x: torch.Tensor, beta: float, alpha: float) -> torch.Tensor:
    """``H <- beta * H + alpha * x^T x`` in place, for ``x`` ``[tokens, cols]`` and a symmetric ``H``,
    computing only the blocks on and above the diagonal.

    A symmetric product needs about half the multiply-adds of a general one; with many
    tokens this is GPTQ's largest cost after the layer's own forward pass. Each block row of
    the upper triangle is one ``addmm`` into ``H``'s own memory (no product to allocate, scale
    and add: that was 12% of the fold at 1536 columns), then copied to the lower triangle, so
    ``H`` stays exactly symmetric.
    """
    cols = x.shape[1]
    block = _GRAM_BLOCK * (2 if cols >= _WIDE_GRAM_COLUMNS else 1)
    if cols < 2 * block:
        product = x.T @ x
        return H.copy_(product).mul_(alpha) if beta == 0 else H.mul_(beta).add_(product, alpha=alpha)
    for i in range(0, cols, block):
        rows = H[i:i + block, i:]
        torch.addmm(rows, x[:, i:i + block].T, x[:, i:], beta=beta, alpha=alpha, out=rows)
        diagonal = H[i:i + block, i:i + block]
        diagonal.copy_(diagonal.triu() + diagonal.triu(1).T)   # its lower half from the upper
        H[i + block:, i:i + block] = H[i:i + block, i + block:].T
    return H


def gram(x: torch.Tensor) -> torch.Tensor:
    """``x^T x`` for ``x`` ``[tokens, cols]``, exactly symmetric (``fold_gram`` into nothing)."""
    return fold_gram(torch.empty(x.shape[1], x.shape[1], dtype=x.dtype, device=x.device), x, 0.0, 1.0)


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


def _column_groups(cols: int, args: QuantArgs, perm: torch.Tensor | None,
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


def _output_error(delta: torch.Tensor, H: torch.Tensor) -> torch.Tensor:
    """Per row ``delta H delta^T / 2``: the mean over tokens of the squared output error."""
    product = delta @ H
    return product.mul_(delta).sum(dim=1) / 2   # in place: one [rows, cols] matrix less at the solve's peak


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
    return _quantize_weight(W, H, args, block_size, dampening_frac, max_damping_retries, static_groups)


def _column_loop(Wt, Hinv, codes_t, Q_t, scale, zp, members, is_first, group_list, col_params, col_args,
                 qmin, qmax, block_size, out_dtype) -> None:
    """The GPTQ column loop over ``Wt`` (W^T, solve order), writing codes and values row-wise."""
    cols = Wt.shape[0]
    lazy_groups = members is not None
    params = None if group_list is not None else col_params(None)
    params_g = -1
    for i1 in range(0, cols, block_size):
        i2 = min(i1 + block_size, cols)
        W1 = Wt[i1:i2].clone()
        Err1 = torch.zeros_like(W1)
        Hinv1 = Hinv[i1:i2, i1:i2]
        for i in range(i2 - i1):
            p = i1 + i
            if lazy_groups and p in is_first:
                g = is_first[p]
                mem = members[g]
                current = Wt[mem]
                in_block = mem < i2
                current[in_block] = W1[mem[in_block] - i1]
                later = ~in_block
                if i > 0 and bool(later.any()):
                    current[later] -= Hinv[i1:p][:, mem[later]].T @ Err1[:i]
                s, z = weight_qparams(current.T, col_args)
                scale[:, g] = s[:, 0].to(out_dtype)
                if zp is not None:
                    zp[:, g] = z[:, 0]
            if group_list is not None and group_list[p] != params_g:
                params_g = group_list[p]
                params = col_params(params_g)
            s32, z32, s_out, z_out = params

            w = W1[i]
            v = w / s32
            if z32 is not None:
                v += z32
            c = v.round_().clamp_(qmin, qmax)
            if out_dtype == GPTQ_PRECISION:
                q = (c - z_out) * s_out if z_out is not None else c * s_out
            else:
                cq = c.to(out_dtype)
                q = ((cq - z_out) * s_out if z_out is not None else cq * s_out).to(GPTQ_PRECISION)
            codes_t[p] = c
            Q_t[p] = q
            err = Err1[i]
            torch.sub(w, q, out=err)
            err /= Hinv1[i, i]
            W1[i + 1:].addr_(Hinv1[i, i + 1:], err, alpha=-1.0)
        Wt[i2:].addmm_(Hinv[i1:i2, i2:].T, Err1, alpha=-1.0)


def _quantize_weight(
    W: torch.Tensor,
    H: torch.Tensor,
    args: QuantArgs,
    block_size: int,
    dampening_frac: float,
    max_damping_retries: int,
    static_groups: bool,
) -> GPTQResult:
    if args.type != "int":
        raise QuantkitError(f"weights.type: GPTQ quantizes integer weights, got {args.type!r}")
    rows, cols = W.shape
    if H.shape != (cols, cols):
        raise QuantkitError(f"hessian: shape {tuple(H.shape)} does not match in_features {cols}")
    args.check_width(cols, "weights.group_size")
    if not bool(torch.isfinite(W).all()):
        raise QuantkitError("weight: contains NaN or Inf")
    if not bool(torch.isfinite(H).all()):
        raise QuantkitError("hessian: calibration inputs produced NaN or Inf")

    out_dtype = W.dtype
    W_in = W
    H_obj = H.to(GPTQ_PRECISION)
    W = W.to(GPTQ_PRECISION).clone()
    H = H_obj.clone()

    dead = torch.diagonal(H) == 0
    n_dead = int(dead.sum())
    H[dead, dead] = 1.0
    W[:, dead] = 0.0

    perm = torch.argsort(torch.diagonal(H), descending=True, stable=True) if args.actorder else None
    group_of_col = _column_groups(cols, args, perm, W.device)
    lazy_groups = args.strategy == "group" and not static_groups
    col_args = dataclasses.replace(args, strategy="channel", group_size=None, actorder=None)

    # qparams known before the solve: channel/tensor from the original weight, static groups.
    if args.strategy == "group":
        n_groups = cols // args.group_size
        scale = torch.zeros(rows, n_groups, dtype=out_dtype, device=W.device)
        zp = None if args.symmetric else torch.zeros(rows, n_groups, dtype=torch.int8, device=W.device)
        if static_groups:
            s, z = weight_qparams(W, args, g_idx=group_of_col if args.actorder == "group" else None)
            scale.copy_(s.to(out_dtype))
            if zp is not None:
                zp.copy_(z)
    else:
        s, zp = weight_qparams(W, args)
        scale = s.to(out_dtype)

    if perm is not None:
        W = W[:, perm]
        H = H[perm]
        H = H[:, perm]   # the unpermuted copy freed first: one n x n matrix less at once
        group_of_pos = group_of_col[perm] if group_of_col is not None else None
    else:
        group_of_pos = group_of_col

    inv = inverse_hessian_factor(H, dampening_frac, max_damping_retries)
    Hinv = inv.U
    del H

    if lazy_groups:
        # positions (in solve order) of each group's columns; a group is fixed at its first
        members = torch.argsort(group_of_pos, stable=True).reshape(-1, args.group_size)
        first_pos = members[:, 0].tolist()
        is_first = {p: g for g, p in enumerate(first_pos)}
    group_list = group_of_pos.tolist() if group_of_pos is not None else None

    def col_params(g: int | None):
        """(scale fp32, zp fp32 or None, scale in out dtype, zp in out dtype) for one column."""
        s = scale[:, g] if g is not None else scale.reshape(-1)
        z = None if zp is None else (zp[:, g] if g is not None else zp.reshape(-1))
        return (s.to(GPTQ_PRECISION), None if z is None else z.to(GPTQ_PRECISION),
                s, None if z is None else z.to(out_dtype))

    # The loop works on W^T ([cols, rows]): one column of W is a contiguous row, and the
    # rank-1 updates touch one contiguous block of memory.
    Wt = W.T.contiguous()
    del W
    codes_t = torch.empty(cols, rows, dtype=torch.int8, device=Wt.device)
    Q_t = torch.empty(cols, rows, dtype=GPTQ_PRECISION, device=Wt.device)
    qmin, qmax = float(args.qmin), float(args.qmax)
    with _one_thread(Wt.device):
        _column_loop(Wt, Hinv, codes_t, Q_t, scale, zp, members if lazy_groups else None,
                     is_first if lazy_groups else {}, group_list, col_params, col_args, qmin, qmax,
                     block_size, out_dtype)
    del Wt, Hinv
    codes = codes_t.T.contiguous()
    Q = Q_t.T.contiguous()

    g_idx = None
    if perm is not None:
        invperm = torch.argsort(perm)
        codes = codes[:, invperm]
        Q = Q[:, invperm]
    if args.actorder == "group":
        g_idx = group_of_col.to(torch.int32)
    if not (bool(torch.isfinite(Q).all()) and bool(torch.isfinite(scale.float()).all())):
        raise QuantkitError("weight: GPTQ produced NaN or Inf (check the calibration inputs)")

    W_in = W_in.to(GPTQ_PRECISION)
    with _one_thread(W_in.device):  # the range search is many small operations
        rtn_q, rtn_s, rtn_z = rtn_quantize_weight(W_in.to(out_dtype), args)
    # one product for the three health figures (one GEMM runs faster than three small ones), its
    # operands written straight into it: no separate copies of the deltas at the solve's peak
    deltas = torch.empty(3 * rows, cols, dtype=GPTQ_PRECISION, device=W_in.device)
    torch.sub(W_in, Q, out=deltas[:rows])
    torch.sub(W_in, dequantize(rtn_q, rtn_s, rtn_z, args).to(GPTQ_PRECISION), out=deltas[rows:2 * rows])
    deltas[2 * rows:] = W_in
    row_loss, row_rtn_loss, row_energy = _output_error(deltas, H_obj).split(rows)
    del deltas
    return GPTQResult(
        q=codes, scale=scale, zero_point=zp, g_idx=g_idx, w_hat=Q.to(out_dtype),
        row_loss=row_loss, row_rtn_loss=row_rtn_loss, row_energy=row_energy,
        damping=inv.damping, damping_retries=inv.retries, dead_columns=n_dead,
    )


# =====================================================================================
# Hessians from a layer's real calibration inputs
# =====================================================================================
@dataclass
class HessianSet:
    """Hessians of one forward pass: one per distinct input tensor.

    ``leader[name]`` is the module whose input ``name`` shares (itself when not shared);
    ``H`` and ``tokens`` are keyed by leader.
    """

    H: dict[str, torch.Tensor] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)
    leader: dict[str, str] = field(default_factory=dict)

    def sharing(self, leader: str) -> list[str]:
        return [n for n, lead in self.leader.items() if lead == leader]


def collect_hessians(ctx: LayerContext, names: list[str], offload: bool = False) -> HessianSet:
    """Run the layer once with pre-hooks on ``names`` and accumulate their Hessians.

    Linears called one after another with the very same tensor object (q/k/v on the
    normed hidden states, gate/up) share one Hessian, accumulated once.
    """
    hs = HessianSet()
    last: list[Any] = [None, None]  # the last input tensor accumulated, and its leader

    def make_hook(name: str):
        def hook(module: nn.Module, inputs: tuple) -> None:
            x = inputs[0]
            leader = last[1] if last[0] is x else name
            if hs.leader.setdefault(name, leader) != leader:
                raise RuntimeError(f"gptq: {ctx.name}.{name} changed which input it shares between calls")
            if leader == name:
                hs.H[name], hs.tokens[name] = accumulate_hessian(ctx.tokens(x.detach()), hs.H.get(name),
                                                                 hs.tokens.get(name, 0))
                last[0], last[1] = x, name
        return hook

    handles = [ctx.targets[n][0].register_forward_pre_hook(make_hook(n)) for n in names]
    try:
        with torch.no_grad():
            ctx.forward()
    finally:
        for h in handles:
            h.remove()
        last[0] = None
    missing = [n for n in names if n not in hs.leader]
    if missing:
        raise QuantkitError(f"{ctx.name}.{missing[0]}: never called during calibration (no Hessian)")
    if offload:
        hs.H = {k: v.cpu() for k, v in hs.H.items()}
    return hs


# =====================================================================================
# The algorithm
# =====================================================================================
@register_algorithm("gptq")
@dataclass
class GPTQ(Algorithm):
    """GPTQ on each decoder layer's target linears, from their real calibration inputs.

    Options (recipe ``algorithm:`` keys):
        block_size: columns per lazy-update block.
        dampening_frac: damping added to ``H``'s diagonal, as a fraction of its mean.
        max_damping_retries: tenfold damping increases tried when Cholesky fails, before
            the layer fails with an error (never a silent fall back to rounding).
        true_sequential: quantize the layer's sub-groups (attention inputs, attention
            output, MLP inputs, MLP output) one after another, so each sub-group's Hessian
            sees the already-quantized earlier ones. When the calibration set fits in memory
            as one pass (``calibration.batch_tokens``: by default as many tokens as fit a
            quarter of the free memory) this takes one pass per layer: the calibration
            batches run in lockstep, each linear is solved in its forward pre-hook once all
            batches have reached it, and that pass's output is propagated. Otherwise
            the layer is re-run once per sub-group, plus the propagation pass. Off: every
            Hessian comes from the layer with float weights (one pass), plus the
            propagation pass. On by default: on SmolLM2 (benchmarks/RESULTS.md) it is as
            good as off and takes 0.58x the time.
        static_groups: group qparams from the original weight before the solve, instead of
            from the error-updated columns when the solve reaches each group.
        offload_hessians: keep Hessians on the CPU between accumulation and solve.

    Act-order comes from the scheme: ``weights.actorder: weight | group``.
    """

    block_size: int = 128
    dampening_frac: float = 0.01
    max_damping_retries: int = 5
    true_sequential: bool = True
    static_groups: bool = False
    offload_hessians: bool = False

    requires_calibration: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int) or self.block_size <= 0:
            raise QuantkitError(f"block_size: must be a positive integer, got {self.block_size!r}")
        if isinstance(self.dampening_frac, bool) or not isinstance(self.dampening_frac, (int, float)) \
                or not math.isfinite(self.dampening_frac) or self.dampening_frac < 0:
            raise QuantkitError(f"dampening_frac: must be a number >= 0, got {self.dampening_frac!r}")
        if isinstance(self.max_damping_retries, bool) or not isinstance(self.max_damping_retries, int) \
                or self.max_damping_retries < 0:
            raise QuantkitError(f"max_damping_retries: must be an integer >= 0, got {self.max_damping_retries!r}")
        for key in ("true_sequential", "static_groups", "offload_hessians"):
            if not isinstance(getattr(self, key), bool):
                raise QuantkitError(f"{key}: must be true or false, got {getattr(self, key)!r}")

    # -- per layer ---------------------------------------------------------------------
    def quantize_layer(self, ctx: LayerContext) -> dict[str, QuantizedWeight]:
        for name, (module, scheme) in ctx.targets.items():
            if scheme.weights is None:
                raise QuantkitError(f"{ctx.name}.{name}: GPTQ needs a weight scheme")
            if scheme.weights.type != "int":
                raise QuantkitError(f"{ctx.name}.{name}: weights.type: GPTQ quantizes integer weights, got {scheme.weights.type!r}")
            scheme.weights.check_width(module.in_features, f"{ctx.name}.{name}")
        ordered = [n for group in ctx.subgroups for n in group if n in ctx.targets]
        rest = [n for n in ctx.targets if n not in ordered]
        subgroups = [[n for n in g if n in ctx.targets] for g in ctx.subgroups] + ([rest] if rest else [])
        subgroups = [g for g in subgroups if g]
        if self.true_sequential and ctx.single_pass:
            return self._quantize_in_flight(ctx, subgroups)
        if not self.true_sequential:
            subgroups = [[n for g in subgroups for n in g]]

        results: dict[str, QuantizedWeight] = {}
        for index, names in enumerate(subgroups):
            hs = collect_hessians(ctx, names, offload=self.offload_hessians)
            for leader in list(hs.H):
                H = hs.H.pop(leader)
                for batch in self._solve_batches(ctx, hs.sharing(leader)):
                    solved = self._solve(ctx, batch, H, hs.tokens[leader], index, hs.sharing(leader))
                    for name, (qw, w_hat) in solved.items():
                        # the next sub-group's inputs are computed with these weights quantized
                        ctx.targets[name][0].weight.data.copy_(w_hat)
                        results[name] = qw
                del H
        return results

    def _quantize_in_flight(self, ctx: LayerContext, subgroups: list[list[str]]) -> dict[str, QuantizedWeight]:
        """True-sequential GPTQ in one pass: each linear is solved in its forward pre-hook.

        The calibration batches run through the layer in lockstep (``ctx.forward(interleaved=
        True)``). Each batch's pre-hook of a linear adds that batch's input to the Hessian
        and waits at ``ctx.sync``; when all batches are there, the linear is solved from
        the complete Hessian (its calibration inputs were computed by the linears before it,
        already quantized) and the quantized weight is swapped in before any batch runs the
        linear. The first linear of a sub-group to run is solved stacked with the sub-group's
        other linears (q/k/v, gate/up normally read the very same tensor: one Hessian, one
        factorisation); when one of them is then called with a different tensor, its
        provisional result is discarded and it is solved on its own input; when the first batch
        to reach it reads the assumed input, the result is confirmed there and no batch pauses
        at it (a later batch reading anything else is an error). A Hessian is
        dropped when the next input is complete. The pass's output is the quantized layer's
        output, so the pipeline propagates it as is.
        """
        subgroup_of = {n: k for k, g in enumerate(subgroups) for n in g}
        results: dict[str, QuantizedWeight] = {}
        # stacked results not yet confirmed: (result, original weight, leader whose input was assumed)
        provisional: dict[str, tuple[QuantizedWeight, torch.Tensor, str]] = {}
        leader_of: dict[str, str] = {}
        current: dict[str, Any] = {"H": None, "tokens": 0, "leader": None}
        pending: dict[str, list] = {}            # Hessians of new inputs, filling batch by batch
        arrivals: dict[str, list[str]] = {}      # per linear, per batch: "assumed", "last" or "new" input
        # per batch: its last input, and each leader's, held weakly: a strong reference kept every
        # batch's input of every linear alive to the pass's end (SmolLM2, 16 batches of 4096 tokens:
        # about 800 MiB, most of the pass's peak); a tensor that was freed cannot be the one arriving
        per_batch: dict[int | None, dict[str, weakref.ref | None]] = {}
        confirmed: dict[str, str] = {}           # stacked results confirmed at the first arrival: their leader
        called: dict[str, set[int | None]] = {}  # per linear, the batches that reached it

        def finish(name: str) -> None:
            """All batches reached ``name``'s pre-hook: solve it (unless a stacked solve did)."""
            kinds = set(arrivals.pop(name))
            if len(kinds) != 1:
                raise mixed(name)
            kind = kinds.pop()
            module = ctx.targets[name][0]
            if name in provisional:
                qw, original, leader = provisional.pop(name)
                if kind == "assumed":  # the input the stacked solve assumed
                    results[name], leader_of[name] = qw, leader
                    return
                module.weight.data = original
            if kind == "new":
                H, tokens = pending.pop(name)
                current.update(H=H, tokens=tokens, leader=name)  # the previous input's Hessian is done
            # stacked with its siblings only (q/k/v in self_attn, gate/up in one MLP or expert): a
            # sub-group of many experts would otherwise re-solve every expert at each expert's input
            parent = name.rpartition(".")[0]
            peers = [n for n in subgroups[subgroup_of[name]]
                     if n != name and n not in results and n not in provisional and n.rpartition(".")[0] == parent]
            stack = next(b for b in self._solve_batches(ctx, [name] + peers) if name in b)
            solved = self._solve(ctx, stack, current["H"], current["tokens"], subgroup_of[name], stack)
            for n, (qw, _) in solved.items():
                m, scheme = ctx.targets[n]
                if n != name:
                    provisional[n] = (qw, m.weight.data, current["leader"])
                m.weight.data = qw.dequantized(scheme.weights, m.weight.dtype)
            results[name], leader_of[name] = solved[name][0], current["leader"]

        def mixed(name: str) -> QuantkitError:
            return QuantkitError(f"{ctx.name}.{name}: reads a shared input in some calibration batches and "
                                 "not in others; set algorithm.true_sequential: false")

        def hook_for(name: str):
            def hook(module: nn.Module, inputs: tuple) -> None:
                batch = ctx.batch_index()
                callers = called.setdefault(name, set())
                if batch in callers:
                    raise QuantkitError(f"{ctx.name}.{name}: called twice in one layer pass; "
                                        "set algorithm.true_sequential: false")
                callers.add(batch)
                x = inputs[0]
                seen = per_batch.setdefault(batch, {"": None})  # "": the last input

                def held(key: str) -> torch.Tensor | None:
                    ref = seen.get(key)
                    return None if ref is None else ref()

                if name in confirmed:   # an earlier batch confirmed the stacked solve's input
                    if held(confirmed[name]) is not x:
                        raise mixed(name)
                    return
                if name in provisional and held(provisional[name][2]) is x:
                    kind = "assumed"
                    if name not in arrivals:
                        # The first batch here reads the input the stacked solve assumed, whose
                        # result is already swapped in: confirm it now, no pause (a pause kept
                        # every batch's act(gate) alive at up_proj); any later batch must agree.
                        qw, _, leader = provisional.pop(name)
                        results[name], leader_of[name], confirmed[name] = qw, leader, leader
                        return
                elif held("") is x:
                    kind = "last"
                else:
                    kind = "new"
                    seen[""] = seen[name] = weakref.ref(x)
                    acc = pending.setdefault(name, [None, 0])
                    acc[0], acc[1] = accumulate_hessian(ctx.tokens(x.detach()), acc[0], acc[1])
                arrivals.setdefault(name, []).append(kind)
                ctx.sync(name, lambda: finish(name), park=(x,))
            return hook

        handles = [ctx.targets[n][0].register_forward_pre_hook(hook_for(n)) for n in subgroup_of]
        try:
            ctx.forward(propagate=True, interleaved=True)
        finally:
            for h in handles:
                h.remove()
            current.clear()
            provisional.clear()
            pending.clear()
            per_batch.clear()
            confirmed.clear()
            called.clear()
        missing = [n for n in subgroup_of if n not in results]
        if missing:
            raise QuantkitError(f"{ctx.name}.{missing[0]}: never called during calibration (no Hessian)")
        for name, qw in results.items():
            qw.stats["hessian_shared_with"] = [n for n, lead in leader_of.items()
                                               if lead == leader_of[name] and n != name]
        return results

    @staticmethod
    def _solve_batches(ctx: LayerContext, names: list[str]) -> list[list[str]]:
        """Linears sharing an input, batched when their weight args and dtype agree."""
        batches: dict[tuple, list[str]] = {}
        for n in names:
            module, scheme = ctx.targets[n]
            # a tensor-wise scale belongs to one module: never stacked
            alone = n if scheme.weights.strategy == "tensor" else None
            batches.setdefault((scheme.weights, module.weight.dtype, alone), []).append(n)
        return list(batches.values())

    def _solve(self, ctx: LayerContext, names: list[str], H: torch.Tensor, tokens: int, subgroup: int,
               shared: list[str]) -> dict[str, tuple[QuantizedWeight, torch.Tensor]]:
        # The rows of linears that share H are independent given H: one stacked solve.
        modules = [ctx.targets[n][0] for n in names]
        args = ctx.targets[names[0]][1].weights
        device = modules[0].weight.device
        # data-parallel calibration: every rank solves from every rank's tokens (identity on one rank)
        H, tokens = merge_mean(H, tokens)
        if tokens == 0:
            # No calibration token reached these linears (an MoE expert the router never picked):
            # with H = I the solve is exactly round-to-nearest, where H = 0 would zero every
            # column as dead and erase the expert.
            H = torch.eye(H.shape[0], dtype=H.dtype)
        W = torch.cat([m.weight.data for m in modules], dim=0)
        try:
            res = gptq_quantize_weight(W, H.to(device), args, block_size=self.block_size,
                                  dampening_frac=self.dampening_frac,
                                  max_damping_retries=self.max_damping_retries,
                                  static_groups=self.static_groups)
        except QuantkitError as e:
            raise QuantkitError(f"{ctx.name}.{'/'.join(names)}: {e}") from None
        out: dict[str, tuple[QuantizedWeight, torch.Tensor]] = {}
        start = 0
        for name, module in zip(names, modules):
            rows = slice(start, start + module.out_features)
            start += module.out_features
            loss = float(res.row_loss[rows].sum())
            rtn_loss = float(res.row_rtn_loss[rows].sum())
            energy = float(res.row_energy[rows].sum())
            per_row = args.strategy != "tensor"
            scale = res.scale[rows] if per_row else res.scale
            zp = res.zero_point
            if zp is not None and per_row:
                zp = zp[rows]
            stats = {
                "algorithm": "gptq",
                "subgroup": subgroup,
                "hessian_shared_with": [n for n in shared if n != name],
                "samples": int(ctx.num_samples),
                "tokens": int(tokens),
                "dampening_frac": float(self.dampening_frac),
                "damping": float(res.damping),
                "damping_retries": int(res.damping_retries),
                "dead_columns": int(res.dead_columns),
                "loss": loss,
                "rtn_loss": rtn_loss,
                "loss_vs_rtn": loss / rtn_loss if rtn_loss > 0 else None,
                "relative_output_error": loss / energy if energy > 0 else None,
                "actorder": args.actorder,
                "static_groups": bool(self.static_groups),
            }
            qw = QuantizedWeight(res.q[rows].contiguous(), scale.contiguous(),
                                 None if zp is None else zp.contiguous(), res.g_idx, stats)
            out[name] = (qw, res.w_hat[rows])
        return out
