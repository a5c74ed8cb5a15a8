"""Deployment footprint: weight bytes before/after quantization, KV-cache bytes per token,
and how many requests of a given context fit in a GPU's memory.

KV bytes per token = 2 (K and V) x layers x kv_heads x head_dim x bytes per element; with a
quantized-KV option (``quantkit.kv_cache.kv_option``) the option's own count instead: its codes,
the scales it stores per token, the unquantized part (K-only / V-only) at ``kv``'s size, and
what it keeps per request whatever the length (KIVI's newest keys).
Weight bytes = parameters x bits / 8, before scale and zero-point overhead (reported
separately for grouped schemes: one 16-bit scale, plus a zero point when asymmetric, per
group of ``group_size`` weights).
"""
from __future__ import annotations

import json
import math
import struct
from dataclasses import asdict, dataclass
from pathlib import Path

from quantkit.errors import QuantkitError
from quantkit.config.sizes import size_bytes

BITS = {"fp32": 32, "float32": 32, "fp16": 16, "float16": 16, "bf16": 16, "bfloat16": 16,
        "fp8": 8, "float8": 8, "int8": 8, "int7": 7, "int6": 6, "int5": 5, "int4": 4, "int3": 3, "int2": 2,
        "nvfp4": 4, "mxfp4": 4}
# Formats whose groups are part of the format: (group size, bytes of each group's scale). NVFP4's
# scales are FP8 (its per-tensor global scales add 4 bytes a tensor, left out), MXFP4's E8M0.
FIXED_GROUPS = {"nvfp4": (16, 1), "mxfp4": (32, 1)}
GiB = 2**30


def parse_bytes(text: str | int, where: str = "--gpu-mem") -> int:
    """'80GiB' -> 85899345920; '80GB' -> 80e9; '80G' -> '80GiB' (the recipe's reading: quantkit/config/sizes.py).

    >>> parse_bytes("80GiB") == parse_bytes("80G") == 80 * 2**30, parse_bytes("1.5 GB")
    (True, 1500000000)
    """
    if isinstance(text, int):
        return text
    size = size_bytes(str(text))
    if size is None:
        raise QuantkitError(f"{where}: cannot read {text!r} as a size (e.g. 80GiB, 24GB)")
    return size


def bits_of(name: str, where: str) -> int:
    if name not in BITS:
        raise QuantkitError(f"{where}: unknown type {name!r} (one of {', '.join(BITS)})")
    return BITS[name]


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, bytes_per_elem: float) -> int:
    """Bytes of K and V for one token across all layers.

    >>> kv_bytes_per_token(32, 8, 128, 2)  # a Llama-3-8B-like model, FP16 KV: 128 KiB
    131072
    """
    return int(2 * layers * kv_heads * head_dim * bytes_per_elem)


def weight_bytes_at_bits(params: int, bits: float) -> int:
    """Weight bytes estimated at a flat ``bits`` per parameter (exact bytes: ``sensitivity.weight_bytes``).

    >>> weight_bytes_at_bits(70 * 10**9, 4)  # 35 GB = 32.6 GiB
    35000000000
    """
    return int(params * bits / 8)


@dataclass(frozen=True)
class AttentionCache:
    """What the serving engine caches per token, where the config alone does not say it: how
    many layers hold a KV cache (a hybrid's linear-attention and state-space layers hold a fixed
    state instead), and, for multi-head latent attention, the latent's width (one vector per
    token and layer, for K and V together). Derived from the model by the caller (``arch/``)."""

    kv_layers: int
    latent: int | None = None


@dataclass
class Shape:
    layers: int
    kv_heads: int
    head_dim: int
    params_total: int
    params_quantizable: int     # the decoder layers' Linear weights
    dtype: str
    kv_layers: int | None = None    # layers holding a KV cache (None: every layer)
    latent: int | None = None       # MLA: the cached latent's width per token and layer


