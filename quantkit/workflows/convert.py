"""The Python API: ``quantize(model_or_path, recipe, calibration=None, options=None) -> QuantizedModel``.

Example:
    >>> import quantkit
    >>> q = quantkit.quantize("path/to/hf-model", "w4a16-g64")                        # doctest: +SKIP
    >>> q.save("out/model-w4a16")                                                    # doctest: +SKIP
    >>> model = quantkit.load("out/model-w4a16")                                     # doctest: +SKIP
    >>> opts = quantkit.ConvertOptions(out="out/m", resume=True)                        # doctest: +SKIP
    >>> q = quantkit.quantize("path/to/hf-model", "w4a16-gptq", "calib/", opts)          # doctest: +SKIP
    >>> q.save()                                       # continues a killed run of out/m, if any  # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch
from torch import nn

from quantkit.common import distributed
from quantkit.common.device import check_device
from quantkit.common.disk_space import disk_full_error, is_disk_full
from quantkit.errors import QuantkitError
from quantkit.arch.experts import kept_patterns, per_expert_state
from quantkit.formats import staging
from quantkit.formats.compressed_tensors import group_for, matches
from quantkit.formats.writer import DiscardWriter, ShardWriter, move_into_place
from quantkit.kv_cache.long_rows import long_rows
from quantkit.common.outputs import OutputPolicy, existing_path
from quantkit.pipeline import PipelineResult, RunOptions, run_pipeline
from quantkit.pipeline.layout import check_checkpoint
from quantkit.pipeline.resume import RunBook, open_run, run_keys
from quantkit.workflows.model_card import check_lang, write_card
from quantkit.recipe import CalibrationSettings, Recipe, load_recipe
from quantkit.inputs.model_folder import copy_side_files, read_config_json
from quantkit.inputs.quantized import kept_note
from quantkit.inputs.source import SafetensorsSource, StateDictSource
from quantkit.runtime.dequantized import load_dequantized
from quantkit.runtime.loader import load
from quantkit.inputs.models import DEFAULT_MODEL_ID, cache_dir, default_model_dir
from quantkit.calibration import load_calibration
from quantkit.pipeline.memory import available_memory
from quantkit.sensitivity.mixed import check_mixed, PLAN_FILE, plan_recipe, SENSITIVITY_FILE
from quantkit.sensitivity import candidates_from
from quantkit.sensitivity.search import SearchOptions, sensitivity_search
import sys
from quantkit.pipeline.onload import build_skeleton, config_dtype
from quantkit.pipeline.rotated_source import check_rotation
from quantkit.arch.lookup import arch_for
from quantkit.arch.meta import auto_class
from quantkit.workflows.data_parallel import check_data_parallel
from quantkit.pipeline.fold_coverage import check_fold_coverage

if TYPE_CHECKING:
    from quantkit.sensitivity.search import SearchOptions

_logger = logging.getLogger("quantkit")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


@dataclass
class QuantizedModel:
    """A finished checkpoint in a staging folder; ``save`` moves it into place."""

    result: PipelineResult
    recipe: Recipe
    _saved: Path | None = None
    warnings: list[str] = field(default_factory=list)  # also in quantization_log.json
    out: Path | None = None       # the folder given to quantize(out=...): save()'s default
    inputs: dict[str, Any] = field(default_factory=dict)   # what save() never writes over (outputs.py)

    @property
    def path(self) -> Path:
        return self._saved or self.result.path

    def save(self, out: str | Path | None = None, overwrite: bool = False) -> Path:
        out = out if out is not None else self.out
        if out is None:
            raise QuantkitError("save: no output folder (pass one, or out= to quantize)")
        if self._saved is not None:
            raise QuantkitError(f"{out}: already saved to {self._saved}")
        if not distributed.is_writer():
            raise QuantkitError(f"save: rank {distributed.rank()} of a data-parallel conversion writes nothing; rank 0 saves")
        self._saved = move_into_place(self.result.path, Path(out), overwrite, OutputPolicy("convert", self.inputs))
        return self._saved

    def load(self, backend: str | None = None):

        return load(self.path, backend=backend)

    def summary(self) -> dict[str, Any]:
        r = self.result
        return {
            "layers": r.num_layers, "quantized_modules": r.num_quantized, "formats": r.formats,
            "bytes_before": r.bytes_before, "bytes_after": r.bytes_after, "ratio": round(r.ratio, 3),
            "seconds": round(r.seconds, 2), "peak_rss_bytes": r.peak_rss_bytes,
        }

    def __del__(self):
        if self._saved is None and self.result.path.exists():
            shutil.rmtree(self.result.path, ignore_errors=True)


def resolve_model(model: "str | Path | nn.Module | None", trust_remote_code: bool = False):
    """``(config, source, folder)`` for a folder, an in-memory model or the embedded default."""
    from transformers import AutoConfig

    if model is None:

        model = default_model_dir()
    if isinstance(model, nn.Module):
        config = model.config
        if not getattr(config, "architectures", None):  # a model built in memory, never saved
            config.architectures = [type(model).__name__]
        folder = _as_dir(getattr(model, "name_or_path", "") or "")
        return config, StateDictSource(per_expert_state(model.state_dict(), config), folder), folder
    folder = Path(model)
    if not folder.exists():
        raise QuantkitError(f"{folder}: model folder not found (hub downloads are not supported; pass a local folder)")
    source = SafetensorsSource(folder)
    qc = read_config_json(folder).get("quantization_config")
    if qc is not None and source.quantized is None:
        kind = qc.get("format") or qc.get("quant_method") if isinstance(qc, dict) else None
        raise QuantkitError(f"{folder}: already quantized (config.json has a quantization_config"
                            f"{f', {kind}' if kind else ''}); pass the original unquantized model (quantkit "
                            "reads FP8 block-scale and gpt-oss MXFP4 sources only)")
    try:
        config = AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code)
    except (ValueError, OSError) as e:
        raise QuantkitError(f"{folder / 'config.json'}: {str(e).splitlines()[0]}") from None
    return config, source, folder


def _as_dir(p) -> Path | None:
    """The folder a model names, if it is one. An empty name (a model built in memory) is none:
    ``Path("")`` is the working directory, whose files are not the model's."""
    if isinstance(p, str) and not p.strip():
        return None
    try:
        p = Path(p)
        return p if p.is_dir() else None
    except TypeError:
        return None


