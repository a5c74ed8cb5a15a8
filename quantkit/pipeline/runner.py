"""The layer loop: onload -> steps -> write back -> propagate -> write the whole layer -> free.

Memory stays flat in model depth: one decoder layer and the calibration set's hidden states
and call arguments are resident at any time (with ``calibration.offload``, only the batches
being run; the embeddings only while the first layer's inputs are captured); every other
weight is read from the safetensors shards when its layer comes up and dropped when the
layer is written, and the heap's freed pages are handed back at each layer boundary.

For each decoder layer:
1. onload its parameters from the shards;
2. run the recipe's transforms (each searches, returns data, then applies it: it may change
   any parameter of the layer) and then its quantizer (codes and qparams of the targets);
3. write the dequantized weights back, so the layer computes what the checkpoint will;
4. propagate: the calibration batches run through the final layer to give the next layer's
   inputs and the static activation scales (skipped when the quantizer's own pass did it);
5. write every tensor of the layer from the layer in memory (packed targets, transformed
   norms and biases), then free it;
6. with a ``RunBook`` (a run for an output folder), commit the layer boundary, so a killed
   run can continue from here with the same bytes (``resume.py``).
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, NoReturn

import torch
from torch import nn

from quantkit.common import distributed
from quantkit.steps import LayerContext, QuantizedWeight
from quantkit.arch.lookup import arch_for
from quantkit.pipeline.layout import COMPUTED_SUFFIXES
from quantkit.pipeline.named_source import named_as_modules, writing_stored_names
from quantkit.arch.spec import attention_of
from quantkit.common.crashpoints import kill_point
from quantkit.errors import QuantkitError
from quantkit.arch.experts import UnfusedExperts
from quantkit.formats.staging import RUN_DIR
from quantkit.formats.writer import ShardWriter
from quantkit.kv_cache import KVObserver
from quantkit.recipe import Recipe
from quantkit.pipeline import residuals
from quantkit.pipeline.batches import num_tokens_of
from quantkit.pipeline.calibrate import prepare_calibration
from quantkit.pipeline.coverage import Routing, coverage_entry
from quantkit.pipeline.expert_stream import StreamPlan, plan_stream
from quantkit.pipeline.finite import FiniteSource
from quantkit.pipeline.layer_steps import Targets, build_steps, layer_context, layer_groups, layer_targets, quantize_targets, run_transforms
from quantkit.pipeline.layer_writer import static_targets, write_kv_scales, write_layer, write_metadata
from quantkit.pipeline.memory import advise_huge_pages, available_memory
from quantkit.pipeline.onload import build_skeleton, dematerialize, get_module, materialize
from quantkit.pipeline.resume import ACTIVATIONS
from quantkit.pipeline.rotated_source import rotated_inputs
from quantkit.pipeline.state import RunOptions, RunState
from quantkit.pipeline.stream import ExpertStream
import resource

__all__ = ["LAYER_MEMORY_SHARE", "PipelineResult", "RunOptions", "build_steps", "layer_groups", "layer_targets",
           "peak_rss_bytes", "run_pipeline"]


@dataclass
class PipelineResult:
    path: Path
    bytes_before: int
    bytes_after: int
    seconds: float
    peak_rss_bytes: int
    num_quantized: int
    num_layers: int
    module_stats: dict[str, dict[str, Any]] = field(default_factory=dict)
    formats: dict[str, int] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        return self.bytes_before / max(self.bytes_after, 1)


def peak_rss_bytes() -> int:

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_pipeline(config, source, recipe: Recipe, samples: list[list[int]] | None, writer: ShardWriter,
                 options: RunOptions = RunOptions()) -> PipelineResult:
    """Quantize the model described by ``config`` whose tensors come from ``source`` into ``writer``.

    ``samples``: the calibration set as token ids (None for a recipe that takes none). The
    recipe's config groups must fit the model (``workflows.module_checks.check_modules``, before any work).
    """
    t0 = time.time()
    state = _open(config, source, recipe, samples, writer, options)
    for i in _layer_indices(state):
        _convert_layer(state, i)
    # inside the staging folder: on failure it goes with it, or stays for --resume
    if state.offload_dir is not None:
        shutil.rmtree(state.offload_dir, ignore_errors=True)
    write_metadata(state)
    writer.finalize()
    lg = state.log
    return PipelineResult(writer.tmp, state.source.nbytes(), writer.total_bytes, time.time() - t0,
                          peak_rss_bytes(), len(lg.stats), len(state.layers), lg.stats, lg.formats)


def _open(config, source, recipe: Recipe, samples: list[list[int]] | None, writer: ShardWriter,
          options: RunOptions) -> RunState:
    """The run's state: inputs checked, the tensors outside the layers copied (or a resumed run's
    writer restored), the calibration inputs captured, the first boundary committed."""
    source = FiniteSource(source)   # every weight checked as it is read, before it is quantized
    advise_huge_pages()   # first here: a bad QUANTKIT_HEAP_HUGE_PAGES fails before anything is written
    arch_name, spec = arch_for(config)
    model = build_skeleton(config)
    source = named_as_modules(model, source)        # read by module names, written back as stored
    writer = writing_stored_names(writer, source)
    _check_tensors(get_module(model, spec.layers), spec.layers, source)
    transforms, quantizer = build_steps(recipe)
    config, source = rotated_inputs(config, spec, model, source, recipe)
    needs_data = recipe.needs_calibration
    if needs_data and not samples:
        raise QuantkitError("calibration: this recipe needs calibration data (a step or static activations)")
    if quantizer.needs_float_inputs and spec.moe is not None:
        # the float pass would route every token a second time (and count it in the coverage)
        raise QuantkitError(f"algorithm.gptaq: not supported on mixture-of-experts models yet ({arch_name})")
    state = RunState(config, arch_name, spec, model, recipe, source, writer, options, samples, transforms, quantizer,
                     num_tokens_of(samples))
    _copy_outside_layers(state)
    source.release()
    if needs_data and recipe.calibration.offload:
        state.offload_dir = writer.tmp / RUN_DIR / ACTIVATIONS
    if needs_data and state.start < len(state.layers):
        state.calibration = prepare_calibration(state)
    _open_book(state)
    state.budget = _layer_budget(recipe, writer)
    return state


def _check_tensors(layers: nn.Module, layers_path: str, source) -> None:
    """Every layer parameter is in the shards: a missing one fails before any work, not at its layer."""
    for name, _ in layers.named_parameters():
        key = f"{layers_path}.{name}"
        if key not in source:
            source.get(key)   # the source's own one-line error naming the tensor


def _copy_outside_layers(state: RunState) -> None:
    """Embeddings, final norm, lm_head: copied unchanged; a resumed run restores its writer instead."""
    writer, source = state.writer, state.source
    if state.resumed is not None:
        writer.restore(state.resumed.writer, state.options.book.run_dir)
        return
    layer_prefix = state.spec.layers + "."
    for k in [k for k in source.keys() if not k.startswith(layer_prefix)]:
        writer.add(k, source.get(k))
        writer.end_unit()  # embeddings can be GBs: do not hold several at once


def _open_book(state: RunState) -> None:
    """A fresh run commits its first boundary; a resumed one takes its log and random state back."""
    book, at = state.options.book, state.resumed
    if at is not None:
        state.log = at.log
    if book is None:
        return
    if at is None:
        batch_tokens = state.calibration.batch_tokens if state.calibration is not None else None
        book.commit(0, len(state.layers), state.writer, None, state.log, batch_tokens)
    else:
        book.restore_rng()


def _layer_indices(state: RunState) -> Iterable[int]:
    total = len(state.layers)
    indices: Iterable[int] = range(state.start, total)
    if state.options.progress is not None:
        indices = state.options.progress(indices, total - state.start)
    return indices


@dataclass
class _Layer:
    """One decoder layer between its onload and its write."""

    index: int
    module: nn.Module
    prefix: str                      # "model.layers.3."
    plan: StreamPlan | None          # its experts streamed a chunk at a time (None: the whole layer at once)
    targets: Targets                 # quantized with the layer (streamed experts not among them)
    streamed: dict[str, tuple[nn.Linear, str]]
    kv: tuple[nn.Module, KVObserver] | None
    ctx: LayerContext
    stream: ExpertStream | None
    routings: dict[str, Routing]


def _convert_layer(state: RunState, i: int) -> None:
    """Onload, steps, propagate, write, commit: one decoder layer."""
    kill_point(f"layer:{i}")
    layer = _onload(state, i)
    rows: dict[str, torch.Tensor] = {}
    results = _steps(state, layer, rows)
    observed = _propagate(state, layer, rows)
    residuals.save_layer(state.writer.tmp, i, rows)
    if state.passes is not None:
        state.passes.advance()
    _record_coverage(state, layer)
    observed = distributed.merge_max(observed, static_targets(layer.targets))
    _write(state, layer, results, observed)
    del results, layer
    _commit(state, i)


def _onload(state: RunState, i: int) -> _Layer:
    """Materialise layer ``i`` (its experts left to the stream when it is over the budget) and
    set up what its steps see."""
    module, prefix = state.layers[i], f"{state.spec.layers}.{i}."
    plan = plan_stream(module, state.budget) if state.spec.moe is not None else None
    if plan is not None and state.transforms:
        _refuse_streamed_transforms(state, prefix, plan)
    materialize(module, prefix, state.source, state.options.device, skip=plan.experts_path if plan is not None else None)
    grouped = layer_groups(module, prefix, state.recipe)
    state.log.groups.extend(dict.fromkeys(g for _, g in grouped.values() if g not in state.log.groups))
    streamed = {}
    if plan is not None:
        streamed = {n: mg for n, mg in grouped.items() if n.startswith(plan.experts_path + ".")}
        grouped = {n: mg for n, mg in grouped.items() if n not in streamed}
        state.say(f"{prefix[:-1]}: weights {plan.layer_bytes / 2**20:.0f} MiB over calibration.layer_memory "
                  f"{state.budget / 2**20:.0f} MiB: experts onloaded {len(plan.chunks[0])} at a time")
    targets = {name: (m, state.recipe.groups[g]) for name, (m, g) in grouped.items()}
    kv = None
    attention = attention_of(module, state.spec)
    if state.recipe.kv_cache is not None and attention is not None:   # a hybrid's linear-attention layer has none
        kv = (attention, KVObserver.for_scheme(state.recipe.kv_cache, state.num_tokens))
    ctx = layer_context(state, i, module, targets, kv)
    stream, routings = None, {}
    if plan is not None:
        stream = ExpertStream.start(state, module, plan)
        stream.subgroups_before = len(ctx.subgroups)
        if stream.routing is not None:
            routings = {prefix + plan.experts_path: stream.routing}
    else:
        routings = _route(state, module, prefix)
    return _Layer(i, module, prefix, plan, targets, streamed, kv, ctx, stream, routings)


def _refuse_streamed_transforms(state: RunState, prefix: str, plan: StreamPlan) -> NoReturn:
    budget = state.budget
    raise QuantkitError(f"{prefix[:-1]}: its weights ({plan.layer_bytes / 2**30:.2f} GiB) exceed calibration."
                        f"layer_memory ({budget / 2**30:.2f} GiB), so its experts are onloaded a chunk at a "
                        f"time; the transforms ({', '.join(k for k, _ in state.transforms)}) need the whole layer: "
                        "raise calibration.layer_memory")


def _route(state: RunState, layer: nn.Module, prefix: str) -> dict[str, Routing]:
    """Give the layer's MoE experts modules their calibration ``Routing`` (none without data)."""
    passes = state.passes
    if passes is None:
        return {}
    routings = {}
    for name, m in layer.named_modules():
        if isinstance(m, UnfusedExperts):
            m.routing = routings[prefix + name] = Routing(
                len(m), state.recipe.calibration.moe_experts == "all", passes.real_tokens, passes.batch_index,
                passes.selected)
    return routings


