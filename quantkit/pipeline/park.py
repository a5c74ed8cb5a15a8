"""Parking a paused calibration batch's activations in a file while the other batches run.

In a lockstep pass (``quantkit.pipeline.interleave``) every batch waits at a sync point with its
intermediates alive: on SmolLM2 (GPTQ, 16 batches of 4096 tokens) the batches paused before
``down_proj`` hold 16 x 51 MiB, most of the conversion's peak. With ``calibration.offload``
the pass parks what it can reach of a pausing batch (the linear's input that the hook was
given, the layer's input): their bytes go to a file of the batch's own, their storage is
shrunk to nothing, and when the batch resumes the bytes are read back into a fresh storage
of the same size. The tensor objects stay the same (so views, identities and weak references
still hold); only their memory is gone in between. What the layer's frames hold besides
(the residual, the normed input) is not reachable and stays.

Only a tensor that is contiguous, on the CPU, and covers its whole storage is parked: then the
storage holds exactly its bytes and nothing else in the batch can see a part of it that would
be lost. Storages that cannot be resized (safetensors' tensors, numpy-shared ones) are left alone. A batch's
parked tensors belong to it alone: while it is paused, nothing may read them (a sync action
works from what the hooks accumulated, never from a batch's tensors).
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Callable, Iterable

import torch

# below this a tensor is not worth a file write and read
MIN_PARK_BYTES = 1 << 20


def parkable(t: torch.Tensor) -> bool:
    nbytes = t.numel() * t.element_size()
    storage = t.untyped_storage()
    return (t.device.type == "cpu" and nbytes >= MIN_PARK_BYTES and t.is_contiguous() and t.storage_offset() == 0
            and storage.nbytes() == nbytes and storage.resizable())


def _bytes(t: torch.Tensor) -> memoryview:
    # a ctypes window on the storage: a numpy view would mark the storage as not resizable
    return memoryview((ctypes.c_char * t.untyped_storage().nbytes()).from_address(t.data_ptr())).cast("B")


def park(tensors: Iterable[torch.Tensor | None], path: Path) -> Callable[[], None]:
    """Write the parkable ``tensors`` to ``path`` and free their storage; returns the restore.

    A second view of a parked storage is not parkable any more (its storage is empty): it comes
    back with the first."""
    parked: list[tuple[torch.Tensor, int]] = []
    with open(path, "wb") as f:
        for t in tensors:
            if t is None or not parkable(t):
                continue
            f.write(_bytes(t))
            parked.append((t, t.untyped_storage().nbytes()))
            t.untyped_storage().resize_(0)

    def restore() -> None:
        with open(path, "rb") as f:
            for t, nbytes in parked:
                t.untyped_storage().resize_(nbytes)
                if f.readinto(_bytes(t)) != nbytes:
                    raise RuntimeError(f"{path}: a parked calibration tensor was cut short")
        path.unlink()

    return restore
