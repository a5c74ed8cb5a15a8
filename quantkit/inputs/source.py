"""Where a model's weights come from: a Hugging Face folder of safetensors, read lazily.

Only headers are read up front (so a corrupt or truncated shard fails before any work);
tensors are read one at a time when the pipeline onloads the layer that owns them.
Pickle checkpoints (``*.bin``, ``*.pt``) are never opened. A source that arrives quantized (FP8
with block scales, gpt-oss's MXFP4 experts: ``quantized.py``) presents its weights dequantized,
under the model's own names, and hides its scales.

Tensors are read into memory they own, not through a file map: safetensors' ``get_tensor``
returns views of a map that stays alive (with every page read through it counted in the
resident set) as long as any one of them lives, so a norm weight pending in the writer kept
every layer read from its shard resident, and a conversion's peak grew with depth.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import torch
from safetensors import safe_open

from quantkit.errors import QuantkitError
from quantkit.inputs.model_folder import check_links
from quantkit.inputs.quantized import Derived, QuantizedLayout, read_layout


class SafetensorsSource:
    """Lazy tensor reader over the ``*.safetensors`` files of a model folder."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise QuantkitError(f"{self.folder}: model folder not found")
        if not (self.folder / "config.json").exists():
            raise QuantkitError(f"{self.folder / 'config.json'}: not found (is this a Hugging Face model folder?)")
        check_links(self.folder)
        files = self._shard_files()
        self._where: dict[str, Path] = {}
        self._entries: dict[str, _Entry] = {}
        self._handles: dict[Path, object] = {}
        self.quantized: QuantizedLayout | None = None   # set below, once the headers are read
        for f in files:
            for name, entry in self._keys(f).items():
                self._where[name] = f
                self._entries[name] = entry
        self.quantized = self._quantized_layout()

    def _quantized_layout(self) -> QuantizedLayout | None:
        """How a source that arrives quantized presents its float weights (``quantized.py``)."""
        config_file = self.folder / "config.json"
        try:
            qc = json.loads(config_file.read_text(encoding="utf-8")).get("quantization_config")
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
            return None   # the config's own reader says what is wrong with it
        headers = {k: (e.dtype, e.shape) for k, e in self._entries.items()}
        return read_layout(qc, headers, self.where, str(config_file))

    def _shard_files(self) -> list[Path]:
        index = self.folder / "model.safetensors.index.json"
        if index.exists():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError, UnicodeDecodeError) as e:
                raise QuantkitError(f"{index}: not a valid safetensors index ({type(e).__name__})") from None
            files = sorted({self.folder / v for v in weight_map.values()})
            for f in files:
                if not f.exists():
                    raise QuantkitError(f"{f}: shard listed in {index.name} is missing")
            return files
        files = sorted(self.folder.glob("*.safetensors"))
        if files:
            return files
        pickled = sorted(p.name for p in self.folder.iterdir() if p.suffix in (".bin", ".pt", ".pth"))
        if pickled:
            raise QuantkitError(
                f"{self.folder / pickled[0]}: pickle checkpoints are not loaded (unsafe); convert the model to safetensors"
            )
        raise QuantkitError(f"{self.folder}: no *.safetensors weights found")

    @staticmethod
    def _keys(f: Path) -> dict[str, "_Entry"]:
        """Each tensor's place in the file (validated by safetensors' own reader)."""
        try:
            size = f.stat().st_size
            with open(f, "rb") as fh:
                header_len = int.from_bytes(fh.read(8), "little")
                if size < 8 or header_len <= 0 or 8 + header_len > size:
                    raise ValueError("header runs past the end of the file")
                header = json.loads(fh.read(header_len))
            end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
            if 8 + header_len + end != size:
                raise ValueError(f"file is {size} bytes, header describes {8 + header_len + end}")
            with safe_open(f, framework="pt") as h:
                names = list(h.keys())
            start = 8 + header_len
            return {k: _Entry(header[k]["dtype"], tuple(header[k]["shape"]), start + header[k]["data_offsets"][0],
                              start + header[k]["data_offsets"][1]) for k in names}
        except QuantkitError:
            raise
        except Exception as e:  # safetensors raises its own error types
            raise QuantkitError(f"{f}: not a valid safetensors file, truncated or corrupt ({e})") from None

    def files(self) -> list[Path]:
        """The shard files the tensors come from."""
        return sorted(set(self._where.values()))

    def keys(self) -> Iterable[str]:
        """The tensors' names: a quantized source's dequantized weights, not its scales."""
        q = self.quantized
        if q is None:
            return self._where.keys()
        return [k for k in self._where if k not in q.hidden or k in q.derived] + \
            [k for k in q.derived if k not in self._where]

    def __contains__(self, name: str) -> bool:
        q = self.quantized
        if q is not None and (name in q.derived or name in q.hidden):
            return name in q.derived
        return name in self._where

    def where(self, name: str) -> str:
        """The file holding tensor ``name``, for messages."""
        derived = self._derived(name)
        if derived is not None:
            name = derived.parts[0]
        return str(self._where.get(name, self.folder))

    def describe(self, name: str) -> tuple[torch.dtype | str, tuple[int, ...]]:
        """Tensor ``name``'s dtype (safetensors' name when torch has none) and shape, from its header."""
        derived = self._derived(name)
        if derived is not None:
            return torch.float32, derived.shape
        e = self._entries[name]
        return _DTYPES.get(e.dtype, e.dtype), e.shape

    def get(self, name: str) -> torch.Tensor:
        derived = self._derived(name)
        if derived is not None:
            return derived.decode(*(self._read(p) for p in derived.parts))
        if self.quantized is not None and name in self.quantized.hidden:
            raise QuantkitError(f"{self.where(name)}: tensor '{name}' is a scale of the quantized source, read "
                                "through the weight it scales")
        return self._read(name)

    def get_slab(self, name: str, index: int) -> torch.Tensor:
        """``get(name)[index]``, reading only that slab of the file (one expert of a fused experts
        tensor ``[E, ...]``): a derived tensor decodes the same slab of each of its parts when they
        all share its leading dimension (gpt-oss's MXFP4 blocks and scales), else it is decoded whole."""
        derived = self._derived(name)
        if derived is None:
            return self._read(name, index)
        if all(self._entries[p].shape[:1] == derived.shape[:1] for p in derived.parts if p in self._entries):
            return derived.decode(*(self._read(p, index).unsqueeze(0) for p in derived.parts))[0]
        return self.get(name)[index]

    def _derived(self, name: str) -> Derived | None:
        return self.quantized.derived.get(name) if self.quantized is not None else None

    def _read(self, name: str, index: int | None = None) -> torch.Tensor:
        """Stored tensor ``name`` as the file holds it (its ``index``-th slab along the first dimension only)."""
        f = self._where.get(name)
        if f is None:
            raise QuantkitError(f"{self.folder}: tensor '{name}' is missing from the checkpoint")
        e = self._entries[name]
        dtype = _DTYPES.get(e.dtype)
        if dtype is None:
            raise QuantkitError(f"{f}: tensor '{name}' has dtype {e.dtype}, which quantkit does not read")
        h = self._handles.get(f)
        if h is None:
            h = self._handles[f] = open(f, "rb")
        begin, end, shape = e.begin, e.end, e.shape
        if index is not None:
            slab = (end - begin) // shape[0]
            begin, end, shape = begin + index * slab, begin + (index + 1) * slab, shape[1:]
        buf = torch.empty(end - begin, dtype=torch.uint8)
        h.seek(begin)
        if h.readinto(buf.numpy()) != buf.numel():
            raise QuantkitError(f"{f}: cannot read tensor '{name}' (file shorter than its header says)")
        return buf.view(dtype).reshape(shape)

    def release(self) -> None:
        """Close the open files between layers."""
        for h in self._handles.values():
            h.close()
        self._handles.clear()

    def nbytes(self, names: Iterable[str] | None = None) -> int:
        total = 0
        for f in sorted(set(self._where.values())):
            with open(f, "rb") as fh:
                header_len = int.from_bytes(fh.read(8), "little")
                header = json.loads(fh.read(header_len))
            for k, v in header.items():
                if k != "__metadata__" and (names is None or k in names):
                    total += v["data_offsets"][1] - v["data_offsets"][0]
        return total

    def close(self) -> None:
        self.release()


