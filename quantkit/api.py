"""The Python API: ``quantize(model_or_path, recipe, calibration=None) -> QuantizedModel``.

Example:
    >>> import quantkit
    >>> q = quantkit.quantize("path/to/hf-model", "w4a16-g64")                        # doctest: +SKIP
    >>> q.save("out/model-w4a16")                                                    # doctest: +SKIP
    >>> model = quantkit.load("out/model-w4a16")                                     # doctest: +SKIP
    >>> q = quantkit.quantize("path/to/hf-model", "w4a16-gptq", "calib/", out="out/m", resume=True)  # doctest: +SKIP
    >>> q.save()                                       # continues a killed run of out/m, if any  # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import nn

from . import distributed
from .device import check_device
from .disk_space import disk_full_error, is_disk_full
from .errors import QuantkitError
from .experts import kept_patterns, per_expert_state
from .formats import staging
from .formats.compressed_tensors import group_for, matches
from .formats.writer import DiscardWriter, ShardWriter, move_into_place
from .kv_cache.long_rows import long_rows
from .outputs import OutputPolicy, existing_path
from .pipeline import PipelineResult, run_pipeline
from .pipeline.layout import check_checkpoint
from .pipeline.resume import RunBook, open_run, run_keys
from .recipe import CalibrationSettings, Recipe, load_recipe
from .sensitivity.settings import DEFAULT_TOKENS
from .model_folder import copy_side_files, read_config_json
from .source import SafetensorsSource, StateDictSource

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
        from .loader import load

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
        from .models import default_model_dir

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
    if qc is not None:
        kind = qc.get("format") or qc.get("quant_method") if isinstance(qc, dict) else None
        raise QuantkitError(f"{folder}: already quantized (config.json has a quantization_config"
                            f"{f', {kind}' if kind else ''}); pass the original unquantized model")
    try:
        config = AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code)
    except (ValueError, OSError) as e:
        raise QuantkitError(f"{folder / 'config.json'}: {str(e).splitlines()[0]}") from None
    return config, source, folder


def _as_dir(p) -> Path | None:
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
    from .calibration import load_calibration

    return load_calibration(source, tok, settings.num_samples, settings.max_seq_len, settings.seed, warn=warn,
                            policy=settings.policy, record=record)


def check_calibration_size(recipe: Recipe, config) -> None:
    """Refuse, before any work, calibration settings no run could hold: ``max_seq_len`` above
    the model's ``max_position_embeddings`` (when its config has one), or one layer's
    calibration activations (``num_samples * max_seq_len * hidden_size * 4`` bytes, float32)
    larger than the memory available now (``calibration.offload`` keeps them on disk instead:
    then only the length is checked)."""
    from .pipeline.memory import available_memory

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
    from .models import cache_dir

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


def quantize(model: "str | Path | nn.Module | None", recipe: "str | Path | Recipe | dict | None" = None,
             calibration: "str | Path | Sequence | None" = None, *, ignore: Sequence[str] = (),
             workdir: str | Path | None = None, out: str | Path | None = None, resume: bool = False,
             device: str = "cpu", progress: Callable | None = None,
             log: Callable | None = None, trust_remote_code: bool = False) -> QuantizedModel:
    """Quantize a model layer by layer into a compressed-tensors checkpoint.

    ``model`` is a local Hugging Face folder, an in-memory transformers model, or ``None`` for the
    embedded default (SmolLM2-135M-Instruct). ``recipe`` is a Recipe, a YAML path, a shipped
    recipe name (``recipes/``) or a preset name. ``calibration`` is a path (sampler output
    folder, JSONL/CSV/Parquet log, text file), a list of texts or a list of token-id lists;
    it is used only when the recipe needs data. ``ignore`` keeps more modules in high
    precision (names or ``re:`` patterns, as ``--ignore``): each must match a Linear module.

    What does not stop the run but should be known (malformed calibration rows skipped under
    the limit, calibration given to a recipe that takes none, a recipe ``ignore`` entry that
    matches nothing) goes to ``log`` as a ``warning: ...`` line (to the ``quantkit`` logger
    without one) and into ``quantization_log.json`` under ``warnings``.

    ``out``: the folder the checkpoint is for (``save()``'s default). The staging folder then
    goes beside it (or in ``workdir``) and records each finished layer, so that a killed run
    can be continued: the same call with ``resume=True`` starts from its last complete layer
    and gives the bytes an uninterrupted run gives (``pipeline/resume.py``); when the model,
    recipe, calibration set or quantkit differ it starts afresh with a warning saying why.
    Dead runs' staging folders for ``out`` are removed (or continued), live ones never touched.
    Interrupted (KeyboardInterrupt) once a layer is done, it keeps the staging folder and
    raises ``ConversionInterrupted``; any other failure removes it.

    In a ``torch.distributed`` process group (``quantkit.distributed.initialize`` under
    torchrun) the calibration is data-parallel: each rank runs its share of the batches and
    the statistics are merged; rank 0 writes, the others' results cannot be saved.
    """
    warnings: list[str] = []

    def warn(message: str) -> None:
        warnings.append(message)
        if log is not None:
            log(f"warning: {message}")
        else:
            _logger.warning(message)

    check_device(device)
    recipe_arg, recipe = recipe, load_recipe(recipe).with_overrides(ignore=list(ignore))
    inputs = conversion_inputs(model, recipe, recipe_arg, calibration)
    if out is not None and distributed.is_writer():
        OutputPolicy("convert", inputs, flag="out").check(Path(out), overwrite=True)   # save() checks the rest
    if distributed.world_size() > 1:
        distributed.check_data_parallel(recipe, resume)
    if resume and out is None:
        raise QuantkitError("resume: needs out= (the output folder of the run to continue)")
    config, source, folder = resolve_model(model, trust_remote_code)
    kept = kept_patterns(config)   # e.g. Qwen2-MoE's shared-expert gates: never quantized
    if kept:
        recipe = recipe.with_overrides(ignore=kept)
    try:
        config_file = str(folder / "config.json") if isinstance(source, SafetensorsSource) else "the model's config"
        check_checkpoint(config, source, config_file, warn)
        check_modules(config, recipe, ignore, warn)
        plan_source = None
        if recipe.mixed is not None:
            from .sensitivity.mixed import check_mixed, plan_recipe

            plan_source = check_mixed(recipe, config)
        samples = None
        drawn: dict = {}   # the drawn set's source and content hashes, for the checkpoint's log
        # a sensitivity search scores calibration text even for a recipe that takes none
        searching = recipe.mixed is not None and isinstance(plan_source, list)
        if recipe.needs_calibration or searching:
            check_calibration_size(recipe, config)
            samples = resolve_calibration(calibration, recipe, folder, warn, record=drawn)
            kv = recipe.kv_cache
            if kv is not None and kv.long_rows:
                origin = calibration if calibration is not None else recipe.calibration.dataset
                samples = samples + long_rows(origin, kv.long_rows, kv.long_len, lambda: _tokenizer(folder), warn)
        elif calibration is not None:
            warn(f"--calib: recipe '{recipe.name}' takes no calibration data (steps: "
                 f"{', '.join(s.name for s in recipe.steps)}; no static activation scales); not used")
        planned = None
        if recipe.mixed is not None:
            recipe, *planned = plan_recipe(recipe, config, plan_source, samples,
                                           lambda: _float_model_of(model, folder, trust_remote_code), log or _logger.info)
            check_modules(config, recipe, (), lambda _: None, planned=True)   # the planned groups' widths (warned once above)
        book: RunBook | None = None
        writes = distributed.is_writer()
        if not writes:
            tmp = None   # a data-parallel rank other than 0: it computes with the others, writes nothing
        elif out is not None:
            out = Path(out)
            book = open_run(Path(workdir) if workdir is not None else out.parent, out,
                            run_keys(recipe, config, source, samples, device), resume,
                            recipe.calibration.offload, say=log or _stderr, warn=warn)
            tmp = book.folder
        else:
            tmp = staging.make_folder(Path(workdir) if workdir is not None else Path(tempfile.gettempdir()))
        writer = ShardWriter(max_shard_size=recipe.output.max_shard_size, folder=tmp) if writes else DiscardWriter()
        try:
            result = run_pipeline(config, source, recipe, samples, writer, device=device, progress=progress, log=log,
                                  book=book, warn=warn)
            if not writes:
                writer.abort()
                return QuantizedModel(result, recipe, warnings=warnings, out=out, inputs=inputs)
            copy_side_files(folder, writer.tmp)
            if planned:
                _write_plan(writer, *planned)
            _record_log(writer, warnings, drawn)
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
    finally:
        source.close()
    return QuantizedModel(result, recipe, warnings=warnings, out=out, inputs=inputs)


def sensitivity(model: "str | Path | nn.Module | None" = None, recipe: "str | Path | Recipe | dict | None" = None,
                calibration: "str | Path | Sequence | None" = None, *, candidates: "Sequence | None" = None,
                tokens: int = DEFAULT_TOKENS, labels: str = "sampled", exact_units: int = 0,
                exact_candidates: "list[str] | None" = None, exact_tokens: int = 2048,
                log: Callable | None = None, trust_remote_code: bool = False):
    """Score every unit of the model's decoder layers in every candidate format (``Sensitivity``).

    The recipe says which linears are quantized and, through its one config group's weights,
    the range observer and activation order each candidate inherits; ``candidates`` are names
    from ``quantkit.sensitivity.CANDIDATES`` or ``{name, weights}`` mappings (default: all).

    Example:
        >>> s = quantkit.sensitivity(None, "w4a16-g64-gptq")        # doctest: +SKIP
        >>> s.ranking("W4_G64")[:3]                                 # the most damaged units  # doctest: +SKIP
    """
    from .sensitivity import candidates_from, sensitivity_search

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
                              tokens=tokens, labels=labels,
                              exact_units=exact_units, exact_candidates=exact_candidates,
                              exact_tokens=exact_tokens, log=log)


def _write_plan(writer: ShardWriter, sens, plan) -> None:
    """The sensitivity data and the plan beside the checkpoint (another budget reuses the first)."""
    from .sensitivity.mixed import PLAN_FILE, SENSITIVITY_FILE

    sens.save(writer.tmp / SENSITIVITY_FILE)
    plan.save(writer.tmp / PLAN_FILE)


def _float_model_of(model, folder: Path | None, trust_remote_code: bool) -> nn.Module:
    if isinstance(model, nn.Module):
        return model
    if folder is None:
        raise QuantkitError("mixed: the sensitivity search needs the model's folder or the model itself")
    return _float_model(folder, trust_remote_code)


def _float_model(folder: Path, trust_remote_code: bool) -> nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, trust_remote_code=trust_remote_code).eval()


def _stderr(line: str) -> None:
    import sys

    print(line, file=sys.stderr)


def check_modules(config, recipe: Recipe, required: Sequence[str], warn: Callable[[str], None],
                  planned: bool = False) -> None:
    """What the recipe says about the model's Linear modules, checked before any data is read:
    no two config groups target one module equally specifically, each group size divides the
    width of the modules it quantizes, and each ``ignore`` entry
    keeps some module in high precision (one given in ``required``, ``--ignore``, fails when
    it matches none; one from the recipe warns)."""
    from .pipeline.onload import build_skeleton

    linears = {n: m for n, m in build_skeleton(config).named_modules() if isinstance(m, nn.Linear)}
    names = list(linears)
    quantized = 0
    for name, m in linears.items():
        group = group_for(name, "Linear", recipe.groups, list(recipe.ignore), where=recipe.origin)
        s = recipe.groups[group] if group is not None else None
        if s is not None and s.weights is not None:
            s.weights.check_width(m.in_features, f"config_groups.{group}.weights ({name})")
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
