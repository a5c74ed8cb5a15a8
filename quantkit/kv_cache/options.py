"""The KV-cache formats quantkit evaluates (``quantkit eval --kv``), as one table of data.

Each format says how K and V are scaled (``Granularity``), in which element type (``Codes``),
whether its scales are static (from the checkpoint's ``k_scale`` / ``v_scale``, else calibrated)
or computed as the cache is written, and what a serving engine calls it. An option is a format
with the parts it quantizes: ``int8-kivi`` both, ``int8-kivi:k`` only K, ``fp8-tensor:v`` only V
(the other part stays in the model's dtype), so K's and V's sensitivity show apart.

Bytes per token (the footprint): ``head_dim`` one-byte codes per KV head and part, plus the
scales stored per token: vLLM's per-token-head formats keep a float32 scale per token and head
(4 bytes); KIVI keeps a float16 scale and minimum per group (V: per 32 channels of a token; K:
per channel per 32 tokens, ``head_dim * 4 / 32`` bytes a token) and its newest ``RESIDUAL``
keys in the model's dtype, a fixed amount per request (``residual_bytes``); static scales are
per layer, nothing per token.

Example:
    >>> opt = kv_option("int8-kivi:k")
    >>> opt.parts, opt.format.engine is None
    (('k',), True)
    >>> kv_option("fp8-token-head").bytes_per_token(layers=30, kv_heads=3, head_dim=64)   # SmolLM2
    12240.0
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from quantkit.errors import QuantkitError
from quantkit.kv_cache import kivi
from quantkit.kv_cache.numerics import FP8, INT8, Codes, per_token_head

PARTS = ("k", "v")


@dataclass(frozen=True)
class Granularity:
    """How one part (K or V) gets its scales."""
    name: str
    static: bool                           # per layer, from the checkpoint or calibration
    scale_bytes: Callable[[int], float]    # stored per token and KV head, given head_dim


TENSOR = Granularity("tensor", True, lambda d: 0.0)
HEAD = Granularity("attn_head", True, lambda d: 0.0)
TOKEN_HEAD = Granularity("token-head", False, lambda d: 4.0)
KIVI_K = Granularity("channel over 32 tokens", False, lambda d: d * 4 / kivi.GROUP)
KIVI_V = Granularity("token, 32 channels", False, lambda d: 4.0 * (d // kivi.GROUP if d % kivi.GROUP == 0 else 1))


@dataclass(frozen=True)
class KVFormat:
    name: str
    codes: Codes
    key: Granularity
    value: Granularity
    engine: str | None        # the serving engine's name for it (vLLM's kv_cache_dtype)
    residual_keys: int = 0    # newest keys kept in the model's dtype (KIVI)

    @property
    def static(self) -> bool:
        return self.key.static


FORMATS: dict[str, KVFormat] = {f.name: f for f in (
    KVFormat("fp8-tensor", FP8, TENSOR, TENSOR, 'vLLM kv_cache_dtype="fp8" (kv_cache_scheme strategy tensor)'),
    KVFormat("fp8-head", FP8, HEAD, HEAD, 'vLLM kv_cache_dtype="fp8" (kv_cache_scheme strategy attn_head)'),
    KVFormat("fp8-token-head", FP8, TOKEN_HEAD, TOKEN_HEAD, 'vLLM kv_cache_dtype="fp8_per_token_head"'),
    KVFormat("int8-token-head", INT8, TOKEN_HEAD, TOKEN_HEAD, 'vLLM kv_cache_dtype="int8_per_token_head"'),
    KVFormat("int8-kivi", INT8, KIVI_K, KIVI_V, None, residual_keys=kivi.RESIDUAL),
)}


@dataclass(frozen=True)
class KVOption:
    """A KV format and the parts it quantizes; ``name`` is how ``--kv`` spells it."""
    format: KVFormat
    parts: tuple[str, ...] = PARTS

    @property
    def name(self) -> str:
        return self.format.name + ("" if self.parts == PARTS else f":{self.parts[0]}")

    def bytes_per_token(self, layers: int, kv_heads: int, head_dim: int, base_bytes: float = 2.0) -> float:
        """KV-cache bytes a token takes over all layers (``base_bytes``: the unquantized part's)."""
        per_head = 0.0
        for part, g in zip(PARTS, (self.format.key, self.format.value)):
            per_head += head_dim + g.scale_bytes(head_dim) if part in self.parts else head_dim * base_bytes
        return layers * kv_heads * per_head

    def residual_bytes(self, layers: int, kv_heads: int, head_dim: int, base_bytes: float = 2.0) -> float:
        """Bytes per request held in full precision whatever its length (KIVI's newest keys)."""
        keys = self.format.residual_keys if "k" in self.parts else 0
        return layers * kv_heads * head_dim * base_bytes * keys


def kv_option(name: str) -> KVOption:
    """The option ``name`` (``FORMAT`` or ``FORMAT:k`` / ``FORMAT:v``); a bad name is one line naming ``--kv``."""
    fmt, _, part = str(name).strip().partition(":")
    if fmt not in FORMATS or part not in ("", *PARTS):
        raise QuantkitError(f"--kv: unknown KV option '{name}' (one of {', '.join(FORMATS)}; "
                            f"':k' or ':v' after it quantizes only K or only V)")
    return KVOption(FORMATS[fmt], (part,) if part else PARTS)


def kv_options(names: str | list[str] | None) -> list[KVOption]:
    """``--kv`` given once or more, each a comma list: the options in order, repeats dropped."""
    items = [names] if isinstance(names, str) else list(names or [])
    out: dict[str, KVOption] = {}
    for item in items:
        for n in str(item).split(","):
            if n.strip():
                opt = kv_option(n)
                out.setdefault(opt.name, opt)
    return list(out.values())


def quantize_dynamic(x: torch.Tensor, g: Granularity, codes: Codes) -> torch.Tensor:
    """One part quantized with scales computed from what is written (not the residual-K path)."""
    return DYNAMIC[g.name](x, codes)


DYNAMIC: dict[str, Callable[[torch.Tensor, Codes], torch.Tensor]] = {
    TOKEN_HEAD.name: per_token_head,
    KIVI_V.name: lambda x, codes: kivi.quantize_values(x),
}