@dataclass(frozen=True)
class _Entry:
    """A tensor's dtype (safetensors' name), shape and byte range in its file."""

    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


_DTYPES = {"BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16, "U16": torch.uint16,
           "I32": torch.int32, "U32": torch.uint32, "I64": torch.int64, "U64": torch.uint64,
           "F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64,
           "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}


class StateDictSource:
    """The same interface over an in-memory model's state dict (the Python API's path)."""

    def __init__(self, state_dict: dict[str, torch.Tensor], folder: Path | None = None):
        self._sd = state_dict
        self.folder = folder

    def keys(self):
        return self._sd.keys()

    def __contains__(self, name):
        return name in self._sd

    def where(self, name: str) -> str:
        return "model"

    def describe(self, name: str) -> tuple[torch.dtype, tuple[int, ...]]:
        t = self._sd[name]
        return t.dtype, tuple(t.shape)

    def get(self, name):
        if name not in self._sd:
            raise QuantkitError(f"model: tensor '{name}' is missing from the state dict")
        return self._sd[name].detach()

    def get_slab(self, name: str, index: int) -> torch.Tensor:
        return self.get(name)[index]

    def release(self):
        pass

    def nbytes(self, names=None):
        return sum(t.numel() * t.element_size() for k, t in self._sd.items() if names is None or k in names)

    def close(self):
        pass
