"""A source read by module names, and a writer that writes the source's own names back.

``arch/checkpoint_names.py`` says which checkpoint keys transformers renames on load; the
pipeline, the layout check and the loader all speak module names, and the output keeps the
names the source was stored under, so it loads wherever the source did.
"""

from __future__ import annotations

from typing import Iterable

import torch

from quantkit.arch.checkpoint_names import module_names
from quantkit.arch.lookup import arch_for
from quantkit.pipeline.fused_experts import fused_pattern, per_expert_view


class ModuleNamedSource:
    """``source`` with every renamed key under its module name."""

    def __init__(self, source, disk_to_module: dict[str, str]):
        self._source = source
        self._to_disk = {m: d for d, m in disk_to_module.items()}
        self._to_module = dict(disk_to_module)
        self.folder = getattr(source, "folder", None)

    def __getattr__(self, name):   # the wrapped source's other attributes (quantized, files, ...)
        return getattr(self._source, name)

    def disk(self, name: str) -> str:
        return self._to_disk.get(name, name)

    def keys(self) -> Iterable[str]:
        return [self._to_module.get(k, k) for k in self._source.keys()]

    def __contains__(self, name: str) -> bool:
        return self.disk(name) in self._source

    def where(self, name: str) -> str:
        return self._source.where(self.disk(name))

    def describe(self, name: str):
        return self._source.describe(self.disk(name))

    def get(self, name: str) -> torch.Tensor:
        return self._source.get(self.disk(name))

    def get_slab(self, name: str, index: int) -> torch.Tensor:
        return self._source.get_slab(self.disk(name), index)

    def nbytes(self, names: Iterable[str] | None = None) -> int:
        return self._source.nbytes(None if names is None else [self.disk(n) for n in names])

    def release(self) -> None:
        self._source.release()

    def close(self) -> None:
        self._source.close()


class DiskNamedWriter:
    """``writer`` adding each tensor under the name the source stored its module under: the
    module-name prefixes the renaming changed (``model.language_model.`` for ``model.``), each
    replaced by its stored one, so tensors the source never had (packed weights, KV scales)
    follow their module."""

    def __init__(self, writer, disk_to_module: dict[str, str]):
        self._writer = writer
        self._prefixes = sorted(renamed_prefixes(disk_to_module).items(), key=lambda kv: -len(kv[0]))

    def __getattr__(self, name):
        return getattr(self._writer, name)

    def add(self, name: str, tensor: torch.Tensor) -> None:
        self._writer.add(self.disk(name), tensor)

    def disk(self, name: str) -> str:
        for module, disk in self._prefixes:
            if name.startswith(module):
                return disk + name[len(module):]
        return name


def renamed_prefixes(disk_to_module: dict[str, str]) -> dict[str, str]:
    """``{module prefix: stored prefix}``: each pair with its common dotted tail taken off.

    >>> renamed_prefixes({"model.layers.0.w": "model.language_model.layers.0.w"})
    {'model.language_model.': 'model.'}
    """
    out = {}
    for disk, module in disk_to_module.items():
        d, m = disk.split("."), module.split(".")
        while d and m and d[-1] == m[-1]:
            d.pop()
            m.pop()
        if m:   # a whole-name renaming (no common tail) keeps its own pair in the source's map
            out[".".join(m) + "."] = ".".join(d) + "." if d else ""
    return out


def named_as_modules(model, source):
    """``source`` as the model's modules name it (as given when transformers renames nothing), its
    experts read per expert where it stores them fused (``fused_experts.py``). A fused experts
    tensor stored under another name (Granite 4's ``block_sparse_moe.input_linear.weight``, which
    transformers renames to ``block_sparse_moe.experts.gate_up_proj``) is renamed first: the model,
    unfused, has no such parameter, but the view reads its experts from it."""
    moe = arch_for(model.config)[1].moe
    fused = fused_pattern(moe) if moe is not None else None
    renamed = module_names(model, source.keys(), also=(lambda n: fused.fullmatch(n) is not None) if fused else None)
    source = ModuleNamedSource(source, renamed) if renamed else source
    return per_expert_view(source, moe)


def writing_stored_names(writer, source):
    """``writer`` writing the stored names back when ``source`` was renamed (else as given)."""
    renamed = getattr(source, "_to_module", None)
    return DiskNamedWriter(writer, renamed) if renamed is not None else writer
