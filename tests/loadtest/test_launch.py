"""The launch config a load test serves with, for the embedded SmolLM2, against a hand calculation
of the memory account (on a GPU and on vLLM's CPU build)."""
from __future__ import annotations

import yaml

from quantkit.serving.memory_account import plan
from quantkit.loadtest.launch_config import launch_for

GIB = 2**30
# SmolLM2-135M: 30 layers, 3 KV heads of 64 (hidden 576 / 9 heads), MLP 1536, vocabulary 49152, tied embeddings
LINEAR = 30 * (2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536)
PARAMS = LINEAR + 49152 * 576 + 30 * 2 * 576 + 576


def test_smollm2_on_a_24gib_gpu_by_hand(smollm2_dir):
    fp = plan(smollm2_dir, "24GiB", 4096, kv="fp16")
    assert fp.kv_bytes_per_token == 2 * 30 * 3 * 64 * 2 == 23040
    assert (fp.params_quantizable, fp.params_total) == (LINEAR, PARAMS) == (106_168_320, 134_515_008)
    # the embedded SmolLM2's weights are stored in float32: 4 bytes a parameter
    assert fp.weight_bytes_after == PARAMS * 4
    fits = int((24 * GIB * 0.9 - PARAMS * 4) // (23040 * 4096))
    assert fp.concurrency == fits == 240
    launch = launch_for(smollm2_dir, 4096, cuda=True, dtype="bfloat16", gpu_mem="24GiB")
    assert launch.predicted_concurrency == 240 and launch.config["max_num_seqs"] == 192   # 80% of 240


def test_smollm2_on_vllms_cpu_build_by_hand(smollm2_dir, tmp_path):
    # the CPU build keeps the KV cache in its own space (4 GiB here) in the dtype it runs, float32
    launch = launch_for(smollm2_dir, 8192, cuda=False, dtype="float32", cpu_kv_cache_gib=4)
    per_request = 2 * 30 * 3 * 64 * 4 * 8192
    assert per_request == 377_487_360 and launch.predicted_concurrency == 4 * GIB // per_request == 11
    assert launch.config["max_num_seqs"] == 8 and launch.config["max_num_batched_tokens"] == 2048
    written = yaml.safe_load(launch.write(tmp_path / "launch.yaml").read_text())
    assert written == launch.config and written["enable_prefix_caching"] is True
