"""The pipeline's skeleton: the meta model with MoE experts as the checkpoint's per-expert linears."""

from __future__ import annotations

from torch import nn

from quantkit.arch.experts import unfuse_model
from quantkit.arch.meta import meta_model


def build_skeleton(config) -> nn.Module:
    """The model with parameters on the meta device and real (computed) buffers.

    MoE experts are unfused into per-expert linears (``experts.py``): the checkpoint's names.
    """
    model = meta_model(config)
    unfuse_model(model, config)
    return model
