"""The recipe's ``kv_cache:`` section and the ``k_scale`` / ``v_scale`` a checkpoint carries.

Scales follow compressed-tensors' layout (``initialize_qparams`` for ``k`` / ``v``): per
``tensor`` ``[1]``, per ``attn_head`` ``[num_kv_heads, 1, 1]`` (broadcast over
``[batch, kv_heads, seq, head_dim]``), in the attention module's dtype;
``scale = absmax / 448`` and codes ``(x / scale).clamp(-448, 448).to(float8_e4m3fn)``.

Example:
    >>> s = KVCacheScheme(strategy="attn_head")
    >>> scale_shape(s, num_kv_heads=3)
    (3, 1, 1)
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import torch
from pydantic import Field, StrictBool, StrictInt, model_validator
from torch import nn

from quantkit.numerics.primitives import FP8_MAX
from quantkit.config.validation import config, invalid, parse
from quantkit.errors import QuantkitError

KV_SCALE_NAMES = ("k_scale", "v_scale")
KVStrategy = Literal["tensor", "attn_head"]


@config
class KVCacheScheme:
    """The recipe's ``kv_cache:`` section: FP8 E4M3, symmetric, static scales from calibration."""

    num_bits: StrictInt = 8
    type: Literal["float"] = "float"
    strategy: KVStrategy = "tensor"
    symmetric: StrictBool = True
    # "minmax": the absmax of what the cache stores; "mse": the range p * absmax (p from 1 down
    # to MSE_MIN_RATIO) with the least quantization error on a subsample of the calibration tokens
    observer: Literal["minmax", "mse"] = "minmax"
    # the calibration source's longest rows, each up to long_len tokens, added to the calibration
    # set (they propagate like every row): the KV ranges of long contexts (long_rows.py)
    long_rows: Annotated[StrictInt, Field(ge=0)] = 0
    long_len: Annotated[StrictInt, Field(ge=16)] = 4096

    @model_validator(mode="after")
    def _fp8(self) -> "KVCacheScheme":
        if self.num_bits != 8:
            raise invalid(f"the KV cache is FP8 E4M3 (8 bits), got {self.num_bits}", "num_bits")
        if not self.symmetric:
            raise invalid("FP8 KV-cache scales are symmetric (engines read no zero point)", "symmetric")
        return self

    def to_dict(self) -> dict[str, Any]:
        """compressed-tensors' ``QuantizationArgs`` form (``quantization_config.kv_cache_scheme``)."""
        return {"num_bits": self.num_bits, "type": self.type, "symmetric": self.symmetric, "group_size": None,
                "strategy": self.strategy, "block_structure": None, "dynamic": False, "actorder": None,
                "observer": self.observer, "observer_kwargs": {}}

    @classmethod
    def from_checkpoint(cls, d: dict[str, Any] | None, where: str) -> "KVCacheScheme | None":
        """The scheme of a checkpoint's ``kv_cache_scheme`` (None when absent)."""
        if d is None:
            return None

        if d.get("dynamic") not in (False, None):
            raise QuantkitError(f"{where}: kv_cache_scheme.dynamic: quantkit reads static KV scales only")
        keep = {k: d[k] for k in ("num_bits", "type", "strategy", "symmetric") if k in d}
        return parse(cls, keep, f"{where}: kv_cache_scheme")


def scale_shape(scheme: KVCacheScheme, num_kv_heads: int) -> tuple[int, ...]:
    return (1,) if scheme.strategy == "tensor" else (num_kv_heads, 1, 1)


def scale_of(absmax: torch.Tensor, scheme: KVCacheScheme, dtype: torch.dtype) -> torch.Tensor:
    """``k_scale`` / ``v_scale`` from the observed absmax (``[kv_heads]``): absmax / 448, never 0."""
    amax = absmax.float().amax().reshape(1) if scheme.strategy == "tensor" else absmax.float().reshape(-1, 1, 1)
    scale = amax / FP8_MAX
    tiny = max(torch.finfo(dtype).tiny, 1e-12)
    return torch.where(scale > 0, scale, torch.full_like(scale, tiny)).to(dtype)


def register_scales(attention: nn.Module, scheme: KVCacheScheme, num_kv_heads: int, dtype: torch.dtype,
                    device=None) -> None:
    """Empty ``k_scale`` / ``v_scale`` buffers on an attention module, filled by ``load_state_dict``."""
    for n in KV_SCALE_NAMES:
        attention.register_buffer(n, torch.empty(scale_shape(scheme, num_kv_heads), dtype=dtype, device=device))
