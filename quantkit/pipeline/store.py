"""What a layer runs on (its input hidden states, its captured call arguments): in memory, or in files."""

from __future__ import annotations

from dataclasses import dataclass
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

        t = load_file(str(self._file(self.generation, j)), device=str(self.device))["hidden"]
        # on the CPU, a copy of our own: safetensors' tensor cannot have its storage resized (park.py)
        return t.clone() if t.device.type == "cpu" else t

    def put_next(self, j: int, t: torch.Tensor) -> None:
        self._write(self.generation + 1, j, t)

    def get_next(self, j: int) -> torch.Tensor:
        """Batch ``j``'s output recorded by ``put_next`` (before ``advance``)."""
        if self.folder is None:
            return self._next[j]
        from safetensors.torch import load_file

        return load_file(str(self._file(self.generation + 1, j)), device=str(self.device))["hidden"]

    def advance(self) -> None:
        if self.folder is None:
            if len(self._next) != self.count:
                raise RuntimeError(f"{self.count - len(self._next)} calibration batches have no output")
            self._mem = [self._next[j] for j in range(self.count)]
            self._next = {}
        self.generation += 1


class ArgumentStore:
    """Each calibration batch's captured call arguments for every layer (masks, position embeddings).

    In memory, or (``folder`` given) one safetensors file per batch, so that only the batch
    being run holds them: a packed block-causal mask is ``rows x len²`` per batch, as large as
    the hidden states at long rows. The layers of a batch share these tensors (the model makes
    one mask and one rotary table per forward): a file holds each once, and ``get`` rebuilds
    a layer's call from it. Anything that is not a tensor (None, flags) stays in memory.
    """

    def __init__(self, folder: Path | None = None, device: str = "cpu"):
        self.folder, self.device = folder, device
        self._calls: list[list[tuple[tuple, dict]]] = []   # [batch][layer]: tensors as _Saved when offloaded

    @property
    def count(self) -> int:
        return len(self._calls)

    def append(self, calls: list[tuple[tuple, dict]]) -> None:
        """The next batch's calls, one ``(args, kwargs)`` per layer."""
        if self.folder is None:
            self._calls.append(calls)
            return
        from safetensors.torch import save_file

        tensors: dict[str, torch.Tensor] = {}
        keys: dict[int, str] = {}

        def stash(x):
            if isinstance(x, torch.Tensor):
                if id(x) not in keys:
                    keys[id(x)] = f"{len(keys):06d}"
                    # a copy of its own: safetensors refuses tensors that share memory
                    tensors[keys[id(x)]] = x.detach().to("cpu", copy=True).contiguous()
                return _Saved(keys[id(x)])
            return _map(x, stash)

        self._calls.append([(stash(a), stash(kw)) for a, kw in calls])
        save_file(tensors, str(self._file(len(self._calls) - 1)))

    def get(self, i: int, j: int) -> tuple[tuple, dict]:
        """Layer ``i``'s call arguments for batch ``j``."""
        args, kwargs = self._calls[j][i]
        if self.folder is None:
            return args, kwargs
        from safetensors.torch import load_file

        saved = load_file(str(self._file(j)), device=str(self.device))

        def fetch(x):
            return saved[x.key] if isinstance(x, _Saved) else _map(x, fetch)

        return fetch(args), fetch(kwargs)

    def _file(self, j: int) -> Path:
        return self.folder / f"args-{j:06d}.safetensors"


@dataclass(frozen=True)
class _Saved:
    """Where an offloaded call argument was: its key in the batch's file."""

    key: str


def _map(x, f):
    """``f`` applied to the items of a plain tuple, list or dict; anything else as it is."""
    if type(x) in (tuple, list):
        return type(x)(f(v) for v in x)
    if type(x) is dict:
        return {k: f(v) for k, v in x.items()}
    return x
