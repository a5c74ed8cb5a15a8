"""Model-free conversion: a checkpoint quantized tensor by tensor, with no model built.

For recipes that need no data (round to nearest: W8A16, W4A16 with groups, FP8_DYNAMIC,
FP8_BLOCK, NVFP4A16, MXFP4A16, MXFP8 ...) the weights are all a conversion reads, so the
safetensors shards are streamed one tensor at a time: no transformers model class is needed
(a folder whose architecture transformers does not know converts too) and memory is bounded
by the largest tensor, whatever the model's size. Which tensors are quantized comes from their
names (``inputs/targets.py``: the rule ``--targets`` replaces). The quantizer core
(``quantizers/rtn.rtn_weight``), the module compressor and the shard writer are the model
path's own, and tensors are written in its order with its unit boundaries, so where both paths
can run the checkpoints are equal bit for bit.

Example:
    >>> from quantkit.workflows.model_free import ModelFreeOptions, quantize_model_free
    >>> q = quantize_model_free("path/to/model", "fp8-dynamic", ModelFreeOptions())   # doctest: +SKIP
    >>> q.save("out/model-fp8")                                                          # doctest: +SKIP
"""

from __future__ import annotations

import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch

from quantkit.common.crashpoints import kill_point
from quantkit.common.disk_space import disk_full_error, is_disk_full
from quantkit.common.i18n import check_lang
from quantkit.numerics.number_formats import number_format
from quantkit.errors import QuantkitError
from quantkit.formats import staging
from quantkit.formats.compressed_tensors import checkpoint_dtype, compress_module, group_for, matches, quantization_config
from quantkit.formats.writer import ShardWriter
from quantkit.inputs.model_folder import copy_side_files, read_config_json
from quantkit.inputs.embedded_model import default_model_dir
from quantkit.inputs.source import SafetensorsSource
from quantkit.inputs.targets import DEFAULT_TARGETS, kept_linear, layer_unit, module_of, target_rule
from quantkit.pipeline import residuals
from quantkit.pipeline.finite import FiniteSource
from quantkit.pipeline.layer_writer import write_strict
from quantkit.pipeline.memory import return_freed_memory
from quantkit.pipeline.runner import PipelineResult, peak_rss_bytes
from quantkit.quantizers.rtn import rtn_weight, shared_global_scale
from quantkit.recipe import Recipe, load_recipe
from quantkit.workflows.model_inputs import base_model_name, conversion_inputs
from quantkit.workflows.quantized_model import QuantizedModel
from quantkit.workflows.model_card import write_card
from quantkit.workflows.model_free_choice import data_free_refusal
from quantkit import __version__

#: Linears an engine fuses into one matrix (vLLM's qkv_proj, gate_up_proj, an expert's w13,
#: DeepSeek's MLA fused_qkv_a_proj), by their names under one parent: under NVFP4 they share one
#: weight global scale, as the model path's sub-groups share it (``quantizers/rtn.shared_global_scales``).
SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"), ("w1", "w3"), ("q_a_proj", "kv_a_proj_with_mqa"))


@dataclass(frozen=True)
class ModelFreeOptions:
    """How a model-free conversion runs.

    ``targets``: a regular expression over module names (a weight's name without ``.weight``)
    choosing the 2-D weights to quantize (None: ``inputs.targets.DEFAULT_TARGETS``, every
    decoder-layer linear). ``ignore``, ``workdir``, ``out``, ``progress``, ``log``, ``lang``: as
    ``ConvertOptions``.

    >>> ModelFreeOptions(targets="re:x")
    Traceback (most recent call last):
    quantkit.errors.QuantkitError: --targets: a regular expression, without compressed-tensors' 're:' prefix: 'x'
    """

    targets: str | None = None
    ignore: Sequence[str] = ()
    workdir: str | Path | None = None
    out: str | Path | None = None
    progress: Callable | None = None
    log: Callable[[str], None] | None = None
    lang: str = "en"

    def __post_init__(self) -> None:
        if isinstance(self.ignore, str):
            raise QuantkitError(f"ignore: a list of module names or 're:' patterns, got the string {self.ignore!r}")
        object.__setattr__(self, "ignore", tuple(self.ignore))
        if isinstance(self.targets, str) and self.targets.startswith("re:"):
            raise QuantkitError(f"--targets: a regular expression, without compressed-tensors' 're:' prefix: "
                                f"{self.targets[3:]!r}")
        target_rule(self.targets)
        check_lang(self.lang, "lang")


