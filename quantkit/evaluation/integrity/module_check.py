"""One quantized module checked against its baseline: the tensors its scheme implies (names,
shapes, dtypes), finite positive scales, codes in range, and the weight error against the float
weight."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from quantkit.formats.compressed_tensors import (compress_module, decompress_module, unpack_module_codes)
from quantkit.formats.fp4_packed import compress_fp4_module
from quantkit.numerics.e8m0 import exponent_to_scale
from quantkit.numerics.fp4_numerics import FP4Weight
from quantkit.numerics.primitives import FP8_DTYPE, dequantize
from quantkit.config.scheme import QuantScheme, fp4_kind
from quantkit.evaluation.integrity.figures import EXCESS_CAP_DB, reconstruction


def problem(text: str, layout: bool = False) -> dict:
    return {"text": text, "layout": layout}


# -- one quantized module ------------------------------------------------------------------------
def expected_layout(scheme: QuantScheme, out: int, cols: int, bias: bool,
                    scale_dtype: torch.dtype) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Tensor name -> (shape, dtype) that ``compress_module`` writes for this module."""
    a = scheme.weights
    if fp4_kind(a) is not None:
        return _fp4_layout(scheme, out, cols, bias, scale_dtype)
    shape = {"tensor": (1,), "channel": (out, 1), "group": (out, cols // (a.group_size or 1)),
             "block": (out // (a.block_structure or (1, 1))[0], cols // (a.block_structure or (1, 1))[1])}[a.strategy]
    meta = "meta"
    q = torch.empty(out, cols, dtype=FP8_DTYPE if a.type == "float" else torch.int8, device=meta)
    acts = scheme.input_activations
    written = compress_module(
        q, torch.empty(shape, dtype=scale_dtype, device=meta),
        None if a.symmetric else torch.empty(shape, dtype=torch.int8, device=meta),
        torch.empty(cols, dtype=torch.int32, device=meta) if a.actorder == "group" else None, scheme,
        torch.empty(out, dtype=scale_dtype, device=meta) if bias else None,
        torch.empty(1, dtype=scale_dtype, device=meta) if acts is not None and not acts.dynamic else None)
    return {k: (tuple(t.shape), t.dtype) for k, t in written.items()}


def _fp4_layout(scheme: QuantScheme, out: int, cols: int, bias: bool, dtype: torch.dtype) -> dict:
    """``expected_layout`` of the FP4 formats: their scale dtypes are the format's own."""
    a, acts, meta = scheme.weights, scheme.input_activations, "meta"
    one = torch.empty(1, dtype=torch.float32, device=meta)
    w = FP4Weight(torch.empty(out, cols, dtype=torch.uint8, device=meta),
                  torch.empty(out, cols // a.group_size, device=meta,
                              dtype=torch.float8_e4m3fn if fp4_kind(a) == "nvfp4" else torch.uint8), one)
    written = compress_fp4_module(w, scheme, torch.empty(out, dtype=dtype, device=meta) if bias else None,
                                  one if acts is not None and acts.calibrated else None)
    return {k: (tuple(t.shape), t.dtype) for k, t in written.items()}


def _layout_problems(tensors: dict[str, torch.Tensor], layout: dict) -> list[dict]:
    problems = []
    for k, (shape, dtype) in layout.items():
        t = tensors.get(k)
        if t is None:
            problems.append(problem(f"{k} missing", layout=True))
        elif tuple(t.shape) != shape:
            problems.append(problem(f"{k}: shape {list(t.shape)}, expected {list(shape)}", layout=True))
        elif dtype.is_floating_point and k != "weight" and not t.dtype.is_floating_point:
            problems.append(problem(f"{k}: dtype {t.dtype}, expected a floating-point type", layout=True))
        elif (k == "weight" or not dtype.is_floating_point) and t.dtype != dtype:
            problems.append(problem(f"{k}: dtype {t.dtype}, expected {dtype}", layout=True))
    return problems


def _float_scale(tensors: dict[str, torch.Tensor], args) -> torch.Tensor:
    """The weight scales as numbers: MX checkpoints store E8M0 exponents, whose 255 (NaN in the
    OCP MX format) decodes to an infinite scale and is reported as not finite."""
    scale = tensors["weight_scale"]
    return exponent_to_scale(scale) if args.is_mx else scale


def positive_finite(name: str, t: torch.Tensor) -> list[dict]:
    t = t.float()
    bad = int((~torch.isfinite(t)).sum())
    out = [problem(f"{name}: {bad} of {t.numel()} values not finite")] if bad else []
    low = int((torch.isfinite(t) & (t <= 0)).sum())
    if low:
        out.append(problem(f"{name}: {low} of {t.numel()} values zero or negative"))
    return out


def _value_problems(tensors: dict[str, torch.Tensor], scheme: QuantScheme, codes: torch.Tensor,
                    zp: torch.Tensor | None, cols: int) -> list[dict]:
    a = scheme.weights
    problems = positive_finite("weight_scale", _float_scale(tensors, a))
    for name in ("weight_global_scale", "input_global_scale"):   # NVFP4's
        if name in tensors:
            problems += positive_finite(name, tensors[name])
    if "input_scale" in tensors:
        problems += positive_finite("input_scale", tensors["input_scale"])
    if a.type == "float":
        bad = int((~torch.isfinite(codes.float())).sum())
        if bad:
            problems.append(problem(f"weight: {bad} codes are NaN (off the FP8 grid)"))
    else:
        for what, t in (("codes", codes), ("zero points", zp)):
            if t is not None and t.numel() and (int(t.min()) < a.qmin or int(t.max()) > a.qmax):
                problems.append(problem(f"{what} outside [{a.qmin}, {a.qmax}]: {int(t.min())}..{int(t.max())}"))
    g_idx = tensors.get("weight_g_idx")
    if g_idx is not None:
        n_groups = cols // a.group_size
        counts = torch.bincount(g_idx.long().clamp(0, n_groups), minlength=n_groups + 1)
        if int(g_idx.min()) < 0 or int(g_idx.max()) >= n_groups or bool((counts[:n_groups] != a.group_size).any()):
            problems.append(problem(f"weight_g_idx: not {n_groups} groups of {a.group_size} columns"))
    return problems


def rel_error(cand: torch.Tensor, ref: torch.Tensor, chunk: int = 1 << 22) -> float:
    """||cand - ref|| / ||ref||: 0 when equal, ``EXCESS_CAP_DB`` when not finite or ``ref`` is zero.

    In chunks: an embedding of 262k x 640 in float64 at once would be 1.3 GB a copy."""
    if cand.dtype == ref.dtype and torch.equal(cand, ref):
        return 0.0
    c, r = cand.reshape(-1), ref.reshape(-1)
    num = den = 0.0
    for i in range(0, c.numel(), chunk):
        rc = r[i:i + chunk].float()
        num += float((c[i:i + chunk].float() - rc).pow_(2).sum(dtype=torch.float64))
        den += float(rc.pow_(2).sum(dtype=torch.float64))
    if not math.isfinite(num):
        return EXCESS_CAP_DB
    return 0.0 if num == 0 else (math.sqrt(num / den) if den > 0 else EXCESS_CAP_DB)


@dataclass(frozen=True)
class ConversionRecord:
    """What the conversion recorded about one module: which quantizer wrote it (``quantizer_of``),
    the SQNR it logged, and its error per output row (``pipeline/residuals.py``)."""

    quantizer: str = "unknown"
    sqnr_db: float | None = None
    rows: torch.Tensor | None = None


def check_module(tensors: dict[str, torch.Tensor], ref: dict[str, torch.Tensor] | None, scheme: QuantScheme,
                 shape: tuple[int, int], has_bias: bool, record: ConversionRecord = ConversionRecord()) -> dict:
    """Layout, values and reconstruction of one quantized module of ``shape`` (out, in).

    ``tensors`` are the checkpoint's, ``ref`` the reference's ``weight`` and ``bias`` (None: no
    reference, layout and values only), both without the module's prefix."""
    out, cols = shape
    ref = ref or {}
    scale = tensors.get("weight_scale")
    scale_dtype = scale.dtype if scale is not None and scale.dtype.is_floating_point else torch.float32
    layout = expected_layout(scheme, out, cols, has_bias, scale_dtype)
    problems = _layout_problems(tensors, layout)
    if "weight_shape" in layout and not problems and tensors["weight_shape"].tolist() != [out, cols]:
        problems.append(problem(f"weight_shape: {tensors['weight_shape'].tolist()}, expected {[out, cols]}",
                                 layout=True))
    entry: dict = {"format": scheme.format, "scheme": _scheme_name(scheme), "problems": problems,
                   "extra": sorted(set(tensors) - set(layout))}
    if problems:
        return entry
    codes, zp = unpack_module_codes(tensors, scheme)
    problems += _value_problems(tensors, scheme, codes, zp, cols)
    if has_bias and ref.get("bias") is not None:
        entry["tensor_rel_error"] = rel_error(tensors["bias"], ref["bias"])
    if ref.get("weight") is None:
        return entry
    g_idx = tensors.get("weight_g_idx")
    if fp4_kind(scheme.weights) is not None:
        decoded = decompress_module(tensors, scheme, torch.float32)
    else:
        decoded = dequantize(codes, _float_scale(tensors, scheme.weights), zp, scheme.weights, g_idx, torch.float32)
    logged_rows = record.rows
    if logged_rows is not None and tuple(logged_rows.shape) != (out,):
        problems.append(problem(f"recorded row errors: shape {list(logged_rows.shape)}, expected [{out}]"))
        logged_rows = None
    figures = reconstruction(ref["weight"], decoded, scheme.weights, record.quantizer, g_idx, record.sqnr_db,
                             logged_rows)
    entry.update(dataclasses.asdict(figures))
    entry["recon_excess_db"] = figures.excess_db
    entry["recon_unit_excess_db"] = figures.unit_excess_db
    entry["recon_gain_error"] = abs(figures.gain - 1.0)
    return entry


def quantizer_of(stats: dict | None) -> str:
    """Which quantizer wrote a module, from its quantization_log.json entry (round to nearest logs an SQNR)."""
    if not stats:
        return "unknown"
    if stats.get("algorithm"):
        return str(stats["algorithm"])
    return "rtn" if "sqnr_db" in stats else "unknown"


def _scheme_name(s: QuantScheme) -> str:
    a = s.weights
    w = f"{'fp' if a.type == 'float' else 'int'}{a.num_bits} {a.strategy}" + (f" {a.group_size}" if a.group_size else "")
    if not a.symmetric:
        w += " asym"
    return w + ("" if s.input_activations is None else f", {s.input_activations.type}8 activations")
