"""A KV option applied to a loaded model: ``prepare_kv`` (scales, once) and ``apply_kv_option``
(a context manager under which every attention layer reads K and V as that cache holds them).

Static formats (``fp8-tensor``, ``fp8-head``) take the checkpoint's ``k_scale`` / ``v_scale``
when its layout matches (``[1]`` per tensor, ``[kv_heads, 1, 1]`` per head), else absmax / 448
of the post-rope K and V over calibration rows, each run alone (no padding) through the model
with its attention unquantized; ``PreparedKV.source`` says which. Dynamic formats need nothing.

Example:
    >>> prepared = prepare_kv(model, kv_option("fp8-head"), calibration=rows)   # doctest: +SKIP
    >>> with apply_kv_option(model, prepared) as m:                              # doctest: +SKIP
    ...     logits = m(ids).logits
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import torch
from torch import nn

from quantkit.arch.lookup import arch_for
from quantkit.arch.spec import attention_of
from quantkit.arch.table import ARCHITECTURES
from quantkit.errors import QuantkitError
from quantkit.kv_cache import kivi
from quantkit.kv_cache.attention import PLAN_ATTR, base_of, register
from quantkit.kv_cache.numerics import fake_quantize_fp8
from quantkit.kv_cache.options import HEAD, KVOption, kv_option, quantize_dynamic
from quantkit.kv_cache.kv_scheme import KVCacheScheme, scale_of

Rows = Sequence[Sequence[int]]


@dataclass
class PreparedKV:
    """An option with its static scales (layer index -> ``(k_scale, v_scale)``, float32)."""
    option: KVOption
    source: str                                   # where the scales come from, for the report
    scales: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    def describe(self) -> dict:
        return {"option": self.option.name, "engine": self.option.format.engine, "scales": self.source}

    def attend(self, fn: Callable, module: nn.Module, query, key, value, mask, kwargs: dict, bool_mask: bool):
        fmt, parts = self.option.format, self.option.parts
        if fmt.static:
            ks, vs = (s.to(key.device) for s in self.scales[module.layer_idx])
        if "v" in parts:
            value = fake_quantize_fp8(value, vs) if fmt.static else quantize_dynamic(value, fmt.value, fmt.codes)
        if "k" in parts:
            if fmt.residual_keys:
                return kivi.attend(fn, module, query, key, value, mask, kwargs, bool_mask)
            key = fake_quantize_fp8(key, ks) if fmt.static else quantize_dynamic(key, fmt.key, fmt.codes)
        return fn(module, query, key, value, mask, **kwargs)


class _Absmax:
    """A plan that quantizes nothing and records each layer's per-KV-head absmax of K and V."""

    def __init__(self) -> None:
        self.seen: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def attend(self, fn, module, query, key, value, mask, kwargs, bool_mask):
        k, v = (x.detach().abs().amax(dim=(0, 2, 3)).float().cpu() for x in (key, value))
        old = self.seen.get(module.layer_idx)
        self.seen[module.layer_idx] = (k, v) if old is None else (torch.maximum(old[0], k), torch.maximum(old[1], v))
        return fn(module, query, key, value, mask, **kwargs)


def attention_modules(model: nn.Module) -> list[nn.Module]:
    """Every decoder layer's attention module (the architecture table says where)."""
    spec = ARCHITECTURES.get(type(model).__name__) or arch_for(model.config)[1]
    found = [attention_of(layer, spec) for layer in model.get_submodule(spec.layers)]
    return [m for m in found if m is not None]


def prepare_kv(model: nn.Module, option: KVOption | str, calibration: Rows | Callable[[], Rows] | None = None
               ) -> PreparedKV:
    """``option``'s scales for ``model``: none (dynamic), the checkpoint's, or calibrated on
    ``calibration`` (token-id rows, or a callable giving them, called only when needed)."""
    option = kv_option(option) if isinstance(option, str) else option
    fmt = option.format
    if not fmt.static:
        return PreparedKV(option, "dynamic: computed per token as the cache is written")
    modules = attention_modules(model)
    per_head = fmt.key is HEAD
    own = [(getattr(m, "k_scale", None), getattr(m, "v_scale", None)) for m in modules]
    if all(k is not None and v is not None and (k.ndim == 3) == per_head for k, v in own):
        return PreparedKV(option, "checkpoint: its k_scale / v_scale",
                          {m.layer_idx: (k.detach().float().clone(), v.detach().float().clone())
                           for m, (k, v) in zip(modules, own)})
    rows = calibration() if callable(calibration) else calibration
    if not rows:
        raise QuantkitError(f"--kv {option.name}: static scales need the checkpoint's "
                            f"{'per-head' if per_head else 'per-tensor'} k_scale / v_scale or calibration rows")
    seen = observe_absmax(model, rows)
    scheme = KVCacheScheme(strategy="attn_head" if per_head else "tensor")
    scales = {i: (scale_of(k, scheme, torch.float32), scale_of(v, scheme, torch.float32)) for i, (k, v) in seen.items()}
    tokens = sum(len(r) for r in rows)
    return PreparedKV(option, f"calibrated: absmax / 448 of post-rope K and V over {len(rows)} rows "
                              f"({tokens} tokens, the longest {max(len(r) for r in rows)})", scales)


@torch.inference_mode()
def observe_absmax(model: nn.Module, rows: Rows) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, the per-KV-head absmax of K and V as attention receives them, over ``rows``
    (each alone: no padding to skip), with K and V left unquantized."""
    plan = _Absmax()
    device = next(model.parameters()).device
    with _installed(model, plan):
        for row in rows:
            model(input_ids=torch.tensor([list(row)], device=device), use_cache=False)
    return plan.seen


@contextlib.contextmanager
def apply_kv_option(model: nn.Module, option: PreparedKV | KVOption | str,
                    calibration: Rows | Callable[[], Rows] | None = None) -> Iterator[nn.Module]:
    """While open, ``model``'s attention reads K and V as ``option``'s cache holds them (in
    place of the checkpoint's own KV scheme, if any); yields ``model``. Cheap to enter again
    with a ``PreparedKV`` (scales are computed by ``prepare_kv``, once)."""
    prepared = option if isinstance(option, PreparedKV) else prepare_kv(model, option, calibration)
    with _installed(model, prepared):
        yield model


@contextlib.contextmanager
def weights_only(model: nn.Module) -> Iterator[nn.Module]:
    """While open, ``model``'s attention reads K and V unquantized (the checkpoint's own KV
    scheme, or an applied option, set aside): the weight-only candidate."""
    before = model.config._attn_implementation
    model.set_attn_implementation(base_of(before))
    try:
        yield model
    finally:
        model.set_attn_implementation(before)


@contextlib.contextmanager
def _installed(model: nn.Module, plan) -> Iterator[None]:
    modules = attention_modules(model)
    before = model.config._attn_implementation
    plans = [getattr(m, PLAN_ATTR, None) for m in modules]
    model.set_attn_implementation(register(base_of(before)))
    for m in modules:
        setattr(m, PLAN_ATTR, plan)
    try:
        yield
    finally:
        for m, p in zip(modules, plans):
            if p is None:
                delattr(m, PLAN_ATTR)
            else:
                setattr(m, PLAN_ATTR, p)
        model.set_attn_implementation(before)
