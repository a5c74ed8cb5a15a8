"""Linears that read one input, solved as one stacked weight, and what each reports.

The rows of linears that share a Hessian are independent given it, so q/k/v (or gate/up) stack
into one weight: one factorisation, one column loop.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from quantkit.common.distributed import merge_mean
from quantkit.errors import QuantkitError
from quantkit.steps.base import LayerContext, QuantizedWeight
from quantkit.numerics.number_formats import number_format
from quantkit.quantizers.gptq.format_grid import solve_fp4
from quantkit.quantizers.gptq.gptaq import Asymmetry
from quantkit.quantizers.gptq.solve import GPTQResult, SolveSettings, solve


def solve_batches(ctx: LayerContext, names: list[str]) -> list[list[str]]:
    """Linears sharing an input, batched when their weight args and dtype agree."""
    batches: dict[tuple, list[str]] = {}
    for n in names:
        module, scheme = ctx.targets[n]
        # a tensor-wise scale belongs to one module: never stacked
        alone = n if scheme.weights.strategy == "tensor" else None
        batches.setdefault((scheme.weights, module.weight.dtype, alone), []).append(n)
    return list(batches.values())


def solve_stack(ctx: LayerContext, settings: SolveSettings, names: list[str], H: torch.Tensor, tokens: int,
                subgroup: int, shared: list[str],
                asymmetry: Asymmetry | None = None) -> dict[str, tuple[QuantizedWeight, torch.Tensor]]:
    """Solve ``names`` (one batch of ``solve_batches``) against the Hessian ``H`` of ``tokens`` tokens.

    Returns per linear its quantized weight, with the report figures in ``stats``
    (``subgroup``: its sub-group's index; ``shared``: the linears that read its input), and its
    dequantized weight. ``asymmetry``: GPTAQ's ``dXXT`` over the same tokens, and its ``alpha``.
    """
    modules = [ctx.targets[n][0] for n in names]
    args = ctx.targets[names[0]][1].weights
    device = modules[0].weight.device
    # data-parallel calibration: every rank solves from every rank's tokens (identity on one rank)
    if asymmetry is not None:
        asymmetry = dataclasses.replace(asymmetry, dXXT=merge_mean(asymmetry.dXXT, tokens)[0].to(device))
    H, tokens = merge_mean(H, tokens)
    if tokens == 0:
        # No calibration token reached these linears (an MoE expert the router never picked):
        # with H = I the solve is exactly round-to-nearest, where H = 0 would zero every
        # column as dead and erase the expert.
        H = torch.eye(H.shape[0], dtype=H.dtype)
        asymmetry = None
    W = torch.cat([m.weight.data for m in modules], dim=0)
    try:
        fmt = number_format(args)
        if not fmt.affine:   # a grid of the format's own (E2M1); integer grids take the general solve
            res = solve_fp4(W, H.to(device), fmt, settings, args.actorder, asymmetry)
        else:
            res = solve(W, H.to(device), args, settings, asymmetry)
    except QuantkitError as e:
        raise QuantkitError(f"{ctx.name}.{'/'.join(names)}: {e}") from None
    out: dict[str, tuple[QuantizedWeight, torch.Tensor]] = {}
    start = 0
    for name, module in zip(names, modules):
        rows = slice(start, start + module.out_features)
        start += module.out_features
        stats = {"algorithm": "gptq", "subgroup": subgroup, "hessian_shared_with": [n for n in shared if n != name],
                 "samples": int(ctx.num_samples), "tokens": int(tokens),
                 **_figures(res, rows, settings), "actorder": args.actorder,
                 "static_groups": bool(settings.static_groups)}
        if asymmetry is not None:
            stats["gptaq_alpha"] = float(asymmetry.alpha)
        out[name] = (_rows_of(res, rows, args.strategy != "tensor", stats), res.w_hat[rows])
    return out


def _figures(res: GPTQResult, rows: slice, settings: SolveSettings) -> dict[str, Any]:
    """The solve's health for some rows: damping, dead columns, output error against RTN's."""
    loss = float(res.row_loss[rows].sum())
    rtn_loss = float(res.row_rtn_loss[rows].sum())
    energy = float(res.row_energy[rows].sum())
    return {
        "dampening_frac": float(settings.dampening_frac),
        "damping": float(res.damping),
        "damping_retries": int(res.damping_retries),
        "dead_columns": int(res.dead_columns),
        "loss": loss,
        "rtn_loss": rtn_loss,
        "loss_vs_rtn": loss / rtn_loss if rtn_loss > 0 else None,
        "relative_output_error": loss / energy if energy > 0 else None,
    }


def _rows_of(res: GPTQResult, rows: slice, per_row: bool, stats: dict[str, Any]) -> QuantizedWeight:
    """One linear's rows of a stacked result (a tensor-wise scale is solved alone: all of it)."""
    scale = res.scale[rows] if per_row else res.scale
    zp = res.zero_point
    if zp is not None and per_row:
        zp = zp[rows]
    return QuantizedWeight(res.q[rows].contiguous(), scale.contiguous(),
                           None if zp is None else zp.contiguous(), res.g_idx, stats, res.global_scale)
