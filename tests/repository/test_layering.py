"""The layering contract (pyproject.toml's [tool.importlinter], the layout in docs/DESIGN.md)
holds over the package, and the same contract does catch an import that runs back up, so this
check can fail: a copy of the package with one planted upward import is refused."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint_imports(root: Path) -> subprocess.CompletedProcess:
    # The package analysed is the one first on the path: the repository's, or a planted copy.
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([str(LINT_IMPORTS), "--config", str(REPO / "pyproject.toml"), "--no-cache"],
                          cwd=root, capture_output=True, text=True, timeout=300, env=env)


def test_no_import_runs_back_up():
    res = _lint_imports(REPO)
    assert res.returncode == 0, f"lint-imports failed:\n{res.stdout[-4000:]}{res.stderr[-2000:]}"
    assert "1 kept, 0 broken" in res.stdout, res.stdout[-2000:]


def test_a_planted_upward_import_is_refused(tmp_path):
    shutil.copytree(REPO / "quantkit", tmp_path / "quantkit", ignore=shutil.ignore_patterns("__pycache__"))
    planted = tmp_path / "quantkit" / "config" / "sizes.py"
    # config/ sits near the bottom of the layers; the pipeline sits well above it
    planted.write_text(planted.read_text() + "\nfrom quantkit.pipeline import runner  # noqa: E402,F401\n")
    res = _lint_imports(tmp_path)
    assert res.returncode == 1, res.stdout[-2000:]
    assert "quantkit.config.sizes -> quantkit.pipeline.runner" in res.stdout, res.stdout[-3000:]
