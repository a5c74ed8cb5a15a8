"""The docs site builds with `mkdocs build --strict`: a broken link or anchor, or a page missing
from the nav, fails it. The CLI reference page is generated from the typer app at build time."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ["mkdocs.yml", "README.md", "README.zh-CN.md", "docs", "benchmarks/RESULTS.md", "scripts/docs_site.py"]

pytest.importorskip("mkdocs")
pytest.importorskip("material")


def build(root: Path, site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
                          cwd=root, env=env, capture_output=True, text=True, timeout=120)


def test_site_builds_strict_with_the_generated_cli_reference(tmp_path):
    site = tmp_path / "site"
    run = build(ROOT, site)
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
    for page in ("quantize", "evaluate", "vllm", "engine", "python-api"):   # the Chinese guides
        html = (site / "docs" / "zh" / page / "index.html").read_text(encoding="utf-8")
        assert "英文原版" in html, page
        assert 'href="../../../benchmarks/RESULTS/#' in html, page   # a cited figure's link, resolved


def test_a_broken_link_fails_the_build(tmp_path):
    root = tmp_path / "repo"
    for name in SOURCES:
        src, dst = ROOT / name, root / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if src.is_dir() else shutil.copy)(src, dst)
    guide = root / "docs" / "quantize.md"
    guide.write_text(guide.read_text(encoding="utf-8") + "\nSee [the missing guide](nowhere.md).\n", encoding="utf-8")
    run = build(root, tmp_path / "site")
    assert run.returncode != 0
    assert "nowhere.md" in run.stdout + run.stderr
