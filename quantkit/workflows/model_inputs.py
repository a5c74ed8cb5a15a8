"""A conversion's inputs resolved: the model (a folder, a module, the embedded default), the
calibration samples, and what the output never writes over."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from torch import nn

from quantkit.arch.experts import per_expert_state
from quantkit.calibration import load_calibration
from quantkit.common.outputs import existing_path
from quantkit.errors import QuantkitError
from quantkit.inputs.model_folder import read_config_json
from quantkit.inputs.embedded_model import DEFAULT_MODEL_ID, cache_dir, default_model_dir
from quantkit.inputs.source import SafetensorsSource, StateDictSource
from quantkit.pipeline.memory import available_memory
from quantkit.config.run_settings import CalibrationSettings
from quantkit.recipe import Recipe

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


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
            tok = tokenizer_of(tokenizer_dir)
            return [tok(t, truncation=True, max_length=settings.max_seq_len)["input_ids"] for t in items[: settings.num_samples]]
        return [list(map(int, x))[: settings.max_seq_len] for x in items[: settings.num_samples]]
    tok = tokenizer_of(tokenizer_dir)

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


def tokenizer_of(folder: Path | None):
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