def resolve_calibration(source: "str | Path | Sequence | None", recipe: Recipe, tokenizer_dir: Path | None,
                        warn: Callable[[str], None] | None = None, record: dict | None = None):
    """Token-id samples for the pipeline from a path, a list of texts, token lists, or the default.

    ``warn`` receives what the calibration reader reports (rows skipped, fewer samples);
    ``record`` what a log or sampler folder's draw holds (``load_calibration``)."""
    settings = recipe.calibration
    if source is None:
        source = settings.dataset
    if source is not None and not isinstance(source, (str, Path)):
        items = list(source)
        if items and isinstance(items[0], str):
            tok = _tokenizer(tokenizer_dir)
            return [tok(t, truncation=True, max_length=settings.max_seq_len)["input_ids"] for t in items[: settings.num_samples]]
        return [list(map(int, x))[: settings.max_seq_len] for x in items[: settings.num_samples]]
    tok = _tokenizer(tokenizer_dir)

    return load_calibration(source, tok, settings.num_samples, settings.max_seq_len, settings.seed, warn=warn,
                            policy=settings.policy, record=record)


def check_calibration_size(recipe: Recipe, config) -> None:
    """Refuse, before any work, calibration settings no run could hold: ``max_seq_len`` above
    the model's ``max_position_embeddings`` (when its config has one), or one layer's
    calibration activations (``num_samples * max_seq_len * hidden_size * 4`` bytes, float32)
    larger than the memory available now (``calibration.offload`` keeps them on disk instead:
    then only the length is checked)."""

    c = recipe.calibration
    limit = getattr(config, "max_position_embeddings", None)
    # the default length is a cap on rows, not a request: a short-context model calibrates on
    # whatever its rows hold; a length the user set above the model's is a mistake
    chosen = c.max_seq_len != CalibrationSettings().max_seq_len
    if isinstance(limit, int) and chosen and c.max_seq_len > limit:
        raise QuantkitError(f"calibration.max_seq_len (or --max-seq-len): {c.max_seq_len} is above the model's "
                            f"max_position_embeddings {limit} (the limit)")
    hidden = getattr(config, "hidden_size", None)
    if c.offload or not isinstance(hidden, int):
        return
    need, free = c.num_samples * c.max_seq_len * hidden * 4, available_memory()
    if need > free:
        raise QuantkitError(f"calibration.num_samples x calibration.max_seq_len (or --num-samples x --max-seq-len): "
                            f"{c.num_samples} x {c.max_seq_len} tokens need {need} bytes of activations per layer "
                            f"(x hidden_size {hidden} x 4), above the {free} bytes available (the limit)")


