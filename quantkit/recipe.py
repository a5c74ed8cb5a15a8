"""Recipes: a YAML file (or preset name) -> a validated, typed ``Recipe``.

A recipe names the scheme (a preset or explicit ``config_groups``), the modules kept in
high precision, the chain of layer steps with their options, and the calibration settings.
Every key is checked before any work starts (``quantkit/config/validation.py``); a bad one fails
with one line naming the file and the key path, e.g.
``recipes/x.yaml: steps[1].gptq: unknown key 'blocksize'``.

Example (``recipes/w4a16-g64.yaml``)::

    version: 1
    scheme: W4A16
    group_size: 64
    ignore: [lm_head]
    steps:
      - smoothquant: {alpha: 0.5}    # transforms first, each a mapping {name: options}
      - gptq                         # the quantizer last; a bare name takes the defaults

``algorithm: gptq`` (or ``algorithm: {name: gptq, block_size: 128}``) is the one-step form.
A chain without a quantizer ends with RTN.

The ``eval:`` section belongs to the evaluation package: the entry points pass its checker
(``load_recipe(path, check_eval=...)``), so this module never imports that package.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any, Callable, Mapping, NamedTuple

from pydantic import Field, StrictInt, StrictStr, field_validator, model_validator

from quantkit import quantizers, transforms  # noqa: F401  (importing them registers every step)
from quantkit.errors import QuantkitError
from quantkit.kv_cache import KVCacheScheme
from quantkit.config.safe_yaml import load_yaml_file
from quantkit.config.scheme import PRESETS, ModulePattern, QuantScheme, with_group_size
from quantkit.config.mixed_section import MixedSettings
from quantkit.config.run_settings import CalibrationSettings, OutputSettings
from quantkit.config.validation import build_options, check_flag, checked_options, config, invalid, parse, short, short_text
from quantkit.steps import ALGORITHMS

RECIPE_VERSION = 1
RECIPES_DIR = Path(__file__).resolve().parent.parent / "recipes"

#: Checks a recipe's ``eval:`` section: ``(section, "eval") -> section``, raising ``QuantkitError``.
EvalCheck = Callable[[Mapping[str, Any], str], Mapping[str, Any]]


@config
class StepSpec:
    """One step of a layer's chain: a registered step's name and its options.

    ``options`` holds the keys the recipe gave, validated against the step class's fields,
    as plain values (an integer given for a float field is a float here).
    """

    name: StrictStr
    options: dict[StrictStr, Any] = dataclasses.field(default_factory=dict)


@config
class Recipe:
    """A validated recipe. ``steps`` ends with the quantizer (RTN when the recipe names none).

    Example:
        >>> r = Recipe.from_dict({"scheme": "W4A16", "steps": ["gptq"]})
        >>> r.algorithm, r.steps[-1].options
        ('gptq', {})
    """

    groups: dict[StrictStr, QuantScheme]
    ignore: tuple[ModulePattern, ...] = ("lm_head",)
    steps: tuple[StepSpec, ...] = (StepSpec("rtn"),)
    calibration: CalibrationSettings = CalibrationSettings()
    output: OutputSettings = OutputSettings()
    eval: dict[StrictStr, Any] = dataclasses.field(default_factory=dict)
    name: StrictStr = "custom"
    kv_cache: KVCacheScheme | None = None  # FP8 KV-cache scales calibrated and written (kv_cache/)
    # where the recipe came from (its file), for errors found later against a model; not in to_dict
    origin: StrictStr = "recipe"
    # formats planned per module from measured sensitivity under a budget (quantkit/sensitivity/)
    mixed: MixedSettings | None = None

    @model_validator(mode="after")
    def _valid_chain(self) -> "Recipe":
        entries = [_Entry(s.name, s.options, f"steps[{i}]", f"steps[{i}].{s.name}", "step")
                   for i, s in enumerate(self.steps)]
        object.__setattr__(self, "steps", _chain(entries))  # frozen: set once, while validating
        return self

    # -- the quantizer, as before steps existed ------------------------------------------------
    @property
    def algorithm(self) -> str:
        """The quantizer's name (the chain's last step)."""
        return self.steps[-1].name

    @property
    def algorithm_options(self) -> dict[str, Any]:
        """The quantizer's options, as the recipe gave them."""
        return dict(self.steps[-1].options)

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "recipe", check_eval: EvalCheck | None = None) -> "Recipe":
        """A recipe from its mapping form; ``where`` (the file) starts every error line.

        ``check_eval`` checks the ``eval:`` section (the evaluation package's
        ``check_eval_section``); without it the section is only required to be a mapping.
        """
        try:
            f = parse(_RecipeFile, d)
            if f.scheme is not None:
                scheme = f.scheme if f.group_size is None else with_group_size(f.scheme, f.group_size)
                groups = {"group_0": scheme}
            else:
                groups = dict(f.config_groups)
            steps = _chain(_entries(f))
            ev = dict(f.eval or {})
            if check_eval is not None:
                ev = dict(check_eval(ev, "eval"))
        except QuantkitError as e:
            raise QuantkitError(f"{where}: {e}") from None
        ignore = tuple(f.ignore)
        if "lm_head" not in ignore:
            ignore = ignore + ("lm_head",)
        return cls(groups, ignore, steps, f.calibration or CalibrationSettings(), f.output or OutputSettings(),
                   ev, f.name or "custom", f.kv_cache, origin=where, mixed=f.mixed)

    @classmethod
    def from_file(cls, path: str | Path, check_eval: EvalCheck | None = None) -> "Recipe":
        path = Path(path)
        data = load_yaml_file(path, "recipe file")   # size, alias expansion and depth bounded
        if data is None:
            data = {}
        if isinstance(data, Mapping) and "name" not in data:
            data = {**data, "name": path.stem}
        return cls.from_dict(data, where=str(path), check_eval=check_eval)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": RECIPE_VERSION,
            "name": self.name,
            "config_groups": {n: _scheme_yaml(s) for n, s in self.groups.items()},
            "ignore": list(self.ignore),
            "steps": [{s.name: dict(s.options)} for s in self.steps],
            "calibration": dataclasses.asdict(self.calibration),
            "output": dataclasses.asdict(self.output),
            "eval": dict(self.eval),
            # only when set: the dict is the resume key, and recipes without it keep theirs
            **({"kv_cache": dataclasses.asdict(self.kv_cache)} if self.kv_cache is not None else {}),
            **({"mixed": _mixed_yaml(self.mixed)} if self.mixed is not None else {}),
        }

    def with_overrides(self, group_size: int | None = None, ignore: list[str] | None = None,
                       num_samples: int | None = None, max_seq_len: int | None = None,
                       dataset: str | None = None, budget_bits: float | None = None,
                       sensitivity: str | None = None, smallest_go: bool = False) -> "Recipe":
        r = self
        if budget_bits is not None or sensitivity is not None or smallest_go:
            mixed = {k: v for k, v in dataclasses.asdict(r.mixed).items() if v is not None} if r.mixed else {}
            if budget_bits is not None:
                mixed.pop("budget_bytes", None)
                mixed.pop("smallest_go", None)
                mixed["budget_bits"] = check_flag(MixedSettings, "budget_bits", budget_bits, "--budget")
            elif smallest_go:   # --budget go: the recipe's smallest_go settings, else the defaults
                mixed.pop("budget_bytes", None)
                mixed.pop("budget_bits", None)
                mixed.setdefault("smallest_go", {})
            if sensitivity is not None:
                mixed["sensitivity"] = sensitivity
            r = dataclasses.replace(r, mixed=parse(MixedSettings, mixed, "mixed"))
        if group_size is not None:
            groups = {}
            for n, s in r.groups.items():
                # weight-only int weights take any strategy's groups; with quantized activations only
                # weights already grouped (W4A8, W4AFP8): an int8 x int8 GEMM wants per-channel weights
                if s.weights is None or s.weights.type != "int" or (
                        s.input_activations is not None and s.weights.strategy != "group"):
                    raise QuantkitError(f"--group-size: config_groups.{n} has no int weights in groups "
                                        "(weight-only, or grouped as in W4A8 and W4AFP8)")
                try:
                    groups[n] = with_group_size(s, group_size)
                except QuantkitError as e:
                    raise QuantkitError(f"--group-size: {e}") from None
            r = dataclasses.replace(r, groups=groups)
        if ignore:
            patterns = tuple(parse(ModulePattern, p, "--ignore") for p in ignore)
            r = dataclasses.replace(r, ignore=tuple(dict.fromkeys(r.ignore + patterns)))
        calib = {}
        if num_samples is not None:
            calib["num_samples"] = num_samples
        if max_seq_len is not None:
            calib["max_seq_len"] = max_seq_len
        if dataset is not None:
            calib["dataset"] = dataset
        if calib:
            try:
                settings = dataclasses.replace(r.calibration, **calib)
            except QuantkitError as e:
                raise QuantkitError(f"calibration.{e}") from None
            r = dataclasses.replace(r, calibration=settings)
        return r

    @property
    def needs_calibration(self) -> bool:

        static_acts = any(s.input_activations is not None and s.input_activations.calibrated for s in self.groups.values())
        # imatrix_mse weighs each column by its mean squared input: calibration data for any quantizer
        weighted = any(s.weights is not None and s.weights.observer == "imatrix_mse" for s in self.groups.values())
        return static_acts or weighted or self.kv_cache is not None \
            or any(ALGORITHMS[s.name].requires_calibration for s in self.steps)


