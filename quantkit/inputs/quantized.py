"""Sources that arrive quantized, read as the float tensors they stand for.

Two layouts that models ship in are read, each named by ``config.json``'s ``quantization_config``:

- ``quant_method: "fp8"`` with ``weight_block_size`` (DeepSeek-V3, Kimi): ``<linear>.weight`` is
  float8_e4m3fn ``[out, in]`` and ``<linear>.weight_scale_inv`` float32
  ``[ceil(out / bo), ceil(in / bi)]``, one scale per ``bo x bi`` block (the edge blocks partial);
  the weight is ``fp8 * scale_inv`` over each block.
- ``quant_method: "mxfp4"`` (gpt-oss's experts): ``<experts>.<proj>_blocks`` uint8
  ``[E, rows, G, 16]``, two E2M1 codes a byte (the low nibble first), and ``<proj>_scales`` uint8
  ``[E, rows, G]``, E8M0 exponents (bias 127) per 32 values; the weight is presented as
  transformers' ``GptOssExperts.<proj>`` holds it, ``[E, G * 32, rows]`` (transposed).

The source presents each weight under the model's own name, in float32 (exact for both), and
hides the scale tensors, so the layout check, the pipeline and every reader see a float model.

Example:
    >>> w = torch.tensor([[1.0, 2.0, 4.0]]).to(torch.float8_e4m3fn)
    >>> dequantize_fp8_block(w, torch.tensor([[0.5, 2.0]]), (1, 2)).tolist()
    [[0.5, 1.0, 8.0]]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

from quantkit.errors import QuantkitError
from quantkit.formats.compressed_tensors import group_for
from quantkit.numerics.e8m0 import BIAS
from quantkit.numerics.fp4_numerics import e2m1_values

#: Each stored tensor as its safetensors header gives it: (dtype name, shape).
Headers = Mapping[str, tuple[str, tuple[int, ...]]]


@dataclass(frozen=True)
class Derived:
    """A float32 tensor the source presents, computed from stored ``parts`` by ``decode``."""

    shape: tuple[int, ...]
    parts: tuple[str, ...]
    decode: Callable[..., torch.Tensor]


@dataclass(frozen=True)
class QuantizedLayout:
    """What a quantized source presents: ``derived`` tensors by the model's names, the stored
    tensors they replace or consume (``hidden``), and the ``method`` its config names."""

    method: str
    derived: dict[str, Derived]
    hidden: frozenset[str]


def read_layout(qc: Any, headers: Headers, where: Callable[[str], str], config_file: str) -> QuantizedLayout | None:
    """The layout of a source whose ``quantization_config`` is ``qc``: None for a float source and
    for methods read elsewhere (a compressed-tensors checkpoint); a one-line refusal naming the
    file and key for a layout that does not hold together."""
    if not isinstance(qc, dict):
        return None
    method = qc.get("quant_method")
    if method == "fp8":
        return _fp8_block_layout(qc, headers, where, config_file)
    if method == "mxfp4":
        return _mxfp4_layout(headers, where)
    return None


# -- FP8 with block scales ----------------------------------------------------------------------
def dequantize_fp8_block(weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """float32 ``weight * scale_inv``, each scale over its ``block`` (rows, columns) of the weight.

    Scaled in place, the scales spread over rows only: a scale tensor as large as the weight would
    double the memory a DeepSeek-V3 expert (7168 x 2048) takes while it is read."""
    rows, cols = weight.shape
    out = weight.to(torch.float32)
    scale = scale_inv.float().repeat_interleave(block[0], 0)[:rows]      # [rows, column blocks]
    whole = cols // block[1]
    out[:, :whole * block[1]].view(rows, whole, block[1]).mul_(scale[:, :whole, None])
    if whole * block[1] < cols:   # the partial block at the right edge
        out[:, whole * block[1]:].mul_(scale[:, whole:])
    return out


def _fp8_block_layout(qc: dict, headers: Headers, where: Callable[[str], str], config_file: str) -> QuantizedLayout:
    block = qc.get("weight_block_size")
    if not (isinstance(block, (list, tuple)) and len(block) == 2
            and all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)):
        raise QuantkitError(f"{config_file}: quantization_config.weight_block_size is {block!r}; quantkit reads FP8 "
                            "weights with block scales, [rows, columns] of positive integers (e.g. [128, 128])")
    if qc.get("fmt", "e4m3") != "e4m3":
        raise QuantkitError(f"{config_file}: quantization_config.fmt is {qc.get('fmt')!r}; quantkit reads 'e4m3' FP8 sources")
    if qc.get("activation_scheme", "dynamic") != "dynamic":
        raise QuantkitError(f"{config_file}: quantization_config.activation_scheme is {qc.get('activation_scheme')!r}; "
                            "quantkit reads 'dynamic' FP8 sources (no stored input scales)")
    bo, bi = block
    derived: dict[str, Derived] = {}
    for key, (dtype, shape) in headers.items():
        if dtype == "F8_E4M3" and key + "_scale_inv" not in headers:
            raise QuantkitError(f"{where(key)}: tensor '{key}' is F8_E4M3 without '{key}_scale_inv' (its block scales)")
        if not key.endswith(".weight_scale_inv"):
            continue
        name = key.removesuffix("_scale_inv")
        w_dtype, w_shape = headers.get(name, (None, ()))
        if w_dtype != "F8_E4M3" or len(w_shape) != 2:
            raise QuantkitError(f"{where(key)}: tensor '{key}' has no F8_E4M3 [out, in] weight '{name}' to scale")
        want = (math.ceil(w_shape[0] / bo), math.ceil(w_shape[1] / bi))
        if dtype not in ("F32", "BF16", "F16") or tuple(shape) != want:
            raise QuantkitError(f"{where(key)}: tensor '{key}' is {dtype} {list(shape)}, but '{name}' {list(w_shape)} in "
                                f"{bo}x{bi} blocks (quantization_config.weight_block_size) needs float {list(want)}")
        derived[name] = Derived(tuple(w_shape), (name, key), lambda w, s: dequantize_fp8_block(w, s, (bo, bi)))
    hidden = frozenset(derived) | {k + "_scale_inv" for k in derived}
    return QuantizedLayout("fp8", derived, hidden)


# -- gpt-oss MXFP4 experts ----------------------------------------------------------------------
def dequantize_mxfp4_experts(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """float32 ``[E, G * 32, rows]`` from ``blocks`` uint8 ``[E, rows, G, 16]`` and ``scales`` uint8
    ``[E, rows, G]``: as transformers dequantizes gpt-oss (``integrations/mxfp4.py``), where the
    low nibble is the even value and each group is ``ldexp(value, exponent - 127)``."""
    codes = torch.stack((blocks & 0x0F, blocks >> 4), dim=-1).flatten(-2)     # [E, rows, G, 32]
    values = torch.ldexp(e2m1_values(codes), (scales.to(torch.int32) - BIAS).unsqueeze(-1).float())
    return values.flatten(-2).transpose(1, 2).contiguous()


def _mxfp4_layout(headers: Headers, where: Callable[[str], str]) -> QuantizedLayout:
    derived: dict[str, Derived] = {}
    for key, (dtype, shape) in headers.items():
        if not key.endswith("_blocks"):
            continue
        name = key.removesuffix("_blocks")
        s_dtype, s_shape = headers.get(name + "_scales", (None, ()))
        if dtype != "U8" or len(shape) != 4 or shape[-1] != 16:
            raise QuantkitError(f"{where(key)}: tensor '{key}' is {dtype} {list(shape)}; MXFP4 blocks are U8 "
                                "[experts, rows, groups, 16] (32 FP4 values a group)")
        if s_dtype != "U8" or tuple(s_shape) != tuple(shape[:-1]):
            found = "missing" if s_dtype is None else f"{s_dtype} {list(s_shape)}"
            raise QuantkitError(f"{where(key)}: tensor '{name}_scales' is {found}, but '{key}' {list(shape)} needs "
                                f"U8 {list(shape[:-1])} (one E8M0 exponent per 32 values)")
        experts, rows, groups, _ = shape
        derived[name] = Derived((experts, groups * 32, rows), (key, name + "_scales"), dequantize_mxfp4_experts)
    hidden = frozenset(k for n in derived for k in (n + "_blocks", n + "_scales"))
    return QuantizedLayout("mxfp4", derived, hidden)


# -- what a recipe leaves unquantized ---------------------------------------------------------
_DESCRIBED = {"fp8": "FP8 with block scales", "mxfp4": "MXFP4"}


def kept_note(layout: QuantizedLayout, groups: Mapping[str, Any], ignore: list[str], dtype: torch.dtype,
              config_file: str) -> str | None:
    """One line when the recipe leaves linears unquantized that the source stores quantized
    (``ignore``, a KEEP plan): quantkit writes them dequantized, in ``dtype``, not in the source's
    format, so the checkpoint grows where the recipe meant to keep a module as it was."""
    kept = [n.removesuffix(".weight") for n, d in layout.derived.items() if len(d.shape) == 2
            and group_for(n.removesuffix(".weight"), "Linear", groups, ignore) is None]
    if not kept:
        return None
    shown = str(dtype).removeprefix("torch.")
    return (f"{config_file}: {len(kept)} linear{'s' if len(kept) > 1 else ''} the source stores as "
            f"{_DESCRIBED[layout.method]} {'are' if len(kept) > 1 else 'is'} left unquantized by the recipe (e.g. "
            f"'{kept[0]}'): written dequantized in {shown}, since quantkit cannot keep the source's format")
