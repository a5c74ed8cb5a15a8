"""gpt-oss: experts held transposed, with gate and up interleaved, biases and a clamped SwiGLU.

transformers' ``GptOssExperts`` holds ``gate_up_proj`` ``[experts, hidden, 2 x inter]`` whose
last dimension alternates gate and up (gate ``[..., ::2]``, up ``[..., 1::2]``), ``down_proj``
``[experts, inter, hidden]``, and a bias for each (``gate_up_proj_bias``, ``down_proj_bias``).
Its activation clamps the gate from above and the up projection on both sides at
``swiglu_limit``, then computes ``(up + 1) * gate * sigmoid(alpha * gate)``. Everything else
(layers, sub-groups, the attention with its sinks, the router ``mlp.router``, which is no
``nn.Linear`` and stays in the model's dtype, listed in ``ignore``) is derived from the trace.

The checkpoints store each block's experts fused under the module's own names; the output
names every expert's linears apart (``mlp.experts.<e>.gate_proj|up_proj|down_proj.weight`` and
``.bias``), as llm-compressor's linearized gpt-oss writes them (see docs/PLATFORM.md).
"""

from __future__ import annotations

import torch
from torch import nn

from quantkit.arch.families.registry import register_family
from quantkit.arch.spec import ExpertLayout, MoESpec


class ClampedSwiGLU(nn.Module):
    """``GptOssExperts._apply_gate`` on the gate and up outputs already split apart."""

    def __init__(self, alpha: float, limit: float):
        super().__init__()
        self.alpha, self.limit = alpha, limit

    def forward(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        gate = gate.clamp(min=None, max=self.limit)
        up = up.clamp(min=-self.limit, max=self.limit)
        return (up + 1) * (gate * torch.sigmoid(gate * self.alpha))

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}, limit={self.limit}"


def clamped_swiglu(fused: nn.Module) -> ClampedSwiGLU:
    """The activation of the fused experts module ``fused``, with its own ``alpha`` and ``limit``."""
    return ClampedSwiGLU(fused.alpha, fused.limit)


register_family(
    "GptOssForCausalLM",
    moe=MoESpec(block="mlp", checkpoint_block="mlp", experts="experts", router="router",
                layout=ExpertLayout(transposed=True, interleaved=True, bias=True), activation=clamped_swiglu),
)
