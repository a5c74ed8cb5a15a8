"""ruff (configured in pyproject.toml's [tool.ruff]) passes over the whole repository, and the
same configuration does catch a violation, so this check can fail."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "pyproject.toml"


def _ruff(*args: str) -> subprocess.CompletedProcess:
    # --no-cache: a test run leaves no .ruff_cache behind in the repository.
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", *args],
                          capture_output=True, text=True, timeout=300)


def test_ruff_passes_over_the_repository():
    res = _ruff(str(REPO))
    assert res.returncode == 0, f"ruff check {REPO} failed:\n{res.stdout}{res.stderr}"


def test_ruff_fails_on_a_planted_unused_import(tmp_path):
    bad = tmp_path / "planted.py"
    bad.write_text("import os\n", encoding="utf-8")
    res = _ruff("--config", str(CONFIG), str(bad))
    assert res.returncode == 1, f"ruff passed a file with an unused import:\n{res.stdout}{res.stderr}"
    assert "F401" in res.stdout, res.stdout