def _tokenizer(folder: Path | None):
    from transformers import AutoTokenizer

    if folder is None:
        raise QuantkitError("calibration: text samples need the model's tokenizer (no model folder known)")
    if not any((folder / f).exists() for f in TOKENIZER_FILES):
        raise QuantkitError(f"{folder}: no tokenizer files ({', '.join(TOKENIZER_FILES)}), needed to "
                            "tokenise the calibration text")
    try:
        return AutoTokenizer.from_pretrained(folder)
    except (OSError, ValueError) as e:
        raise QuantkitError(f"{folder}: cannot load the tokenizer ({str(e).splitlines()[0]})") from None


def conversion_inputs(model: "str | Path | nn.Module | None", recipe: Recipe,
                      recipe_arg: "str | Path | Recipe | dict | None" = None,
                      calibration: "str | Path | Sequence | None" = None) -> dict[str, Path | None]:
    """What a conversion reads from disk, by role: its output may overlap none of them (outputs.py).
    The embedded default model's folder is the cache's (``QUANTKIT_CACHE``)."""

    folder = cache_dir() if model is None else existing_path(model)
    if isinstance(model, nn.Module):
        folder = _as_dir(getattr(model, "name_or_path", "") or "")
    return {"model folder": folder, "recipe": existing_path(recipe_arg),
            "calibration data": existing_path(calibration) or existing_path(recipe.calibration.dataset),
            "sensitivity file": existing_path(recipe.mixed.sensitivity) if recipe.mixed is not None else None}


class ConversionInterrupted(KeyboardInterrupt):
    """A resumable run stopped by SIGINT (or SIGTERM, which the CLI turns into it): its staging
    folder is kept, and the same call with ``resume=True`` continues it."""

    def __init__(self, folder: Path, layers_done: int, num_layers: int):
        super().__init__(f"interrupted after {layers_done} of {num_layers} layers; staging folder {folder} kept")
        self.folder, self.layers_done, self.num_layers = folder, layers_done, num_layers


@dataclass(frozen=True)
class ConvertOptions:
    """How ``quantize`` runs, beside what it converts (the model, the recipe, the calibration data).

    ``ignore``: more modules kept in high precision (names or ``re:`` patterns, as ``--ignore``);
    each must match a Linear module. ``workdir``: where the staging folder goes (default: beside
    ``out``, else the system's temporary folder). ``out``: the folder the checkpoint is for
    (``save()``'s default); with it each finished layer is recorded, and ``resume=True`` continues
    a killed run of ``out``. ``device``: where the per-layer work runs (``cpu``, ``cuda``,
    ``cuda:N``). ``progress(iterable, total)`` wraps the layer loop; ``log`` receives progress and
    ``warning: ...`` lines (without it, warnings go to the ``quantkit`` logger). ``lang``: the
    language of the model card's words, ``en`` or ``zh`` (as ``--lang``).

    >>> ConvertOptions(ignore=["lm_head"], device="cpu").ignore
    ('lm_head',)
    >>> ConvertOptions(ignore="lm_head")
    Traceback (most recent call last):
    quantkit.errors.QuantkitError: ignore: a list of module names or 're:' patterns, got the string 'lm_head'
    """

    ignore: Sequence[str] = ()
    workdir: str | Path | None = None
    out: str | Path | None = None
    resume: bool = False
    device: str = "cpu"
    progress: Callable | None = None
    log: Callable[[str], None] | None = None
    trust_remote_code: bool = False
    lang: str = "en"

    def __post_init__(self) -> None:
        if isinstance(self.ignore, str):
            raise QuantkitError(f"ignore: a list of module names or 're:' patterns, got the string {self.ignore!r}")
        object.__setattr__(self, "ignore", tuple(self.ignore))
        for key in ("resume", "trust_remote_code"):
            if not isinstance(getattr(self, key), bool):
                raise QuantkitError(f"{key}: must be true or false, got {getattr(self, key)!r}")
        check_device(self.device)
        check_lang(self.lang, "lang")


