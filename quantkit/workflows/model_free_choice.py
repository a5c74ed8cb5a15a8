"""Whether a conversion runs model-free, and why: the recipe needs no data, the user asked, or
transformers cannot build the folder's model; and the flags a model-free conversion refuses."""

from __future__ import annotations

from pathlib import Path

from quantkit.errors import QuantkitError
from quantkit.inputs.model_folder import read_config_json
from quantkit.recipe import Recipe


def data_free_refusal(recipe: Recipe) -> str | None:
    """Why ``recipe`` needs the model or calibration data (one line naming the step), or None."""
    for k, step in enumerate(recipe.steps):
        if step.name != "rtn":
            return (f"steps[{k}]: '{step.name}' needs the model's layers and calibration data; a model-free "
                    "conversion rounds to nearest only (drop --model-free)")
    for key, s in recipe.groups.items():
        if s.weights is not None and s.weights.observer == "imatrix_mse":
            return (f"config_groups.{key}.weights.observer: imatrix_mse weighs each column by its inputs, read "
                    "from calibration data; a model-free conversion has none (drop --model-free, or use mse)")
        if s.input_activations is not None and s.input_activations.calibrated:
            return (f"config_groups.{key}.input_activations: static scales are calibrated on data; a model-free "
                    "conversion takes dynamic activations only (drop --model-free)")
    if recipe.kv_cache is not None:
        return "kv_cache: KV-cache scales are calibrated on data; a model-free conversion has none (drop --model-free)"
    if recipe.mixed is not None:
        return "mixed: a mixed-precision plan is searched on data; a model-free conversion has none (drop --model-free)"
    return None


def model_path_refusal(folder: Path, trust_remote_code: bool = False) -> str | None:
    """Why transformers cannot build the folder's model (so the model path cannot convert it), or
    None when it can: its config unreadable, or no causal-LM class for its ``model_type``."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING, MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING

    read_config_json(folder)   # an empty or broken config.json is the user's to fix: one line, no fallback
    try:
        config = AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code)
    except (ValueError, OSError, KeyError) as e:
        return f"{folder / 'config.json'}: transformers cannot read it ({str(e).splitlines()[0]})"
    known = type(config) in MODEL_FOR_CAUSAL_LM_MAPPING or type(config) in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING
    if not known and not getattr(config, "auto_map", None):
        return f"{folder / 'config.json'}: transformers has no causal-LM class for model_type '{config.model_type}'"
    return None


#: ``model_free_reason``'s answer when the user asked for a model-free conversion.
ASKED = "asked"


def model_free_reason(model: "str | Path | None", recipe: Recipe, asked: bool, trust_remote_code: bool = False) -> str | None:
    """Whether a conversion runs model-free, and why: ``ASKED`` (``--model-free``: a recipe that
    needs data is refused, naming its step), the reason transformers cannot build the folder's
    model when the recipe needs no data, else None (the model path)."""
    refusal = data_free_refusal(recipe)
    if asked:
        if refusal is not None:
            raise QuantkitError(f"--model-free: {refusal}")
        return ASKED
    if refusal is not None or model is None or not Path(model).is_dir() or not (Path(model) / "config.json").is_file():
        return None
    return model_path_refusal(Path(model), trust_remote_code)


def check_flags(given: dict[str, bool]) -> None:
    """Refuse, naming it, a flag a model-free conversion cannot honour (it streams tensors on the
    CPU: no layers to resume from, no ranks, no data)."""
    for flag, on in given.items():
        if on:
            raise QuantkitError(f"{flag}: not with a model-free conversion (it streams the tensors on the CPU, "
                                "with no layers, ranks or data)")