# -- the file's form -----------------------------------------------------------------------------
@config
class _RecipeFile:
    """What a recipe file may say; ``Recipe.from_dict`` resolves it into a ``Recipe``."""

    version: StrictInt = RECIPE_VERSION
    name: StrictStr | None = None
    description: StrictStr | None = None
    scheme: QuantScheme | None = None  # a preset name or a mapping
    group_size: Annotated[StrictInt, Field(gt=0)] | None = None
    config_groups: dict[StrictStr, QuantScheme] | None = None
    ignore: tuple[ModulePattern, ...] = ("lm_head",)
    algorithm: Any = None  # a name or {name: ..., options...}: read by _entries
    steps: list[Any] | None = None  # names or {name: options}: read by _entries
    calibration: CalibrationSettings | None = None
    output: OutputSettings | None = None
    eval: dict[StrictStr, Any] | None = None  # checked by the evaluation package
    kv_cache: KVCacheScheme | None = None
    mixed: MixedSettings | None = None

    @field_validator("scheme", mode="before")
    @classmethod
    def _preset(cls, value: Any) -> Any:
        if isinstance(value, str):
            if value.upper() not in PRESETS:
                raise invalid(f"unknown preset '{short_text(value)}' (known: {', '.join(PRESETS)})")
            return PRESETS[value.upper()]
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "_RecipeFile":
        if self.version != RECIPE_VERSION:
            raise invalid(f"unsupported recipe version {short(self.version)} (this quantkit reads {RECIPE_VERSION})",
                          "version")
        if (self.scheme is None) == (self.config_groups is None):
            raise invalid("give exactly one of 'scheme' (a preset name or mapping) and 'config_groups'", "scheme")
        if self.config_groups == {}:
            raise invalid("expected a non-empty mapping", "config_groups")
        if self.group_size is not None:
            if self.config_groups is not None:
                raise invalid("set it inside config_groups.<name>.weights", "group_size")
            w = self.scheme.weights
            if w is None or w.type != "int" or self.scheme.input_activations is not None:
                raise invalid("only weight-only int schemes take a group size", "group_size")
        if self.algorithm is not None and self.steps is not None:
            raise invalid("give 'steps' or 'algorithm', not both", "steps")
        return self


