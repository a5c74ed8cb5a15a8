"""The Python API's sensitivity: every unit of the decoder scored in every candidate format."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch
from torch import nn

from quantkit.arch.meta import auto_class
from quantkit.common.outputs import OutputPolicy
from quantkit.config.mixed_section import MixedSettings
from quantkit.config.validation import check_flag
from quantkit.errors import QuantkitError
from quantkit.inputs.source import SafetensorsSource
from quantkit.recipe import Recipe, load_recipe
from quantkit.runtime.dequantized import load_dequantized
from quantkit.sensitivity import candidates_from
from quantkit.sensitivity.data import Sensitivity
from quantkit.sensitivity.search import SearchOptions, sensitivity_search
from quantkit.workflows.model_inputs import conversion_inputs, resolve_calibration, resolve_model
from quantkit.workflows.module_checks import check_modules


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
    return sensitivity_search(float_model_of(model, folder, trust_remote_code), config, recipe, samples, cands,
                              options if options is not None else SearchOptions(), log=log)


def float_model_of(model, folder: Path | None, trust_remote_code: bool) -> nn.Module:
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


@dataclass(frozen=True)
class SensitivityRequest:
    """What ``quantkit sensitivity`` is asked (each field is the flag of its name)."""

    model: str | None = None
    recipe: str = "w4a16-g64"
    calib: str | None = None
    candidates: tuple[str, ...] | None = None
    tokens: int | None = None           # None: the mixed: key's default
    exact_units: int = 0
    out: Path | None = None             # where sensitivity.json goes (None: not written)
    overwrite: bool = False


def measure_sensitivity(request: SensitivityRequest, log: Callable[[str], None] = print) -> tuple[Sensitivity, Path | None]:
    """``quantkit sensitivity`` whole: the flags checked, the search, the file written when asked."""
    tokens = MixedSettings().tokens if request.tokens is None else request.tokens
    check_flag(MixedSettings, "tokens", tokens, "--tokens")
    out = request.out
    if out is not None and not out.parent.is_dir():
        raise QuantkitError(f"--out: {out.parent} is not a folder")
    r = load_recipe(request.recipe)
    policy = None
    if out is not None:
        policy = OutputPolicy("sensitivity", conversion_inputs(request.model, r, request.recipe, request.calib))
        policy.check(out, request.overwrite, is_file=True)
    s = sensitivity(request.model, r, request.calib,
                    candidates=None if request.candidates is None else list(request.candidates),
                    options=SearchOptions(tokens, exact_units=request.exact_units), log=log)
    return s, (s.save(out, request.overwrite, policy) if out is not None else None)
