"""The float model a quantized source stands for (``inputs/quantized.py``): the baseline an
evaluation compares a re-quantized checkpoint with, and the float model a sensitivity search
measures.

transformers' own readers cannot stand in: its FP8 block dequantizer refuses a weight whose
width is not a whole number of blocks (the edge blocks DeepSeek-V3's layout allows), so the model
is built from the config with no ``quantization_config`` and given the source's dequantized
tensors, under the names the checkpoint uses (MoE experts unfused as quantkit reads them).
"""

from __future__ import annotations

from pathlib import Path

import torch

from quantkit.arch.experts import unfuse_model
from quantkit.arch.meta import auto_class
from quantkit.errors import QuantkitError
from quantkit.inputs.source import SafetensorsSource


def is_quantized_source(path: str | Path) -> bool:
    """Whether ``path`` is a source quantkit reads dequantized (FP8 block scales, gpt-oss MXFP4)."""
    return SafetensorsSource(path).quantized is not None


def load_dequantized(path: str | Path, dtype: torch.dtype = torch.float32, trust_remote_code: bool = False):
    """The model of ``path``'s config in ``dtype``, its weights the source's dequantized tensors.

    Example:
        >>> model = load_dequantized("deepseek-fp8-folder")          # doctest: +SKIP
    """
    from accelerate import init_empty_weights
    from transformers import AutoConfig

    path = Path(path)
    source = SafetensorsSource(path)
    cfg = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code).to_dict()
    cfg.pop("quantization_config", None)
    config = AutoConfig.for_model(**cfg)
    with init_empty_weights(include_buffers=False):   # the weights come from the source, once
        model = auto_class(config).from_config(config, dtype=dtype, trust_remote_code=trust_remote_code)
    if not all(k in source for k in model.state_dict()):
        unfuse_model(model, config)   # fused experts in memory, per-expert names in the checkpoint
    state, missing = {}, []
    for k, p in model.state_dict().items():
        if k in source:
            state[k] = source.get(k).to(p.dtype)
        elif not (k == "lm_head.weight" and getattr(config, "tie_word_embeddings", False)):
            missing.append(k)
    if missing:
        raise QuantkitError(f"{path}: tensor '{missing[0]}' missing from the checkpoint ({len(missing)} missing)")
    model.load_state_dict(state, strict=False, assign=True)
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    source.close()
    return model.eval()
