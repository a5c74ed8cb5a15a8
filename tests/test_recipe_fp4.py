"""The shipped FP4 recipes, and FP4 recipes that name what the format fixes otherwise: refused
by the command with exit code 2 and one line naming the file and the key, nothing written."""

from __future__ import annotations

import dataclasses

import pytest
from typer.testing import CliRunner

import quantkit
from quantkit.cli import app

SHIPPED = {"nvfp4": ("nvfp4-pack-quantized", "rtn", True), "nvfp4a16": ("nvfp4-pack-quantized", "rtn", False),
           "nvfp4a16-gptq": ("nvfp4-pack-quantized", "gptq", False),
           "mxfp4": ("mxfp4-pack-quantized", "rtn", False), "mxfp4a16": ("mxfp4-pack-quantized", "rtn", False)}


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_fp4_recipes(name):
    fmt, algorithm, calibrated = SHIPPED[name]
    recipe = quantkit.load_recipe(name)
    scheme = recipe.groups["group_0"]
    assert scheme.format == fmt and recipe.ignore == ("lm_head",)
    assert list(recipe.to_dict()["steps"][-1]) == [algorithm]
    acts = scheme.input_activations
    assert (acts is not None and acts.calibrated) == calibrated
    # GPTQ visits columns by decreasing diag(H); every column keeps its group (no g_idx)
    assert scheme.weights.actorder == ("weight" if algorithm == "gptq" else None)
    if algorithm == "gptq":   # otherwise the RTN recipe's weights
        rtn = quantkit.load_recipe(name.removesuffix("-gptq")).groups["group_0"]
        assert dataclasses.replace(scheme.weights, actorder=None) == rtn.weights and scheme.format == rtn.format


BAD = {
    "group_size: 64": ("{num_bits: 4, type: float, group_size: 64}", None,
                       "config_groups.group_0.weights.group_size: FP4 groups are fixed by the format"),
    "NVFP4 activations dynamic per token": (
        "{num_bits: 4, type: float, group_size: 16}", "{num_bits: 4, type: float, group_size: 16, dynamic: true}",
        "config_groups.group_0.input_activations.dynamic: NVFP4 activations need 'local'"),
    "NVFP4 activations static": (
        "{num_bits: 4, type: float, group_size: 16}", "{num_bits: 4, type: float, group_size: 16}",
        "config_groups.group_0.input_activations.dynamic"),
    "MXFP4 weights, NVFP4 activations": (
        "{num_bits: 4, type: float, group_size: 32}", "{num_bits: 4, type: float, group_size: 16, dynamic: local}",
        "config_groups.group_0.input_activations: MXFP4 weights take MXFP4 activations"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_fp4_recipe_exits_2_naming_file_and_key(tiny_llama, tmp_path, case):
    weights, acts, needle = BAD[case]
    path = tmp_path / "bad.yaml"
    text = f"version: 1\nconfig_groups:\n  group_0:\n    targets: [Linear]\n    weights: {weights}\n"
    if acts:
        text += f"    input_activations: {acts}\n"
    path.write_text(text + "algorithm: {name: rtn}\n")
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["convert", str(tiny_llama), "--recipe", str(path), "--out", str(out)])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert lines[-1].startswith("error: ") and str(path) in lines[-1] and needle in lines[-1], lines
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]