def quantize_model_free(model: "str | Path | None", recipe: "str | Path | Recipe | dict | None" = None,
                        options: ModelFreeOptions | None = None) -> QuantizedModel:
    """Quantize the model folder ``model`` (None: the embedded default) tensor by tensor with a
    recipe that needs no data; ``save()`` moves the checkpoint into place, as ``quantize``'s."""
    options = options if options is not None else ModelFreeOptions()
    resolved = load_recipe(recipe)
    return convert_model_free(model, resolved, options, conversion_inputs(model, resolved, recipe))


def convert_model_free(model: "str | Path | None", recipe: Recipe, options: ModelFreeOptions,
                       inputs: dict[str, Path | None]) -> QuantizedModel:
    """``quantize_model_free`` for a recipe already resolved; ``inputs`` as ``convert``'s."""
    t0 = time.time()
    recipe = recipe.with_overrides(ignore=list(options.ignore))
    refusal = data_free_refusal(recipe)
    if refusal is not None:
        raise QuantkitError(refusal)
    if model is not None and not isinstance(model, (str, Path)):
        raise QuantkitError(f"model-free: reads a model folder, not a {type(model).__name__} (quantize converts "
                            "a model in memory)")
    folder = Path(model) if model is not None else default_model_dir()
    if not folder.is_dir():
        raise QuantkitError(f"{folder}: model folder not found (hub downloads are not supported; pass a local folder)")
    job = _Job(folder, read_config_json(folder), recipe, options, FiniteSource(open_source(folder)))
    try:
        job.plan = plan_tensors(job)
        result = _write(job, model)
    finally:
        job.source.close()
    result.seconds = time.time() - t0
    return QuantizedModel(result, recipe, warnings=job.warnings, out=job.out, inputs=inputs)


def open_source(folder: Path) -> SafetensorsSource:
    """The folder's shards, read lazily. A source that arrives quantized is read as the model path
    reads it (FP8 with block scales: its weights dequantized, ``inputs/quantized.py``), as long as
    what it presents is 2-D weights; any other quantized folder is refused."""
    source = SafetensorsSource(folder)
    qc = read_config_json(folder).get("quantization_config")
    layout = source.quantized
    if qc is not None and layout is None:
        source.close()
        raise QuantkitError(f"{folder}: already quantized (config.json has a quantization_config); pass the "
                            "original unquantized model (quantkit reads FP8 block-scale sources too)")
    fused = sorted(k for k, d in (layout.derived.items() if layout is not None else ()) if len(d.shape) != 2)
    if fused:
        source.close()
        raise QuantkitError(f"{source.where(fused[0])}: '{fused[0]}' holds fused experts in {layout.method}; a "
                            "model-free conversion quantizes 2-D weights only (drop --model-free: the model path "
                            "splits them per expert)")
    return source


def _config_dtype(config: dict) -> torch.dtype | None:
    """The floating dtype ``config.json`` names (``dtype`` or ``torch_dtype``), or None."""
    name = config.get("dtype") or config.get("torch_dtype")
    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    return dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else None


@dataclass
class _Plan:
    """What the conversion writes, from the checkpoint's names and headers alone."""

    outside: list[str]                 # tensors outside every decoder layer, in the checkpoint's order
    units: list[list[str]]             # each decoder layer's tensors, layers in order
    groups: dict[str, str]             # quantized module -> its config group
    kept: list[str]                    # the format's ignore list: linears left in high precision
    siblings: dict[str, tuple[str, ...]] = field(default_factory=dict)   # NVFP4 module -> those sharing its scale


@dataclass
class _Job:
    folder: Path
    config: dict
    recipe: Recipe
    options: ModelFreeOptions
    source: FiniteSource
    plan: _Plan | None = None
    warnings: list[str] = field(default_factory=list)
    stats: dict[str, dict] = field(default_factory=dict)
    formats: dict[str, int] = field(default_factory=dict)
    scales: dict[tuple[str, ...], torch.Tensor] = field(default_factory=dict)

    @property
    def out(self) -> Path | None:
        return Path(self.options.out) if self.options.out is not None else None

    def warn(self, message: str) -> None:
        self.warnings.append(message)
        if self.options.log is not None:
            self.options.log(f"warning: {message}")


