"""``quantkit loadtest`` against vLLM's CPU build, really started: vLLM starts with the config
``quantkit plan --emit vllm`` prints; a short ramp (two steps) on the bundled log reports its
steps with the engine's own figures; an engine killed mid-run leaves a report marked incomplete,
a non-zero exit and no process."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from engine_helpers import ROOT, engine_processes, held_out_traffic, no_engine_left, quantkit, require_engine
from quantkit.serving.vllm import ServeOptions, find_engine, serve

LOG = ROOT / "calibration" / "default.jsonl"


def test_vllm_starts_with_the_emitted_config(smollm2_dir, tmp_path):
    require_engine()
    res = quantkit("plan", smollm2_dir, "--emit", "vllm", "--gpu-mem", "24GiB", "--max-len", "2048", timeout=300)
    assert res.returncode == 0, res.stderr
    text = "\n".join(ln for ln in res.stdout.splitlines() if not ln.startswith("#"))
    cfg = yaml.safe_load(text)
    path = tmp_path / "launch.yaml"
    path.write_text(text)
    opts = ServeOptions(max_model_len=cfg["max_model_len"], extra_args=("--config", str(path)))
    with serve(find_engine(), smollm2_dir, opts) as served:
        # what the server says it runs, from its own log
        assert served.settings["max_num_seqs"] == cfg["max_num_seqs"]
        assert served.settings["max_num_batched_tokens"] == cfg["max_num_batched_tokens"]
        assert served.settings["enable_prefix_caching"] == "True"
        pid = served.pid
    assert not no_engine_left(f"--port {served.endpoint.url.rsplit(':', 1)[1]}"), pid


def test_a_short_real_ramp_reports_every_step(w8a8_checkpoint, tmp_path):
    require_engine()
    out = tmp_path / "lt"
    traffic = held_out_traffic(tmp_path / "held-out.jsonl")
    res = quantkit("loadtest", w8a8_checkpoint, "--engine", "vllm", "--traffic", traffic, "--slo", "ttft=5s,tpot=200ms",
                   "--max-concurrency", "4", "--min-requests", "4", "--max-model-len", "2048", "--out", out,
                   timeout=1200)
    assert res.returncode == 0, res.stderr[-3000:]
    data = json.loads((out / "report.json").read_text())
    assert data["complete"] and [s["concurrency"] for s in data["steps"]] == [1, 2, 4]
    assert all(s["requests"] >= 4 and s["errors"] == 0 for s in data["steps"])
    for s in data["steps"]:
        for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
            assert s[key]["p50"] <= s[key]["p90"] <= s[key]["p99"]
    one = data["steps"][0]
    # one stream: tokens per second cannot beat one token per TPOT (a margin for the first token)
    assert one["output_tokens_per_s"] <= 1.1 * 1000 / one["tpot_ms"]["p50"]
    eng = data["engine"]
    assert eng["version"] == "0.32.0" and eng["quantization"] == "compressed-tensors"
    assert eng["launch_config"]["max_num_seqs"] == eng["max_num_seqs"]
    # the dtype the host gives int8 weights, and why, in the report
    host = find_engine().capabilities
    assert eng["dtype"] == eng["dtype_choice"]["dtype"] == ("bfloat16" if host.amx else "float32")
    assert eng["host"] == host.describe()
    assert eng["dtype_choice"]["reason"] in (out / "report.md").read_text()
    assert 0 < eng["probe"]["step_s"] < eng["probe"]["budget_step_s"]
    # the memory account against what the engine allocated (KV in the served dtype, in its own CPU space)
    assert abs(eng["max_concurrency"] - eng["predicted_concurrency"]) < 1
    for direction in ("prompt", "output"):
        assert set(data["lengths"][direction]) >= {"p50", "p90", "p99", "mu", "sigma"}
    assert "Load test" in (out / "report.html").read_text()
    assert not engine_processes(str(w8a8_checkpoint))


def test_an_engine_killed_mid_run_leaves_an_incomplete_report(w8a8_checkpoint, tmp_path):
    require_engine()
    out = tmp_path / "lt"
    cmd = [sys.executable, "-m", "quantkit.cli", "loadtest", str(w8a8_checkpoint), "--engine", "vllm", "--traffic",
           str(LOG), "--slo", "ttft=5s,tpot=200ms", "--max-concurrency", "8", "--min-requests", "6",
           "--max-model-len", "2048", "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    seen = b""
    while b"concurrency 2 running" not in seen:   # the step bar: kill the engine once step two is under way
        chunk = os.read(proc.stderr.fileno(), 4096)
        assert chunk, seen.decode(errors="replace")[-2000:]
        seen += chunk
    time.sleep(2)
    servers = [int(p.split(":")[0]) for p in engine_processes(str(w8a8_checkpoint))
               if "api_server" in p and "watchdog" not in p]
    assert servers, seen.decode(errors="replace")[-2000:]
    for pid in servers:
        os.kill(pid, signal.SIGKILL)
    rest = (seen + proc.stderr.read()).decode(errors="replace")
    proc.wait(timeout=300)
    assert proc.returncode == 2, rest[-3000:]
    assert "incomplete report" in rest
    data = json.loads((out / "report.json").read_text())
    assert not data["complete"] and data["ramps"][0]["stopped"].startswith("the server failed")
    # one line that quotes the engine's own last line and keeps its log
    line = rest.strip().splitlines()[-1]
    assert "the engine's last error: " in line and "(log: " in line, rest[-3000:]
    assert Path(line.rsplit("(log: ", 1)[1].split(")")[0]).exists()
    assert [s["concurrency"] for s in data["steps"]] == [1]
    assert "INCOMPLETE" in (out / "report.md").read_text()
    assert not no_engine_left(str(w8a8_checkpoint))