def quantize(model: "str | Path | nn.Module | None", recipe: "str | Path | Recipe | dict | None" = None,
             calibration: "str | Path | Sequence | None" = None,
             options: ConvertOptions | None = None) -> QuantizedModel:
    """Quantize a model layer by layer into a compressed-tensors checkpoint.

    ``model`` is a local Hugging Face folder, an in-memory transformers model, or ``None`` for the
    embedded default (SmolLM2-135M-Instruct). ``recipe`` is a Recipe, a YAML path, a shipped
    recipe name (``recipes/``) or a preset name. ``calibration`` is a path (sampler output
    folder, JSONL/CSV/Parquet log, text file), a list of texts or a list of token-id lists;
    it is used only when the recipe needs data. ``options``: how it runs (``ConvertOptions``).

    What does not stop the run but should be known (malformed calibration rows skipped under
    the limit, calibration given to a recipe that takes none, a recipe ``ignore`` entry that
    matches nothing) goes to ``options.log`` as a ``warning: ...`` line (to the ``quantkit``
    logger without one) and into ``quantization_log.json`` under ``warnings``.

    With ``options.out`` the staging folder goes beside it (or in ``workdir``) and records each
    finished layer, so that a killed run can be continued: the same call with ``resume=True``
    starts from its last complete layer and gives the bytes an uninterrupted run gives
    (``pipeline/resume.py``); when the model, recipe, calibration set or quantkit differ it
    starts afresh with a warning saying why. Dead runs' staging folders for ``out`` are removed
    (or continued), live ones never touched. Interrupted (KeyboardInterrupt) once a layer is
    done, it keeps the staging folder and raises ``ConversionInterrupted``; any other failure
    removes it.

    In a ``torch.distributed`` process group (``quantkit.common.distributed.initialize`` under
    torchrun) the calibration is data-parallel: each rank runs its share of the batches and
    the statistics are merged; rank 0 writes, the others' results cannot be saved.
    """
    options = options if options is not None else ConvertOptions()
    resolved = load_recipe(recipe)
    return convert(model, resolved, calibration, options, conversion_inputs(model, resolved, recipe, calibration))


def convert(model: "str | Path | nn.Module | None", recipe: Recipe, calibration: "str | Path | Sequence | None",
            options: ConvertOptions, inputs: dict[str, Path | None]) -> QuantizedModel:
    """``quantize`` for a recipe already resolved, and ``inputs`` (``conversion_inputs``): what the
    output may overlap none of, as the caller named them (the command line: the recipe file too)."""
    job = _Conversion(model, recipe.with_overrides(ignore=list(options.ignore)), calibration, options, inputs)
    _check_request(job)
    job.config, job.source, job.folder = resolve_model(model, options.trust_remote_code)
    kept = kept_patterns(job.config)   # e.g. Qwen2-MoE's shared-expert gates: never quantized
    if kept:
        job.recipe = job.recipe.with_overrides(ignore=kept)
    try:
        plan_source = _check_model(job)
        _resolve_samples(job, plan_source)
        _plan(job, plan_source)
        result = _write_checkpoint(job)
    finally:
        job.source.close()
    return QuantizedModel(result, job.recipe, warnings=job.warnings, out=job.out, inputs=inputs)


