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

import gc
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
from torch import nn

from .. import distributed
from ..algorithms import Algorithm, LayerContext, QuantizedWeight, Step, Transform, TransformResult, build_algorithm
from ..arch import ArchSpec, arch_for
from ..crashpoints import kill_point
from ..errors import QuantkitError
from ..experts import UnfusedExperts
from ..formats.compressed_tensors import compress_module, group_for, quantization_config, scheme_for
from ..formats.staging import RUN_DIR
from ..formats.writer import ShardWriter
from ..jsonio import nonfinite_warning
from ..kv_cache import KVObserver
from ..primitives import calculate_qparams
from ..recipe import Recipe
from ..scheme import QuantScheme
from . import batches as _batches
from . import record, residuals
from .batches import auto_batch_tokens, make_chunks, num_tokens_of
from .capture import capture_inputs
from .coverage import Routing, coverage_entry, coverage_lines
from .expert_stream import ChunkPasses, ExpertInputs, ExpertSums, StreamPlan, add_expert_sums, plan_stream
from .finite import FiniteSource
from .memory import advise_huge_pages, available_memory, return_freed_memory
from .onload import build_skeleton, dematerialize, get_module, materialize
from .passes import CalibrationPasses
from .resume import ACTIVATIONS, Boundary, LayerLog, RunBook
from .store import ActivationStore, ArgumentStore


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
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def build_steps(recipe: Recipe) -> tuple[list[tuple[str, Transform]], Algorithm]:
    """The recipe's chain as step objects: (key, transform) pairs, then the quantizer."""
    transforms: list[tuple[str, Transform]] = []
    quantizer: Algorithm | None = None
    for k, spec in enumerate(recipe.steps):
        step: Step = build_algorithm(spec.name, spec.options, where=f"steps[{k}]")
        if isinstance(step, Transform):
            transforms.append((record.step_key(k, spec.name), step))
        else:
            quantizer = step   # the recipe's validation puts exactly one quantizer, last
    return transforms, quantizer


def layer_groups(layer: nn.Module, prefix: str, recipe: Recipe) -> dict[str, tuple[nn.Linear, str]]:
    """The layer's target linears (names within the layer) -> (module, config group key)."""
    out = {}
    for name, m in layer.named_modules():
        if isinstance(m, nn.Linear):
            g = group_for(f"{prefix}{name}", "Linear", recipe.groups, list(recipe.ignore), where=recipe.origin)
            if g is not None:
                out[name] = (m, g)
    return out


def layer_targets(layer: nn.Module, prefix: str, recipe: Recipe) -> dict[str, tuple[nn.Linear, QuantScheme]]:
    return {name: (m, recipe.groups[g]) for name, (m, g) in layer_groups(layer, prefix, recipe).items()}


def _check_widths(layers: nn.Module, layers_path: str, recipe: Recipe) -> None:
    for i, layer in enumerate(layers):
        prefix = f"{layers_path}.{i}."
        for name, (m, group) in layer_groups(layer, prefix, recipe).items():
            recipe.groups[group].weights.check_width(m.in_features, f"config_groups.{group}.weights ({prefix}{name})")


def _check_tensors(layers: nn.Module, layers_path: str, source) -> None:
    """Every layer parameter is in the shards: a missing one fails before any work, not at its layer."""
    for name, _ in layers.named_parameters():
        key = f"{layers_path}.{name}"
        if key not in source:
            source.get(key)   # the source's own one-line error naming the tensor


def _subgroups(spec: ArchSpec, targets: dict) -> list[list[str]]:
    return spec.layer_subgroups(list(targets))


def _route(layer: nn.Module, prefix: str, passes: CalibrationPasses | None,
           settings) -> dict[str, Routing]:
    """Give the layer's MoE experts modules their calibration ``Routing`` (none without data)."""
    if passes is None:
        return {}
    routings = {}
    for name, m in layer.named_modules():
        if isinstance(m, UnfusedExperts):
            m.routing = routings[prefix + name] = Routing(
                len(m), settings.moe_experts == "all", passes.real_tokens, passes.batch_index, passes.selected)
    return routings


