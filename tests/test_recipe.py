from pathlib import Path

import pytest

from quantkit.errors import QuantkitError
from quantkit.recipe import RECIPES_DIR, Recipe, load_recipe


@pytest.mark.parametrize("path", sorted(RECIPES_DIR.glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_recipes_load(path):
    r = Recipe.from_file(path)
    assert r.groups and "lm_head" in r.ignore
    # a recipe survives its own serialisation
    again = Recipe.from_dict(r.to_dict())
    assert again.groups == r.groups and again.algorithm == r.algorithm


def _write(tmp_path, text) -> Path:
    p = tmp_path / "r.yaml"
    p.write_text(text)
    return p


@pytest.mark.parametrize("text,needle", [
    ("scheme: W4A16\nbogus: 1\n", "unknown key 'bogus'"),
    ("scheme: W4A16\nalgorithm: {name: rtn, damp: 0.1}\n", "unknown key 'damp'"),
    ("scheme: W4A16\nalgorithm: {name: magic}\n", "unknown algorithm 'magic'"),
    ("scheme: W4A16\ncalibration: {samples: 3}\n", "calibration: unknown key 'samples'"),
    ("scheme: W4A16\ncalibration: {batch_tokens: 0}\n", "calibration.batch_tokens"),
    ("scheme: W4A16\ncalibration: {batch_tokens: many}\n", "calibration.batch_tokens"),
    ("scheme: W4A16\ncalibration: {offload: maybe}\n", "calibration.offload"),
    ("config_groups: {g: {weights: {num_bits: 4, group_size: 64, colour: red}}}\n", "config_groups.g.weights: unknown key 'colour'"),
    ("scheme: W4A16\nconfig_groups: {}\n", "exactly one of"),
    ("scheme: FP8\ngroup_size: 64\n", "group_size"),
    ("version: 7\nscheme: W8A16\n", "version"),
    ("scheme: [unclosed\n", "not valid YAML"),
    ("config_groups: {g: {weights: {num_bits: 8, strategy: token}}}\n", "strategy"),
])
def test_bad_recipes_name_file_and_key(tmp_path, text, needle):
    p = _write(tmp_path, text)
    with pytest.raises(QuantkitError) as e:
        Recipe.from_file(p)
    msg = str(e.value)
    assert needle in msg and str(p) in msg and "\n" not in msg


def test_lookup_by_name_preset_and_overrides():
    assert load_recipe("w8a16").groups["group_0"].weights.num_bits == 8
    assert load_recipe("FP8_DYNAMIC").groups["group_0"].format == "float-quantized"
    r = load_recipe("w4a16").with_overrides(group_size=32, ignore=["re:.*down_proj"], num_samples=7)
    assert r.groups["group_0"].weights.group_size == 32
    assert "re:.*down_proj" in r.ignore and r.calibration.num_samples == 7
    with pytest.raises(QuantkitError, match="no recipe file"):
        load_recipe("nonexistent-recipe")


@pytest.mark.parametrize("name", ["w4a8", "w4afp8"])
def test_group_size_override_regroups_int4_weights_under_quantized_activations(name):
    """Their recipes say to add --group-size 64 where a width is not a multiple of 128 (SmolLM2's 576)."""
    scheme = load_recipe(name).with_overrides(group_size=64).groups["group_0"]
    assert (scheme.weights.group_size, scheme.weights.strategy) == (64, "group")
    assert scheme.input_activations == load_recipe(name).groups["group_0"].input_activations


@pytest.mark.parametrize("name", ["w8a8", "fp8-dynamic", "nvfp4a16"])
def test_group_size_override_refuses_weights_it_cannot_regroup(name):
    with pytest.raises(QuantkitError, match="--group-size: config_groups.group_0 has no int weights in groups"):
        load_recipe(name).with_overrides(group_size=64)


def test_static_activations_need_calibration():
    assert load_recipe("fp8").needs_calibration
    assert not load_recipe("fp8-dynamic").needs_calibration