class _Entry(NamedTuple):
    """A step as the recipe wrote it, with the key paths its errors name."""

    name: Any
    options: Any
    at: str        # where an unknown name is reported
    options_at: str  # where its options' errors are reported
    noun: str      # "step", or "algorithm" for the one-step form


def _entries(f: _RecipeFile) -> list[_Entry]:
    if f.algorithm is not None:
        algo = {"name": f.algorithm} if isinstance(f.algorithm, str) else f.algorithm
        if not isinstance(algo, Mapping) or not isinstance(algo.get("name"), str):
            raise QuantkitError("algorithm: expected a name or a mapping with 'name'")
        options = {k: v for k, v in algo.items() if k != "name"}
        return [_Entry(algo["name"], options, "algorithm.name", "algorithm", "algorithm")]
    entries = []
    for i, step in enumerate(f.steps or []):
        at = f"steps[{i}]"
        if isinstance(step, str):
            name, options = step, None
        elif isinstance(step, Mapping) and len(step) == 1 and isinstance(next(iter(step)), str):
            (name, options), = step.items()
        else:
            raise QuantkitError(f"{at}: expected a step name or a mapping {{name: options}}, got {short(step)}")
        entries.append(_Entry(name, options, at, f"{at}.{short_text(name)}", "step"))
    return entries


