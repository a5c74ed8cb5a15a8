"""Every figure the README and the guides (the Chinese ones too) cite is in benchmarks/RESULTS.md,
where they say it is.

A cited figure is a link into RESULTS.md: `[2.3x](benchmarks/RESULTS.md#calibration-sampler)`.
The checker fails when the anchor is not one of RESULTS.md's `## ` sections, when the figure's
text does not appear in that section, or when a line with a figure names RESULTS.md without linking a section.
It also checks that every script RESULTS.md tells you to run is in the repository.
"""

import re
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path("benchmarks/RESULTS.md")

LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")
SCRIPT = re.compile(r"\b((?:benchmarks|scripts|tests)/[\w./-]+\.(?:py|sh))\b")
PYTHON_SCRIPT = re.compile(r"\bpython3?\s+(?:-\S+\s+)*([\w./-]+\.py)\b")
VERDICT_WORD = re.compile(r"\b(GO|REVIEW|NO-GO)\b")


def slug(heading: str) -> str:
    """The anchor GitHub and mkdocs both give a plain heading."""
    text = re.sub(r"[^\w\s-]", "", heading.strip().lower())
    return re.sub(r"\s", "-", text)


def plain(text: str) -> str:
    return re.sub(r"\*\*|`", "", text)


def sections(results_text: str) -> dict[str, str]:
    """Anchor -> text of each `## ` section (its `###` sub-sections included)."""
    out, anchor = {}, None
    for line in results_text.splitlines():
        if line.startswith("## "):
            anchor = slug(line[3:])
            out[anchor] = ""
        elif anchor is not None:
            out[anchor] += plain(line) + "\n"
    return out


def pages(root: Path) -> list[Path]:
    """The README in each language and every guide, the translated ones in docs/zh/ included."""
    return sorted(root.glob("README*.md")) + sorted((root / "docs").rglob("*.md"))


def check_claims(root: Path) -> list[str]:
    """Problems with the RESULTS.md citations of README*.md and docs/*.md under root."""
    results = (root / RESULTS).resolve()
    known = sections(results.read_text(encoding="utf-8"))
    problems = [f"{RESULTS}: heading '{a}' gives different anchors on GitHub and mkdocs"
                for a in known if "--" in a]
    for page in pages(root):
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            where = f"{page.relative_to(root)}:{n}"
            for text, target in LINK.findall(line):
                path, _, anchor = target.partition("#")
                if not path or (page.parent / path).resolve() != results:
                    continue
                figure = plain(text)
                claim = any(c.isdigit() for c in figure) or VERDICT_WORD.search(figure)
                if not anchor:
                    if claim:
                        problems.append(f"{where}: '{figure}' links RESULTS.md without a section")
                elif anchor not in known:
                    problems.append(f"{where}: no section '#{anchor}' in RESULTS.md")
                elif claim and figure not in known[anchor]:
                    problems.append(f"{where}: '{figure}' is not in RESULTS.md#{anchor}")
            rest = LINK.sub("", line)
            if "RESULTS.md" in rest and any(c.isdigit() for c in rest):
                problems.append(f"{where}: names RESULTS.md beside a figure without linking a section")
    return problems


def check_commands(results_text: str, root: Path) -> list[str]:
    """Scripts named in RESULTS.md that are not in the repository under root."""
    named = set(SCRIPT.findall(results_text)) | set(PYTHON_SCRIPT.findall(results_text))
    return [f"RESULTS.md names {p}, which is not in the repository"
            for p in sorted(named) if not (root / p).is_file()]


def copy_docs(dst: Path) -> Path:
    for page in pages(ROOT):
        (dst / page.relative_to(ROOT)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(page, dst / page.relative_to(ROOT))
    (dst / RESULTS).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / RESULTS, dst / RESULTS)
    return dst


def test_every_cited_figure_is_in_its_results_section():
    assert check_claims(ROOT) == []


def test_the_readme_cites_results():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(LINK.findall(readme)) >= 10 and "benchmarks/RESULTS.md#" in readme


def test_every_script_results_names_exists():
    text = (ROOT / RESULTS).read_text(encoding="utf-8")
    assert len(SCRIPT.findall(text)) >= 20       # the pattern finds the commands
    assert check_commands(text, ROOT) == []


def test_a_planted_figure_without_a_row_fails(tmp_path):
    root = copy_docs(tmp_path)
    readme = root / "README.md"
    readme.write_text(readme.read_text(encoding="utf-8")
                      + "\nGPTQ runs in [0.123x](benchmarks/RESULTS.md#gptq) of the time.\n", encoding="utf-8")
    assert check_claims(root) == ["README.md:%d: '0.123x' is not in RESULTS.md#gptq"
                                  % len(readme.read_text(encoding="utf-8").splitlines())]


def test_a_missing_section_or_a_bare_mention_fails(tmp_path):
    root = copy_docs(tmp_path)
    guide = root / "docs" / "planted.md"
    guide.write_text("Fast: [2x](../benchmarks/RESULTS.md#no-such-section).\n"
                     "Also 3x faster (benchmarks/RESULTS.md).\n"
                     "And [4x](../benchmarks/RESULTS.md).\n", encoding="utf-8")
    assert check_claims(root) == [
        "docs/planted.md:1: no section '#no-such-section' in RESULTS.md",
        "docs/planted.md:2: names RESULTS.md beside a figure without linking a section",
        "docs/planted.md:3: '4x' links RESULTS.md without a section",
    ]


def test_a_script_that_is_not_in_the_repository_fails():
    text = "    python qrun.py /tmp/x\n    .venv/bin/python benchmarks/gptq.py --threads 2\n"
    assert check_commands(text, ROOT) == ["RESULTS.md names qrun.py, which is not in the repository"]


def test_a_figure_in_a_translated_guide_is_checked(tmp_path):
    root = copy_docs(tmp_path)
    guide = root / "docs" / "zh" / "planted.md"
    guide.write_text("GPTQ 耗时是它的 [0.123x](../../benchmarks/RESULTS.md#gptq)。\n", encoding="utf-8")
    assert check_claims(root) == ["docs/zh/planted.md:1: '0.123x' is not in RESULTS.md#gptq"]