def plan_tensors(job: _Job) -> _Plan:
    """Every tensor's place (outside the layers, or in its layer), each target's config group,
    the ignore list; the rule, the widths and the ignore entries checked before any is read."""
    source, recipe = job.source, job.recipe
    rule = target_rule(job.options.targets)
    outside, units = [], {}
    for k in source.keys():
        unit = layer_unit(k)
        (outside if unit is None else units.setdefault(unit, [])).append(k)
    ordered = [units[u] for u in sorted(units)]
    groups, linears = {}, []
    for k in [*(k for keys in ordered for k in keys), *outside]:
        module, (dtype, shape) = module_of(k), source.describe(k)
        if module is None or len(shape) != 2:
            continue
        linears.append(module)
        if not rule.match(module):
            continue
        g = group_for(module, "Linear", recipe.groups, list(recipe.ignore), where=recipe.origin)
        s = recipe.groups[g] if g is not None else None
        if s is None or s.weights is None:
            continue
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise QuantkitError(f"{source.where(k)}: tensor '{k}' is {dtype}, not a floating weight: the target rule "
                                "(--targets) must leave it out")
        s.weights.check_width(shape[1], f"config_groups.{g}.weights ({module})", shape[0])
        groups[module] = g
    _check_selection(job, rule, linears, groups)
    kept = [m for m in linears if m not in groups and kept_linear(m)]
    if "lm_head.weight" not in source and job.config.get("tie_word_embeddings") and "lm_head" not in kept:
        kept.append("lm_head")   # a tied head has no tensor of its own, but engines build it as a linear
    return _Plan(outside, ordered, groups, kept, _siblings(groups, recipe))


def _check_selection(job: _Job, rule: re.Pattern, linears: list[str], groups: dict[str, str]) -> None:
    """The rule selects some tensor, something is quantized, every ignore entry keeps something."""
    flag = "--targets" if job.options.targets is not None else "--targets (the default rule)"
    like = f" (its 2-D weights are named like '{linears[0]}.weight')" if linears else ""
    if not any(rule.match(m) for m in linears):
        raise QuantkitError(f"{flag}: {rule.pattern!r} matches no 2-D weight of {job.folder}{like}")
    if not groups:
        raise QuantkitError(f"{flag}: the ignore entries and config_groups' targets leave none of the weights it "
                            "selects quantized: nothing would be quantized")
    for pattern in job.recipe.ignore:
        if pattern == "lm_head" or any(matches(m, "Linear", pattern) for m in linears):
            continue
        if pattern in job.options.ignore:
            raise QuantkitError(f"--ignore: '{pattern}' matches no 2-D weight of the model{like}")
        job.warn(f"ignore: '{pattern}' matches no 2-D weight of the model, so it keeps nothing in high precision{like}")


def _siblings(groups: dict[str, str], recipe: Recipe) -> dict[str, tuple[str, ...]]:
    """Targets whose format has a global scale (NVFP4) that share one with their fused siblings
    (``SIBLINGS``)."""
    scaled = {m for m, g in groups.items() if number_format(recipe.groups[g].weights).has_global_scale}
    out = {}
    for m in scaled:
        parent, _, leaf = m.rpartition(".")
        for names in SIBLINGS:
            members = tuple(f"{parent}.{n}" for n in names if f"{parent}.{n}" in scaled)
            if leaf in names and len(members) > 1:
                out[m] = members
    return out


def _global_scale(job: _Job, module: str) -> torch.Tensor | None:
    """The shared NVFP4 global scale of ``module``'s siblings: each read once more for its largest
    magnitude, one at a time, so memory stays one tensor deep."""
    members = job.plan.siblings.get(module)
    if members is None:
        return None
    if members not in job.scales:
        amaxes, dtype = [], None
        for m in members:
            w = _read(job, f"{m}.weight", cast=True)
            dtype = dtype or w.dtype
            amaxes.append(w.abs().amax())
            del w
        args = job.recipe.groups[job.plan.groups[module]].weights
        job.scales = {members: shared_global_scale(amaxes, dtype, args)}   # siblings are neighbours: keep one
    return job.scales[members]


def _write(job: _Job, model) -> PipelineResult:
    """Every tensor into a staging folder, then the metadata, side files and model card."""
    options = job.options
    parent = Path(options.workdir) if options.workdir is not None else (
        job.out.parent if job.out is not None else Path(tempfile.gettempdir()))
    parent.mkdir(parents=True, exist_ok=True)
    _remove_dead_runs(parent, job.out, options.log)
    writer = ShardWriter(max_shard_size=job.recipe.output.max_shard_size,
                         folder=staging.make_folder(parent, out=job.out))
    try:
        _write_tensors(job, writer)
        _write_metadata(job, writer)
        writer.finalize()
        copy_side_files(job.folder, writer.tmp)
        write_card(writer.tmp, base_model_name(model, job.folder), options.lang)
        shutil.rmtree(writer.tmp / staging.RUN_DIR, ignore_errors=True)
    except BaseException as e:
        writer.abort()
        if is_disk_full(e):
            raise disk_full_error(writer.tmp.parent, None, "writing the checkpoint") from None
        raise
    return PipelineResult(writer.tmp, job.source.nbytes(), writer.total_bytes, 0.0, peak_rss_bytes(),
                          len(job.stats), len(job.plan.units), job.stats, job.formats)


