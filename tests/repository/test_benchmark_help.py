"""Every benchmark script answers ``--help`` with its usage and exits 0, doing no work.

A script that measures at import time, or whose ``--help`` needs an optional dependency, would
start a long run or fail where a reader only asked how to call it. The scripts run a few at a time,
each in its own process with the repository first on PYTHONPATH (as ``python benchmarks/X.py`` from a
checkout).
"""
from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py"))
TIMEOUT_S = 180   # importing torch and transformers on a loaded 2-core machine


def _help(script: Path, env: dict) -> tuple[int, str, str]:
    try:
        done = subprocess.run([sys.executable, str(script), "--help"], cwd=ROOT, env=env, text=True,
                              capture_output=True, stdin=subprocess.DEVNULL, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return -1, "", f"killed after {TIMEOUT_S} s: --help started real work"
    return done.returncode, done.stdout, done.stderr


@pytest.fixture(scope="module")
def helps() -> dict[str, tuple[int, str, str]]:
    """script name -> (exit status, stdout, stderr) of ``python SCRIPT --help``, a few at a time
    (each may import torch: all at once would hold gigabytes)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = pool.map(lambda p: _help(p, env), SCRIPTS)
        return {p.name: r for p, r in zip(SCRIPTS, results)}


def test_there_are_scripts_to_check():
    assert len(SCRIPTS) >= 20 and ROOT / "benchmarks" / "eval.py" in SCRIPTS


@pytest.mark.parametrize("name", [p.name for p in SCRIPTS])
def test_help_prints_usage_and_exits_0(helps, name):
    rc, stdout, stderr = helps[name]
    assert rc == 0, f"{name} --help exited {rc}:\n{stderr[-2000:]}"
    assert stdout.startswith(f"usage: {name} "), f"{name} --help printed no usage line:\n{stdout[:500]}"
