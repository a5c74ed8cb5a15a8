"""The KV cache in FP8: the recipe's ``kv_cache:`` scheme, K/V observed as the cache stores them,
the ``k_scale`` / ``v_scale`` a checkpoint carries, and the attention that reads them back.

What a serving engine caches is the keys **after** the rotary embedding (and after a
per-head key norm, Gemma3) and the values as projected, per KV head, before GQA repeats
them. Those are what the observer sees: a forward pre-hook on the attention module hands it,
in place of the cache, an object whose ``update(key_states, value_states, ...)`` records
them and returns them unchanged (the call transformers' attention makes to its cache, right
where a real cache would store them; compressed-tensors calibrates the same way).

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

import contextlib
import inspect
import sys
from typing import Any, Callable, Iterator, Literal

import torch
from pydantic import StrictBool, StrictInt, model_validator
from torch import nn

from .primitives import FP8_DTYPE, FP8_MAX
from .validation import config, invalid

KV_SCALE_NAMES = ("k_scale", "v_scale")
MSE_GRID = 20          # candidate ranges for observer "mse"
MSE_MIN_RATIO = 0.5    # the smallest candidate: half the absmax
MSE_TOKENS = 16384     # at most about this many tokens a layer kept for the search
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
        from .errors import QuantkitError
        from .validation import parse

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


def fake_quantize(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x`` ``[batch, kv_heads, seq, head_dim]`` as the FP8 cache holds it, back in ``x``'s dtype."""
    s = scale.to(x.dtype)
    return (x / s).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE).to(x.dtype) * s


