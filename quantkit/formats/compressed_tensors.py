"""The compressed-tensors checkpoint format: per-module compression and the config block.

Compression and decompression are pure functions over one module's tensors; the model-level
``quantization_config`` is built from the schemes and the ignore list. What vLLM and
transformers (through the compressed-tensors package) read back is exactly this.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

import torch

from quantkit.errors import QuantkitError
from quantkit.numerics.primitives import dequantize
from quantkit.config.scheme import QuantArgs, QuantScheme, fp4_kind
from quantkit.formats.fp4_packed import FP4_FORMATS, compress_fp4_module, decompress_fp4_module, unpack_fp4
from quantkit.formats.packing import pack_int32, unpack_int32
from quantkit.numerics.e8m0 import exponent_to_scale, scale_to_exponent
from quantkit.numerics.fp4_numerics import FP4Weight

CT_VERSION = "0.12.2"  # the config layout written here is read by compressed-tensors >= 0.10
FORMATS = ("pack-quantized", "int-quantized", "float-quantized", "mxfp8-quantized", *FP4_FORMATS)

#: Formats compressed-tensors decompresses to bfloat16 whatever the model's dtype: its FP4 unpacker
#: returns bfloat16 codes and its E8M0 scale decoder bfloat16 scales, and the weight takes their
#: dtype. The other formats decompress to their scale's dtype, which a reader casts to the model's.
READER_BF16_FORMATS = (*FP4_FORMATS, "mxfp8-quantized")


def compress_module(q: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None,
                    g_idx: torch.Tensor | None, scheme: QuantScheme, bias: torch.Tensor | None = None,
                    input_scale: torch.Tensor | None = None,
                    global_scale: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Tensors of one quantized Linear, named as the format names them (without the prefix).

    FP4 formats (``formats/fp4_packed.py``): ``q`` holds E2M1 codes, ``global_scale`` NVFP4's weight
    global scale and ``input_scale`` its input global scale.
    """
    if fp4_kind(scheme.weights) is not None:
        return compress_fp4_module(FP4Weight(q, scale, global_scale), scheme, bias, input_scale)
    args = scheme.weights
    fmt = scheme.format
    out: dict[str, torch.Tensor] = {"weight_scale": scale.contiguous()}
    if args.is_mx:   # powers of two, stored as their E8M0 exponents
        out["weight_scale"] = scale_to_exponent(scale).contiguous()
    if fmt == "pack-quantized":
        out["weight_packed"] = pack_int32(q, args.num_bits, dim=1)
        out["weight_shape"] = torch.tensor(list(q.shape), dtype=torch.int64)
        if zero_point is not None:
            out["weight_zero_point"] = pack_int32(zero_point.to(torch.int8), args.num_bits, dim=0)
    else:
        out["weight"] = q.contiguous()
        if zero_point is not None:
            out["weight_zero_point"] = zero_point.to(torch.int8).contiguous()
    if g_idx is not None:
        if args.actorder != "group":
            raise ValueError("g_idx is stored only for actorder 'group'")
        # the linears of one stacked GPTQ solve share their g_idx: safetensors refuses shared storage
        out["weight_g_idx"] = g_idx.to(torch.int32, copy=True).contiguous()
    if bias is not None:
        out["bias"] = bias.contiguous()
    if input_scale is not None:
        out["input_scale"] = input_scale.reshape(1).contiguous()
    return out


def unpack_module_codes(tensors: Mapping[str, torch.Tensor], scheme: QuantScheme):
    """``(codes, zero_point)`` as int8 from one module's tensor dict, whatever its format."""
    args = scheme.weights
    if fp4_kind(args) is not None:
        return unpack_fp4(tensors["weight_packed"]), None
    if "weight_packed" in tensors:
        shape = tuple(int(s) for s in tensors["weight_shape"].tolist())
        codes = unpack_int32(tensors["weight_packed"], args.num_bits, shape, dim=1)
        zp = tensors.get("weight_zero_point")
        if zp is not None:
            n_cols = tensors["weight_scale"].shape[-1]
            zp = unpack_int32(zp, args.num_bits, (shape[0], n_cols), dim=0)
        return codes, zp
    return tensors["weight"], tensors.get("weight_zero_point")


def decompress_module(tensors: Mapping[str, torch.Tensor], scheme: QuantScheme,
                      dtype: torch.dtype | None = None) -> torch.Tensor:
    """The dequantized weight of one module."""
    if fp4_kind(scheme.weights) is not None:
        return decompress_fp4_module(tensors, scheme, dtype)
    codes, zp = unpack_module_codes(tensors, scheme)
    scale = tensors["weight_scale"]
    if scheme.weights.is_mx:
        scale = exponent_to_scale(scale)
    return dequantize(codes, scale, zp, scheme.weights, tensors.get("weight_g_idx"), dtype)


# -- config -------------------------------------------------------------------------------------
def quantization_config(groups: Mapping[str, QuantScheme], ignore: list[str],
                        kv_cache_scheme: dict | None = None) -> dict[str, Any]:
    """``config.json["quantization_config"]`` for a model quantized with ``groups``."""
    formats = {s.format for s in groups.values()}
    return {
        "quant_method": "compressed-tensors",
        "format": formats.pop() if len(formats) == 1 else "mixed-precision",
        "config_groups": {name: s.to_dict() for name, s in groups.items()},
        "ignore": list(ignore),
        "kv_cache_scheme": kv_cache_scheme,
        "quantization_status": "compressed",
        "global_compression_ratio": None,
        "sparsity_config": {},
        "version": CT_VERSION,
    }


