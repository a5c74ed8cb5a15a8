"""Onload and offload: the model as a meta skeleton, one layer materialised from the shards at a time."""

from __future__ import annotations

import torch
from torch import nn
from quantkit.arch.experts import unfuse_model


def get_module(root: nn.Module, path: str) -> nn.Module:
    m = root
    for part in path.split("."):
        m = m[int(part)] if part.isdigit() else getattr(m, part)
    return m


def build_skeleton(config) -> nn.Module:
    """The model with parameters on the meta device and real (computed) buffers.

    MoE experts are unfused into per-expert linears (``experts.py``): the checkpoint's names.
    """
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM


    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=config_dtype(config))
    unfuse_model(model, config)
    return model.eval()


def config_dtype(config) -> torch.dtype:
    d = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or torch.float32
    if isinstance(d, str):
        d = getattr(torch, d)
    return d


def materialize(module: nn.Module, prefix: str, source, device: str = "cpu", skip: str | None = None) -> None:
    """Load a module's parameters (those stored in the checkpoint) from the source; those under
    the sub-module ``skip`` stay on the meta device (a streamed layer's experts)."""
    state = {}
    for name, p in module.named_parameters(recurse=True):
        if skip is not None and name.startswith(skip + "."):
            continue
        state[name] = source.get(f"{prefix}{name}").to(device=device, dtype=p.dtype)
    for name, b in module.named_buffers(recurse=True):
        key = f"{prefix}{name}"
        if key in source:
            state[name] = source.get(key).to(device)
    module.load_state_dict(state, strict=False, assign=True)


def dematerialize(module: nn.Module) -> None:
    # every name of a tied parameter (a tied head is the embedding's Parameter under a second
    # name): deduplicated names left the head holding the real embedding (108 MiB on SmolLM2)
    for name, p in list(module.named_parameters(recurse=True, remove_duplicate=False)):
        owner = module.get_submodule(name.rsplit(".", 1)[0]) if "." in name else module
        leaf = name.rsplit(".", 1)[-1]
        setattr(owner, leaf, nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=False))
