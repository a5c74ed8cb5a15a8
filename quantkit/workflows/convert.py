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

from torch import nn

from quantkit.common import distributed
from quantkit.common.device import check_device
from quantkit.common.disk_space import disk_full_error, is_disk_full
from quantkit.errors import QuantkitError
from quantkit.arch.experts import kept_patterns
from quantkit.formats import staging
from quantkit.formats.writer import DiscardWriter, ShardWriter
from quantkit.kv_cache.long_rows import long_rows
from quantkit.common.outputs import OutputPolicy
from quantkit.pipeline import PipelineResult, RunOptions, run_pipeline
from quantkit.pipeline.layout import check_checkpoint
from quantkit.pipeline.resume import RunBook, open_run, run_keys
from quantkit.workflows.model_card import check_lang, write_card
from quantkit.recipe import Recipe, load_recipe
from quantkit.inputs.model_folder import copy_side_files
from quantkit.inputs.quantized import kept_note
from quantkit.inputs.source import SafetensorsSource
from quantkit.sensitivity.mixed import check_mixed, PLAN_FILE, plan_recipe, SENSITIVITY_FILE
import sys
from quantkit.pipeline.onload import config_dtype
from quantkit.workflows.data_parallel import check_data_parallel
from quantkit.workflows.measure_sensitivity import float_model_of
from quantkit.workflows.model_inputs import (base_model_name, check_calibration_size, conversion_inputs,
                                              resolve_calibration, resolve_model, tokenizer_of)
from quantkit.workflows.module_checks import check_modules
from quantkit.workflows.quantized_model import QuantizedModel

if TYPE_CHECKING:
    pass

_logger = logging.getLogger("quantkit")


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
            job.samples = job.samples + long_rows(origin, kv.long_rows, kv.long_len, lambda: tokenizer_of(job.folder),
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
                                       lambda: float_model_of(job.model, job.folder, trust),
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


def _write_plan(writer: ShardWriter, sens, plan) -> None:
    """The sensitivity data and the plan beside the checkpoint (another budget reuses the first)."""

    sens.save(writer.tmp / SENSITIVITY_FILE)
    plan.save(writer.tmp / PLAN_FILE)


def _stderr(line: str) -> None:

    print(line, file=sys.stderr)


def _record_log(writer: ShardWriter, warnings: list[str], drawn: dict) -> None:
    """The run's warnings, and the calibration set's source and content hashes (never its text:
    an evaluation's business slices leave those rows out, ``--calib-sample CHECKPOINT``)."""
    path = writer.tmp / "quantization_log.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    data["calibration"] = {**data["calibration"], **drawn}
    writer.write_json(path.name, {**data, "warnings": list(warnings)})