def _remove_dead_runs(parent: Path, out: Path | None, say: Callable[[str], None] | None) -> None:
    """A killed run of the same output left its staging folder: nothing resumes a model-free run
    (it is one pass over the shards), so it goes. Live runs' folders and others' are left alone."""
    if out is None:
        return
    for folder, owner in staging.dead_folders(parent):
        if owner.out == str(out.resolve()):
            staging.remove(folder)
            if say is not None:
                say(f"removed {folder}: the staging folder of a killed run of {out} (pid {owner.pid})")


def _write_tensors(job: _Job, writer: ShardWriter) -> None:
    """The model path's order and unit boundaries: each tensor outside the layers a unit of its
    own, then each layer, targets first; a unit's pending tensors flushed early once they pass
    the largest source tensor, so the writer never holds more than that (or its flush size)."""
    plan, source = job.plan, job.source
    cap = max(writer.flush_bytes, max((_nbytes(source, k) for k in source.keys()), default=0))
    for k in plan.outside:
        writer.add(k, source.get(k))   # as the model path copies them: as the source presents them
        writer.end_unit()
        return_freed_memory()
    source.release()
    units = enumerate(plan.units)
    if job.options.progress is not None:
        units = job.options.progress(units, len(plan.units))
    for index, keys in units:
        kill_point(f"layer:{index}")
        rows: dict[str, torch.Tensor] = {}
        targets = [k for k in keys if module_of(k) in plan.groups]
        for k in targets + [k for k in keys if k not in targets]:
            if k in targets:
                _write_target(job, writer, module_of(k), rows)
            else:
                writer.add(k, _read(job, k, cast=False))
            if writer.pending_bytes > cap:
                writer.flush()
        residuals.save_layer(writer.tmp, index, rows)
        writer.end_unit()
        source.release()
        return_freed_memory()   # the heap's holes handed back: resident stays what is alive (memory.py)


def _read(job: _Job, key: str, cast: bool) -> torch.Tensor:
    """Tensor ``key`` as the model path holds it: a weight it quantizes (``cast``), or one a
    quantized source dequantized, in the dtype ``config.json`` names (its layers are built in
    it); every other tensor as stored."""
    t = job.source.get(key)
    layout = job.source.quantized
    derived = layout is not None and key in layout.derived
    dtype = _config_dtype(job.config)
    return t.to(dtype) if dtype is not None and (cast or derived) and t.is_floating_point() else t


def _nbytes(source, key: str) -> int:
    dtype, shape = source.describe(key)
    n = torch.Size(shape).numel()
    return n * (dtype.itemsize if isinstance(dtype, torch.dtype) else 1)


def _write_target(job: _Job, writer: ShardWriter, module: str, rows: dict[str, torch.Tensor]) -> None:
    """One weight rounded to nearest and written as the format packs it; its row errors and
    statistics recorded as the model path records them."""
    group = job.plan.groups[module]
    scheme = job.recipe.groups[group]
    w = _read(job, f"{module}.weight", cast=True)
    r = rtn_weight(w, scheme.weights, _global_scale(job, module))
    for name, t in compress_module(r.q, r.scale, r.zero_point, r.g_idx, scheme, None, None, r.global_scale).items():
        writer.add(f"{module}.{name}", t)
    rows[module] = residuals.row_errors(w, r.dequantized(scheme.weights, torch.float32))
    job.stats[module] = {"format": scheme.format, **r.stats}
    job.formats[scheme.format] = job.formats.get(scheme.format, 0) + 1


def _write_metadata(job: _Job, writer: ShardWriter) -> None:
    """``config.json`` (the source's, with its ``quantization_config``) and ``quantization_log.json``."""
    recipe, plan = job.recipe, job.plan
    used = {g: recipe.groups[g] for g in dict.fromkeys(plan.groups.values())}
    config = {**job.config, "quantization_config": quantization_config(used, plan.kept, None)}
    # as the model path writes it: bfloat16 where the format's reader yields bfloat16 weights
    source = config.get("dtype") or config.get("torch_dtype") or "float32"
    config["dtype"] = str(checkpoint_dtype(set(job.formats), getattr(torch, str(source)))).removeprefix("torch.")
    config.pop("torch_dtype", None)
    write_strict(writer, "config.json", config, job.warn)
    architectures = job.config.get("architectures") or [job.config.get("model_type", "unknown")]
    log = {"quantkit_version": __version__, "recipe": recipe.to_dict(), "architecture": architectures[0],
           "model_free": {"targets": job.options.targets or DEFAULT_TARGETS},
           "calibration": {"num_samples": 0, "num_tokens": 0}, "modules": job.stats, "warnings": list(job.warnings)}
    write_strict(writer, "quantization_log.json", log, job.warn)
