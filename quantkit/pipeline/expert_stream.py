"""A decoder layer whose weights exceed the memory budget: its MoE experts onloaded a few at a time.

A big MoE block (Qwen3-235B: 128 experts, 4.8 GB a layer in bf16) can outgrow the memory the
layer loop has, while each of its experts is small. The block's output enters the layer's
output only by additions (``residual + experts``, plus a shared expert where there is one), so
the layer can run in two stages:

1. **without its experts**: ``UnfusedExperts.deferred`` records each calibration batch's input
   to the block (hidden states, top-k indices and weights, ``ExpertInputs``) and the block adds
   nothing; the rest of the layer (attention, shared expert) is quantized by the recipe's
   quantizer as usual, and its propagating pass records the layer's output without the experts;
2. **expert-major**, a chunk of experts at a time (as many as fit the budget, ``plan_stream``):
   the chunk is onloaded, quantized by the same quantizer over its recorded tokens (``run``
   below plays the layer's forward for it: gate/up, then down, one sub-group after the other),
   its quantized outputs weighted by the routing and added into each batch's sum of expert
   outputs (``ExpertSums``), written, and dropped. At the end each batch's sum is added to the
   layer's output without the experts: the next layer's input.

Each expert runs on exactly the positions it runs on in the block's own calibration forward
(``experts.calibration_rows``) and the sums are added in ascending expert order, as the block
adds them, so for a block without a shared expert the next layer's inputs, the Hessians and the
checkpoint are bit for bit those of the whole-layer path. With a shared expert (Qwen2-MoE) the
two additions into the residual happen in the other order: rounding-level differences.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from quantkit.arch.experts import UnfusedExperts, calibration_rows
from quantkit.pipeline.coverage import Routing
from quantkit.pipeline.passes import observe_static


def module_bytes(module: nn.Module) -> int:
    """Bytes of a module's parameters (meta ones count as they will be once materialised)."""
    return sum(p.numel() * p.element_size() for p in module.parameters())


@dataclass(frozen=True)
class StreamPlan:
    """How a layer too big for the budget is run: its experts block, and the experts onloaded together."""

    experts_path: str            # within the layer, as the checkpoint names it ("mlp.experts")
    chunks: list[list[int]]      # expert indices, ascending, chunk by chunk
    layer_bytes: int


