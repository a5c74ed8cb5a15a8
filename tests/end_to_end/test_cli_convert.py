"""Bad input: one line naming the file or key, exit code 2, no output folder left behind."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


RECIPE_DIR = Path(__file__).resolve().parents[2] / "recipes"


def run_cli(*args, cwd=None):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-m", "quantkit.cli", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=300)


def _assert_clean_failure(res, needle, out: Path):
    assert res.returncode == 2, res.stderr
    lines = [l for l in res.stderr.strip().splitlines() if l.startswith("error:")]
    assert len(lines) == 1 and needle in lines[0], res.stderr
    assert "Traceback" not in res.stderr
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".quantkit-tmp")]


@pytest.fixture
def model_copy(tiny_llama, tmp_path):
    dst = tmp_path / "model"
    shutil.copytree(tiny_llama, dst)
    return dst


def test_truncated_safetensors(model_copy, tmp_path):
    f = model_copy / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    out = tmp_path / "out"
    _assert_clean_failure(run_cli("convert", model_copy, "--recipe", "w8a16", "--out", out, "--no-eval"),
                          "model.safetensors", out)


def test_missing_safetensors(model_copy, tmp_path):
    (model_copy / "model.safetensors").unlink()
    out = tmp_path / "out"
    _assert_clean_failure(run_cli("convert", model_copy, "--recipe", "w8a16", "--out", out, "--no-eval"),
                          "no *.safetensors", out)


def test_pickle_checkpoint_is_refused(model_copy, tmp_path):
    (model_copy / "model.safetensors").rename(model_copy / "pytorch_model.bin")
    out = tmp_path / "out"
    _assert_clean_failure(run_cli("convert", model_copy, "--recipe", "w8a16", "--out", out, "--no-eval"),
                          "pytorch_model.bin", out)


def test_unknown_recipe_key(model_copy, tmp_path):
    r = tmp_path / "bad.yaml"
    r.write_text("scheme: W4A16\ngroup_size: 32\nalgorithm: {name: rtn, blocksize: 4}\n")
    out = tmp_path / "out"
    _assert_clean_failure(run_cli("convert", model_copy, "--recipe", r, "--out", out, "--no-eval"), "blocksize", out)


def test_group_size_that_does_not_divide(model_copy, tmp_path):
    out = tmp_path / "out"
    res = run_cli("convert", model_copy, "--recipe", "w4a16", "--group-size", "48", "--out", out, "--no-eval")
    _assert_clean_failure(res, "group_size 48 does not divide in_features 64", out)


def test_an_architecture_named_nowhere_converts_from_its_derived_structure(model_copy, tmp_path):
    """A class name quantkit has no entry for: its structure is derived from its forward."""
    cfg = json.loads((model_copy / "config.json").read_text())
    cfg["architectures"] = ["FancyNetForCausalLM"]
    (model_copy / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "out"
    res = run_cli("convert", model_copy, "--recipe", "w8a16", "--out", out, "--no-eval")
    assert res.returncode == 0, res.stderr
    assert json.loads((out / "config.json").read_text())["architectures"] == ["FancyNetForCausalLM"]


def test_a_model_transformers_cannot_build_is_refused_for_a_data_driven_recipe(model_copy, tmp_path):
    cfg = json.loads((model_copy / "config.json").read_text())
    cfg["model_type"], cfg["architectures"] = "fancynet", ["FancyNetForCausalLM"]
    (model_copy / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "out"
    _assert_clean_failure(run_cli("convert", model_copy, "--recipe", "w4a16-g64-gptq", "--out", out, "--no-eval"),
                          "model type `fancynet`", out)


def test_existing_output_folder(model_copy, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    res = run_cli("convert", model_copy, "--recipe", "w8a16", "--out", out, "--no-eval")
    assert res.returncode == 2 and "output folder exists" in res.stderr and "--overwrite" in res.stderr
    assert (out / "keep.txt").read_text() == "mine"  # untouched


def test_convert_inspect_and_overwrite(model_copy, tmp_path):
    out = tmp_path / "out"
    res = run_cli("convert", model_copy, "--recipe", "w8a8", "--out", out, "--no-eval")
    assert res.returncode == 0, res.stderr
    assert "smaller" in res.stdout and (out / "model.safetensors").exists()
    info = json.loads(run_cli("inspect", out, "--json").stdout)
    assert info["format"] == "int-quantized" and info["modules_by_format"] == {"int-quantized": 14}
    assert info["backend"]["cpu"] == "torch" and info["steps"] == ["rtn"]
    assert "steps rtn" in run_cli("inspect", out).stdout
    res = run_cli("convert", model_copy, "--recipe", "w8a16", "--out", out, "--overwrite", "--no-eval")
    assert res.returncode == 0, res.stderr
    assert json.loads((out / "config.json").read_text())["quantization_config"]["format"] == "pack-quantized"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "out"]


def test_missing_model_folder(tmp_path):
    out = tmp_path / "out"
    _assert_clean_failure(run_cli("convert", tmp_path / "nope", "--out", out, "--no-eval"), "nope", out)
