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

# the longest any mode may take: /v1/models is read within 30 s, the probe answered within 20 s
# (serving/probe.py), a quantkit command starts in a few seconds
DEADLINE_S = {"models-slow-loris": 30 + 30, "hang": 20 + 45}
DEFAULT_DEADLINE_S = 60
# a scoring request that never ends is bounded by the request deadline (1800 s): what ends it here is SIGTERM
SIGNALLED = {"hang-scoring"}
# the load test reads /v1/models, the probe's plain answer, then streams through vllm bench serve
LOADTEST_MODES = sorted(set(MODES) - SIGNALLED)


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


@pytest.mark.parametrize("mode", sorted(set(MODES) - SIGNALLED))
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


def test_sigterm_while_a_server_holds_requests_exits_within_seconds(smollm2_dir, tmp_path):
    """The candidate's server takes every scoring request and never answers: SIGTERM ends the
    evaluation in a few seconds (the requests in flight are given up), exit 130, no report."""
    import os
    import signal

    with CorruptServer("clean") as base, CorruptServer("hang-scoring") as cand:
        proc = subprocess.Popen([sys.executable, "-m", "quantkit.cli", *map(str, _eval(smollm2_dir, tmp_path, cand.url,
                                                                                         base.url))],
                                cwd=ROOT, stderr=subprocess.PIPE)
        seen = b""
        while b"engine: candidate" not in seen:   # the candidate's pass has sent its requests
            chunk = os.read(proc.stderr.fileno(), 4096)
            assert chunk, seen.decode(errors="replace")[-2000:]
            seen += chunk
        time.sleep(2)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rest = proc.stderr.read()
        rc = proc.wait(timeout=60)
        took = time.monotonic() - t0
    assert rc == 130, (rc, (seen + rest).decode(errors="replace")[-2000:])
    assert took < 5, took
    assert (seen + rest).decode(errors="replace").strip().splitlines()[-1] == "interrupted: no report was written"
    assert not (tmp_path / "r").exists()


@pytest.fixture
def raising_template(smollm2_dir, tmp_path):
    """The embedded model with a chat template that raises (its weights hard-linked where the
    file system allows, else copied: quantkit follows no symbolic link out of a model folder)."""
    import os
    import shutil

    folder = tmp_path / "raising"
    folder.mkdir()
    for f in smollm2_dir.iterdir():
        if f.name == "chat_template.jinja":
            continue
        try:
            os.link(f, folder / f.name)
        except OSError:
            shutil.copy(f, folder / f.name)
    (folder / "chat_template.jinja").write_text("{{ raise_exception('this template refuses every conversation') }}")
    return folder


def test_a_chat_template_that_raises_is_one_line_in_eval_and_loadtest(raising_template, tmp_path):
    with CorruptServer("clean") as base, CorruptServer("clean") as cand:
        res, _ = _run(_eval(raising_template, tmp_path, cand.url, base.url), DEFAULT_DEADLINE_S)
        lt, _ = _run(["loadtest", raising_template, "--endpoint", cand.url, "--traffic",
                      ROOT / "calibration" / "default.jsonl", "--slo", "ttft=5s", "--max-concurrency", "1",
                      "--min-requests", "2", "--out", tmp_path / "lt"], DEFAULT_DEADLINE_S)
    for r in (res, lt):
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
        line = r.stderr.strip().splitlines()[-1]
        assert line.startswith(f"error: {raising_template}: the chat template fails on one user turn"), line
        assert "this template refuses every conversation" in line
    assert not (tmp_path / "r").exists() and not (tmp_path / "lt").exists()