def _unroute(layer: nn.Module) -> None:
    for m in layer.modules():
        if isinstance(m, UnfusedExperts):
            m.routing = None


def _routers(model: nn.Module, spec: ArchSpec) -> list[str]:
    """The MoE routers, for ``ignore``: an engine (vLLM's routers are linear layers) would
    otherwise apply the groups' "Linear" target to them."""
    if spec.moe is None:
        return []
    return [f"{name.rsplit('.', 1)[0]}.{spec.moe.router}" for name, m in model.named_modules()
            if isinstance(m, UnfusedExperts)]


def _no_data(**_: Any) -> None:
    raise QuantkitError("calibration: this step ran the layer but no calibration data was captured")


def run_pipeline(config, source, recipe: Recipe, samples: list[list[int]] | None, writer: ShardWriter,
                 device: str = "cpu", progress: Callable[[Iterable, int], Iterable] | None = None,
                 log: Callable[[str], None] | None = None, book: RunBook | None = None,
                 warn: Callable[[str], None] | None = None) -> PipelineResult:
    """Quantize the model described by ``config`` whose tensors come from ``source``.

    ``warn``: told what is written but worth knowing (a statistic that is not a finite number).

    ``book``: commit each layer boundary into the staging folder; with ``book.resumed``,
    continue from that boundary (the writer, log and hidden states as they were there).
    """
    t0 = time.time()
    source = FiniteSource(source)   # every weight checked as it is read, before it is quantized
    advise_huge_pages()   # first here: a bad QUANTKIT_HEAP_HUGE_PAGES fails before anything is written
    arch_name, spec = arch_for(config)
    model = build_skeleton(config)
    layers = get_module(model, spec.layers)
    _check_widths(layers, spec.layers, recipe)
    _check_tensors(layers, spec.layers, source)
    transforms, quantizer = build_steps(recipe)
    needs_data = recipe.needs_calibration
    if needs_data and not samples:
        raise QuantkitError("calibration: this recipe needs calibration data (a step or static activations)")

    at = book.resumed if book is not None else None
    start = at.layers_done if at is not None else 0
    if at is None:
        # Non-layer tensors (embeddings, final norm, lm_head): copied unchanged.
        layer_prefix = spec.layers + "."
        for k in [k for k in source.keys() if not k.startswith(layer_prefix)]:
            writer.add(k, source.get(k))
            writer.end_unit()  # embeddings can be GBs: do not hold several at once
    else:
        writer.restore(at.writer, book.run_dir)
    source.release()

    passes: CalibrationPasses | None = None
    offload_dir = writer.tmp / RUN_DIR / ACTIVATIONS if needs_data and recipe.calibration.offload else None
    single_pass, batch_tokens = False, None
    if needs_data and start < len(layers):
        passes, single_pass, batch_tokens = _prepare_calibration(model, config, source, spec, recipe, samples,
                                                                 offload_dir, device, log, at, book)
    lg = at.log if at is not None else LayerLog()
    if book is not None:
        if at is None:
            book.commit(0, len(layers), writer, None, lg, batch_tokens)
        else:
            book.restore_rng()
    num_tokens = num_tokens_of(samples)
    budget = _layer_budget(recipe, writer)
    iterator: Iterable[int] = range(start, len(layers))
    if progress is not None:
        iterator = progress(iterator, len(layers) - start)
    for i in iterator:
        kill_point(f"layer:{i}")
        layer, prefix = layers[i], f"{spec.layers}.{i}."
        plan = plan_stream(layer, budget) if spec.moe is not None else None
        if plan is not None and transforms:
            raise QuantkitError(f"{prefix[:-1]}: its weights ({plan.layer_bytes / 2**30:.2f} GiB) exceed calibration."
                                f"layer_memory ({budget / 2**30:.2f} GiB), so its experts are onloaded a chunk at a "
                                f"time; the transforms ({', '.join(k for k, _ in transforms)}) need the whole layer: "
                                "raise calibration.layer_memory")
        materialize(layer, prefix, source, device, skip=plan.experts_path if plan is not None else None)
        grouped = layer_groups(layer, prefix, recipe)
        lg.groups.extend(dict.fromkeys(g for _, g in grouped.values() if g not in lg.groups))
        streamed = {}
        if plan is not None:
            streamed = {n: mg for n, mg in grouped.items() if n.startswith(plan.experts_path + ".")}
            grouped = {n: mg for n, mg in grouped.items() if n not in streamed}
            if log is not None:
                log(f"{prefix[:-1]}: weights {plan.layer_bytes / 2**20:.0f} MiB over calibration.layer_memory "
                    f"{budget / 2**20:.0f} MiB: experts onloaded {len(plan.chunks[0])} at a time")
        targets = {name: (m, recipe.groups[g]) for name, (m, g) in grouped.items()}
        kv = None
        if recipe.kv_cache is not None:
            kv = (get_module(layer, spec.attention), KVObserver.for_scheme(recipe.kv_cache, num_tokens))
        ctx = _context(i, prefix[:-1], layer, targets, spec, config, passes, single_pass,
                       len(samples or []), num_tokens, kv)
        stream = None
        if plan is not None:
            stream = _Stream.start(layer, prefix, plan, passes, recipe.calibration, offload_dir, device)
            stream.subgroups_before = len(ctx.subgroups)
            routings = {prefix + plan.experts_path: stream.routing} if stream.routing is not None else {}
        else:
            routings = _route(layer, prefix, passes, recipe.calibration)

        found = _run_transforms(ctx, transforms, writer.tmp)
        if found:
            lg.transforms[ctx.name] = {key: r.summary for key, r in found.items()}
        rows: dict[str, torch.Tensor] = {}
        results = _quantize(quantizer, ctx, prefix, rows)
        observed: dict[str, torch.Tensor] = {}
        if passes is not None:
            if not ctx.propagated:
                passes.run(layer, i, propagate=True, observe=targets, observed=observed, kv=kv)
            else:
                observed = ctx.observed
        if stream is not None:
            stream.run(i, prefix, quantizer, spec, config, streamed, recipe, source, device, writer, rows, lg,
                       len(samples or []), num_tokens)
        residuals.save_layer(writer.tmp, i, rows)
        if passes is not None:
            passes.hidden.advance()
        for name, routing in routings.items():
            lg.experts[name] = coverage_entry(routing, recipe.calibration.moe_min_tokens, distributed.merge_sum)
        _unroute(layer)

        observed = distributed.merge_max(observed, _static(targets))
        skip = plan.experts_path + "." if plan is not None else None   # written chunk by chunk
        params = [(n, p) for n, p in layer.named_parameters() if skip is None or not n.startswith(skip)]
        _write_layer(writer, prefix, params, targets, results, observed, lg.stats, lg.formats)
        if kv is not None:
            dtype = next(kv[0].parameters()).dtype   # compressed-tensors: the attention module's dtype
            for leaf, scale in kv[1].scales(recipe.kv_cache, dtype).items():
                writer.add(f"{prefix}{spec.attention}.{leaf}", scale)
        dematerialize(layer)
        del results, targets, ctx
        writer.end_unit()
        if book is not None:
            book.commit(i + 1, len(layers), writer, passes.hidden if passes is not None else None, lg,
                        batch_tokens)
        source.release()
        gc.collect(1)  # tensors go by reference counting; a full collection costs ~0.2 s a layer
        return_freed_memory()
    # inside the staging folder: on failure it goes with it, or stays for --resume
    if offload_dir is not None:
        shutil.rmtree(offload_dir, ignore_errors=True)

    ignore = [n for n, m in model.named_modules()
              if isinstance(m, nn.Linear) and scheme_for(n, "Linear", recipe.groups, list(recipe.ignore)) is None]
    ignore += [n for n in _routers(model, spec) if n not in ignore]
    groups_used = {g: recipe.groups[g] for g in lg.groups}
    cfg = config.to_dict()
    cfg["quantization_config"] = quantization_config(groups_used or recipe.groups, ignore,
                                                     recipe.kv_cache.to_dict() if recipe.kv_cache else None)
    _write_strict(writer, "config.json", cfg, warn or log)
    quant_log: dict[str, Any] = {
        "quantkit_version": _version(), "recipe": recipe.to_dict(), "architecture": arch_name,
        "calibration": {"num_samples": len(samples or []), "num_tokens": num_tokens},
        "modules": lg.stats,
    }
    if lg.transforms:
        quant_log["transforms"] = lg.transforms
    if lg.experts:
        settings = recipe.calibration
        quant_log["moe_coverage"] = {"mode": settings.moe_experts, "min_tokens": settings.moe_min_tokens,
                                     "layers": lg.experts,
                                     "under_min": {n: r["under_min"] for n, r in lg.experts.items() if r["under_min"]}}
        if log is not None:
            for line in coverage_lines(lg.experts, settings.moe_experts, settings.moe_min_tokens):
                log(line)
    _write_strict(writer, "quantization_log.json", quant_log, warn or log)
    writer.finalize()
    return PipelineResult(writer.tmp, source.nbytes(), writer.total_bytes, time.time() - t0,
                          peak_rss_bytes(), len(lg.stats), len(layers), lg.stats, lg.formats)


