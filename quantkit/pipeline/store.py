"""The hidden states entering the current layer: in memory, or offloaded to files."""

from __future__ import annotations

from pathlib import Path

import torch


class ActivationStore:
    """The hidden states entering the current layer, one tensor per calibration batch.

    In memory, or (``folder`` given) in safetensors files there, so that only the batch
    being run is resident: for models whose calibration activations do not fit in memory.
    ``put_next`` records a batch's output; ``advance`` makes the outputs the next inputs.
    ``generation`` counts the layers run: the inputs of layer ``generation`` are held.
    """

    def __init__(self, first: list[torch.Tensor], folder: Path | None = None, device: str = "cpu",
                 generation: int = 0):
        self.folder, self.device, self.generation = folder, device, generation
        self._mem: list[torch.Tensor | None] = []
        self._next: dict[int, torch.Tensor] = {}
        self.count = len(first)
        for j, t in enumerate(first):
            self._write(generation, j, t)

    @classmethod
    def on_disk(cls, folder: Path, count: int, generation: int, device: str = "cpu") -> "ActivationStore":
        """The offloaded inputs of layer ``generation``, already in ``folder`` (a resumed run)."""
        store = cls([], folder, device, generation)
        store.count = count
        return store

    def in_memory(self) -> list[torch.Tensor] | None:
        """The held inputs when they are in memory; None when offloaded (the files hold them)."""
        return None if self.folder is not None else list(self._mem)

    def _file(self, generation: int, j: int) -> Path:
        return self.folder / f"hidden-{generation % 2}-{j:06d}.safetensors"

    def _write(self, generation: int, j: int, t: torch.Tensor) -> None:
        if self.folder is None:
            if generation == self.generation:
                self._mem.append(t)
            else:
                self._next[j] = t
            return
        from safetensors.torch import save_file

        save_file({"hidden": t.detach().contiguous().cpu()}, str(self._file(generation, j)))

    def get(self, j: int) -> torch.Tensor:
        if self.folder is None:
            return self._mem[j]
        from safetensors.torch import load_file

        return load_file(str(self._file(self.generation, j)), device=str(self.device))["hidden"]

    def put_next(self, j: int, t: torch.Tensor) -> None:
        self._write(self.generation + 1, j, t)

    def advance(self) -> None:
        if self.folder is None:
            if len(self._next) != self.count:
                raise RuntimeError(f"{self.count - len(self._next)} calibration batches have no output")
            self._mem = [self._next[j] for j in range(self.count)]
            self._next = {}
        self.generation += 1
