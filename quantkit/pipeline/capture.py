"""Capture what enters each decoder layer: layer 0's hidden states and every layer's call arguments."""

from __future__ import annotations

import torch
from torch import nn

from quantkit.pipeline.batches import CalibrationChunk
from quantkit.pipeline.onload import get_module


class _Recorder(nn.Module):
    """Stands in for a decoder layer while capturing: records its call, passes input through."""

    def __init__(self, layer: nn.Module, calls: list):
        super().__init__()
        self.calls = calls
        for attr in ("attention_type", "is_sliding", "sliding_window", "layer_idx"):
            if hasattr(layer, attr):
                setattr(self, attr, getattr(layer, attr))

    def forward(self, hidden_states, *args, **kwargs):
        self.calls.append((args, kwargs))
        return hidden_states


def layer_output(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def capture_inputs(model: nn.Module, layers_path: str, chunks: list[CalibrationChunk], device: str):
    """Per chunk, as it runs: the hidden states entering layer 0 and each layer's ``(args, kwargs)``.

    A generator, so that the caller can offload a chunk's captures before the next one runs.
    """
    layers = get_module(model, layers_path)
    originals = list(layers)
    calls: list[list] = [[] for _ in originals]
    for i, layer in enumerate(originals):
        layers[i] = _Recorder(layer, calls[i])
    base = get_module(model, layers_path.rsplit(".", 1)[0])
    hidden = []
    hook = layers[0].register_forward_pre_hook(lambda m, a, kw: hidden.append(a[0] if a else kw["hidden_states"]), with_kwargs=True)
    try:
        for c in chunks:
            kw = {} if c.position_ids is None else {"position_ids": c.position_ids.to(device)}
            with torch.no_grad():
                base(input_ids=c.input_ids.to(device), use_cache=False, **kw)
            yield hidden.pop(), [layer_calls.pop() for layer_calls in calls]
    finally:
        hook.remove()
        for i, layer in enumerate(originals):
            layers[i] = layer