def _write_strict(writer: ShardWriter, name: str, data: dict, warn: Callable[[str], None] | None) -> None:
    """``data`` as ``name`` (non-finite numbers as null: strict JSON), saying which fields were not finite."""
    message = nonfinite_warning(data, name)
    if message is not None and warn is not None:
        warn(message)
    writer.write_json(name, data)


def _prepare_calibration(model, config, source, spec: ArchSpec, recipe: Recipe, samples, offload_dir: Path | None,
                         device: str, log, at: Boundary | None,
                         book: RunBook | None) -> tuple[CalibrationPasses, bool, int]:
    """Capture every layer's calibration inputs; the embeddings are onloaded for it.

    A resumed run (``at``) recaptures the call arguments (a cheap embedding pass) but takes the
    hidden states entering its first layer from the boundary, and the batch size it used.
    """
    layer_prefix, base = spec.layers + ".", spec.layers.rsplit(".", 1)[0] + "."
    # the embeddings and whatever else the base model runs before its layers; not the head
    outer = [n for n, _ in model.named_parameters() if n.startswith(base) and not n.startswith(layer_prefix)]
    model.load_state_dict({n: source.get(n) for n in outer if n in source}, strict=False, assign=True)
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    if at is not None and at.batch_tokens is not None:
        batch_tokens = at.batch_tokens   # auto_batch_tokens reads the free memory: it can differ now
    else:
        batch_tokens = recipe.calibration.batch_tokens or auto_batch_tokens(config, device)
    # every rank must make the same batches and the same lockstep decision (free memory differs)
    batch_tokens = distributed.smallest(batch_tokens)
    chunks = make_chunks(samples, min(batch_tokens, _batches.MICRO_BATCH_TOKENS), packed=spec.packed_calibration)
    # the whole set in memory at once: an interleaved pass can run (LayerContext)
    single_pass = sum(c.input_ids.numel() for c in chunks) <= batch_tokens
    if log is not None:
        rows = sum(c.input_ids.shape[0] for c in chunks)
        ranks = distributed.world_size()
        log(f"calibration: {len(samples)} samples, {num_tokens_of(samples)} tokens in {rows} rows, "
            f"{len(chunks)} batch{'es' if len(chunks) > 1 else ''} per layer"
            f"{', all in one pass' if single_pass else ''}{f', shared by {ranks} ranks' if ranks > 1 else ''}")
    # data-parallel: every rank made the same batches (and took the same single_pass decision)
    # and runs its own share; on one rank that is all of them
    chunks = [chunks[j] for j in distributed.owned_batches(len(chunks), distributed.rank(), distributed.world_size())]
    if offload_dir is not None:
        offload_dir.mkdir(parents=True, exist_ok=True)
    first, calls = [], ArgumentStore(offload_dir, device)
    for hidden_in, layer_calls in capture_inputs(model, spec.layers, chunks, device):
        first.append(hidden_in)
        calls.append(layer_calls)
    dematerialize(model)   # the embeddings only fed the capture: the layers never use them
    start = at.layers_done if at is not None else 0
    if start == 0:
        hidden = ActivationStore(first, offload_dir, device)
    elif offload_dir is not None:
        hidden = ActivationStore.on_disk(offload_dir, len(first), start, device)
    else:
        hidden = ActivationStore(book.hidden_states(device), None, device, generation=start)
    if hidden.count != len(first):
        raise RuntimeError(f"resume: {hidden.count} saved calibration batches, {len(first)} now")
    del first
    return CalibrationPasses(chunks, hidden, calls), single_pass, batch_tokens


