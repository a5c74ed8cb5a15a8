"""Experts a checkpoint stores fused, read per expert: a source view.

gpt-oss's checkpoints store each block's experts as one tensor per fused parameter
(``<layer>.mlp.experts.gate_up_proj`` ``[E, hidden, 2 x inter]`` with its ``_bias``, ``down_proj``
...), as transformers holds them, while quantkit's model, its targets and its output name every
expert's linears apart (``arch/experts.py``). ``FusedExpertsSource`` presents the per-expert names
(``<layer>.<block>.<experts>.<e>.<linear>.weight`` / ``.bias``) and slices them out of the stored
tensors as ``MoESpec.layout`` describes (``arch/experts_layout.py``, the same slicing the
model's own unfusing uses), for any fused layout the spec describes. Expert ``e`` is slab ``e``
of every fused tensor (their first dimension), contiguous on disk: the view reads one expert's
slabs when the first of its tensors is asked for (``get_slab``: only those bytes of the file; an
MXFP4 source decodes only that expert's blocks and scales) and holds that expert only, so a
layer's onload, and a streamed layer's chunk of experts, take no more memory than per-expert
checkpoints do, plus one expert.
"""

from __future__ import annotations

import re
from typing import Iterable

import torch

from quantkit.arch.experts_layout import expert_sizes, expert_tensors, fused_names
from quantkit.arch.spec import MoESpec


class FusedExpertsSource:
    """``source`` with each block's fused expert tensors presented per expert (``keys``, ``get``,
    ``describe``); every other tensor is the wrapped source's."""

    def __init__(self, source, moe: MoESpec, blocks: dict[str, int]):
        self._source = source
        self._moe = moe
        self._blocks = blocks                 # "<layer>.<block>.<experts>." -> experts in the block
        self._fused = {f"{b}{n}" for b in blocks for n in fused_names(moe)}
        self._names = {f"{b}{e}.{leaf}": b for b, num in blocks.items() for e in range(num)
                       for leaf in _leaves(moe)}
        self._held: tuple[str, dict[str, torch.Tensor]] | None = None   # "<block><e>", its slabs [1, ...]
        self.folder = getattr(source, "folder", None)

    def __getattr__(self, name):   # the wrapped source's other attributes (quantized, files, ...)
        return getattr(self._source, name)

    def keys(self) -> Iterable[str]:
        out = [k for k in self._source.keys() if k not in self._fused]
        return out + list(self._names)

    def __contains__(self, name: str) -> bool:
        return name in self._names or (name not in self._fused and name in self._source)

    def where(self, name: str) -> str:
        block = self._names.get(name)
        return self._source.where(block + self._moe.fused[0] if block is not None else name)

    def describe(self, name: str):
        block = self._names.get(name)
        if block is None:
            return self._source.describe(name)
        dtype, shape = self._source.describe(block + self._moe.fused[0])
        _, hidden, inter = expert_sizes(self._moe, tuple(shape))
        _, _, leaf = name[len(block):].partition(".")
        linear, _, kind = leaf.rpartition(".")
        out_features, in_features = (hidden, inter) if linear == self._moe.linears[2] else (inter, hidden)
        return dtype, ((out_features, in_features) if kind == "weight" else (out_features,))

    def get(self, name: str) -> torch.Tensor:
        block = self._names.get(name)
        if block is None:
            return self._source.get(name)
        index, _, leaf = name[len(block):].partition(".")
        key = f"{block}{index}"
        if self._held is None or self._held[0] != key:
            self._held = None    # the previous expert's slabs go before the next one's are read
            self._held = (key, {n: self._slab(block + n, int(index)).unsqueeze(0) for n in fused_names(self._moe)})
        part = expert_tensors(self._moe, self._held[1], 0)[leaf]
        return part.clone(memory_format=torch.contiguous_format)

    def _slab(self, name: str, index: int) -> torch.Tensor:
        """Expert ``index``'s slab of a fused tensor, read alone where the source can."""
        get_slab = getattr(self._source, "get_slab", None)
        return get_slab(name, index) if get_slab is not None else self._source.get(name)[index]

    def nbytes(self, names: Iterable[str] | None = None) -> int:
        if names is None:
            return self._source.nbytes(None)
        stored = set()
        for n in names:
            block = self._names.get(n)
            stored.update([block + f for f in fused_names(self._moe)] if block is not None else [n])
        return self._source.nbytes(stored)

    def release(self) -> None:
        self._held = None
        self._source.release()

    def close(self) -> None:
        self._held = None
        self._source.close()


def _leaves(moe: MoESpec) -> list[str]:
    kinds = ("weight", "bias") if moe.layout.bias else ("weight",)
    return [f"{linear}.{kind}" for linear in moe.linears for kind in kinds]


def fused_pattern(moe: MoESpec) -> re.Pattern:
    """A block's fused tensors by module name, ``<prefix>.<index>.<checkpoint_block>.<experts>.
    <fused_names>``, whatever the layers' path; group 1 is the block's experts prefix."""
    names = "|".join(re.escape(n) for n in fused_names(moe))
    return re.compile(rf"(.*\.\d+\.{re.escape(moe.checkpoint_block)}\.{re.escape(moe.experts)}\.)(?:{names})")


def per_expert_view(source, moe: MoESpec | None):
    """``source`` (read by module names) read per expert where it stores ``moe``'s experts fused
    (as given otherwise). A block is found by its first fused tensor."""
    if moe is None:
        return source
    pattern = fused_pattern(moe)
    blocks = {}
    for key in source.keys():
        found = pattern.fullmatch(key) if key.endswith("." + moe.fused[0]) else None
        if found is not None:
            blocks[found.group(1)] = int(source.describe(key)[1][0])
    return FusedExpertsSource(source, moe, blocks) if blocks else source
