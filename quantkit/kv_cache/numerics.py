"""What a quantized KV cache holds, as pure functions over ``[batch, kv_heads, seq, head_dim]``
(the layout transformers' attention receives K and V in, before GQA repeats the heads). Each
returns the dequantized values in ``x``'s dtype: what attention reads back from the cache.

- ``fake_quantize_fp8``: FP8 E4M3 with a static scale (``[1]`` or ``[kv_heads, 1, 1]``), the
  checkpoint's ``k_scale`` / ``v_scale``; ``(x / s).clamp(±448).to(float8_e4m3fn) * s``.
- ``per_token_head``: one scale per token and KV head computed as the token is written,
  vLLM's ``fp8_per_token_head`` / ``int8_per_token_head``: in vLLM's
  ``vllm/v1/attention/ops/triton_reshape_and_cache_flash.py`` (``_reshape_cache_per_token_head``,
  grid ``(num_tokens, num_kv_heads)``) the scale is ``max(absmax over head_size / QUANT_MAX,
  1e-6)`` in float32 (QUANT_MAX 127 for int8 with codes clamped to [-128, 127], 448 for FP8),
  codes ``clamp(x * (1 / scale))`` stored with the cast to the cache dtype; its test
  (``tests/quantization/test_per_token_kv_cache.py``) rounds to nearest for the int8 reference.
  The float32 scale is stored beside the codes (4 bytes per token and head, for K and for V).
- ``group_minmax``: KIVI's asymmetric min-max quantizer (``2^bits - 1`` levels between a group's
  minimum and maximum), used along channels for V (groups of channels of one token) and along
  tokens for K (``kivi.py``).

Example:
    >>> x = torch.tensor([[[[0.5, -1.0, 0.25, 2.0]]]])   # one token of one head
    >>> y = per_token_head(x, INT8)                       # scale 2 / 127
    >>> float(y[0, 0, 0, 3]), round(float(y[0, 0, 0, 0]), 4)   # 0.5 / scale = 31.75 -> code 32
    (2.0, 0.5039)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quantkit.numerics.primitives import FP8_DTYPE, FP8_MAX

SCALE_FLOOR = 1e-6   # vLLM's floor on a per-token-head scale (an all-zero head stays zero)


@dataclass(frozen=True)
class Codes:
    """A cache element type: the largest code magnitude and how a scaled value becomes a code."""
    name: str
    qmax: float
    qmin: float
    integer: bool

    def round(self, y: torch.Tensor) -> torch.Tensor:
        """Scaled float32 values -> the values of the codes (still float32)."""
        if self.integer:
            return y.round().clamp(self.qmin, self.qmax)
        return y.clamp(self.qmin, self.qmax).to(FP8_DTYPE).float()


FP8 = Codes("fp8", FP8_MAX, -FP8_MAX, integer=False)
INT8 = Codes("int8", 127.0, -128.0, integer=True)


def fake_quantize_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x`` as the FP8 cache holds it with a static scale, back in ``x``'s dtype."""
    s = scale.to(x.dtype)
    return (x / s).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE).to(x.dtype) * s


def per_token_head(x: torch.Tensor, codes: Codes) -> torch.Tensor:
    """One float32 scale per token and KV head (the last dim), computed from that token alone."""
    xf = x.float()
    scale = (xf.abs().amax(dim=-1, keepdim=True) / codes.qmax).clamp_min(SCALE_FLOOR)
    return (codes.round(xf * (1.0 / scale)) * scale).to(x.dtype)


def group_minmax(x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, bits: int = 8) -> torch.Tensor:
    """``x`` on ``2^bits - 1`` uniform steps from ``lo`` to ``hi`` (broadcast with ``x``): codes
    ``round((x - lo) / scale)`` in ``[0, 2^bits - 1]``, read back as ``code * scale + lo``. A
    constant group (``hi == lo``) reads back exactly."""
    levels = 2**bits - 1
    xf, lo, hi = x.float(), lo.float(), hi.float()
    scale = (hi - lo) / levels
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = ((xf - lo) / safe).round().clamp(0, levels)
    return (q * scale + lo).to(x.dtype)


def channel_groups(x: torch.Tensor, group: int, bits: int = 8) -> torch.Tensor:
    """Per token, min-max over groups of ``group`` consecutive channels of each KV head (the last
    dim; one group per head when ``head_dim`` is not a multiple): KIVI's per-token V."""
    d = x.shape[-1]
    g = group if d % group == 0 else d
    xs = x.reshape(*x.shape[:-1], d // g, g)
    return group_minmax(xs, xs.amin(dim=-1, keepdim=True), xs.amax(dim=-1, keepdim=True), bits).reshape(x.shape)
