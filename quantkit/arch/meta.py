"""The model a config describes, built on the meta device: no weight allocated or read."""

from __future__ import annotations

import copy

import torch
from torch import nn


def config_dtype(config) -> torch.dtype:
    """The weights' dtype the config declares (float32 when it declares none)."""
    d = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or torch.float32
    if isinstance(d, str):
        d = getattr(torch, d)
    return d


def auto_class(config):
    """transformers' auto class that builds ``config``'s model: the causal-LM one, or for a
    vision-language model that has none (Qwen2.5-VL, Qwen3-VL) the image-text-to-text one."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    if type(config) in MODEL_FOR_CAUSAL_LM_MAPPING:
        return AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING

    return AutoModelForImageTextToText if type(config) in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING else AutoModelForCausalLM


def meta_model(config) -> nn.Module:
    """transformers' model class for ``config`` with parameters on the meta device and real
    (computed) buffers, in eval mode."""
    from accelerate import init_empty_weights

    with init_empty_weights(include_buffers=False):
        model = auto_class(config).from_config(config, dtype=config_dtype(config))
    return model.eval()


def traceable_model(config) -> nn.Module:
    """The model entirely on the meta device, buffers included, for a structural trace
    (``trace.py``). MoE experts run as transformers' ``batched_mm`` (every token gathers its
    top-k experts' weights): no data-dependent shape, so the forward runs on meta tensors."""
    config = copy.deepcopy(config)
    for c in {id(c): c for c in (config, getattr(config, "get_text_config", lambda: config)())}.values():
        c._experts_implementation = "batched_mm"
    with torch.device("meta"):
        model = auto_class(config).from_config(config, dtype=config_dtype(config))
    return model.eval()
