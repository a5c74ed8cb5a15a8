"""Recipes: a YAML file (or preset name) -> a validated, typed ``Recipe``.

A recipe names the scheme (a preset or explicit ``config_groups``), the modules kept in
high precision, the algorithm and its options, and the calibration settings. Unknown keys
are rejected with their full path, e.g. ``recipes/x.yaml: algorithm: unknown key 'blocksize'``.

Example (``recipes/w4a16-g64.yaml``)::

    version: 1
    scheme: W4A16
    group_size: 64
    ignore: [lm_head]
    algorithm: {name: rtn}
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from .errors import QuantkitError
from .scheme import QuantScheme, preset, with_group_size

RECIPE_VERSION = 1
RECIPES_DIR = Path(__file__).resolve().parent.parent / "recipes"
_TOP_KEYS = {"version", "name", "description", "scheme", "group_size", "config_groups", "ignore",
             "algorithm", "calibration", "output", "eval"}


@dataclass(frozen=True)
class CalibrationSettings:
    num_samples: int = 128
    max_seq_len: int = 512
    seed: int = 0
    dataset: str | None = None  # a path; None: the embedded default sample
    # Calibration tokens run through a layer in one call (samples packed into rows). None:
    # as many as fit a quarter of the free memory, normally all of them (one pass per layer).
    batch_tokens: int | None = None
    # Keep the calibration hidden states in files next to the output between layers (only
    # the batch being run is in memory): for models whose activations do not fit.
    offload: bool = False

    def __post_init__(self):
        if not isinstance(self.offload, bool):
            raise QuantkitError(f"calibration.offload: must be true or false, got {self.offload!r}")
        if self.batch_tokens is not None and (isinstance(self.batch_tokens, bool)
                                              or not isinstance(self.batch_tokens, int) or self.batch_tokens < 1):
            raise QuantkitError(f"calibration.batch_tokens: must be a positive integer or null, got {self.batch_tokens!r}")
        if self.num_samples < 1:
            raise QuantkitError(f"calibration.num_samples: must be >= 1, got {self.num_samples}")
        if self.max_seq_len < 8:
            raise QuantkitError(f"calibration.max_seq_len: must be >= 8, got {self.max_seq_len}")


@dataclass(frozen=True)
class OutputSettings:
    max_shard_size: int = 2 * 1024**3  # bytes

    def __post_init__(self):
        if self.max_shard_size < 1024:
            raise QuantkitError(f"output.max_shard_size: too small ({self.max_shard_size} bytes)")


@dataclass(frozen=True)
class Recipe:
    groups: dict[str, QuantScheme]
    ignore: tuple[str, ...] = ("lm_head",)
    algorithm: str = "rtn"
    algorithm_options: dict[str, Any] = field(default_factory=dict)
    calibration: CalibrationSettings = CalibrationSettings()
    output: OutputSettings = OutputSettings()
    eval: dict[str, Any] = field(default_factory=dict)
    name: str = "custom"

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "recipe") -> "Recipe":
        if not isinstance(d, Mapping):
            raise QuantkitError(f"{where}: expected a mapping at the top level")
        unknown = sorted(set(d) - _TOP_KEYS)
        if unknown:
            raise QuantkitError(f"{where}: unknown key '{unknown[0]}' (allowed: {', '.join(sorted(_TOP_KEYS))})")
        version = d.get("version", RECIPE_VERSION)
        if version != RECIPE_VERSION:
            raise QuantkitError(f"{where}: version: unsupported recipe version {version!r} (this quantkit reads {RECIPE_VERSION})")
        try:
            groups = _groups(d)
            ignore = d.get("ignore", ["lm_head"])
            if isinstance(ignore, str) or not all(isinstance(x, str) for x in ignore):
                raise QuantkitError("ignore: expected a list of module names or 're:' patterns")
            algo = d.get("algorithm", "rtn")
            if isinstance(algo, str):
                algo = {"name": algo}
            if not isinstance(algo, Mapping) or "name" not in algo:
                raise QuantkitError("algorithm: expected a name or a mapping with 'name'")
            options = {k: v for k, v in algo.items() if k != "name"}
            from .algorithms import build_algorithm

            build_algorithm(algo["name"], options)  # validates option keys now, not mid-run
            calib = _section(CalibrationSettings, d.get("calibration"), "calibration")
            output = _section(OutputSettings, d.get("output"), "output")
            ev = d.get("eval") or {}
            if not isinstance(ev, Mapping):
                raise QuantkitError("eval: expected a mapping")
            from .evaluation.section import check_eval_section

            ev = check_eval_section(ev)  # keys, thresholds, languages: fail before converting
        except QuantkitError as e:
            raise QuantkitError(f"{where}: {e}") from None
        ignore = tuple(ignore)
        if "lm_head" not in ignore:
            ignore = ignore + ("lm_head",)
        return cls(groups, ignore, algo["name"], options, calib, output, dict(ev), str(d.get("name", "custom")))

    @classmethod
    def from_file(cls, path: str | Path) -> "Recipe":
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
            data = yaml.safe_load(text)
        except FileNotFoundError:
            raise QuantkitError(f"{path}: recipe file not found") from None
        except (yaml.YAMLError, UnicodeDecodeError) as e:
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise QuantkitError(f"{path}: not valid YAML ({first})") from None
        d = dict(data or {})
        d.setdefault("name", path.stem)
        return cls.from_dict(d, where=str(path))

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": RECIPE_VERSION,
            "name": self.name,
            "config_groups": {n: _scheme_yaml(s) for n, s in self.groups.items()},
            "ignore": list(self.ignore),
            "algorithm": {"name": self.algorithm, **self.algorithm_options},
            "calibration": dataclasses.asdict(self.calibration),
            "output": dataclasses.asdict(self.output),
            "eval": dict(self.eval),
        }

    def with_overrides(self, group_size: int | None = None, ignore: list[str] | None = None,
                       num_samples: int | None = None, max_seq_len: int | None = None,
                       dataset: str | None = None) -> "Recipe":
        r = self
        if group_size is not None:
            groups = {}
            for n, s in r.groups.items():
                if s.weights is None or s.weights.type != "int" or s.input_activations is not None:
                    raise QuantkitError(f"--group-size: config_groups.{n} is not a weight-only int scheme")
                groups[n] = with_group_size(s, group_size)
            r = dataclasses.replace(r, groups=groups)
        if ignore:
            r = dataclasses.replace(r, ignore=tuple(dict.fromkeys(r.ignore + tuple(ignore))))
        calib = {}
        if num_samples is not None:
            calib["num_samples"] = num_samples
        if max_seq_len is not None:
            calib["max_seq_len"] = max_seq_len
        if dataset is not None:
            calib["dataset"] = dataset
        if calib:
            r = dataclasses.replace(r, calibration=dataclasses.replace(r.calibration, **calib))
        return r

    @property
    def needs_calibration(self) -> bool:
        from .algorithms import ALGORITHMS, ensure_registered

        ensure_registered()
        static_acts = any(s.input_activations is not None and not s.input_activations.dynamic for s in self.groups.values())
        return ALGORITHMS[self.algorithm].requires_calibration or static_acts


def _section(cls, value, key):
    if value is None:
        return cls()
    if not isinstance(value, Mapping):
        raise QuantkitError(f"{key}: expected a mapping")
    allowed = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise QuantkitError(f"{key}: unknown key '{unknown[0]}' (allowed: {', '.join(sorted(allowed))})")
    value = dict(value)
    if key == "output" and isinstance(value.get("max_shard_size"), str):
        value["max_shard_size"] = parse_size(value["max_shard_size"], "output.max_shard_size")
    for f in dataclasses.fields(cls):
        if f.name in value and value[f.name] is not None and f.type in ("int", int) and not isinstance(value[f.name], int):
            raise QuantkitError(f"{key}.{f.name}: expected an integer, got {value[f.name]!r}")
    return cls(**value)


def _groups(d: Mapping[str, Any]) -> dict[str, QuantScheme]:
    has_scheme, has_groups = "scheme" in d, "config_groups" in d
    if has_scheme == has_groups:
        raise QuantkitError("scheme: give exactly one of 'scheme' (a preset name or mapping) and 'config_groups'")
    if has_scheme:
        s = d["scheme"]
        scheme = preset(s) if isinstance(s, str) else QuantScheme.from_dict(s, "scheme")
        if d.get("group_size") is not None:
            if scheme.weights is None or scheme.weights.type != "int":
                raise QuantkitError("group_size: only int weight schemes take a group size")
            scheme = with_group_size(scheme, d["group_size"])
        return {"group_0": scheme}
    if "group_size" in d:
        raise QuantkitError("group_size: set it inside config_groups.<name>.weights")
    cg = d["config_groups"]
    if not isinstance(cg, Mapping) or not cg:
        raise QuantkitError("config_groups: expected a non-empty mapping")
    return {str(n): QuantScheme.from_dict(g, f"config_groups.{n}") for n, g in cg.items()}


def _scheme_yaml(s: QuantScheme) -> dict[str, Any]:
    out: dict[str, Any] = {"targets": list(s.targets)}
    for key in ("weights", "input_activations"):
        a = getattr(s, key)
        if a is not None:
            out[key] = {k: v for k, v in dataclasses.asdict(a).items() if v is not None}
    return out


def parse_size(text: str, where: str) -> int:
    units = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
    t = text.strip().upper().replace(" ", "")
    num = t.rstrip("KMGIB")
    unit = t[len(num):]
    try:
        return int(float(num) * units[unit])
    except (ValueError, KeyError):
        raise QuantkitError(f"{where}: cannot read size {text!r} (e.g. '2GB', '500MiB')") from None


def load_recipe(recipe: "str | Path | Recipe | Mapping | None") -> Recipe:
    """A recipe from a ``Recipe``, a mapping, a YAML path, a shipped recipe name or a preset name."""
    if isinstance(recipe, Recipe):
        return recipe
    if recipe is None:
        recipe = "w4a16-g64"
    if isinstance(recipe, Mapping):
        return Recipe.from_dict(recipe)
    text = str(recipe)
    path = Path(text)
    if path.suffix in (".yaml", ".yml") or path.exists():
        return Recipe.from_file(path)
    shipped = RECIPES_DIR / f"{text.lower()}.yaml"
    if shipped.exists():
        return Recipe.from_file(shipped)
    from .scheme import PRESETS

    if text.upper() in PRESETS:
        return Recipe.from_dict({"scheme": text.upper(), "name": text.lower()})
    known = sorted(p.stem for p in RECIPES_DIR.glob("*.yaml")) if RECIPES_DIR.exists() else []
    raise QuantkitError(f"--recipe: no recipe file, shipped recipe or preset named '{text}' (shipped: {', '.join(known)}; presets: {', '.join(PRESETS)})")
