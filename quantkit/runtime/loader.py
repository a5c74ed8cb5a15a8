"""Reading a quantized checkpoint back: ``quantkit.load(dir)``.

The model is built on the meta device, every Linear that a config group targets is swapped
for a ``QuantLinear`` with the checkpoint's tensor layout, and the shards are assigned in
place (no float copy of the quantized weights is ever made). A ``kv_cache_scheme`` gives each
attention module its ``k_scale`` / ``v_scale`` and switches attention to one that reads K and V
as the FP8 cache holds them (``quantkit.kv_cache``), so every measure sees the KV error too.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

from quantkit.arch.lookup import arch_for
from quantkit.arch.spec import attention_of
from quantkit.errors import QuantkitError
from quantkit.arch.experts import unfuse_model
from quantkit.arch.meta import auto_class
from quantkit.pipeline.named_source import named_as_modules
from quantkit.formats.compressed_tensors import parse_quantization_config, scheme_for
from quantkit.kernels import backend_for_format, collecting_fallbacks, select_backend
from quantkit.kv_cache import KVCacheScheme, register_scales, use_kv_attention
from quantkit.runtime.modules import QuantLinear
from quantkit.pipeline.onload import config_dtype as _config_dtype
from quantkit.inputs.source import SafetensorsSource


def load(path: str | Path, backend: str | None = None, device: str = "cpu", trust_remote_code: bool = False):
    """Load a compressed-tensors checkpoint written by quantkit (or another compliant tool).

    Example:
        >>> model = quantkit.load("out/smollm2-w4a16")                  # doctest: +SKIP
        >>> model(input_ids).logits                                     # doctest: +SKIP
    """
    from accelerate import init_empty_weights
    from transformers import AutoConfig

    path = Path(path)
    source = SafetensorsSource(path)
    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    qc = getattr(config, "quantization_config", None)
    if qc is None:
        raise QuantkitError(f"{path / 'config.json'}: no quantization_config (not a quantized checkpoint)")
    qc = qc if isinstance(qc, dict) else qc.to_dict()
    groups, ignore = parse_quantization_config(qc, str(path / "config.json"))
    kv_scheme = KVCacheScheme.from_checkpoint(qc.get("kv_cache_scheme"), str(path / "config.json"))
    cfg = config.to_dict()
    cfg.pop("quantization_config", None)
    plain = type(config).from_dict(cfg)
    dtype = _config_dtype(plain)
    with init_empty_weights(include_buffers=False):
        model = auto_class(plain).from_config(plain, dtype=dtype, trust_remote_code=trust_remote_code)
    unfuse_model(model, plain)   # MoE experts as the checkpoint's per-expert linears
    with collecting_fallbacks() as fallbacks:   # the device's: the modules' are added below
        chosen = select_backend(torch.device(device).type, backend)
    explicit = bool(backend or os.environ.get("QUANTKIT_BACKEND"))
    swapped = 0
    for name, m in list(model.named_modules()):
        if not isinstance(m, nn.Linear):
            continue
        s = scheme_for(name, "Linear", groups, ignore, where=str(path / "config.json"))
        if s is None:
            continue
        q = QuantLinear(m.in_features, m.out_features, m.bias is not None, s, dtype=dtype, device="meta", backend=chosen)
        parent, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, leaf, q)
        swapped += 1
    if kv_scheme is not None:
        _, spec = arch_for(plain)
        kv_heads = getattr(plain, "num_key_value_heads", None) or plain.num_attention_heads
        for attention in filter(None, (attention_of(layer, spec) for layer in model.get_submodule(spec.layers))):
            register_scales(attention, kv_scheme, kv_heads, dtype, "meta")
    source = named_as_modules(model, source)   # a checkpoint stored under transformers' older names
    expected = dict(model.state_dict())
    state = {}
    for k in source.keys():
        if k in expected:
            state[k] = source.get(k).to(device)
    missing = [k for k in expected if k not in state and not _tied(k, plain)]
    if missing:
        raise QuantkitError(f"{path}: tensor '{missing[0]}' missing from the checkpoint ({len(missing)} missing)")
    model.load_state_dict(state, strict=False, assign=True)
    if getattr(plain, "tie_word_embeddings", False):
        model.tie_weights()
    # Buffers computed at construction (rotary frequencies) are real already; move all to device.
    model.to(device)
    with collecting_fallbacks() as module_fallbacks:
        for m in model.modules():
            if isinstance(m, QuantLinear):
                m.set_backend(backend_for_format(m.format, chosen, explicit))
    fallbacks += [r for r in module_fallbacks if r not in fallbacks]
    attention = use_kv_attention(model) if kv_scheme is not None else None
    model.eval()
    model.quantkit_info = {"path": str(path), "backend": chosen, "quantized_modules": swapped,
                           "format": qc.get("format"), "kv_cache": kv_scheme and kv_scheme.strategy,
                           "attention": attention, "fallbacks": fallbacks}
    return model


def model_fallbacks(model) -> list[str]:
    """Why ``model`` (``load``'s) runs slower kernels than its device's default, once per reason:
    what loading it recorded and what its modules' later ``set_backend`` calls did; [] for a
    model that is not quantkit's."""
    info = getattr(model, "quantkit_info", None)
    out = list(info.get("fallbacks", [])) if isinstance(info, dict) else []
    for m in model.modules():
        if isinstance(m, QuantLinear) and m.fallback and m.fallback not in out:
            out.append(m.fallback)
    return out


def _tied(key: str, config) -> bool:
    return key == "lm_head.weight" and getattr(config, "tie_word_embeddings", False)