@dataclass
class _Conversion:
    """One conversion as it proceeds: the model resolved, the recipe as it will run, the data drawn."""

    model: Any
    recipe: Recipe
    calibration: Any
    options: ConvertOptions
    inputs: dict[str, Path | None]
    warnings: list[str] = field(default_factory=list)   # also in quantization_log.json
    config: Any = None
    source: Any = None
    folder: Path | None = None
    samples: list[list[int]] | None = None
    drawn: dict = field(default_factory=dict)   # the drawn set's source and content hashes, for the log
    planned: tuple | None = None                # a mixed recipe's (Sensitivity, Plan)

    @property
    def out(self) -> Path | None:
        return Path(self.options.out) if self.options.out is not None else None

    def warn(self, message: str) -> None:
        self.warnings.append(message)
        if self.options.log is not None:
            self.options.log(f"warning: {message}")
        else:
            _logger.warning(message)


def _check_request(job: _Conversion) -> None:
    """What the call asks for, before the model is read: the output, the ranks, the resume."""
    options = job.options
    if options.out is not None and distributed.is_writer():
        OutputPolicy("convert", job.inputs, flag="out").check(Path(options.out), overwrite=True)   # save() checks the rest
    if distributed.world_size() > 1:
        check_data_parallel(job.recipe, options.resume)
    if options.resume and options.out is None:
        raise QuantkitError("resume: needs out= (the output folder of the run to continue)")


def _check_model(job: _Conversion):
    """The checkpoint and the recipe against the model; a mixed recipe's plan source (its
    sensitivity data, or the candidates to search), else None."""
    config_file = str(job.folder / "config.json") if isinstance(job.source, SafetensorsSource) else "the model's config"
    check_checkpoint(job.config, job.source, config_file, job.warn)
    check_modules(job.config, job.recipe, job.options.ignore, job.warn)
    if job.recipe.mixed is None:
        _note_kept(job)
        return None

    return check_mixed(job.recipe, job.config)


def _resolve_samples(job: _Conversion, plan_source) -> None:
    """The calibration set, when the recipe needs one (a sensitivity search scores calibration
    text even for a recipe that takes none); otherwise a warning if one was given."""
    recipe = job.recipe
    searching = recipe.mixed is not None and isinstance(plan_source, list)
    if recipe.needs_calibration or searching:
        check_calibration_size(recipe, job.config)
        job.samples = resolve_calibration(job.calibration, recipe, job.folder, job.warn, record=job.drawn)
        kv = recipe.kv_cache
        if kv is not None and kv.long_rows:
            origin = job.calibration if job.calibration is not None else recipe.calibration.dataset
            job.samples = job.samples + long_rows(origin, kv.long_rows, kv.long_len, lambda: _tokenizer(job.folder),
                                                  job.warn)
    elif job.calibration is not None:
        job.warn(f"--calib: recipe '{recipe.name}' takes no calibration data (steps: "
                 f"{', '.join(s.name for s in recipe.steps)}; no static activation scales); not used")


def _plan(job: _Conversion, plan_source) -> None:
    """A mixed recipe's groups planned under its budget (the planned groups' widths checked)."""
    if job.recipe.mixed is None:
        return

    trust = job.options.trust_remote_code
    job.recipe, *planned = plan_recipe(job.recipe, job.config, plan_source, job.samples,
                                       lambda: _float_model_of(job.model, job.folder, trust),
                                       job.options.log or _logger.info)
    job.planned = tuple(planned)
    check_modules(job.config, job.recipe, (), lambda _: None, planned=True)   # the ignore entries were warned above
    _note_kept(job)


def _note_kept(job: _Conversion) -> None:
    """Say when a quantized source's linears are left unquantized (written dequantized)."""
    layout = getattr(job.source, "quantized", None)
    if layout is not None:
        note = kept_note(layout, job.recipe.groups, list(job.recipe.ignore), config_dtype(job.config),
                         str(job.folder / "config.json"))
        if note is not None:
            job.warn(note)


