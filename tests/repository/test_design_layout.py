"""docs/DESIGN.md's layout section names exactly the package's top-level folders and modules, and
every module a layout line names inside a folder (``loader.py``, ``trace.py``) is in that folder."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "quantkit"


def layout_block() -> list[str]:
    text = (ROOT / "docs" / "DESIGN.md").read_text(encoding="utf-8")
    section = text[text.index("## Layout:"):]
    return re.search(r"```\n(.*?)```", section, re.S).group(1).splitlines()[1:]


def layout_rows() -> dict[str, str]:
    """Each top-level name in the folder/module column -> the text of its row (continuations joined)."""
    rows: dict[str, str] = {}
    current: list[str] = []
    for line in layout_block():
        column = line[7:29].strip()
        if column:
            current = [n.strip() for n in column.split(",")]
            for n in current:
                rows[n] = ""
        for n in current:
            rows[n] += " " + line[29:]
    return rows


def tree() -> set[str]:
    folders = {p.name + "/" for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    return folders | {p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py"}


def test_the_layout_names_every_top_level_folder_and_module_and_nothing_else():
    named = set(layout_rows())
    assert named == tree(), f"only in DESIGN.md: {sorted(named - tree())}; only in quantkit/: {sorted(tree() - named)}"


def test_every_module_a_folder_row_names_exists_in_that_folder():
    missing = []
    for name, text in layout_rows().items():
        if not name.endswith("/"):
            continue
        for module in re.findall(r"\b([a-z_]+\.py)\b", text):
            if not list((PACKAGE / name).rglob(module)):
                missing.append(f"{name}{module}")
    assert not missing, missing
