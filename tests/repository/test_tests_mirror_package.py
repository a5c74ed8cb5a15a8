"""tests/ is laid out like quantkit/: a test file sits in the folder of the package it tests
(tests/evaluation/ for quantkit/evaluation/, deeper folders allowed below it), at the top of tests/
only for a top-level module (test_recipe*.py for recipe.py), in tests/end_to_end/ for a command or
a conversion run whole, or in tests/repository/ for checks over the whole repository (lint, the
layering, the docs, the benchmark scripts)."""
from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
PACKAGE = TESTS.parent / "quantkit"
OUTSIDE_THE_PACKAGE = {"end_to_end", "repository"}


def misplaced(test_files: list[Path], tests: Path, package: Path) -> list[str]:
    """The test files (relative to ``tests``) that sit in no folder of ``package``."""
    modules = {p.stem for p in package.glob("*.py") if p.name != "__init__.py"}
    bad = []
    for f in test_files:
        rel = f.relative_to(tests)
        if len(rel.parts) == 1:
            stem = rel.stem.removeprefix("test_")
            if not any(stem == m or stem.startswith(m + "_") for m in modules):
                bad.append(rel.as_posix())
            continue
        top = rel.parts[0]
        if top in OUTSIDE_THE_PACKAGE:
            continue
        if not (package / top / "__init__.py").exists():
            bad.append(rel.as_posix())
    return bad


def test_every_test_file_sits_under_the_package_it_tests():
    files = sorted(TESTS.rglob("test_*.py"))
    assert len(files) > 100
    bad = misplaced(files, TESTS, PACKAGE)
    assert not bad, f"test files outside the package's layout: {bad}"


def test_a_misplaced_test_file_is_found(tmp_path):
    package, tests = tmp_path / "quantkit", tmp_path / "tests"
    (package / "pipeline").mkdir(parents=True)
    (package / "pipeline" / "__init__.py").write_text("")
    (package / "recipe.py").write_text("")
    files = [tests / "pipeline" / "test_runner.py", tests / "test_recipe_keys.py", tests / "test_runner.py",
             tests / "algorithms" / "test_gptq.py", tests / "end_to_end" / "test_main_job.py"]
    assert misplaced(files, tests, package) == ["test_runner.py", "algorithms/test_gptq.py"]