def checkpoint_dtype(formats: set[str], source_dtype: torch.dtype) -> torch.dtype:
    """The dtype ``config.json`` declares: the source's, unless a format's reference reader yields
    bfloat16 weights, which a float32 or float16 model (``dtype="auto"``) could not multiply.

    >>> checkpoint_dtype({"pack-quantized"}, torch.float32), checkpoint_dtype({"mxfp8-quantized"}, torch.float32)
    (torch.float32, torch.bfloat16)
    """
    return torch.bfloat16 if formats & set(READER_BF16_FORMATS) else source_dtype


def parse_quantization_config(qc: Mapping[str, Any], where: str = "config.json") -> tuple[dict[str, QuantScheme], list[str]]:
    """Schemes and ignore list from a compressed-tensors ``quantization_config``."""
    if qc.get("quant_method") != "compressed-tensors":
        raise QuantkitError(f"{where}: quantization_config.quant_method is not 'compressed-tensors'")
    fmt = qc.get("format")
    groups = {}
    for name, g in (qc.get("config_groups") or {}).items():
        g = dict(g)
        g_fmt = g.pop("format", None) or fmt
        w = g.get("weights")
        a = g.get("input_activations")
        scheme = QuantScheme(
            tuple(g.get("targets", ["Linear"])),
            None if w is None else _args_from_ct(w, f"{where}: config_groups.{name}.weights"),
            None if a is None else _args_from_ct(a, f"{where}: config_groups.{name}.input_activations"),
        )
        if g_fmt not in (scheme.format, "mixed-precision"):
            raise QuantkitError(f"{where}: config_groups.{name} has format '{g_fmt}', quantkit reads '{scheme.format}'")
        groups[name] = scheme
    return groups, list(qc.get("ignore") or [])


def _args_from_ct(d: Mapping[str, Any], where: str) -> QuantArgs:
    keep = {"num_bits", "type", "symmetric", "strategy", "group_size", "dynamic", "actorder",
            "block_structure", "scale_dtype"}
    d = {k: v for k, v in d.items() if k in keep and not (k in ("block_structure", "scale_dtype") and v is None)}
    if isinstance(d.get("block_structure"), list):
        d["block_structure"] = tuple(d["block_structure"])
    try:
        return QuantArgs(**d)
    except QuantkitError as e:
        raise QuantkitError(f"{where}.{e}") from None


# -- matching modules to schemes --------------------------------------------------------------
#: compressed-tensors' precedence when several groups target one module
#: (``compressed_tensors.utils.match.match_targets``, first target wins): an exact module name,
#: then a ``re:`` pattern on the name, then a class name. Ranks index this tuple.
MATCH_RANKS = ("exact name", "regex", "class")


def match_rank(name: str, class_name: str, pattern: str) -> int | None:
    """How specifically ``pattern`` targets the module (an index of ``MATCH_RANKS``), or ``None``.

    >>> [match_rank("m.down_proj", "Linear", p) for p in ("m.down_proj", "re:.*down", "Linear", "re:x")]
    [0, 1, 2, None]
    """
    if pattern.startswith("re:"):
        return 1 if re.match(pattern[3:], name) is not None else None
    if pattern == name:
        return 0
    return 2 if pattern == class_name else None


def matches(name: str, class_name: str, pattern: str) -> bool:
    """compressed-tensors target matching: 're:<regex>' on the name, else a class or exact name."""
    return match_rank(name, class_name, pattern) is not None


def group_for(name: str, class_name: str, groups: Mapping[str, QuantScheme], ignore: list[str],
              where: str = "") -> str | None:
    """The key of the config group a module falls under, or ``None`` when ignored or untargeted.

    The most specific match wins, as compressed-tensors resolves it. Two groups matching the
    module equally specifically are refused (``where`` starts the line): compressed-tensors
    would pick one by the order of its target strings, and the other would vanish unseen.
    """
    if any(matches(name, class_name, p) for p in ignore):
        return None
    best: dict[str, int] = {}
    for key, scheme in groups.items():
        ranks = [r for t in scheme.targets if (r := match_rank(name, class_name, t)) is not None]
        if ranks:
            best[key] = min(ranks)
    if not best:
        return None
    top = min(best.values())
    tied = [k for k, r in best.items() if r == top]
    if len(tied) > 1:
        prefix = f"{where}: " if where else ""
        raise QuantkitError(f"{prefix}config_groups.{tied[0]} and config_groups.{tied[1]} both target '{name}' "
                            f"by {MATCH_RANKS[top]}: make one of them more specific (an exact name beats a "
                            "regex, a regex beats a class)")
    return tied[0]


def scheme_for(name: str, class_name: str, groups: Mapping[str, QuantScheme], ignore: list[str],
               where: str = "") -> QuantScheme | None:
    """The scheme a module falls under (``group_for``), or ``None`` when ignored or untargeted."""
    key = group_for(name, class_name, groups, ignore, where)
    return None if key is None else groups[key]
