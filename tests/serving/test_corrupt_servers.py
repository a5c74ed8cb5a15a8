"""Servers are untrusted: against every way the corrupt server (corrupt_server.py) answers wrongly,
``quantkit eval --endpoint`` and ``quantkit loadtest --endpoint`` end in one line naming the server,
exit code 2, no report, no traceback, within a stated deadline: never a verdict computed from
answers that are not numbers. The clean server, the control, gives a verdict."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from corrupt_server import MODES, CorruptServer
from engine_helpers import ROOT, small_recipe

# the longest any mode may take: /v1/models is read within 30 s, the probe answered within 45 s
# (serving/probe.py), a quantkit command starts in a few seconds
DEADLINE_S = {"models-slow-loris": 30 + 30, "hang": 45 + 45}
DEFAULT_DEADLINE_S = 60
LOADTEST_MODES = ["nan-logprobs", "error-500", "not-json", "models-len-abc", "models-no-id", "hang"]


def _run(args: list, timeout: float) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "quantkit.cli", *map(str, args)], capture_output=True, text=True,
                         cwd=ROOT, timeout=timeout + 60)
    return res, time.monotonic() - t0


def _eval(smollm2_dir, tmp_path, cand_url: str, base_url: str):
    recipe = small_recipe(tmp_path / "small.yaml", text_items=3, gen_prompts=2, extract_items=0)
    return ["eval", "--baseline", smollm2_dir, "--candidate", smollm2_dir, "--suite", "numbers-en,knowledge-en",
            "--recipe", recipe, "--endpoint", cand_url, "--baseline-endpoint", base_url, "--path-tokens", "0",
            "--out", tmp_path / "r"]


def test_the_clean_server_gives_a_verdict(smollm2_dir, tmp_path):
    with CorruptServer("clean") as base, CorruptServer("clean") as cand:
        res, _ = _run(_eval(smollm2_dir, tmp_path, cand.url, base.url), DEFAULT_DEADLINE_S)
    assert res.returncode == 0, res.stderr[-2000:]
    assert (tmp_path / "r" / "report.json").exists()


def _refused(res: subprocess.CompletedProcess, seconds: float, mode: str, url: str, out) -> None:
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    assert res.returncode == 2, (mode, res.returncode, res.stderr[-2000:])
    line = res.stderr.strip().splitlines()[-1]
    assert line.startswith("error: ") and url in line, (mode, line)
    assert seconds < DEADLINE_S.get(mode, DEFAULT_DEADLINE_S), (mode, seconds)
    assert not (out / "report.json").exists() or '"complete": false' in (out / "report.json").read_text()


@pytest.mark.parametrize("mode", sorted(MODES))
def test_eval_never_scores_a_corrupt_candidate(mode, smollm2_dir, tmp_path):
    with CorruptServer("clean") as base, CorruptServer(mode) as cand:
        res, seconds = _run(_eval(smollm2_dir, tmp_path, cand.url, base.url), DEADLINE_S.get(mode, DEFAULT_DEADLINE_S))
    _refused(res, seconds, mode, cand.url, tmp_path / "r")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("mode", ["nan-logprobs", "models-len-2", "string-choices"])
def test_eval_never_scores_a_corrupt_baseline(mode, smollm2_dir, tmp_path):
    with CorruptServer(mode) as base, CorruptServer("clean") as cand:
        res, seconds = _run(_eval(smollm2_dir, tmp_path, cand.url, base.url), DEFAULT_DEADLINE_S)
    _refused(res, seconds, mode, base.url, tmp_path / "r")
    assert "--baseline-endpoint" in res.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("mode", LOADTEST_MODES)
def test_loadtest_refuses_a_corrupt_server_in_one_line(mode, smollm2_dir, tmp_path):
    out = tmp_path / "lt"
    with CorruptServer(mode) as cand:
        res, seconds = _run(["loadtest", smollm2_dir, "--endpoint", cand.url, "--traffic",
                             ROOT / "calibration" / "default.jsonl", "--slo", "ttft=5s,tpot=200ms",
                             "--max-concurrency", "2", "--min-requests", "4", "--max-model-len", "2048", "--out", out],
                            DEADLINE_S.get(mode, DEFAULT_DEADLINE_S))
    _refused(res, seconds, mode, cand.url, out)


def test_the_same_server_for_both_models_is_refused(smollm2_dir, tmp_path):
    with CorruptServer("clean") as one:
        res, seconds = _run(_eval(smollm2_dir, tmp_path, one.url, one.url + "/v1"), DEFAULT_DEADLINE_S)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
    line = res.stderr.strip().splitlines()[-1]
    assert line.startswith("error: --baseline-endpoint: the same server and model as --endpoint"), line
    assert not (tmp_path / "r").exists()
