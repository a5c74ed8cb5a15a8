"""The plan matches a hand calculation, and reads a quantized checkpoint's own formats."""
import json

import pytest
from typer.testing import CliRunner

from quantkit.errors import QuantkitError
from quantkit.serving.memory_account import (GiB, WeightFormat, kv_bytes_per_token, parse_bytes, plan,
                                             weight_bytes_at_bits)

LLAMA3_8B = dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                 vocab_size=128256, intermediate_size=14336, torch_dtype="bfloat16")


def test_kv_bytes_hand_calculation():
    per_tok = kv_bytes_per_token(32, 8, 128, 2)          # 2 x 32 x 8 x 128 x 2 bytes
    assert per_tok == 128 * 1024                          # 128 KiB per token
    assert per_tok * 8192 == 1 * GiB                      # 1 GiB per 8K-token request
    assert 32 * per_tok * 8192 == 32 * GiB                # 32 GiB for 32 such requests
    assert kv_bytes_per_token(32, 8, 128, 1) == 64 * 1024  # FP8 KV halves it


def test_int4_weights_of_a_70b_model():
    b = weight_bytes_at_bits(70 * 10**9, 4)
    assert b == 35 * 10**9                                # 35 GB
    assert round(b / GiB, 1) == 32.6                      # 32.6 GiB, before scales/zero points


def test_plan_from_config_and_concurrency():
    fp = plan(LLAMA3_8B, "80GiB", 8192, weights="int4", kv="fp16", utilization=1.0)
    assert fp.kv_bytes_per_token == 131072 and fp.kv_bytes_per_request == GiB
    # params: decoder Linears 32 x (2*4096*4096 + 2*4096*1024 + 3*4096*14336) + embeddings + norms
    quant = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336)
    assert fp.params_quantizable == quant
    assert fp.params_total == quant + 2 * 128256 * 4096 + 32 * 2 * 4096 + 4096
    assert fp.weight_bytes_before == fp.params_total * 2
    assert fp.weight_bytes_after == quant // 2 + (fp.params_total - quant) * 2
    assert fp.scale_bytes == quant // 128 * 2
    free = 80 * GiB - fp.weight_bytes_after - fp.scale_bytes
    assert fp.concurrency == int(free // GiB)


def test_parse_bytes():
    assert parse_bytes("80GiB") == 80 * GiB and parse_bytes("24GB") == 24 * 10**9


def test_plan_cli(tmp_path):
    from quantkit.cli.plan_command import plan_command
    import typer
    app = typer.Typer()
    app.command()(plan_command)
    (tmp_path / "config.json").write_text(json.dumps(LLAMA3_8B))
    r = CliRunner().invoke(app, [str(tmp_path), "--gpu-mem", "80GiB", "--max-len", "8192", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["kv_bytes_per_token"] == 131072 and d["kv_bytes_per_request"] == GiB
    r = CliRunner().invoke(app, [str(tmp_path), "--kv", "fp7"])
    assert r.exit_code == 2 and "--kv" in r.output
    r = CliRunner().invoke(app, [str(tmp_path), "--max-len", "8192", "--kv", "int8-kivi:k"])
    assert r.exit_code == 0, r.output
    # K: 128 codes + a float16 scale and minimum per channel per 32 tokens; V fp16: 32 x 8 x 400 bytes
    assert "KV cache (int8-kivi:k): 100 KiB per token" in r.output and "(of which 8 MiB whatever its length)" in r.output
    r = CliRunner().invoke(app, [str(tmp_path), "--kv", "int3-kivi"])
    assert r.exit_code == 2 and "--kv: unknown KV option 'int3-kivi'" in r.output


def test_plan_with_a_quantized_kv_option():
    """The footprint of a KV option: its own bytes per token (codes, per-token scales, the part it
    leaves unquantized at ``kv``'s size) and what it keeps per request whatever the length."""
    from quantkit.kv_cache import kv_option

    fp16 = plan(LLAMA3_8B, "80GiB", 8192, weights="int4", kv="fp16", utilization=1.0)
    head = plan(LLAMA3_8B, "80GiB", 8192, weights="int4", kv_option=kv_option("fp8-token-head"), utilization=1.0)
    # 32 layers x 8 KV heads x (K and V: 128 one-byte codes + a float32 scale)
    assert head.kv_bytes_per_token == 32 * 8 * 2 * (128 + 4) and head.kv_dtype == "fp8-token-head"
    assert head.kv_bytes_fixed == 0 and head.kv_bytes_per_request == head.kv_bytes_per_token * 8192
    free = 80 * GiB - head.weight_bytes_after - head.scale_bytes
    assert head.concurrency == int(free // head.kv_bytes_per_request) > fp16.concurrency
    k_only = plan(LLAMA3_8B, "80GiB", 8192, kv_option=kv_option("fp8-tensor:k"))
    assert k_only.kv_bytes_per_token == 32 * 8 * (128 + 128 * 2)          # V stays 2 bytes
    kivi = plan(LLAMA3_8B, "80GiB", 8192, kv_option=kv_option("int8-kivi"))
    # K: a float16 scale and minimum per channel per 32 tokens; V: per 32 channels of a token
    assert kivi.kv_bytes_per_token == 32 * 8 * ((128 + 128 * 4 / 32) + (128 + 4 * 4))
    assert kivi.kv_bytes_fixed == 32 * 8 * 128 * 2 * 128                   # the newest 128 keys, fp16
    assert kivi.kv_bytes_per_request == kivi.kv_bytes_per_token * 8192 + kivi.kv_bytes_fixed


@pytest.mark.parametrize("key, value", [("hidden_size", "64"), ("hidden_size", float("nan")), ("num_attention_heads", 0),
                                        ("vocab_size", -100), ("num_hidden_layers", -3), ("intermediate_size", True)])
def test_a_config_value_that_is_not_a_count_is_named(key, value):
    cfg = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=100, intermediate_size=128)
    with pytest.raises(QuantkitError, match=f"^config.json: {key}: expected a positive whole number"):
        plan({**cfg, key: value})


def test_a_negative_group_size_is_named():
    cfg = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=100, intermediate_size=128)
    with pytest.raises(QuantkitError, match="^--group-size: expected 0"):
        plan(cfg, weights=WeightFormat("int4", group_size=-3))


def test_plan_of_an_int4_checkpoint_reads_its_weights_from_the_checkpoint(tiny_llama, tmp_path):
    """``quantkit plan CKPT`` without --weights: the checkpoint's own quantization_config says int4
    in groups of 64, so the weights shrink and their group scales are priced; the float model's stay."""
    import quantkit
    from quantkit.cli import app

    ckpt = quantkit.quantize(str(tiny_llama), "w4a16-g64").save(tmp_path / "w4")
    got = json.loads(CliRunner().invoke(app, ["plan", str(ckpt), "--json"]).output)
    base = json.loads(CliRunner().invoke(app, ["plan", str(tiny_llama), "--json"]).output)
    assert got["weights_after"] == "int4" and base["weights_after"] == base["weights_before"]
    assert got["weight_bytes_after"] < base["weight_bytes_after"]
    assert got["scale_bytes"] == got["params_quantizable"] // 64 * 2     # one fp16 scale per group of 64