def _context(i: int, name: str, layer: nn.Module, targets, spec: ArchSpec, config, passes: CalibrationPasses | None,
             single_pass: bool, num_samples: int, num_tokens: int, kv=None) -> LayerContext:
    if passes is None:
        return LayerContext(i, name, layer, targets, _subgroups(spec, targets), run=_no_data,
                            num_samples=num_samples, num_tokens=num_tokens, arch=spec, config=config)
    ctx: LayerContext

    def run(propagate: bool = False, interleaved: bool = False, batches: list[int] | None = None) -> None:
        passes.run(layer, i, propagate=propagate, interleaved=interleaved, batches=batches,
                   observe=ctx.targets, observed=ctx.observed if propagate else None, kv=kv)

    ctx = LayerContext(i, name, layer, targets, _subgroups(spec, targets), run=run,
                       num_samples=num_samples, num_tokens=num_tokens, single_pass=single_pass,
                       arch=spec, config=config, num_batches=passes.count,
                       tokens=passes.tokens(name), sync=passes.sync, batch_index=passes.batch_index)
    return ctx


def _run_transforms(ctx: LayerContext, transforms: list[tuple[str, Transform]], out_dir: Path) -> dict[str, TransformResult]:
    """Each transform searches (or reloads its saved result) and applies it, in the recipe's order."""
    found: dict[str, TransformResult] = {}
    for key, step in transforms:
        load_from = getattr(step, "load_from", None)
        if load_from:
            result = record.load_result(load_from, ctx.index, ctx.name, key, f"steps[{key.split('.')[0]}].{step.name}")
        else:
            result = step.search(ctx)
        step.apply(ctx, result)
        found[key] = result
    record.save_layer(out_dir, ctx.index, found)
    return found


