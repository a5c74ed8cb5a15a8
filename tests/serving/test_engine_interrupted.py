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
