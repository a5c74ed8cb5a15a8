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
from quantkit.serving.vllm import find_engine


@pytest.fixture(scope="module")
def engine_python():
    return require_engine()


@pytest.fixture(scope="module")
def ckpt(w8a8_checkpoint):
    require_engine()
    return w8a8_checkpoint


def test_w8a8_in_the_engine_agrees_with_quantkit_and_names_vllm(engine_python, ckpt, tmp_path):
    # teacher-forced texts and multiple choice: greedy generation over a few prompts flips with the
    # engine's own int8 rounding (benchmarks/RESULTS.md, the engine evaluation)
    recipe = small_recipe(tmp_path / "small.yaml", gen_prompts=0, extract_items=0)
    common = ("--candidate", ckpt, "--suite", "numbers-en,knowledge-en", "--max-len", "1024", "--recipe", recipe)
    res = quantkit("eval", *common, "--engine", "vllm", "--out", tmp_path / "engine")
    assert res.returncode == 0, res.stderr[-3000:]
    assert not no_engine_left(str(ckpt))
    ref = quantkit("eval", *common, "--out", tmp_path / "in-process")
    assert ref.returncode == 0, ref.stderr[-3000:]
    eng, own = report(tmp_path / "engine"), report(tmp_path / "in-process")
    engine = eng["engine"]
    # the host decides the dtype: bfloat16 for int8 weights where vLLM takes its AMX kernel, else float32
    host = find_engine(engine_python).capabilities
    dtype = "bfloat16" if host.amx else "float32"
    for who in ("baseline", "candidate"):
        assert engine[who]["engine"] == "vllm" and engine[who]["version"] == "0.32.0"
        assert engine[who]["host"] == host.describe()
        # one more than --max-len: a window of the full length plus its one output token fits
        assert engine[who]["dtype"] == dtype and engine[who]["max_model_len"] == 1025
        assert engine[who]["dtype_choice"]["dtype"] == dtype and engine[who]["dtype_choice"]["reason"]
        # probed before its pass, well inside the step budget
        assert 0 < engine[who]["probe"]["step_s"] < engine[who]["probe"]["budget_step_s"]
    assert engine["candidate"]["quantization"] == "compressed-tensors"
    assert engine["baseline"]["quantization"] == "None"
    assert any("--kv" in n for n in engine["not_measured"])
    s_eng, s_own = eng["slices"]["numbers-en"], own["slices"]["numbers-en"]
    assert s_eng["tokens"] == s_own["tokens"]
    for key in ("ppl_base", "ppl_cand"):
        assert abs(s_eng[key] / s_own[key] - 1) <= 0.03, (key, s_eng[key], s_own[key])
    assert abs(s_eng["top1_agreement"] - s_own["top1_agreement"]) <= 0.03
    mc_eng, mc_own = eng["slices"]["knowledge-en"], own["slices"]["knowledge-en"]
    assert mc_eng["mc_items"] == mc_own["mc_items"] == 12
    # float32 in both paths: the same picks; bfloat16 in the engine may flip one near tie of the 12
    picks_apart = abs(mc_eng["mc_accuracy_base"] - mc_own["mc_accuracy_base"]) * 12
    assert picks_apart <= (0 if dtype == "float32" else 1) + 1e-9, (mc_eng, mc_own)
    assert not [r for r in eng["verdict"]["reasons"] if r["measure"].startswith("path_")]
    assert 0 < s_eng["path_kl_mean"] < 0.1 and s_eng["path_tokens"] == s_eng["tokens"]


def test_a_context_cap_below_the_deployment_length_is_refused_before_any_server(engine_python, ckpt, tmp_path):
    capped = tmp_path / "capped"
    capped.mkdir()
    for f in ckpt.iterdir():
        if f.is_file() and f.name != "config.json":
            shutil.copy(f, capped / f.name)
    cfg = json.loads((ckpt / "config.json").read_text())
    (capped / "config.json").write_text(json.dumps({**cfg, "max_position_embeddings": 1024}))
    res = quantkit("eval", "--candidate", capped, "--engine", "vllm", "--max-len", "2048", "--out", tmp_path / "r",
                   timeout=600)
    assert res.returncode == 2, res.stderr[-2000:]
    line = res.stderr.strip().splitlines()[-1]
    assert "--max-len: 2048 exceeds the candidate's max_position_embeddings (1024" in line
    assert not (tmp_path / "r").exists() and not no_engine_left(str(capped), within_s=1)
