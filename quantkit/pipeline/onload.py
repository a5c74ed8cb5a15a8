"""Onload and offload: the model as a meta skeleton, one layer materialised from the shards at a time."""

from __future__ import annotations

import torch
from torch import nn
from quantkit.arch.meta import config_dtype  # noqa: F401  (the pipeline's name for it)
from quantkit.arch.skeleton import build_skeleton  # noqa: F401


def get_module(root: nn.Module, path: str) -> nn.Module:
    m = root
    for part in path.split("."):
        m = m[int(part)] if part.isdigit() else getattr(m, part)
    return m


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
