"""Where each expert's linears sit in a block's fused expert tensors, as ``MoESpec.layout`` describes.

Shared by the unfusing of a model's experts (``experts.py``), the split of an in-memory state dict,
and the source view that reads experts a checkpoint stores fused (``pipeline/fused_experts.py``):
all three slice the very same way. Nothing here reads a family's name.
"""

from __future__ import annotations

from typing import Mapping

import torch

from quantkit.arch.spec import MoESpec


def fused_names(moe: MoESpec) -> tuple[str, ...]:
    """The fused experts module's tensors: the two weights, then their biases where the layout has them."""
    return moe.fused + (tuple(f"{n}_bias" for n in moe.fused) if moe.layout.bias else ())


def expert_sizes(moe: MoESpec, gate_up_shape: tuple[int, ...]) -> tuple[int, int, int]:
    """``(experts, hidden, inter)`` from the fused gate/up weight's shape under ``moe.layout``.

    >>> from quantkit.arch.spec import ExpertLayout
    >>> expert_sizes(MoESpec(), (4, 16, 8)), expert_sizes(MoESpec(layout=ExpertLayout(transposed=True)), (4, 8, 16))
    ((4, 8, 8), (4, 8, 8))
    """
    num, a, b = gate_up_shape
    return (num, a, b // 2) if moe.layout.transposed else (num, b, a // 2)


def expert_tensors(moe: MoESpec, fused: Mapping[str, torch.Tensor], e: int) -> dict[str, torch.Tensor]:
    """Expert ``e``'s tensors, ``{"<linear>.weight" | "<linear>.bias": view}`` in ``nn.Linear``'s
    ``[out, in]``, sliced from a block's fused tensors (``fused``, keyed as ``fused_names``) as
    ``moe.layout`` describes them.

    >>> from quantkit.arch.spec import ExpertLayout
    >>> moe = MoESpec(layout=ExpertLayout(transposed=True, interleaved=True))
    >>> gate_up = torch.arange(8.).reshape(1, 2, 4)          # [E, hidden 2, 2 x inter 2]: g u g u
    >>> t = expert_tensors(moe, {"gate_up_proj": gate_up, "down_proj": torch.zeros(1, 2, 2)}, 0)
    >>> t["gate_proj.weight"].tolist(), t["up_proj.weight"].tolist()
    ([[0.0, 4.0], [2.0, 6.0]], [[1.0, 5.0], [3.0, 7.0]])
    """
    layout, (gate, up, down) = moe.layout, moe.linears
    rows, down_w = fused[moe.fused[0]][e], fused[moe.fused[1]][e]
    if layout.transposed:
        rows, down_w = rows.T, down_w.T
    out = {f"{down}.weight": down_w, **_split_gate_up(rows, layout.interleaved, gate, up, "weight")}
    if layout.bias:
        out.update(_split_gate_up(fused[f"{moe.fused[0]}_bias"][e], layout.interleaved, gate, up, "bias"))
        out[f"{down}.bias"] = fused[f"{moe.fused[1]}_bias"][e]
    return out


def _split_gate_up(t: torch.Tensor, interleaved: bool, gate: str, up: str, kind: str) -> dict[str, torch.Tensor]:
    half = t.shape[0] // 2
    g, u = (t[0::2], t[1::2]) if interleaved else (t[:half], t[half:])
    return {f"{gate}.{kind}": g, f"{up}.{kind}": u}