def _write_checkpoint(job: _Conversion) -> PipelineResult:
    """The layer loop into a staging folder, then the side files and the log beside its shards."""
    book, writer = _open_writer(job)
    options = job.options
    try:
        result = run_pipeline(job.config, job.source, job.recipe, job.samples, writer,
                              RunOptions(options.device, options.progress, options.log, job.warn, book))
        if not distributed.is_writer():
            writer.abort()
            return result
        copy_side_files(job.folder, writer.tmp)
        if job.planned:
            _write_plan(writer, *job.planned)
        _record_log(writer, job.warnings, job.drawn)
        write_card(writer.tmp, base_model_name(job.model, job.folder), options.lang)
        shutil.rmtree(writer.tmp / staging.RUN_DIR)   # the bookkeeping never reaches the checkpoint
    except KeyboardInterrupt:
        # several ranks are never resumed (check_data_parallel): nothing worth keeping
        if book is not None and book.layers_done > 0 and distributed.world_size() == 1:
            raise ConversionInterrupted(writer.tmp, book.layers_done, book.last.num_layers) from None
        writer.abort()
        raise
    except BaseException as e:
        writer.abort()
        if is_disk_full(e):   # the other writers (parked activations, resume records, JSON)
            raise disk_full_error(writer.tmp.parent, None, "writing the checkpoint") from None
        raise
    return result


def base_model_name(model, folder: Path | None) -> str:
    """What the model card names as the base model: the embedded default's Hugging Face id, else
    the id a folder's config.json was saved from, else the folder's name."""
    if model is None:
        return DEFAULT_MODEL_ID
    if folder is None:
        return type(model).__name__
    try:
        saved_from = str(read_config_json(folder).get("_name_or_path") or "")
    except QuantkitError:
        saved_from = ""
    looks_like_id = saved_from.count("/") == 1 and not saved_from.startswith((".", "/", "~"))
    return saved_from if looks_like_id else folder.name


def _open_writer(job: _Conversion) -> tuple[RunBook | None, ShardWriter]:
    """The staging folder's writer (with ``out``, one that records each layer for a resume); a
    data-parallel rank other than 0 computes with the others and writes nothing."""
    if not distributed.is_writer():
        return None, DiscardWriter()
    options, book = job.options, None
    workdir = Path(options.workdir) if options.workdir is not None else None
    if job.out is not None:
        book = open_run(workdir if workdir is not None else job.out.parent, job.out,
                        run_keys(job.recipe, job.config, job.source, job.samples, options.device), options.resume,
                        job.recipe.calibration.offload, say=options.log or _stderr, warn=job.warn)
        tmp = book.folder
    else:
        tmp = staging.make_folder(workdir if workdir is not None else Path(tempfile.gettempdir()))
    return book, ShardWriter(max_shard_size=job.recipe.output.max_shard_size, folder=tmp)


def sensitivity(model: "str | Path | nn.Module | None" = None, recipe: "str | Path | Recipe | dict | None" = None,
                calibration: "str | Path | Sequence | None" = None, *, candidates: "Sequence | None" = None,
                options: "SearchOptions | None" = None, log: Callable | None = None,
                trust_remote_code: bool = False):
    """Score every unit of the model's decoder layers in every candidate format (``Sensitivity``).

    The recipe says which linears are quantized and, through its one config group's weights,
    the range observer and activation order each candidate inherits; ``candidates`` are names
    from ``quantkit.sensitivity.CANDIDATES`` or ``{name, weights}`` mappings (default: all).
    ``options``: the tokens scored on, the labels, the exact measurements (``SearchOptions``).

    Example:
        >>> s = quantkit.sensitivity(None, "w4a16-g64-gptq")        # doctest: +SKIP
        >>> s.ranking("W4_G64")[:3]                                 # the most damaged units  # doctest: +SKIP
    """

    recipe = load_recipe(recipe)
    groups = list(recipe.groups.values())
    base = groups[0].weights if len(groups) == 1 else None
    cands = candidates_from(None if candidates is None else list(candidates), base, "candidates")
    config, source, folder = resolve_model(model, trust_remote_code)
    try:
        check_modules(config, recipe, (), lambda _: None)
        samples = resolve_calibration(calibration, recipe, folder)
    finally:
        source.close()
    return sensitivity_search(_float_model_of(model, folder, trust_remote_code), config, recipe, samples, cands,
                              options if options is not None else SearchOptions(), log=log)


def _write_plan(writer: ShardWriter, sens, plan) -> None:
    """The sensitivity data and the plan beside the checkpoint (another budget reuses the first)."""

    sens.save(writer.tmp / SENSITIVITY_FILE)
    plan.save(writer.tmp / PLAN_FILE)


