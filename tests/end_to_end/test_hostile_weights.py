"""Weights that disagree with themselves or with config.json, converted in a real process.

Each case corrupts a copy of a tiny model one way (a NaN in a weight, an integer weight,
config.json describing fewer layers or other widths than the shards hold, a tensor the model
has no place for) and runs ``convert`` on it: exit 2, one ``error:`` line naming the culprit,
no traceback, nothing new anywhere the command could write (the case's folder, its working
directory, its temporary folder) and every input byte for byte as it was.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

import pytest
import torch
from safetensors.torch import load_file, save_file

from hostile import assert_refused, digests, entries, quantkit_env, run_quantkit
from model_factory import make_llama_dir, save_byte_tokenizer

Q_PROJ = "model.layers.0.self_attn.q_proj.weight"


@pytest.fixture(scope="module")
def clean_model(tmp_path_factory) -> Path:
    model = make_llama_dir(tmp_path_factory.mktemp("clean") / "model", vocab=260)
    return save_byte_tokenizer(model)


def edit_tensors(model: Path, change: Callable[[dict], None]) -> None:
    tensors = load_file(str(model / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(model / "model.safetensors"), metadata={"format": "pt"})


def edit_config(model: Path, **values) -> None:
    cfg = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**cfg, **values}))


def nan_in_a_weight(model: Path) -> list[str]:
    def poison(t):
        t[Q_PROJ][0, :3] = float("nan")
        t[Q_PROJ][1, 0] = float("-inf")
    edit_tensors(model, poison)
    return ["model/model.safetensors", f"'{Q_PROJ}'", "3 NaN and 1 inf values"]


def inf_in_the_embeddings(model: Path) -> list[str]:
    edit_tensors(model, lambda t: t["model.embed_tokens.weight"][5].fill_(float("inf")))
    return ["model/model.safetensors", "'model.embed_tokens.weight'", "0 NaN and 64 inf values"]


def int8_linear_weight(model: Path) -> list[str]:
    name = "model.layers.1.mlp.up_proj.weight"
    edit_tensors(model, lambda t: t.update({name: t[name].to(torch.int8)}))
    return ["model/model.safetensors", f"'{name}'", "dtype int8"]


def bool_norm_weight(model: Path) -> list[str]:
    name = "model.layers.0.input_layernorm.weight"
    edit_tensors(model, lambda t: t.update({name: t[name] > 0}))
    return [f"'{name}'", "dtype bool"]


def fewer_layers_in_config(model: Path) -> list[str]:
    edit_config(model, num_hidden_layers=1)
    return ["model/config.json", "num_hidden_layers is 1", "holds 2 layers"]


def hidden_size_wrong(model: Path) -> list[str]:
    edit_config(model, hidden_size=128)
    return ["'model.embed_tokens.weight'", "shape (260, 64) on disk", "model/config.json implies (260, 128)"]


def intermediate_size_wrong(model: Path) -> list[str]:
    edit_config(model, intermediate_size=96)
    return ["'model.layers.0.mlp.gate_proj.weight'", "shape (128, 64) on disk", "implies (96, 64)"]


def tensor_with_no_place(model: Path) -> list[str]:
    edit_tensors(model, lambda t: t.update({"model.layers.0.mlp.spare.weight": torch.zeros(4)}))
    return ["model/model.safetensors", "'model.layers.0.mlp.spare.weight'", "would be dropped"]


CASES = [nan_in_a_weight, inf_in_the_embeddings, int8_linear_weight, bool_norm_weight, fewer_layers_in_config,
         hidden_size_wrong, intermediate_size_wrong, tensor_with_no_place]


@pytest.mark.parametrize("corrupt", CASES, ids=lambda f: f.__name__)
def test_bad_weights_are_refused_and_leave_nothing(corrupt, clean_model, tmp_path):
    case, tmpdir = tmp_path / "case", tmp_path / "tmpdir"   # the case's folder is its working directory
    tmpdir.mkdir()
    model = Path(shutil.copytree(clean_model, case / "model"))
    names = corrupt(model)
    inputs, before = digests(model), entries(case, tmpdir)

    res = run_quantkit(["convert", model.relative_to(case), "--recipe", "w8a16", "--out", case / "out", "--no-eval"],
                       cwd=case, env=quantkit_env(TMPDIR=str(tmpdir)))

    assert_refused(res, *names)
    assert entries(case, tmpdir) == before
    assert digests(model) == inputs


def test_the_clean_model_converts(clean_model, tmp_path):
    """The cases' baseline: without the corruption the same command succeeds."""
    res = run_quantkit(["convert", clean_model, "--recipe", "w8a16", "--out", tmp_path / "out", "--no-eval"],
                       cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "warning:" not in res.stderr


def strict_json(path: Path):
    return json.loads(path.read_text(encoding="utf-8"), parse_constant=lambda c: pytest.fail(f"{path}: {c}"))


def test_a_non_finite_statistic_is_written_as_null_and_warned(clean_model, tmp_path):
    """An all-zero weight has no signal: its SQNR is -inf, which JSON cannot hold."""
    model = Path(shutil.copytree(clean_model, tmp_path / "model"))
    edit_tensors(model, lambda t: t[Q_PROJ].zero_())
    res = run_quantkit(["convert", model, "--recipe", "w8a16", "--out", tmp_path / "out", "--no-eval"],
                       cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    log = strict_json(tmp_path / "out" / "quantization_log.json")
    assert log["modules"][Q_PROJ.removesuffix(".weight")]["sqnr_db"] is None
    warned = [line for line in res.lines if line.startswith("warning:")]
    assert len(warned) == 1 and f"modules.{Q_PROJ.removesuffix('.weight')}.sqnr_db" in warned[0], res.stderr
    assert log["warnings"] == [warned[0].removeprefix("warning: ")]
    for f in ("config.json", "model.safetensors.index.json"):
        if (tmp_path / "out" / f).exists():
            strict_json(tmp_path / "out" / f)
