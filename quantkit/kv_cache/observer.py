"""K and V observed where the cache would store them, for the checkpoint's static scales.

What a serving engine caches is the keys **after** the rotary embedding (and after a per-head
key norm, Gemma3) and the values as projected, per KV head, before GQA repeats them. Those are
what the observer sees: a forward pre-hook on the attention module hands it, in place of the
cache, an object whose ``update(key_states, value_states, ...)`` records them and returns them
unchanged (the call transformers' attention makes to its cache, right where a real cache would
store them; compressed-tensors calibrates the same way).
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Callable, Iterator

import torch
from torch import nn

from quantkit.numerics.primitives import FP8_MAX
from quantkit.kv_cache.numerics import fake_quantize_fp8
from quantkit.kv_cache.kv_scheme import KVCacheScheme, scale_of

MSE_GRID = 20          # candidate ranges for observer "mse"
MSE_MIN_RATIO = 0.5    # the smallest candidate: half the absmax
MSE_TOKENS = 16384     # at most about this many tokens a layer kept for the search


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
        err = (fake_quantize_fp8(x, scale) - x).pow(2).sum(dim=(0, 2))
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