def _float_model_of(model, folder: Path | None, trust_remote_code: bool) -> nn.Module:
    if isinstance(model, nn.Module):
        return model
    if folder is None:
        raise QuantkitError("mixed: the sensitivity search needs the model's folder or the model itself")
    return _float_model(folder, trust_remote_code)


def _float_model(folder: Path, trust_remote_code: bool) -> nn.Module:
    from transformers import AutoConfig

    if SafetensorsSource(folder).quantized is not None:   # FP8 blocks, MXFP4: read dequantized
        return load_dequantized(folder, torch.float32, trust_remote_code)
    cls = auto_class(AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code))
    return cls.from_pretrained(folder, dtype=torch.float32, trust_remote_code=trust_remote_code).eval()


def _stderr(line: str) -> None:

    print(line, file=sys.stderr)


def check_modules(config, recipe: Recipe, required: Sequence[str], warn: Callable[[str], None],
                  planned: bool = False) -> None:
    """What the recipe says about the model's Linear modules, checked before any data is read:
    no two config groups target one module equally specifically, each group size divides the
    width of the modules it quantizes, and each ``ignore`` entry
    keeps some module in high precision (one given in ``required``, ``--ignore``, fails when
    it matches none; one from the recipe warns)."""

    if any(step.name == "rotate" for step in recipe.steps):
        check_rotation(config, arch_for(config)[1], recipe)
    check_fold_coverage(*arch_for(config), recipe, warn)
    if recipe.kv_cache is not None and arch_for(config)[1].attention is None:
        raise QuantkitError(f"{recipe.origin}: kv_cache: {arch_for(config)[0]}: {arch_for(config)[1].kv_cache_blocked}")
    linears = {n: m for n, m in build_skeleton(config).named_modules() if isinstance(m, nn.Linear)}
    names = list(linears)
    quantized = 0
    inside = arch_for(config)[1].layers + "."
    for name, m in linears.items():
        if not name.startswith(inside):   # a vision tower's linears are written as read (in ignore)
            continue
        group = group_for(name, "Linear", recipe.groups, list(recipe.ignore), where=recipe.origin)
        s = recipe.groups[group] if group is not None else None
        if s is not None and s.weights is not None:
            s.weights.check_width(m.in_features, f"config_groups.{group}.weights ({name})", m.out_features)
            if s.input_activations is not None:
                s.input_activations.check_width(m.in_features, f"config_groups.{group}.input_activations ({name})")
            quantized += 1
    if names and not quantized and recipe.kv_cache is None and not planned:
        _nothing_quantized(recipe, names, required)
    for pattern in recipe.ignore:
        if pattern == "lm_head" or any(matches(n, "Linear", pattern) for n in names):
            continue
        like = f" (its Linear modules are named like '{names[0]}')" if names else ""
        if pattern in required:
            raise QuantkitError(f"--ignore: '{pattern}' matches no Linear module of the model{like}")
        warn(f"ignore: '{pattern}' matches no Linear module of the model, so it keeps nothing in high precision{like}")


def _nothing_quantized(recipe: Recipe, names: list[str], required: Sequence[str]) -> None:
    """A conversion that would quantize no Linear module writes an unquantized copy under a
    quantized name: refused, naming what kept everything in high precision."""
    ignore = [p for p in recipe.ignore if p != "lm_head"]
    culprit = ([f"--ignore '{p}'" for p in required if p in ignore]
               or [f"ignore: '{p}'" for p in ignore] or ["its config_groups' targets"])
    raise QuantkitError(f"{culprit[0]}: keeps all {len(names)} Linear modules of the model in high precision "
                        "(or none is targeted): nothing would be quantized")


def _record_log(writer: ShardWriter, warnings: list[str], drawn: dict) -> None:
    """The run's warnings, and the calibration set's source and content hashes (never its text:
    an evaluation's business slices leave those rows out, ``--calib-sample CHECKPOINT``)."""
    path = writer.tmp / "quantization_log.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    data["calibration"] = {**data["calibration"], **drawn}
    writer.write_json(path.name, {**data, "warnings": list(warnings)})
