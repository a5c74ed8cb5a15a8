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
    """The class that builds ``config``'s model: the one its ``architectures`` names when
    transformers has it (the model's own class: a vision-language checkpoint keeps its tower),
    else transformers' causal-LM auto class, or for a vision-language model that has none
    (Qwen2.5-VL, Qwen3-VL) the image-text-to-text one."""
    import transformers
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING, MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING

    for name in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, name, None) if name.isidentifier() else None
        if isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel):
            return OwnClass(cls)
    if type(config) in MODEL_FOR_CAUSAL_LM_MAPPING:
        return AutoModelForCausalLM
    return AutoModelForImageTextToText if type(config) in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING else AutoModelForCausalLM


class OwnClass:
    """A model class used as the auto classes are (``from_config``, ``from_pretrained``)."""

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.__name__ = cls.__name__

    def from_config(self, config, **kwargs):
        kwargs.pop("trust_remote_code", None)   # the class is transformers' own: no remote code
        return self.cls._from_config(config, **kwargs)

    def from_pretrained(self, *args, **kwargs):
        return self.cls.from_pretrained(*args, **kwargs)


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