# -- observing K and V where the cache would store them ---------------------------------------------
class KVObserver:
    """Per-KV-head absmax of one attention module's keys and values over the real tokens; with
    ``keep_every``, every n-th real token is also kept (``[n, kv_heads, head_dim]``) for the
    ``mse`` search.

    Example:
        >>> KVObserver.for_scheme(KVCacheScheme(observer="mse"), num_tokens=65536).keep_every
        4
    """

    def __init__(self, keep_every: int | None = None) -> None:
        self.keep_every = keep_every
        self.absmax: dict[str, torch.Tensor] = {}
        self.kept: dict[str, list[torch.Tensor]] = {"k": [], "v": []}

    @classmethod
    def for_scheme(cls, scheme: KVCacheScheme, num_tokens: int) -> "KVObserver":
        return cls(-(-num_tokens // MSE_TOKENS) if scheme.observer == "mse" else None)

    def record(self, k: torch.Tensor, v: torch.Tensor, tokens: Callable[[torch.Tensor], torch.Tensor]) -> None:
        for name, x in (("k", k), ("v", v)):
            rows = _token_rows(x, tokens)
            self.absmax[name] = _running_max(self.absmax.get(name), rows.abs().amax(dim=(0, 2)).float())
            if self.keep_every is not None:
                self.kept[name].append(rows[:: self.keep_every].float())

    @contextlib.contextmanager
    def observing(self, attention: nn.Module, tokens: Callable[[torch.Tensor], torch.Tensor]) -> Iterator[None]:
        """While open, every call of ``attention`` records its post-rope K and V."""
        name = _cache_kwarg(attention)

        def pre_hook(module, args, kwargs):
            kwargs = dict(kwargs)
            kwargs.pop("past_key_values" if name == "cache" else "cache", None)
            kwargs[name] = _ObservingCache(self, tokens, kwargs.get(name))
            return args, kwargs

        handle = attention.register_forward_pre_hook(pre_hook, with_kwargs=True)
        try:
            yield
        finally:
            handle.remove()

    def scales(self, scheme: KVCacheScheme, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        if not self.absmax:
            raise RuntimeError("kv_cache: the attention module was never called with calibration data")
        out = {}
        for name in ("k", "v"):
            amax = self.absmax[name]
            if scheme.observer == "mse":
                amax = mse_range(torch.cat(self.kept[name]), amax, per_head=scheme.strategy == "attn_head")
            out[f"{name}_scale"] = scale_of(amax, scheme, dtype)
        return out


def mse_range(x: torch.Tensor, absmax: torch.Tensor, per_head: bool) -> torch.Tensor:
    """The range per KV head (``[kv_heads]``; one value repeated when not ``per_head``) among
    ``p * absmax``, ``p`` in ``MSE_GRID`` steps from 1 to ``MSE_MIN_RATIO``, whose E4M3
    quantize-dequantize of ``x`` (``[n, kv_heads, head_dim]``) has the least squared error."""
    top = absmax if per_head else absmax.amax().expand_as(absmax)
    best_err, best = None, top
    for p in torch.linspace(1.0, MSE_MIN_RATIO, MSE_GRID).tolist():
        scale = (p * top / FP8_MAX).clamp_min(1e-12).reshape(1, -1, 1)
        err = (fake_quantize(x, scale) - x).pow(2).sum(dim=(0, 2))
        if not per_head:
            err = err.sum().expand_as(err)
        if best_err is None:
            best_err, best = err, top.clone()
        else:
            better = err < best_err
            best_err = torch.where(better, err, best_err)
            best = torch.where(better, p * top, best)
    return best


class _ObservingCache:
    """Stands where the attention module's cache is: records K and V, stores nothing."""

    def __init__(self, observer: KVObserver, tokens, inner) -> None:
        self.observer, self.tokens, self.inner = observer, tokens, inner

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        self.observer.record(key_states.detach(), value_states.detach(), self.tokens)
        if self.inner is not None:
            return self.inner.update(key_states, value_states, *args, **kwargs)
        return key_states, value_states


def _cache_kwarg(attention: nn.Module) -> str:
    params = inspect.signature(attention.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _token_rows(x: torch.Tensor, tokens) -> torch.Tensor:
    """``[batch, kv_heads, seq, head_dim]`` -> the real tokens, ``[n, kv_heads, head_dim]``."""
    b, h, s, d = x.shape
    return tokens(x.transpose(1, 2).reshape(b, s, h * d)).reshape(-1, h, d)


def _running_max(a: torch.Tensor | None, b: torch.Tensor) -> torch.Tensor:
    return b if a is None else torch.maximum(a, b)


# -- attention over the quantized cache (quantkit.load) -------------------------------------------
def attention_name(base: str) -> str:
    return f"quantkit_fp8_kv|{base}"


def kv_attention(base: str) -> Callable:
    """An attention function (transformers' ``AttentionInterface``) that reads K and V as the
    FP8 cache holds them (``module.k_scale`` / ``v_scale``), then runs ``base`` ("sdpa", "eager")."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    def attention(module: nn.Module, query, key, value, attention_mask, **kwargs):
        # "eager" is each model's own function (GQA repeat, soft-capping), beside its attention class
        fn = sys.modules[type(module).__module__].eager_attention_forward if base == "eager" else ALL_ATTENTION_FUNCTIONS[base]
        return fn(module, query, fake_quantize(key, module.k_scale), fake_quantize(value, module.v_scale),
                  attention_mask, **kwargs)

    return attention


def use_kv_attention(model: nn.Module) -> str:
    """Switch ``model`` to the FP8-KV attention over its current implementation; returns the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    base = model.config._attn_implementation or "eager"
    name = attention_name(base)
    AttentionInterface.register(name, kv_attention(base))   # idempotent: same name, same function
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[base])
    model.set_attn_implementation(name)
    return name


def register_scales(attention: nn.Module, scheme: KVCacheScheme, num_kv_heads: int, dtype: torch.dtype,
                    device=None) -> None:
    """Empty ``k_scale`` / ``v_scale`` buffers on an attention module, filled by ``load_state_dict``."""
    for n in KV_SCALE_NAMES:
        attention.register_buffer(n, torch.empty(scale_shape(scheme, num_kv_heads), dtype=dtype, device=device))
