"""A decoder layer over ``calibration.layer_memory``: the layer run without its experts, then its
experts a chunk at a time (``expert_stream.py`` plans the chunks and runs their passes)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from quantkit.common import distributed
from quantkit.steps import LayerContext
from quantkit.arch.experts import UnfusedExperts
from quantkit.pipeline.coverage import Routing
from quantkit.pipeline.expert_stream import ChunkPasses, ExpertInputs, ExpertSums, StreamPlan, add_expert_sums
from quantkit.pipeline.layer_steps import no_data, quantize_targets
from quantkit.pipeline.layer_writer import static_targets, write_layer
from quantkit.pipeline.onload import dematerialize, materialize
from quantkit.pipeline.passes import CalibrationPasses
from quantkit.pipeline.state import RunState


@dataclass
class ExpertStream:
    """A layer's experts, quantized a chunk at a time over the tokens recorded for them."""

    plan: StreamPlan
    experts: UnfusedExperts
    passes: CalibrationPasses | None
    inputs: ExpertInputs | None
    sums: ExpertSums | None
    routing: Routing | None
    subgroups_before: int = 0   # the sub-groups of the layer without its experts

    @classmethod
    def start(cls, state: RunState, layer: nn.Module, plan: StreamPlan) -> "ExpertStream":
        """Record the tokens routed to the experts while the rest of the layer runs."""
        experts, passes = layer.get_submodule(plan.experts_path), state.passes
        inputs = sums = routing = None
        if passes is not None:
            device = state.options.device
            inputs = ExpertInputs(state.offload_dir, device, passes.batch_index, passes.real_tokens)
            sums = ExpertSums(state.offload_dir, device)
            routing = Routing(len(experts), state.recipe.calibration.moe_experts == "all", passes.real_tokens,
                              passes.batch_index, passes.selected)
            experts.deferred = inputs.record
        return cls(plan, experts, passes, inputs, sums, routing)

    def run(self, state: RunState, i: int, streamed: dict, rows: dict[str, torch.Tensor]) -> None:
        """Every chunk of experts: onloaded, quantized over the recorded tokens, its weighted outputs
        added into the sums, written, dropped; then the sums added to the layer's outputs."""
        self.experts.deferred = None
        for chunk in self.plan.chunks:
            self._chunk(state, i, chunk, streamed, rows)
        if self.passes is not None:
            add_expert_sums(self.passes.hidden, self.sums, self.passes.count)
            self.inputs.clear()
            self.sums.clear()

    def _chunk(self, state: RunState, i: int, chunk: list[int], streamed: dict, rows: dict[str, torch.Tensor]) -> None:
        prefix, path, passes = f"{state.spec.layers}.{i}.", self.plan.experts_path, self.passes
        for e in chunk:
            materialize(self.experts[e], f"{prefix}{path}.{e}.", state.source, state.options.device)
        names = {f"{path}.{e}." for e in chunk}
        targets = {n: (m, state.recipe.groups[g]) for n, (m, g) in streamed.items() if n[:n.rindex(".") + 1] in names}
        cp = None if passes is None else ChunkPasses(self.experts, chunk, self.inputs, self.sums, self.routing,
                                                     passes.count)
        data = {} if cp is None else {"num_batches": passes.count, "batch_index": cp.batch_index}
        ctx = LayerContext(i, prefix[:-1], self.experts, targets, state.spec.layer_subgroups(list(targets)),
                           run=no_data if cp is None else cp.run, num_samples=state.num_samples,
                           num_tokens=state.num_tokens, arch=state.spec, config=state.config, **data)
        results = quantize_targets(state.quantizer, ctx, prefix, rows)
        for r in results.values():   # numbered as in the whole layer: after the rest of it
            if "subgroup" in r.stats:
                r.stats["subgroup"] += self.subgroups_before
        observed: dict[str, torch.Tensor] = {}
        if cp is not None:
            cp.run(propagate=True, observe=targets, observed=observed)
        observed = distributed.merge_max(observed, static_targets(targets))
        params = [(f"{path}.{e}.{n}", p) for e in chunk for n, p in self.experts[e].named_parameters()]
        write_layer(state.writer, prefix, params, targets, results, observed, state.log)
        for e in chunk:
            dematerialize(self.experts[e])
        del results, targets, ctx
        state.writer.end_unit()
        state.release()