def _write_layer(writer: ShardWriter, prefix: str, params: list[tuple[str, torch.Tensor]], targets,
                 results: dict[str, QuantizedWeight], observed: dict[str, torch.Tensor], stats: dict,
                 formats: dict) -> None:
    """Every tensor of the layer (``params``: its parameters, named within it), from the layer in
    memory: packed targets, everything else as it now is."""
    written = set()
    for name, (m, s) in targets.items():
        r = results[name]
        input_scale = None
        if name in observed:
            amax = observed[name].reshape(1)
            input_scale, _ = calculate_qparams(-amax, amax, s.input_activations, dtype=m.weight.dtype)
        elif s.input_activations is not None and not s.input_activations.dynamic:
            raise QuantkitError(f"{prefix}{name}: no calibration token reached it, so its static input scale "
                                "cannot be calibrated (an MoE expert no token was routed to: set "
                                "calibration.moe_experts: all)")
        for k, t in compress_module(r.q, r.scale, r.zero_point, r.g_idx, s, m.bias, input_scale).items():
            writer.add(f"{prefix}{name}.{k}", t)
        written.update({f"{name}.weight", f"{name}.bias"})
        stats[f"{prefix}{name}"] = {"format": s.format, **r.stats}
        formats[s.format] = formats.get(s.format, 0) + 1
    for pname, p in params:
        if pname not in written:
            writer.add(f"{prefix}{pname}", p.data)


def _quantize(quantizer: Algorithm, ctx: LayerContext, prefix: str, rows: dict[str, torch.Tensor]) -> dict[str, QuantizedWeight]:
    """The quantizer on ``ctx``'s targets; their dequantized weights written back, so the layer's
    outputs (the next layer's inputs) are the quantized model's own, and what it left per row
    recorded into ``rows`` (in float32, as the integrity pass decodes)."""
    # the weights the quantizer is given (GPTQ updates its working copy in place), for the row record
    given = {name: m.weight.data.clone() for name, (m, _) in ctx.targets.items()}
    results = quantizer.quantize_layer(ctx)
    missing = set(ctx.targets) - set(results)
    if missing:
        raise RuntimeError(f"{quantizer.name} returned no result for {sorted(missing)}")
    for name, (m, s) in ctx.targets.items():
        rows[prefix + name] = residuals.row_errors(given.pop(name), results[name].dequantized(s.weights, torch.float32))
        m.weight.data = results[name].dequantized(s.weights, m.weight.dtype)
    return results


