"""The units of a mixed-precision plan: the decoder linears that take one format together.

A unit is one target Linear, or the linears the architecture table marks as fused
(``ArchSpec.fused``: q/k/v, gate/up), which serving engines run as one matrix and so must
share a format. Only linears the recipe quantizes are planned; ``ignore`` stays as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from quantkit.arch.lookup import arch_for
from quantkit.formats.compressed_tensors import group_for
from quantkit.pipeline.onload import build_skeleton, config_dtype, get_module
from quantkit.recipe import Recipe
from quantkit.config.candidates import weight_bytes


@dataclass(frozen=True)
class FormatUnit:
    """Linears that get one format: full module names and their ``(out, in)`` shapes."""

    name: str                              # "model.layers.3.self_attn.q_proj+k_proj+v_proj"
    members: tuple[str, ...]
    shapes: tuple[tuple[int, int], ...]
    layer: int

    @property
    def params(self) -> int:
        return sum(o * i for o, i in self.shapes)

    def nbytes(self, args, dtype: torch.dtype) -> int:
        return sum(weight_bytes(args, o, i, dtype) for o, i in self.shapes)

    def to_dict(self) -> dict:
        return {"name": self.name, "members": list(self.members), "shapes": [list(s) for s in self.shapes],
                "layer": self.layer}

    @classmethod
    def from_dict(cls, d: dict) -> "FormatUnit":
        return cls(d["name"], tuple(d["members"]), tuple(tuple(s) for s in d["shapes"]), int(d["layer"]))


def _unit_name(prefix: str, names: tuple[str, ...]) -> str:
    parent = names[0].rpartition(".")[0]
    if len(names) > 1 and all(n.rpartition(".")[0] == parent for n in names):
        return f"{prefix}{parent}.{'+'.join(n.rpartition('.')[2] for n in names)}"
    return "+".join(prefix + n for n in names)


def plan_units(config, recipe: Recipe) -> tuple[list[FormatUnit], torch.dtype]:
    """The model's units in layer order, and the checkpoint dtype their sizes are counted in."""
    _, spec = arch_for(config)
    layers = get_module(build_skeleton(config), spec.layers)
    units = []
    for i, layer in enumerate(layers):
        prefix = f"{spec.layers}.{i}."
        linears = {n: m for n, m in layer.named_modules() if isinstance(m, nn.Linear)
                   and group_for(prefix + n, "Linear", recipe.groups, list(recipe.ignore), recipe.origin) is not None}
        taken: set[str] = set()
        for fused in spec.fused:
            present = tuple(n for n in fused if n in linears)
            if len(present) > 1:
                units.append(_unit(prefix, present, linears, i))
                taken.update(present)
        units.extend(_unit(prefix, (n,), linears, i) for n in linears if n not in taken)
    # fused units first in each layer is only how they were found: order by where they compute
    order = {prefix_name: k for k, prefix_name in enumerate(
        f"{spec.layers}.{i}.{n}" for i, layer in enumerate(layers) for n, _ in layer.named_modules())}
    units.sort(key=lambda u: order[u.members[0]])
    return units, config_dtype(config)


def _unit(prefix: str, names: tuple[str, ...], linears: dict[str, nn.Linear], layer: int) -> FormatUnit:
    return FormatUnit(_unit_name(prefix, names), tuple(prefix + n for n in names),
                      tuple((linears[n].out_features, linears[n].in_features) for n in names), layer)