def _chain(entries: list[_Entry]) -> tuple[StepSpec, ...]:
    """Validated steps: names registered, options checked, zero or more transforms then at
    most one quantizer, last; RTN appended when there is none."""

    steps: list[StepSpec] = []
    for e in entries:
        cls = ALGORITHMS.get(e.name)
        if cls is None:
            raise QuantkitError(f"{e.at}: unknown {e.noun} '{short_text(e.name)}' (known: {', '.join(sorted(ALGORITHMS))})")
        if e.options is not None and not isinstance(e.options, Mapping):
            raise QuantkitError(f"{e.options_at}: expected a mapping of options, got {short(e.options)}")
        values = checked_options(cls, e.options, e.options_at)
        build_options(cls, values, e.options_at)  # the step's own checks (ranges) run now, not mid-run
        steps.append(StepSpec(e.name, values))
    for e, step in zip(entries[1:], steps[1:]):
        if getattr(ALGORITHMS[step.name], "must_be_first", False):
            raise QuantkitError(f"{e.at}: '{step.name}' must be the first step (the other steps search on its result)")
    for e, step in zip(entries[:-1], steps[:-1]):
        if ALGORITHMS[step.name].kind == "quantizer":
            raise QuantkitError(f"{e.at}: '{step.name}' is a quantizer, so it must be the last step")
    if not steps or ALGORITHMS[steps[-1].name].kind != "quantizer":
        steps.append(StepSpec("rtn"))
    return tuple(steps)


def _scheme_yaml(s: QuantScheme) -> dict[str, Any]:
    out: dict[str, Any] = {"targets": list(s.targets)}
    for key in ("weights", "input_activations"):
        a = getattr(s, key)
        if a is not None:
            out[key] = {k: v for k, v in dataclasses.asdict(a).items() if v is not None}
    return out


def _mixed_yaml(m: MixedSettings) -> dict[str, Any]:
    out = {k: v for k, v in dataclasses.asdict(m).items() if v is not None and k != "candidates"}
    if m.candidates is not None:
        out["candidates"] = [{"name": c.name, "weights": None if c.weights is None else
                              {k: v for k, v in dataclasses.asdict(c.weights).items() if v is not None}}
                             for c in m.candidates]
    return out


def load_recipe(recipe: "str | Path | Recipe | Mapping | None", check_eval: EvalCheck | None = None) -> Recipe:
    """A recipe from a ``Recipe``, a mapping, a YAML path, a shipped recipe name or a preset name.

    ``check_eval`` also checks the ``eval:`` section (see ``Recipe.from_dict``).
    """
    if isinstance(recipe, Recipe):
        if check_eval is not None:
            try:
                check_eval(recipe.eval, "eval")
            except QuantkitError as e:
                raise QuantkitError(f"recipe {recipe.name}: {e}") from None
        return recipe
    if recipe is None:
        recipe = "w4a16-g64"
    if isinstance(recipe, Mapping):
        return Recipe.from_dict(recipe, check_eval=check_eval)
    text = str(recipe)
    path = Path(text)
    if path.suffix in (".yaml", ".yml") or path.exists():
        return Recipe.from_file(path, check_eval)
    shipped = RECIPES_DIR / f"{text.lower()}.yaml"
    if shipped.exists():
        return Recipe.from_file(shipped, check_eval)
    if text.upper() in PRESETS:
        return Recipe.from_dict({"scheme": text.upper(), "name": text.lower()})
    known = sorted(p.stem for p in RECIPES_DIR.glob("*.yaml")) if RECIPES_DIR.exists() else []
    raise QuantkitError(f"--recipe: no recipe file, shipped recipe or preset named '{short_text(text)}' (shipped: {', '.join(known)}; presets: {', '.join(PRESETS)})")
