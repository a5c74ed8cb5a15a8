"""``quantkit plan --emit vllm``: the launch config follows the memory account, checked against a
hand calculation for a Llama-3-8B-shaped model."""
from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from quantkit.errors import QuantkitError
from quantkit.serving.vllm import command_line, launch_config as vllm_launch
from quantkit.serving.memory_account import plan

LLAMA3_8B = dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                 vocab_size=128256, intermediate_size=14336)
GIB = 2**30


def test_llama3_8b_int4_on_80gib_by_hand():
    fp = plan(LLAMA3_8B, "80GiB", 8192, weights="int4", kv="fp16")
    # KV: 2 (K and V) x 32 layers x 8 KV heads x 128 head_dim x 2 bytes = 128 KiB a token, 1 GiB at 8192
    assert fp.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131072 and fp.kv_bytes_per_request == GIB
    # decoder Linear weights: 32 x (q, o: 4096^2; k, v: 4096 x 1024; gate, up, down: 4096 x 14336), at 4 bits
    linear = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336)
    assert fp.params_quantizable == linear == 6_979_321_856
    scales = linear // 128 * 2                      # an fp16 scale per group of 128
    weights = linear // 2 + (fp.params_total - linear) * 2
    assert (fp.weight_bytes_after, fp.scale_bytes) == (weights, scales)
    fits = int((80 * GIB * 0.9 - weights - scales) // GIB)
    assert fp.concurrency == fits == 66
    cfg = vllm_launch(fp, "meta-llama/Meta-Llama-3-8B-Instruct")
    assert cfg == {"model": "meta-llama/Meta-Llama-3-8B-Instruct", "max_model_len": 8192, "max_num_seqs": 52,
                   "gpu_memory_utilization": 0.9, "max_num_batched_tokens": 2048, "enable_chunked_prefill": True,
                   "enable_prefix_caching": True, "kv_cache_dtype": "auto"}
    assert command_line(cfg).startswith("vllm serve meta-llama/Meta-Llama-3-8B-Instruct --max-model-len 8192 "
                                        "--max-num-seqs 52 --gpu-memory-utilization 0.9")


def test_an_fp8_cache_doubles_the_sequences_and_says_fp8():
    fp16 = vllm_launch(plan(LLAMA3_8B, "80GiB", 32768, weights="fp8", kv="fp16"), "m")
    fp8 = vllm_launch(plan(LLAMA3_8B, "80GiB", 32768, weights="fp8", kv="fp8"), "m")
    assert fp8["kv_cache_dtype"] == "fp8" and fp16["kv_cache_dtype"] == "auto"
    assert fp8["max_num_seqs"] >= 2 * fp16["max_num_seqs"] and fp8["max_num_batched_tokens"] == 4096


def test_a_model_that_does_not_fit_has_no_launch_config():
    with pytest.raises(QuantkitError, match="do not fit in 16 GiB"):
        vllm_launch(plan(LLAMA3_8B, "16GiB", 8192, weights="bf16", kv="fp16"), "m")


def test_the_command_prints_yaml_and_the_command_line(smollm2_dir):
    res = subprocess.run([sys.executable, "-m", "quantkit.cli", "plan", str(smollm2_dir), "--emit", "vllm",
                          "--gpu-mem", "24GiB", "--max-len", "4096"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    cfg = yaml.safe_load(res.stdout)
    fp = plan(smollm2_dir, "24GiB", 4096)
    assert cfg["max_num_seqs"] == int(0.8 * fp.concurrency) and cfg["max_model_len"] == 4096
    assert res.stdout.rstrip().splitlines()[-1] == "# " + command_line(cfg)
    bad = subprocess.run([sys.executable, "-m", "quantkit.cli", "plan", "--emit", "sglang"], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip() == "error: --emit: 'sglang': expected one of vllm"


def test_the_emitted_length_stays_within_the_models_context_unless_asked(tmp_path):
    """A 2048-context model: the launch config serves 2048 by default; a longer --max-len is
    emitted only because it was asked, and the output says so."""
    import json

    folder = tmp_path / "short"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**LLAMA3_8B, "max_position_embeddings": 2048,
                                                    "torch_dtype": "bfloat16"}))
    run = lambda *a: subprocess.run([sys.executable, "-m", "quantkit.cli", "plan", str(folder), "--emit", "vllm", *a],  # noqa: E731
                                    capture_output=True, text=True, timeout=300)
    plain = run()
    assert plain.returncode == 0, plain.stderr
    assert yaml.safe_load("\n".join(ln for ln in plain.stdout.splitlines() if not ln.startswith("#")))["max_model_len"] == 2048
    assert "note:" not in plain.stdout
    asked = run("--max-len", "100000")
    assert asked.returncode == 0, asked.stderr
    assert "max_model_len: 100000" in asked.stdout
    assert "# note: --max-len 100000 exceeds the model's max_position_embeddings (2048), as asked" in asked.stdout
