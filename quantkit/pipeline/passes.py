"""One decoder layer run over the calibration batches: the contract every step observes through.

``CalibrationPasses`` owns what a layer needs to run on calibration data (the hidden
states and each batch's captured call arguments, both in ``store.py``; which positions are
real tokens) and gives a step three ways to use it, all through forward hooks on the
layer's modules:

- ``run(layer, i)``: every batch, one after another (hooks may ask ``batch_index()``);
- ``run(layer, i, batches=[...])``: some batches only (a transform's search on a subset);
- ``run(layer, i, interleaved=True)``: every batch in lockstep, pausing at ``sync`` points
  (``quantkit.pipeline.interleave``: GPTQ's one-pass true-sequential solve);
- ``propagate=True`` (every batch): the pass's outputs become the next layer's inputs, and the
  inputs of static-activation linears are observed for their scales (and, given a ``kv``
  observer, the keys and values the attention module would cache).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Callable, Iterator

import torch
from torch import nn

from quantkit.errors import QuantkitError
from quantkit.pipeline.interleave import Interleaver
from quantkit.kv_cache import KVObserver
from quantkit.config.scheme import QuantScheme
from quantkit.pipeline.batches import CalibrationChunk
from quantkit.pipeline.capture import layer_output
from quantkit.pipeline.memory import bound_freed_memory
from quantkit.pipeline.park import park as park_tensors
from quantkit.pipeline.store import ActivationStore, ArgumentStore


class CalibrationPasses:
    def __init__(self, chunks: list[CalibrationChunk], hidden: ActivationStore, calls: ArgumentStore,
                 float_hidden: ActivationStore | None = None):
        self.chunks, self.hidden, self.calls = chunks, hidden, calls
        # the float model's hidden states, carried beside the quantized ones when the quantizer
        # asks (GPTAQ); advanced with them at each layer boundary
        self.float_hidden = float_hidden
        self.interleaver = Interleaver()
        self._batch: int | None = None
        self._selected: set[int | None] = set()   # batches whose running module sees real tokens only
        self._inputs: dict[int, torch.Tensor] = {}   # each running batch's layer input

    @property
    def count(self) -> int:
        return self.hidden.count

    def batch_index(self) -> int | None:
        """The batch now running (None outside a pass)."""
        return self._batch

    def sync(self, key: str, action: Callable[[], None], park: tuple[torch.Tensor, ...] = ()) -> None:
        """``Interleaver.sync`` for the running batch. With the activations offloaded, a batch that
        pauses parks ``park`` (its tensors the hook holds) and its layer input in a file of its
        own until it resumes (``park.py``): paused batches then hold only what the layer's frames
        keep besides.

        A pausing batch then bounds the heap's free resident pages (``memory.bound_freed_memory``),
        as does a lockstep batch that finishes (``run``): the temporaries it freed lie between the paused batches' live blocks, where glibc keeps
        them resident. Once they have grown by ``FREED_MEMORY_SLACK`` since the last trim they
        are handed back to the OS. Trimming at every pause cost about 15% of the wall time in
        page faults on SmolLM2, since the next batch reused and faulted in the same pages at
        once. Blocks in maps of their own (``mallopt``'s threshold at 1 MiB, replaced in session
        14) faulted in every temporary of every batch (benchmarks/RESULTS.md)."""
        folder, j = self.hidden.folder, self._batch
        tensors = (*park, self._inputs.get(j))

        def on_pause() -> Callable[[], None] | None:
            restore = None
            if folder is not None and j is not None:
                restore = park_tensors(tensors, folder / f"parked-{j:06d}.bin")
            bound_freed_memory()   # after parking: the parked storages' pages count too
            return restore

        self.interleaver.sync(key, action, on_pause=on_pause)

    def real_tokens(self) -> torch.Tensor | None:
        """The running batch's real-token mask over its flattened positions (None: no padding)."""
        j = self._batch
        valid = None if j is None else self.chunks[j].valid
        return None if valid is None else valid.flatten()

    @contextlib.contextmanager
    def selected(self) -> Iterator[None]:
        """Inside it, the running batch's hooks get real tokens only (an MoE expert's gathered
        inputs): ``tokens(x)`` takes them as they are. Kept per batch, since a lockstep pass
        pauses one batch inside it while the others run."""
        j = self._batch
        self._selected.add(j)
        try:
            yield
        finally:
            self._selected.discard(j)

    def tokens(self, where: str) -> Callable[[torch.Tensor], torch.Tensor]:
        """``tokens(x)`` for the batch now running: its real tokens as ``[n, features]``."""
        def tokens(x: torch.Tensor) -> torch.Tensor:
            j = self._batch
            valid = None if j is None else self.chunks[j].valid
            if valid is None or j in self._selected:
                return x.reshape(-1, x.shape[-1])
            if x.ndim == 2 and x.shape[0] == valid.numel():   # positions flattened (an MoE block's shared expert)
                return x[valid.flatten().to(x.device)]
            if tuple(x.shape[:-1]) != tuple(valid.shape):
                raise QuantkitError(f"{where}: a linear's input has shape {tuple(x.shape)}, not [rows, row_len, features] "
                                    f"{tuple(valid.shape)}: cannot tell calibration tokens from padding")
            return x[valid.to(x.device)]
        return tokens

    def run(self, layer: nn.Module, i: int, propagate: bool = False, interleaved: bool = False,
            batches: list[int] | None = None, observe: dict[str, tuple[nn.Linear, QuantScheme]] | None = None,
            observed: dict[str, torch.Tensor] | None = None,
            kv: tuple[nn.Module, KVObserver] | None = None) -> None:
        """Run layer ``i`` over the calibration batches (see the module docstring).

        With ``propagate``, the input absmax of each linear in ``observe`` whose scheme has
        static activations is recorded into ``observed`` (real tokens only), and ``kv``'s
        observer records the keys and values of ``kv``'s attention module.
        """
        if propagate and batches is not None:
            raise RuntimeError("a propagating pass must run every calibration batch")
        order = list(range(self.count)) if batches is None else list(batches)
        hooks = self._observe_static(observe or {}, observed, f"layers.{i}") if propagate else []

        def call(j: int) -> None:
            args, kwargs = self.calls.get(i, j)
            x = self._inputs[j] = self.hidden.get(j)   # the call stack holds it anyway: parked at a pause
            try:
                out = layer_output(layer(x, *args, **kwargs))
            finally:
                del x, self._inputs[j]
            if propagate:
                self.hidden.put_next(j, out)
            if interleaved:
                # After the last pause the batches finish one by one, each freeing its paused
                # intermediates while its output lands in pages an earlier trim handed back:
                # unbounded, the resident set peaked here, ~100 MiB above the last pause
                # (SmolLM2, 16 batches; benchmarks/RESULTS.md).
                bound_freed_memory()

        def select(j: int) -> None:
            self._batch = j

        observing = kv[1].observing(kv[0], self.tokens(f"layers.{i}")) if propagate and kv else contextlib.nullcontext()
        try:
            with torch.no_grad(), observing:
                if interleaved:   # every paused batch's intermediates live at once: see ``sync``
                    self.interleaver.run([functools.partial(call, j) for j in order],
                                         before=lambda k: select(order[k]))
                else:
                    for j in order:
                        select(j)
                        call(j)
        finally:
            self._batch = None
            for h in hooks:
                h.remove()

    def run_float(self, layer: nn.Module, i: int) -> None:
        """Every batch of the float model's inputs through layer ``i`` as it is (its float weights,
        before the quantizer changes them); the outputs are the float model's next inputs."""
        if self.float_hidden is None:
            raise RuntimeError("a float pass needs the float model's hidden states")
        try:
            with torch.no_grad():
                for j in range(self.count):
                    self._batch = j
                    args, kwargs = self.calls.get(i, j)
                    self.float_hidden.put_next(j, layer_output(layer(self.float_hidden.get(j), *args, **kwargs)))
        finally:
            self._batch = None

    def advance(self) -> None:
        """The outputs recorded become the next layer's inputs (the float model's too, when carried)."""
        self.hidden.advance()
        if self.float_hidden is not None:
            self.float_hidden.advance()

    def _observe_static(self, targets, observed, where) -> list:
        return observe_static(targets, observed, self.tokens(where))


def observe_static(targets: dict[str, tuple[nn.Linear, QuantScheme]], observed: dict[str, torch.Tensor] | None,
                   tokens: Callable[[torch.Tensor], torch.Tensor]) -> list:
    """Pre-hooks recording into ``observed`` the input absmax (of ``tokens(x)``: real tokens) of
    each static-activation linear in ``targets``; ``observed`` is cleared first. No hooks without it."""
    if observed is None:
        return []
    observed.clear()
    hooks = []
    for name, (m, s) in targets.items():
        a = s.input_activations
        if a is not None and a.calibrated:
            def observe(mod, inp, _name=name):
                x = tokens(inp[0].detach())
                if x.numel() == 0:   # an MoE expert no token of this batch was routed to
                    return
                v = x.abs().amax().float()
                observed[_name] = torch.maximum(observed.get(_name, v), v)
            hooks.append(m.register_forward_pre_hook(observe))
    return hooks
