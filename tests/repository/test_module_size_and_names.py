"""One concept per file: no module outside kernels/ is over 400 lines, and no two modules share a
file name unless they play one role (docs/DESIGN.md, "File names"): ``base.py`` is an extension
axis's contract and registry, ``__init__.py`` and ``__main__.py`` are Python's own."""
from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "quantkit"
MAX_MODULE_LINES = 400
SIZE_EXEMPT = ("kernels/",)   # a Triton kernel file keeps its autotune configs, kernel, wrapper and reference together


def long_modules(package: Path) -> list[str]:
    out = []
    for p in sorted(package.rglob("*.py")):
        rel = p.relative_to(package).as_posix()
        n = len(p.read_text(encoding="utf-8").splitlines())
        if n > MAX_MODULE_LINES and not rel.startswith(SIZE_EXEMPT):
            out.append(f"{rel}: {n} lines")
    return out


def shared_names(package: Path) -> dict[str, list[str]]:
    by_name: dict[str, list[str]] = defaultdict(list)
    for p in sorted(package.rglob("*.py")):
        by_name[p.name].append(p.relative_to(package).as_posix())
    return {n: paths for n, paths in by_name.items() if len(paths) > 1}


def roles_in_design() -> set[str]:
    """The file names docs/DESIGN.md's "File names" paragraph allows more than once."""
    text = (ROOT / "docs" / "DESIGN.md").read_text(encoding="utf-8")
    section = text[text.index("File names:"):]
    section = section[:section.index("\n\n")]
    return set(re.findall(r"`([a-z_]+\.py)`", section))


def test_no_module_outside_the_kernels_is_over_the_limit():
    assert not long_modules(PACKAGE), long_modules(PACKAGE)


def test_modules_share_a_file_name_only_for_a_role_the_design_names():
    allowed = roles_in_design()
    assert {"base.py", "__init__.py", "__main__.py"} <= allowed
    clashes = {n: paths for n, paths in shared_names(PACKAGE).items() if n not in allowed}
    assert not clashes, clashes


def test_a_planted_clash_and_a_long_module_are_found(tmp_path):
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "report.py").write_text("x = 1\n")
    (tmp_path / "a" / "big.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    assert shared_names(tmp_path) == {"report.py": ["a/report.py", "b/report.py"]}
    assert long_modules(tmp_path) == [f"a/big.py: {MAX_MODULE_LINES + 1} lines"]
