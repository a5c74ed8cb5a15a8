"""Every recipe key is checked before any work: one line naming the file and the key path."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from quantkit.steps import ALGORITHMS, Transform
from quantkit.errors import QuantkitError
from quantkit.recipe import Recipe, StepSpec
from quantkit.config.scheme import QuantArgs

# (id, recipe text, the key path and message the one line must carry)
BAD = [
    ("rotate-not-first", "scheme: W4A16\nsteps: [awq, rotate, rtn]\n",
     "steps[1]: 'rotate' must be the first step (the other steps search on its result)"),
    ("rotate-seed-2-64", "scheme: W4A16\nsteps: [{rotate: {seed: 18446744073709551616}}, rtn]\n",
     "steps[0].rotate.seed: must be in [0, 2^63), or null, got 18446744073709551616"),
    ("rotate-seed-negative", "scheme: W4A16\nsteps: [{rotate: {seed: -1}}, rtn]\n",
     "steps[0].rotate.seed: must be in [0, 2^63), or null, got -1"),
    ("int-9-bits", "config_groups:\n  group_0:\n    weights: {num_bits: 9, group_size: 32}\n",
     "config_groups.group_0.weights.num_bits: int quantization supports 2..8 bits, got 9"),
    ("block-without-structure", "scheme: {weights: {num_bits: 8, type: float, strategy: block}}\n",
     "scheme.weights.block_structure: strategy 'block' needs block_structure [rows, columns]"),
    ("mx-scales-on-int", "scheme: {weights: {num_bits: 4, group_size: 32, scale_dtype: torch.uint8}}\n",
     "scheme.weights.scale_dtype: E8M0 scales (torch.uint8) need float values in groups of 32 (MX)"),
    ("fp8-scales-outside-nvfp4", "scheme: {weights: {num_bits: 8, type: float, scale_dtype: torch.float8_e4m3fn}}\n",
     "scheme.weights.scale_dtype: FP8 (E4M3) scales under a global scale are NVFP4's"),
    ("e8m0-scales-on-nvfp4", "scheme: {weights: {num_bits: 4, type: float, group_size: 16, scale_dtype: torch.uint8}}\n",
     "scheme.weights.scale_dtype: NVFP4 scales are torch.float8_e4m3fn, got torch.uint8"),
    ("int-activation-groups", "scheme: {weights: {num_bits: 4, group_size: 32}, input_activations: "
     "{num_bits: 8, strategy: group, group_size: 32, dynamic: true}}\n",
     "scheme.input_activations.strategy: 'group' is not supported for activations"),
    ("symmetric-string", "config_groups:\n  group_0:\n    weights: {num_bits: 4, group_size: 32, symmetric: 'false'}\n",
     "config_groups.group_0.weights.symmetric: expected true or false, got 'false'"),
    ("num-bits-float", "config_groups:\n  group_0:\n    weights: {num_bits: 4.0, group_size: 32}\n",
     "config_groups.group_0.weights.num_bits: expected an integer, got 4.0"),
    ("group-size-bool", "config_groups:\n  group_0:\n    weights: {num_bits: 4, group_size: true}\n",
     "config_groups.group_0.weights.group_size: expected an integer, got True"),
    ("group-size-zero", "config_groups:\n  group_0:\n    weights: {num_bits: 4, group_size: 0}\n",
     "config_groups.group_0.weights.group_size: must be > 0, got 0"),
    ("group-size-negative", "config_groups:\n  group_0:\n    weights: {num_bits: 4, group_size: -64}\n",
     "config_groups.group_0.weights.group_size: must be > 0, got -64"),
    ("top-group-size-zero", "scheme: W4A16\ngroup_size: 0\n", "group_size: must be > 0, got 0"),
    ("unknown-step", "scheme: W4A16\nsteps: [magic]\n", "steps[0]: unknown step 'magic' (known: "),
    ("unknown-step-option", "scheme: W4A16\nsteps:\n  - awq\n  - gptq: {blocksize: 128}\n",
     "steps[1].gptq: unknown key 'blocksize'"),
    ("step-option-type", "scheme: W4A16\nsteps:\n  - gptq: {block_size: 1.5}\n",
     "steps[0].gptq.block_size: expected an integer, got 1.5"),
    ("step-own-check", "scheme: W4A16\nsteps:\n  - gptq: {block_size: 0}\n",
     "steps[0].gptq.block_size: must be a positive integer, got 0"),
    ("algorithm-and-steps", "scheme: W4A16\nalgorithm: gptq\nsteps: [gptq]\n",
     "steps: give 'steps' or 'algorithm', not both"),
    ("quantizer-not-last", "scheme: W4A16\nsteps: [gptq, rtn]\n",
     "steps[0]: 'gptq' is a quantizer, so it must be the last step"),
    ("algorithm-option", "scheme: W4A16\nalgorithm: {name: gptq, blocksize: 4}\n",
     "algorithm: unknown key 'blocksize'"),
    ("top-level-list", "- scheme\n- W4A16\n", "expected a mapping, got a list"),
]


def _recipe(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    return path


# -- the library ---------------------------------------------------------------------------------
@pytest.mark.parametrize("text,expected", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_from_dict_names_the_key_path(text, expected):
    with pytest.raises(QuantkitError) as e:
        Recipe.from_dict(yaml.safe_load(text), where="x.yaml")
    assert str(e.value).startswith(f"x.yaml: {expected}"), str(e.value)
    assert "\n" not in str(e.value)


def test_unknown_step_lists_the_known_ones():
    with pytest.raises(QuantkitError) as e:
        Recipe.from_dict({"scheme": "W4A16", "steps": ["gtpq"]})
    assert all(name in str(e.value) for name in ("gptq", "rtn"))


def test_recipe_path_that_is_a_folder(tmp_path):
    with pytest.raises(QuantkitError, match=f"^{tmp_path}: is a folder, not a recipe file$"):
        Recipe.from_file(tmp_path)


# A transform registered for these tests only: the option types the real transforms use.
@dataclass
class _Scale(Transform):
    alpha: float = 0.5
    steps: int = 4
    duo: bool = True
    floor: float | None = None
    ratios: list[float] | None = None
    load_from: str | None = None

    def __post_init__(self):
        if not 0 <= self.alpha <= 1:
            raise QuantkitError(f"alpha: must be in [0, 1], got {self.alpha}")

    def search(self, ctx):
        raise NotImplementedError

    def apply(self, ctx, result):
        raise NotImplementedError


@pytest.fixture
def scale(monkeypatch):
    monkeypatch.setattr(_Scale, "name", "scale")
    monkeypatch.setitem(ALGORITHMS, "scale", _Scale)
    return _Scale


@pytest.mark.parametrize("options,expected", [
    ({"alpha": 1}, {"alpha": 1.0}),                          # a float field takes an integer
    ({"ratios": [1, 0.5], "floor": None}, {"ratios": [1.0, 0.5], "floor": None}),
    ({"load_from": "out/x", "duo": False, "steps": 8}, {"load_from": "out/x", "duo": False, "steps": 8}),
])
def test_step_options_typed_from_the_fields(scale, options, expected):
    r = Recipe.from_dict({"scheme": "W4A16", "steps": [{"scale": options}]})
    assert r.steps[0] == StepSpec("scale", expected)
    assert type(r.steps[0].options.get("alpha", 0.0)) is float


@pytest.mark.parametrize("options,expected", [
    ({"steps": 2.0}, "steps[0].scale.steps: expected an integer, got 2.0"),
    ({"steps": True}, "steps[0].scale.steps: expected an integer, got True"),
    ({"duo": "no"}, "steps[0].scale.duo: expected true or false, got 'no'"),
    ({"alpha": True}, "steps[0].scale.alpha: expected a number, got True"),
    ({"alpha": "0.5"}, "steps[0].scale.alpha: expected a number, got '0.5'"),
    ({"floor": "x"}, "steps[0].scale.floor: expected a number, got 'x'"),
    ({"ratios": [0.5, "x"]}, "steps[0].scale.ratios[1]: expected a number, got 'x'"),
    ({"load_from": 3}, "steps[0].scale.load_from: expected a string, got 3"),
    ({"alfa": 0.5}, "steps[0].scale: unknown key 'alfa' (allowed: alpha, duo, floor, load_from, ratios, steps)"),
    ({"alpha": 2}, "steps[0].scale.alpha: must be in [0, 1], got 2.0"),   # the class's own check
])
def test_step_options_refused(scale, options, expected):
    with pytest.raises(QuantkitError) as e:
        Recipe.from_dict({"scheme": "W4A16", "steps": [{"scale": options}, "gptq"]}, where="x.yaml")
    assert str(e.value) == f"x.yaml: {expected}"


def test_chain_rules(scale):
    bare = Recipe.from_dict({"scheme": "W4A16", "steps": ["scale"]})
    assert [s.name for s in bare.steps] == ["scale", "rtn"]           # no quantizer: RTN appended
    assert bare.algorithm == "rtn" and bare.needs_calibration           # a transform needs data
    assert [s.name for s in Recipe.from_dict({"scheme": "W4A16", "steps": []}).steps] == ["rtn"]
    assert not Recipe.from_dict({"scheme": "W4A16"}).needs_calibration
    with pytest.raises(QuantkitError, match=r"steps\[0\]: 'gptq' is a quantizer"):
        Recipe.from_dict({"scheme": "W4A16", "steps": ["gptq", "scale"]})
    # built in code, the chain is checked the same way
    groups = bare.groups
    with pytest.raises(QuantkitError, match=r"steps\[0\]: 'rtn' is a quantizer"):
        Recipe(groups, steps=(StepSpec("rtn"), StepSpec("gptq")))
    assert Recipe(groups, steps=(StepSpec("scale", {"alpha": 1}),)).steps == (StepSpec("scale", {"alpha": 1.0}),
                                                                             StepSpec("rtn"))


def test_steps_round_trip(scale):
    r = Recipe.from_dict({"scheme": "W4A16", "group_size": 32,
                          "steps": [{"scale": {"alpha": 1, "ratios": [0.25]}}, {"gptq": {"block_size": 64}}]})
    d = r.to_dict()
    assert d["steps"] == [{"scale": {"alpha": 1.0, "ratios": [0.25]}}, {"gptq": {"block_size": 64}}]
    again = Recipe.from_dict(yaml.safe_load(yaml.safe_dump(d)))
    assert again == r
    assert again.algorithm == "gptq" and again.algorithm_options == {"block_size": 64}


def test_algorithm_is_a_one_step_chain():
    one = Recipe.from_dict({"scheme": "W4A16", "algorithm": {"name": "gptq"}})
    assert one == Recipe.from_dict({"scheme": "W4A16", "steps": ["gptq"]})
    assert one == Recipe.from_dict({"scheme": "W4A16", "algorithm": "gptq"})
    assert one.steps == (StepSpec("gptq"),) and one.algorithm == "gptq"
    opts = Recipe.from_dict({"scheme": "W4A16", "algorithm": {"name": "gptq", "block_size": 64}})
    assert opts == Recipe.from_dict({"scheme": "W4A16", "steps": [{"gptq": {"block_size": 64}}]})
    assert opts.algorithm_options == {"block_size": 64}
    assert Recipe.from_dict({"scheme": "W4A16"}).algorithm == "rtn"


def test_schemes_stay_hashable_and_identical():
    r = Recipe.from_dict({"scheme": "W4A16", "group_size": 32})
    s = r.groups["group_0"]
    assert {s.weights: 1}[QuantArgs(num_bits=4, group_size=32)] == 1   # equal args, equal hash
    assert dataclasses.replace(r, ignore=("x",)).groups["group_0"] is s  # the pipeline matches by `is`
    with pytest.raises(QuantkitError, match="group_size: must be > 0, got 0"):
        r.with_overrides(group_size=0)


def test_recipe_import_does_not_load_the_evaluation_package():
    code = ("import quantkit.recipe, sys; "
            "assert not any(m.startswith('quantkit.evaluation') or m == 'typer' for m in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr


# -- the command line ----------------------------------------------------------------------------
def _convert(model: Path, recipe: Path, out: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-m", "quantkit.cli", "convert", str(model), "--recipe", str(recipe),
                           "--out", str(out), "--no-eval"], capture_output=True, text=True, env=env, timeout=300)


def _assert_one_line(res: subprocess.CompletedProcess, *needles: str) -> None:
    assert res.returncode == 2, res.stderr
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("error: ") and all(n in lines[0] for n in needles), lines[0]
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize("text,expected", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_cli_refuses_bad_recipe_before_any_work(tiny_llama, tmp_path, text, expected):
    recipe = _recipe(tmp_path, text)
    out = tmp_path / "out"
    _assert_one_line(_convert(tiny_llama, recipe, out), f"{recipe}: {expected}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]   # no output, no staging folder


@pytest.mark.parametrize("options,expected", [
    ("{}", "steps[0].rotate.residual: hidden_size 172 is not a power of two times a Hadamard order"),
    ("{residual: false}", "steps[0].rotate.heads: head_dim 86 is not a power of two times a Hadamard order"),
])
def test_cli_refuses_a_rotation_the_model_cannot_take(tmp_path, options, expected):
    """172 = 43 x 4 and 86 = 43 x 2 have no Hadamard matrix quantkit builds: refused before any layer,
    nothing written."""
    from model_factory import make_llama_dir

    model = make_llama_dir(tmp_path / "model" / "odd", hidden=172, intermediate=256, heads=2, kv_heads=2)
    before = sorted((p.name, p.stat().st_mtime_ns) for p in model.iterdir())
    recipe = _recipe(tmp_path, f"scheme: W4A16\ngroup_size: 4\nsteps: [{{rotate: {options}}}, rtn]\n")
    _assert_one_line(_convert(model, recipe, tmp_path / "out"), f"{recipe}: {expected}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml", "model"]
    assert sorted((p.name, p.stat().st_mtime_ns) for p in model.iterdir()) == before


def test_cli_refuses_a_recipe_folder(tiny_llama, tmp_path):
    folder = tmp_path / "recipes.yaml"
    folder.mkdir()
    out = tmp_path / "out"
    _assert_one_line(_convert(tiny_llama, folder, out), f"{folder}: is a folder, not a recipe file")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["recipes.yaml"]
    assert not any(folder.iterdir())


def test_cli_checks_the_eval_section_before_converting(tiny_llama, tmp_path):
    recipe = _recipe(tmp_path, "scheme: W8A16\neval: {max_len: 8}\n")
    out = tmp_path / "out"
    _assert_one_line(_convert(tiny_llama, recipe, out), f"{recipe}: eval.max_len: must be >= 16, got 8")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]


@pytest.mark.parametrize("options,expected", [
    ({"screen_tokens": 0}, "steps[0].awq.screen_tokens: must be >= 1, got 0"),
    ({"search_clip_grid": 0}, "steps[0].awq.search_clip_grid: must be >= 1, got 0"),
    ({"clip_grid": -2}, "steps[0].awq.clip_grid: must be >= 1, got -2"),
])
def test_awq_search_options_refused(options, expected):
    with pytest.raises(QuantkitError) as e:
        Recipe.from_dict({"scheme": "W4A16", "steps": [{"awq": options}, "rtn"]}, where="x.yaml")
    assert str(e.value) == f"x.yaml: {expected}"