def _static(targets) -> list[str]:
    """The targets whose input scales are calibrated (static activations)."""
    return [n for n, (_, s) in targets.items() if s.input_activations is not None and not s.input_activations.dynamic]


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


@dataclass
class _Stream:
    """A layer run without its experts, then its experts a chunk at a time (``expert_stream.py``)."""

    plan: StreamPlan
    experts: UnfusedExperts
    passes: CalibrationPasses | None
    inputs: ExpertInputs | None
    sums: ExpertSums | None
    routing: Routing | None
    subgroups_before: int = 0   # the sub-groups of the layer without its experts

    @classmethod
    def start(cls, layer: nn.Module, prefix: str, plan: StreamPlan, passes: CalibrationPasses | None, settings,
              offload_dir: Path | None, device: str) -> "_Stream":
        experts = layer.get_submodule(plan.experts_path)
        inputs = sums = routing = None
        if passes is not None:
            inputs = ExpertInputs(offload_dir, device, passes.batch_index, passes.real_tokens)
            sums = ExpertSums(offload_dir, device)
            routing = Routing(len(experts), settings.moe_experts == "all", passes.real_tokens, passes.batch_index,
                              passes.selected)
            experts.deferred = inputs.record
        return cls(plan, experts, passes, inputs, sums, routing)

    def run(self, i: int, prefix: str, quantizer: Algorithm, spec: ArchSpec, config, streamed: dict, recipe: Recipe,
            source, device: str, writer: ShardWriter, rows: dict, lg: LayerLog, num_samples: int,
            num_tokens: int) -> None:
        """Every chunk of experts: onloaded, quantized over the recorded tokens, its weighted outputs
        added into the sums, written, dropped; then the sums added to the layer's outputs."""
        self.experts.deferred = None
        path, passes = self.plan.experts_path, self.passes
        for chunk in self.plan.chunks:
            for e in chunk:
                materialize(self.experts[e], f"{prefix}{path}.{e}.", source, device)
            names = {f"{path}.{e}." for e in chunk}
            targets = {n: (m, recipe.groups[g]) for n, (m, g) in streamed.items() if n[:n.rindex(".") + 1] in names}
            cp = None if passes is None else ChunkPasses(self.experts, chunk, self.inputs, self.sums,
                                                         self.routing, passes.count)
            data = {} if cp is None else {"num_batches": passes.count, "batch_index": cp.batch_index}
            ctx = LayerContext(i, prefix[:-1], self.experts, targets, _subgroups(spec, targets),
                               run=_no_data if cp is None else cp.run, num_samples=num_samples,
                               num_tokens=num_tokens, arch=spec, config=config, **data)
            results = _quantize(quantizer, ctx, prefix, rows)
            for r in results.values():   # numbered as in the whole layer: after the rest of it
                if "subgroup" in r.stats:
                    r.stats["subgroup"] += self.subgroups_before
            observed: dict[str, torch.Tensor] = {}
            if cp is not None:
                cp.run(propagate=True, observe=targets, observed=observed)
            observed = distributed.merge_max(observed, _static(targets))
            params = [(f"{path}.{e}.{n}", p) for e in chunk for n, p in self.experts[e].named_parameters()]
            _write_layer(writer, prefix, params, targets, results, observed, lg.stats, lg.formats)
            for e in chunk:
                dematerialize(self.experts[e])
            del results, targets, ctx
            writer.end_unit()
            source.release()
            gc.collect(1)
            return_freed_memory()
        if passes is not None:
            add_expert_sums(passes.hidden, self.sums, passes.count)
            self.inputs.clear()
            self.sums.clear()


def _version() -> str:
    from .. import __version__

    return __version__