def _steps(state: RunState, layer: _Layer, rows: dict[str, torch.Tensor]) -> dict[str, QuantizedWeight]:
    """The recipe's transforms (search, apply), then its quantizer; each result's summary logged."""
    found = run_transforms(layer.ctx, state.transforms, state.writer.tmp)
    if found:
        state.log.transforms[layer.ctx.name] = {key: r.summary for key, r in found.items()}
    return quantize_targets(state.quantizer, layer.ctx, layer.prefix, rows)


def _propagate(state: RunState, layer: _Layer, rows: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The calibration batches through the quantized layer (unless the quantizer's own pass was
    the propagating one), then its streamed experts; returns the static activations observed."""
    observed: dict[str, torch.Tensor] = {}
    passes = state.passes
    if passes is not None:
        if not layer.ctx.propagated:
            passes.run(layer.module, layer.index, propagate=True, observe=layer.targets, observed=observed,
                       kv=layer.kv)
        else:
            observed = layer.ctx.observed
    if layer.stream is not None:
        layer.stream.run(state, layer.index, layer.streamed, rows)
    return observed


def _record_coverage(state: RunState, layer: _Layer) -> None:
    """Tokens per expert into the log; the experts' routing dropped."""
    for name, routing in layer.routings.items():
        state.log.experts[name] = coverage_entry(routing, state.recipe.calibration.moe_min_tokens,
                                                 distributed.merge_sum)
    for m in layer.module.modules():
        if isinstance(m, UnfusedExperts):
            m.routing = None


def _write(state: RunState, layer: _Layer, results: dict[str, QuantizedWeight],
           observed: dict[str, torch.Tensor]) -> None:
    """Every tensor of the layer from the layer in memory (streamed experts were written chunk by
    chunk), its KV-cache scales, then the layer dropped."""
    skip = layer.plan.experts_path + "." if layer.plan is not None else None
    params = [(n, p) for n, p in layer.module.named_parameters() if skip is None or not n.startswith(skip)]
    # buffers the checkpoint stores (DeepSeek-V3's router bias): the model reads them back from it
    params += [(n, b) for n, b in layer.module.named_buffers()
               if f"{layer.prefix}{n}" in state.source and not n.endswith(COMPUTED_SUFFIXES)]
    write_layer(state.writer, layer.prefix, params, layer.targets, results, observed, state.log)
    if layer.kv is not None:
        write_kv_scales(state, layer.prefix, layer.kv)
    dematerialize(layer.module)


def _commit(state: RunState, i: int) -> None:
    """The layer boundary: the writer's unit ended, the boundary recorded for a resume, memory trimmed."""
    state.writer.end_unit()
    book = state.options.book
    if book is not None:
        calibration = state.calibration
        book.commit(i + 1, len(state.layers), state.writer, calibration.passes.hidden if calibration else None,
                    state.log, calibration.batch_tokens if calibration else None)
    state.release()


#: Share of the memory available when the layer loop starts that one layer's weights may take
#: (``calibration.layer_memory`` unset), once the writer's pending tensors (up to 64 MiB) are
#: set aside. At its peak a chunk of streamed experts is about three times its weights (the
#: weights, the copy given to the quantizer for the row record, the dequantized result written
#: back); beside that the heap's fragments, the solves' Hessians and the calibration activations.
#: A third of it was OOM-killed under a 1 GiB cap.
LAYER_MEMORY_SHARE = 0.2


def _layer_budget(recipe: Recipe, writer: ShardWriter) -> int:
    budget = recipe.calibration.layer_memory
    if budget is None:
        budget = max(1, int((available_memory() - writer.flush_bytes) * LAYER_MEMORY_SHARE))
    return distributed.smallest(budget)   # every rank streams the same layers in the same chunks
