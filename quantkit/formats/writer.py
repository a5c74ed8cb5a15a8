"""Streaming, atomic writer for a sharded safetensors checkpoint folder.

Tensors are added as each layer finishes and flushed into shards of bounded size, so the
writer never holds more than one shard. Everything goes into a temporary folder beside the
destination; ``commit`` renames it into place only when the checkpoint is complete.

A resumable run (``pipeline/resume.py``) saves, at each layer boundary, the pending tensors
not yet in a shard as a part file (``save_pending``); ``state`` and ``restore`` carry the
writer across a restart, so the resumed run flushes the same shards at the same points.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from quantkit.common.crashpoints import kill_point
from quantkit.common.disk_space import disk_full_error, is_disk_full
from quantkit.common.outputs import OutputPolicy, ordinary_permissions
from quantkit.common.jsonio import dumps_strict


def prepare_output(out: Path, overwrite: bool, policy: OutputPolicy) -> None:
    """Fail before any work when the destination may not be written (``outputs.py``: it exists
    without ``overwrite``, is not quantkit's own output, overlaps an input, or cannot be made)."""
    policy.check(Path(out), overwrite)


def _save(tensors: dict[str, torch.Tensor], path: Path, nbytes: int, metadata: dict | None = None) -> None:
    try:
        save_file(tensors, str(path), metadata=metadata)
    except Exception as e:   # safetensors raises its own error type for a failed write
        Path(path).unlink(missing_ok=True)
        if is_disk_full(e):
            raise disk_full_error(Path(path).parent, nbytes, f"writing {Path(path).name}") from None
        raise


class ShardWriter:
    def __init__(self, workdir: Path | None = None, max_shard_size: int = 2 * 1024**3,
                 flush_bytes: int = 64 * 1024**2, folder: Path | None = None):
        """``folder``: an existing staging folder to write into (``formats.staging``); else a new
        temporary one in ``workdir``."""
        base = Path(workdir) if workdir is not None else None
        if base is not None:
            base.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(folder) if folder is not None else Path(tempfile.mkdtemp(prefix=".quantkit-tmp-", dir=base))
        self.max_shard_size = max_shard_size
        # Pending tensors are written out at the end of a unit (a layer) once they exceed
        # this, so resident memory stays bounded whatever the model's depth.
        self.flush_bytes = min(flush_bytes, max_shard_size)
        self._pending: dict[str, torch.Tensor] = {}
        self._pending_bytes = 0
        self._shards: list[tuple[Path, list[str]]] = []
        self.total_bytes = 0
        self._parts: list[str] = []      # part files holding the pending tensors saved so far
        self._saved: set[str] = set()    # pending tensors already in a part file
        self._next_part = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        t = tensor.detach().to("cpu").contiguous()
        n = t.numel() * t.element_size()
        if self._pending and self._pending_bytes + n > self.max_shard_size:
            self.flush()
        self._pending[name] = t
        self._pending_bytes += n
        self.total_bytes += n

    @property
    def pending_bytes(self) -> int:
        """Bytes of the tensors added and not yet in a shard (what the writer holds in memory)."""
        return self._pending_bytes

    def end_unit(self) -> None:
        """Called after each layer: write the pending shard if it is large enough."""
        if self._pending_bytes >= self.flush_bytes:
            self.flush()

    def flush(self, last: bool = False) -> None:
        if not self._pending:
            return
        path = self.tmp / f"shard-{len(self._shards):05d}.safetensors"
        _save(self._pending, path, self._pending_bytes, metadata={"format": "pt"})
        kill_point("shard:last" if last else f"shard:{len(self._shards)}", partial=path)
        self._shards.append((path, list(self._pending)))
        self._pending, self._pending_bytes = {}, 0
        self._parts, self._saved = [], set()

    def save_pending(self, folder: Path) -> None:
        """Save the pending tensors not yet saved as ``folder/part-NNNNN.safetensors``."""
        new = {k: t for k, t in self._pending.items() if k not in self._saved}
        if not new:
            return
        name = f"part-{self._next_part:05d}.safetensors"
        _save(new, Path(folder) / name, sum(t.numel() * t.element_size() for t in new.values()))
        self._parts.append(name)
        self._saved.update(new)
        self._next_part += 1

    def state(self) -> dict:
        """What ``restore`` needs (JSON): the shards written, the part files of pending tensors."""
        return {"shards": [[p.name, names] for p, names in self._shards], "parts": list(self._parts),
                "next_part": self._next_part, "total_bytes": self.total_bytes}

    def restore(self, state: dict, folder: Path) -> None:
        """Continue from ``state``: its shards are in ``self.tmp``, its part files in ``folder``."""
        self._shards = [(self.tmp / name, list(names)) for name, names in state["shards"]]
        self._pending = {}
        for part in state["parts"]:
            self._pending.update(load_file(str(Path(folder) / part)))
        self._pending_bytes = sum(t.numel() * t.element_size() for t in self._pending.values())
        self._parts, self._saved = list(state["parts"]), set(self._pending)
        self._next_part, self.total_bytes = state["next_part"], state["total_bytes"]

    def finalize(self) -> None:
        """Name the shards as transformers expects and write the index when sharded."""
        self.flush(last=True)
        n = len(self._shards)
        if n == 1:
            self._shards[0][0].rename(self.tmp / "model.safetensors")
            return
        weight_map = {}
        for i, (path, names) in enumerate(self._shards):
            final = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
            path.rename(self.tmp / final)
            weight_map.update({k: final for k in names})
        index = {"metadata": {"total_size": self.total_bytes}, "weight_map": dict(sorted(weight_map.items()))}
        (self.tmp / "model.safetensors.index.json").write_text(dumps_strict(index, indent=2))

    def write_json(self, name: str, data) -> None:
        (self.tmp / name).write_text(dumps_strict(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")

    def abort(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


def move_into_place(tmp: Path, out: Path, overwrite: bool, policy: OutputPolicy) -> Path:
    """Rename a finished folder to ``out``, marked as ``policy.command``'s output (replacing only
    quantkit's own output of that command, and only with ``overwrite``)."""
    out = Path(out)
    prepare_output(out, overwrite, policy)
    out.parent.mkdir(parents=True, exist_ok=True)
    staged = tmp
    if os.stat(tmp).st_dev != os.stat(out.parent).st_dev:
        staged = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
        shutil.rmtree(staged)
        shutil.copytree(tmp, staged)
        shutil.rmtree(tmp, ignore_errors=True)
    policy.stamp(staged)
    ordinary_permissions(staged)
    return policy.replace(staged, out, overwrite)


class DiscardWriter(ShardWriter):
    """The writer of a rank that computes but does not write (a data-parallel rank other than 0):
    every tensor is counted and dropped, no shard, index or JSON is written. The per-layer
    records the pipeline keeps beside the shards (integrity rows) go to a private temporary
    folder that ``abort`` removes."""

    def __init__(self) -> None:
        super().__init__(folder=Path(tempfile.mkdtemp(prefix="quantkit-rank-")))

    def add(self, name: str, tensor: torch.Tensor) -> None:
        self.total_bytes += tensor.numel() * tensor.element_size()

    def end_unit(self) -> None:
        pass

    def flush(self, last: bool = False) -> None:
        pass

    def finalize(self) -> None:
        pass

    def write_json(self, name: str, data) -> None:
        pass