def _count(cfg: dict, key: str) -> int:
    """A positive whole number of ``cfg``'s, or one line naming the key and what it holds."""
    if key not in cfg:
        raise QuantkitError(f"config.json: missing key {key!r}")
    value = cfg[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise QuantkitError(f"config.json: {key}: expected a positive whole number, got {str(value)[:40]!r}")
    return value


def shape_from_config(cfg: dict) -> Shape:
    """Model shape from a HF config dict (Llama-style decoders, incl. text_config wrappers)."""
    cfg = cfg.get("text_config", cfg)
    hidden, layers, heads, vocab, inter = (_count(cfg, k) for k in ("hidden_size", "num_hidden_layers",
                                                                  "num_attention_heads", "vocab_size",
                                                                  "intermediate_size"))
    kv = _count(cfg, "num_key_value_heads") if cfg.get("num_key_value_heads") is not None else heads
    hd = _count(cfg, "head_dim") if cfg.get("head_dim") is not None else hidden // heads
    if hd < 1:
        raise QuantkitError(f"config.json: hidden_size {hidden} over {heads} heads leaves no head_dim")
    attn = hidden * heads * hd * 2 + hidden * kv * hd * 2
    mlp = 3 * hidden * inter
    quantizable = layers * (attn + mlp)
    embed = vocab * hidden * (1 if cfg.get("tie_word_embeddings", False) else 2)
    norms = layers * 2 * hidden + hidden
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16").replace("torch.", "")
    return Shape(layers, kv, hd, quantizable + embed + norms, quantizable, dtype)


def _safetensors_numels(folder: Path) -> tuple[int, int] | None:
    """(total, decoder-layer 2-D weights) parameter counts read from safetensors headers."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    total = quant = 0
    for f in files:
        with open(f, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            header = json.loads(fh.read(n))
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            if not name.endswith(".weight") or "weight_packed" in name:
                return None  # a packed checkpoint: count from config instead
            numel = math.prod(meta["shape"])
            total += numel
            if ".layers." in name and len(meta["shape"]) == 2:
                quant += numel
    return total, quant


def shape_of(model: str | Path | dict) -> Shape:
    """Shape of a model folder, a config.json file, or a config dict."""
    if isinstance(model, dict):
        return shape_from_config(model)
    path = Path(model)
    cfg_path = path / "config.json" if path.is_dir() else path
    if not cfg_path.exists():
        raise QuantkitError(f"{cfg_path}: no config.json")
    try:
        cfg = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise QuantkitError(f"{cfg_path}: not JSON ({e.msg})") from None
    shape = shape_from_config(cfg)
    counted = _safetensors_numels(path) if path.is_dir() else None
    if counted:
        shape.params_total, shape.params_quantizable = counted
    return shape


@dataclass
class Footprint:
    layers: int
    kv_heads: int
    head_dim: int
    kv_dtype: str
    kv_bytes_per_token: int
    max_len: int
    kv_bytes_per_request: int
    kv_bytes_fixed: int           # per request whatever its length (KIVI's full-precision keys)
    params_total: int
    params_quantizable: int
    weights_before: str
    weights_after: str
    weight_bytes_before: int
    weight_bytes_after: int
    scale_bytes: int              # scale (+ zero point) overhead of the after-weights
    gpu_mem_bytes: int
    utilization: float
    concurrency: int              # requests at max_len that fit beside the weights

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class WeightFormat:
    """The weights after quantization: their type (``BITS``'s names; None keeps the model's) and,
    below 8 bits, the groups whose scales (and zero points, when asymmetric) add to them."""

    type: str | None = None
    group_size: int | None = 128
    symmetric: bool = True


def plan(model: str | Path | dict, gpu_mem: str | int = "80GiB", max_len: int = 8192,
         weights: WeightFormat | str | None = None, kv: str = "fp16", utilization: float = 0.9,
         kv_option=None, cache: AttentionCache | None = None) -> Footprint:
    """Deployment footprint of ``model`` quantized to ``weights`` (a type name such as "int4", in
    groups of 128 with symmetric scales, or a ``WeightFormat``) with a ``kv`` KV cache, or the
    quantized cache ``kv_option`` (a ``KVOption``; ``kv`` is then the unquantized part's type).
    ``cache``: the attention cache as derived from the model (hybrid layers, MLA's latent); by
    default every layer caches ``num_key_value_heads`` heads of K and V.

    >>> cfg = dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
    ...            num_key_value_heads=8, vocab_size=128256, intermediate_size=14336)
    >>> fp = plan(cfg, "80GiB", 8192, weights="int4", kv="fp16")
    >>> fp.kv_bytes_per_token, fp.kv_bytes_per_request == 2**30
    (131072, True)
    >>> plan(cfg, weights=WeightFormat("int4", group_size=32)).scale_bytes // fp.scale_bytes
    4
    >>> plan(cfg, weights="nvfp4").scale_bytes * 2 == plan(cfg, weights="mxfp4").scale_bytes * 4 == fp.scale_bytes * 8
    True
    """
    fmt = weights if isinstance(weights, WeightFormat) else WeightFormat(weights)
    group_size, symmetric = fmt.group_size, fmt.symmetric
    if group_size is not None and (isinstance(group_size, bool) or group_size < 0):
        raise QuantkitError(f"--group-size: expected 0 (one scale a channel) or more, got {group_size}")
    shape = shape_of(model)
    before = shape.dtype if shape.dtype in BITS else "bf16"
    after = fmt.type or before
    b_before, b_after = bits_of(before, "weights"), bits_of(after, "--weights")
    kv_bits = bits_of(kv, "--kv")
    if max_len < 1:
        raise QuantkitError(f"--max-len: must be positive, got {max_len}")
    if not 0 < utilization <= 1:
        raise QuantkitError(f"--utilization: {utilization!r} is not in (0, 1] (the share of GPU memory the "
                            "server may use, e.g. 0.9)")
    mem = parse_bytes(gpu_mem)
    others = shape.params_total - shape.params_quantizable
    wb_before = weight_bytes_at_bits(shape.params_total, b_before)
    wb_after = weight_bytes_at_bits(shape.params_quantizable, b_after) + weight_bytes_at_bits(others, b_before)
    scales = 0
    if after in FIXED_GROUPS:   # --group-size does not apply: the format fixes its groups
        group_size, per_group = FIXED_GROUPS[after]
        scales = shape.params_quantizable // group_size * per_group
    elif b_after < 8 and group_size:
        per_group = 2 + (0 if symmetric else 1)   # fp16 scale (+ int8 zero point)
        scales = shape.params_quantizable // group_size * per_group
    if cache is not None:
        shape.kv_layers, shape.latent = cache.kv_layers, cache.latent
    kv_layers = shape.layers if shape.kv_layers is None else shape.kv_layers
    dims = (kv_layers, shape.kv_heads, shape.head_dim)
    if shape.latent is not None and kv_option is not None:
        raise QuantkitError("--kv: a quantized KV-cache option does not apply to multi-head latent attention "
                            "(the engine caches the latent, not per-head K and V)")
    if shape.latent is not None:   # one latent vector per token and layer stands for K and V
        per_tok, fixed, kv_name = int(kv_layers * shape.latent * kv_bits / 8), 0, kv
    elif kv_option is None:
        per_tok, fixed, kv_name = kv_bytes_per_token(*dims, kv_bits / 8), 0, kv
    else:
        per_tok = int(math.ceil(kv_option.bytes_per_token(*dims, base_bytes=kv_bits / 8)))
        fixed = int(kv_option.residual_bytes(*dims, base_bytes=kv_bits / 8))
        kv_name = kv_option.name
    per_req = per_tok * max_len + fixed
    free = mem * utilization - wb_after - scales
    conc = max(0, int(free // per_req))
    return Footprint(kv_layers, shape.kv_heads, shape.head_dim, kv_name, per_tok, max_len, per_req, fixed,
                     shape.params_total, shape.params_quantizable, before, after, wb_before, wb_after,
                     scales, mem, utilization, conc)
