"""An engine evaluation stopped at any point (the server starting, mid-scoring, while the report is
written; killed outright or sent SIGTERM) leaves no process of the engine and nothing that looks
like a finished report. Kill points: quantkit/common/crashpoints.py."""
from __future__ import annotations

import pytest

from engine_helpers import no_engine_left, quantkit, require_engine, small_recipe


@pytest.fixture(scope="module")
def ckpt(w8a8_checkpoint):
    require_engine()
    return w8a8_checkpoint


def _run_until(point: str, ckpt, tmp_path, signal: str = "KILL"):
    recipe = small_recipe(tmp_path / "small.yaml")
    out = tmp_path / "report"
    # two slices, scored at once (SLICES_AT_ONCE): the point is reached by both
    res = quantkit("eval", "--candidate", ckpt, "--suite", "numbers-en,names-en", "--max-len", "512", "--recipe", recipe,
                   "--engine", "vllm", "--out", out,
                   env={"QUANTKIT_TEST_KILL_AT": point, "QUANTKIT_TEST_KILL_SIGNAL": signal})
    return res, out


def _nothing_complete(out) -> bool:
    """No report folder; at most a hidden staging folder beside it, without report.html."""
    staged = list(out.parent.glob(f".{out.name}.tmp-*"))
    return not out.exists() and not any((s / "report.html").exists() for s in staged)


@pytest.mark.parametrize("point", ["engine:starting", "engine:scoring", "report:writing"])
def test_killed_outright_leaves_no_engine_and_no_report(point, ckpt, tmp_path):
    res, out = _run_until(point, ckpt, tmp_path)
    assert res.returncode == -9, (res.returncode, res.stderr[-2000:])
    assert not no_engine_left(str(ckpt)), point
    assert _nothing_complete(out)


def test_sigterm_mid_scoring_stops_the_engine_and_says_so(ckpt, tmp_path):
    res, out = _run_until("engine:scoring", ckpt, tmp_path, signal="TERM")
    assert res.returncode == 130, (res.returncode, res.stderr[-2000:])
    assert res.stderr.strip().splitlines()[-1] == "interrupted: no report was written"
    assert not no_engine_left(str(ckpt), within_s=5)   # stopped before the command returned
    assert _nothing_complete(out)


def test_an_engine_killed_mid_pass_is_one_line_quoting_its_own_last_error(ckpt, tmp_path):
    """The server's processes die under a running pass: the command fails in one line that names
    the request, quotes the engine's own last log line and keeps that log; nothing is left."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from engine_helpers import ROOT, engine_processes

    from quantkit.inputs.embedded_model import default_model_dir

    recipe = small_recipe(tmp_path / "small.yaml", text_items=48)
    cmd = [sys.executable, "-m", "quantkit.cli", "eval", "--candidate", str(ckpt), "--suite", "numbers-en,names-en",
           "--max-len", "512", "--recipe", str(recipe), "--engine", "vllm", "--out", str(tmp_path / "report")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    seen = b""
    while b"engine: baseline" not in seen:   # the baseline's pass has started: both servers passed their probe
        chunk = os.read(proc.stderr.fileno(), 4096)
        assert chunk, seen.decode(errors="replace")[-2000:]
        seen += chunk
    time.sleep(1)
    # the baseline's server (the embedded default's folder), mid-pass
    engines = [int(p.split(":")[0]) for p in engine_processes(f"--model {default_model_dir()} ") if "watchdog" not in p]
    assert engines, seen.decode(errors="replace")[-2000:]
    for pid in engines:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    rest = (seen + proc.stderr.read()).decode(errors="replace")
    assert proc.wait(timeout=300) == 2, rest[-3000:]
    line = rest.strip().splitlines()[-1]
    assert line.startswith("error: ") and "the engine's last error: " in line and "(log: " in line, rest[-3000:]
    assert Path(line.rsplit("(log: ", 1)[1].split(")")[0]).exists()
    assert not no_engine_left(str(ckpt))
    assert _nothing_complete(tmp_path / "report")