def plan_stream(layer: nn.Module, budget: int) -> StreamPlan | None:
    """None when the layer's weights fit ``budget`` bytes or it has no experts block; else the
    chunks: the rest of the layer plus one chunk of experts fits the budget, one expert at least.

    >>> from quantkit.arch.experts import Expert, GatedActivation
    >>> layer = nn.Module(); layer.norm = nn.Linear(8, 8, bias=False)      # 256 bytes
    >>> layer.experts = UnfusedExperts([Expert(("g", "u", "d"), 8, 4, GatedActivation(nn.SiLU()), torch.float32,
    ...                                        torch.device("meta")) for _ in range(5)])  # 384 each
    >>> plan_stream(layer, 1200).chunks, plan_stream(layer, 10_000)
    ([[0, 1], [2, 3], [4]], None)
    """
    total = module_bytes(layer)
    if total <= budget:
        return None
    found = [(name, m) for name, m in layer.named_modules() if isinstance(m, UnfusedExperts)]
    if not found:
        return None
    name, experts = found[0]
    rest = total - module_bytes(experts)
    per_expert = max(module_bytes(e) for e in experts)
    n = max(1, (budget - rest) // per_expert)
    chunks = [list(range(a, min(a + n, len(experts)))) for a in range(0, len(experts), n)]
    return StreamPlan(name, chunks, total)


class BatchTensors:
    """Named tensors per calibration batch, in memory or (``folder`` given, ``calibration.offload``)
    one safetensors file per batch, ``<name>-NNNNNN.safetensors``."""

    def __init__(self, folder: Path | None, device: str, name: str):
        self.folder, self.device, self.name = folder, device, name
        self._mem: dict[int, dict[str, torch.Tensor]] = {}
        self.batches: set[int] = set()

    def put(self, j: int, tensors: dict[str, torch.Tensor]) -> None:
        self.batches.add(j)
        if self.folder is None:
            self._mem[j] = tensors
            return
        from safetensors.torch import save_file

        save_file({k: v.detach().to("cpu", copy=True).contiguous() for k, v in tensors.items()}, str(self._file(j)))

    def get(self, j: int) -> dict[str, torch.Tensor] | None:
        if j not in self.batches:
            return None
        if self.folder is None:
            return self._mem[j]
        from safetensors.torch import load_file

        return load_file(str(self._file(j)), device=str(self.device))

    def _file(self, j: int) -> Path:
        return self.folder / f"{self.name}-{j:06d}.safetensors"

    def clear(self) -> None:
        self._mem.clear()
        if self.folder is not None:
            for j in self.batches:
                self._file(j).unlink(missing_ok=True)
        self.batches.clear()


class ExpertInputs(BatchTensors):
    """Each calibration batch's input to the experts block, as the layer's last pass gave it:
    ``(hidden [T, H], top_k_index [T, k], top_k_weights [T, k], real [T] or None)``. A later pass
    over a batch replaces an earlier one's record: the propagating pass, with the layer's
    quantized attention, runs last."""

    def __init__(self, folder: Path | None, device: str, batch_index: Callable[[], int | None],
                 real_tokens: Callable[[], torch.Tensor | None]):
        super().__init__(folder, device, "expert-inputs")
        self._batch_index, self._real_tokens = batch_index, real_tokens

    def record(self, hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> None:
        j = self._batch_index()
        if j is None:
            raise RuntimeError("an experts block ran outside a calibration pass while its layer was streamed")
        tensors = {"hidden": hidden, "index": top_k_index, "weights": top_k_weights}
        real = self._real_tokens()
        if real is not None:
            tensors["real"] = real.to(hidden.device)
        self.put(j, tensors)

    def inputs(self, j: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        t = self.get(j)
        return t["hidden"], t["index"], t["weights"], t.get("real")


class ExpertSums(BatchTensors):
    """Per calibration batch, the routing-weighted sum of the expert outputs so far, ``[T, H]``
    (read and written once per chunk when offloaded)."""

    def __init__(self, folder: Path | None, device: str):
        super().__init__(folder, device, "expert-sums")

    def load(self, j: int, like: torch.Tensor) -> torch.Tensor:
        """Batch ``j``'s sum, zeros like ``like`` (the block's input) before the first chunk."""
        t = self.get(j)
        return torch.zeros_like(like) if t is None else t["sum"]

    def store(self, j: int, total: torch.Tensor) -> None:
        self.put(j, {"sum": total})


class ChunkPasses:
    """The calibration passes of one chunk of experts, over the recorded block inputs.

    ``run(propagate=False, batches=None)`` is the chunk's ``LayerContext.run``: every batch's
    recorded tokens through each expert of the chunk in ascending order (every expert in every
    batch, even on no tokens, as in the block's calibration forward). With ``propagate`` the
    outputs are weighted by the routing and added into ``sums``, the tokens per expert go into
    ``routing``'s counts, and the inputs of ``observe``'s static-activation linears are recorded
    into ``observed`` (absmax).
    """

    def __init__(self, experts: UnfusedExperts, chunk: list[int], inputs: ExpertInputs, sums: ExpertSums,
                 routing: Routing, count: int):
        self.experts, self.chunk, self.inputs, self.sums = experts, chunk, inputs, sums
        self.routing, self.count = routing, count
        self._batch: int | None = None

    def batch_index(self) -> int | None:
        return self._batch

    def run(self, propagate: bool = False, interleaved: bool = False, batches: list[int] | None = None,
            observe: dict | None = None, observed: dict[str, torch.Tensor] | None = None) -> None:
        if interleaved:
            raise RuntimeError("a chunk of streamed experts runs its batches one after another")
        order = list(range(self.count)) if batches is None else list(batches)
        # the recorded inputs are real tokens already
        hooks = observe_static(observe or {}, observed, lambda x: x) if propagate else []
        try:
            with torch.no_grad():
                for j in order:
                    self._batch = j
                    self._run_batch(j, propagate)
        finally:
            self._batch = None
            for h in hooks:
                h.remove()

    def _run_batch(self, j: int, propagate: bool) -> None:
        hidden, index, weights, real = self.inputs.inputs(j)
        total = self.sums.load(j, hidden) if propagate else None
        routed_n, seen_n = self.routing.counts.setdefault(j, ([0] * self.routing.num_experts,
                                                               [0] * self.routing.num_experts))
        for e in self.chunk:
            rows, weight, routed = calibration_rows(e, index, weights, real, self.routing.all_experts)
            y = self.experts[e](hidden[rows])
            if propagate:
                total.index_add_(0, rows, (y * weight).to(total.dtype))
                routed_n[e], seen_n[e] = routed, int(rows.numel())
        if propagate:
            self.sums.store(j, total)


def add_expert_sums(hidden, sums: ExpertSums, count: int) -> None:
    """The next layer's inputs: each batch's output without the experts plus its sum of expert outputs."""
    for j in range(count):
        partial = hidden.get_next(j)
        total = sums.load(j, partial.reshape(-1, partial.shape[-1]))
        hidden.put_next(j, partial + total.reshape(partial.shape).to(partial.dtype))
