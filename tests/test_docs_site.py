"""The docs site builds with `mkdocs build --strict`: a broken link or anchor, or a page missing
from the nav, fails it. The CLI reference page is generated from the typer app at build time."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytest.importorskip("mkdocs")
pytest.importorskip("material")


def test_site_builds_strict_with_the_generated_cli_reference(tmp_path):
    site = tmp_path / "site"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_MKDOCS_2_WARNING": "1"}
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(site)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr

    assert "quantkit" in (site / "index.html").read_text()
    cli = (site / "docs" / "cli" / "index.html").read_text()
    from typer.main import get_command

    from quantkit.cli import app
    commands = get_command(app).commands
    assert {"convert", "eval", "calibrate"} <= set(commands)
    for name in commands:                 # every command of the app has its section
        assert f"quantkit {name}" in cli, name
    assert "--budget" in cli              # and its flags
    results = (site / "benchmarks" / "RESULTS" / "index.html").read_text()
    assert 'id="kv-cache"' in results
