"""The attention function that reads K and V as the quantized cache holds them.

Registered in transformers' ``AttentionInterface`` as ``quantkit_kv|<base>`` (with ``<base>``'s
mask function), it quantize-dequantizes K and V, then runs ``<base>``: ``sdpa``, or the model's
own ``eager_attention_forward`` (GQA repeat, soft-capping, sliding window through the mask).
What it does to K and V is the attention module's plan (``module.quantkit_kv``, set by
``apply_kv_option``); without one, the checkpoint's static FP8 scales (``module.k_scale`` /
``v_scale``, registered by ``quantkit.load``). It sees the whole cache on every call (past and
new entries, as the cache returns them in full precision) and quantizes it again, which equals
quantizing each entry once when written: every format's codes depend only on what was written.
"""

from __future__ import annotations

import sys
from typing import Callable

from torch import nn

from quantkit.kv_cache.numerics import fake_quantize_fp8
from quantkit.errors import QuantkitError

PLAN_ATTR = "quantkit_kv"
PREFIX = "quantkit_kv|"
BASES = ("sdpa", "eager")


def attention_name(base: str) -> str:
    return f"{PREFIX}{base}"


def base_of(name: str | None) -> str:
    """The base implementation under a quantkit name (``quantkit_kv|sdpa`` -> ``sdpa``)."""
    name = name or "eager"
    return name[len(PREFIX):] if name.startswith(PREFIX) else name


def base_function(base: str, module: nn.Module) -> Callable:
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    # "eager" is each model's own function (GQA repeat, soft-capping), beside its attention class
    return sys.modules[type(module).__module__].eager_attention_forward if base == "eager" else ALL_ATTENTION_FUNCTIONS[base]


def kv_attention(base: str) -> Callable:
    """An attention function (transformers' ``AttentionInterface``) over the quantized cache."""
    bool_mask = base != "eager"   # sdpa's masks are boolean, eager's additive

    def attention(module: nn.Module, query, key, value, attention_mask, **kwargs):
        fn = base_function(base, module)
        plan = getattr(module, PLAN_ATTR, None)
        if plan is None:
            return fn(module, query, fake_quantize_fp8(key, module.k_scale), fake_quantize_fp8(value, module.v_scale),
                      attention_mask, **kwargs)
        return plan.attend(fn, module, query, key, value, attention_mask, kwargs, bool_mask)

    return attention


def register(base: str) -> str:
    """Register ``quantkit_kv|<base>`` (idempotent: same name, same behaviour); returns the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface


    if base not in BASES:
        raise QuantkitError(f"--kv: attention implementation '{base}' cannot read a quantized KV cache "
                            f"(quantkit wraps {' or '.join(BASES)})")
    name = attention_name(base)
    AttentionInterface.register(name, kv_attention(base))
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[base])
    return name


def use_kv_attention(model: nn.Module) -> str:
    """Switch ``model`` to the quantized-KV attention over its current implementation; returns the name."""
    name = register(base_of(model.config._attn_implementation))
    model.set_attn_implementation(name)
    return name
