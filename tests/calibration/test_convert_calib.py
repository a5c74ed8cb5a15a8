"""Acceptance item 4: `quantkit convert --calib` with the embedded default uses the sampled set,
and FP8 static activation scales are calibrated from it. Runs on a tiny random Llama carrying
SmolLM2's tokenizer (the real 135M model adds ~30 s and proves nothing more about the hook)."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from quantkit.calibration import default_log_path, load_calibration

N, LEN = 12, 96


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory, tokenizer):
    from transformers import AutoModelForCausalLM, LlamaConfig

    folder = tmp_path_factory.mktemp("tiny-llama")
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=True)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder


def _input_scales(folder) -> dict[str, float]:
    from safetensors import safe_open

    out = {}
    for shard in sorted(folder.glob("*.safetensors")):
        with safe_open(str(shard), "pt") as fh:
            out.update({k: fh.get_tensor(k).item() for k in fh.keys() if k.endswith("input_scale")})
    return out


def test_cli_calibrate_then_convert_fp8_static(tiny_model, tokenizer, tmp_path):
    from quantkit.cli import app

    runner = CliRunner()
    calib = tmp_path / "calib"
    res = runner.invoke(app, ["calibrate", "--model", str(tiny_model), "--n", str(N), "--max-len", str(LEN),
                              "--out", str(calib), "--seed", "4"])
    assert res.exit_code == 0, res.output
    manifest = json.loads((calib / "manifest.json").read_text())
    assert manifest["source"]["name"] == "default.jsonl" and manifest["counts"]["selected"] == N

    outs = {}
    for name, source in (("sampled", str(calib)), ("log", str(default_log_path()))):
        out = tmp_path / f"fp8-{name}"
        res = runner.invoke(app, ["convert", str(tiny_model), "--recipe", "fp8", "--calib", source,
                                  "--num-samples", str(N), "--max-seq-len", str(LEN), "--out", str(out),
                                  "--no-eval"])
        assert res.exit_code == 0, res.output
        outs[name] = out

    log = json.loads((outs["sampled"] / "quantization_log.json").read_text())
    expected = load_calibration(calib, tokenizer, N, LEN, seed=log["recipe"]["calibration"].get("seed", 0))
    drawn = log["calibration"]
    assert {k: drawn[k] for k in ("num_samples", "num_tokens")} == {"num_samples": N, "num_tokens": sum(map(len, expected))}
    # the set's source and content hashes (not its text): what the business slices leave out
    assert drawn["source"] == manifest["source"] and drawn["sample_content"] == manifest["sample_content"]

    scales = _input_scales(outs["sampled"])
    linears = 2 * 7  # q k v o gate up down per layer
    assert len(scales) == linears and all(v > 0 for v in scales.values())
    assert scales != _input_scales(outs["log"])  # another calibration set gives other scales


def test_a_narrow_log_is_warned_in_the_conversion_log(tiny_model, default_rows, tmp_path):
    """A one-task log: the coverage report's narrow-set warning is a `warning:` line of the
    conversion and is kept in quantization_log.json."""
    from quantkit.cli import app

    log = tmp_path / "classification.jsonl"
    log.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in default_rows
                           if r["task"] == "classification"), encoding="utf-8")
    out = tmp_path / "fp8-narrow"
    res = CliRunner().invoke(app, ["convert", str(tiny_model), "--recipe", "fp8", "--calib", str(log), "--num-samples",
                                   str(N), "--max-seq-len", str(LEN), "--out", str(out), "--no-eval"])
    assert res.exit_code == 0, res.output
    warned = [line for line in res.stderr.splitlines() if line.startswith("warning:")]
    assert len(warned) == 1 and "narrow calibration set: the sample covers 1 task type (classification 12)" in warned[0]
    assert json.loads((out / "quantization_log.json").read_text())["warnings"] == [warned[0].removeprefix("warning: ")]
