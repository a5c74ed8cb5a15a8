"""``quantkit eval --engine vllm`` for real: vLLM's server started on 127.0.0.1 from the engine's
own environment (.venv-vllm, built by scripts/setup-engine.sh; these tests fail without it),
scored, and stopped with every process it made.

The accuracy thresholds are the issue's: every slice's perplexity within 3% and top-1 agreement
within 0.03 of quantkit's own path, the same verdict; they are checked here on a small suite and
on the full default suite by benchmarks/engine_eval.py (benchmarks/RESULTS.md)."""
from __future__ import annotations

import json
import shutil

import pytest

from engine_helpers import (no_engine_left, quantkit, report, require_engine, small_recipe)


@pytest.fixture(scope="module")
def engine_python():
    return require_engine()


@pytest.fixture(scope="module")
def fp8(fp8_checkpoint):
    require_engine()
    return fp8_checkpoint


def test_fp8_in_the_engine_agrees_with_quantkit_and_names_vllm(engine_python, fp8, tmp_path):
    recipe = small_recipe(tmp_path / "small.yaml")
    common = ("--candidate", fp8, "--suite", "numbers-en,knowledge-en", "--max-len", "1024", "--recipe", recipe)
    res = quantkit("eval", *common, "--engine", "vllm", "--out", tmp_path / "engine")
    assert res.returncode == 0, res.stderr[-3000:]
    assert not no_engine_left(str(fp8))
    ref = quantkit("eval", *common, "--out", tmp_path / "in-process")
    assert ref.returncode == 0, ref.stderr[-3000:]
    eng, own = report(tmp_path / "engine"), report(tmp_path / "in-process")
    engine = eng["meta"]["engine"]
    for who in ("baseline", "candidate"):
        assert engine[who]["engine"] == "vllm" and engine[who]["version"] == "0.32.0"
        assert engine[who]["dtype"] == "float32" and engine[who]["max_model_len"] == 1024
    assert engine["candidate"]["quantization"] == "compressed-tensors"
    assert engine["baseline"]["quantization"] == "None"
    assert any("--kv" in n for n in engine["not_measured"])
    s_eng, s_own = eng["slices"]["numbers-en"], own["slices"]["numbers-en"]
    assert s_eng["tokens"] == s_own["tokens"]
    for key in ("ppl_base", "ppl_cand"):
        assert abs(s_eng[key] / s_own[key] - 1) <= 0.03, (key, s_eng[key], s_own[key])
    assert abs(s_eng["top1_agreement"] - s_own["top1_agreement"]) <= 0.03
    assert eng["slices"]["knowledge-en"]["mc_items"] == own["slices"]["knowledge-en"]["mc_items"] == 12
    assert s_eng["path_top1"] >= 0.95 and s_eng["path_ppl_gap"] <= 0.03
    assert eng["verdict"]["decision"] == own["verdict"]["decision"]


def test_a_context_cap_below_the_deployment_length_is_refused_before_any_server(engine_python, fp8, tmp_path):
    capped = tmp_path / "capped"
    capped.mkdir()
    for f in fp8.iterdir():
        if f.is_file() and f.name != "config.json":
            shutil.copy(f, capped / f.name)
    cfg = json.loads((fp8 / "config.json").read_text())
    (capped / "config.json").write_text(json.dumps({**cfg, "max_position_embeddings": 1024}))
    res = quantkit("eval", "--candidate", capped, "--engine", "vllm", "--max-len", "2048", "--out", tmp_path / "r",
                   timeout=600)
    assert res.returncode == 2, res.stderr[-2000:]
    line = res.stderr.strip().splitlines()[-1]
    assert "--max-len: 2048 exceeds the candidate's max_position_embeddings (1024" in line
    assert not (tmp_path / "r").exists() and not no_engine_left(str(capped), within_s=1)
