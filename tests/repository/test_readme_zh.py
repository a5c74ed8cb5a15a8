"""README.zh-CN.md stays in step with README.md: the same commands, the same sections, and each
links to the other."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)


def commands(text: str) -> list[str]:
    """The quantkit and bash lines of a page's code blocks, in order."""
    return [line.strip() for block in FENCE.findall(text) for line in block.splitlines()
            if "quantkit" in line or line.strip().startswith("bash ")]


def sections(text: str) -> int:
    return len(re.findall(r"^## ", FENCE.sub("", text), re.M))


def test_both_readmes_list_the_same_commands_and_sections():
    en = (ROOT / "README.md").read_text(encoding="utf-8")
    zh = (ROOT / "README.zh-CN.md").read_text(encoding="utf-8")
    assert len(commands(en)) >= 3
    assert commands(zh) == commands(en)
    assert sections(zh) == sections(en) >= 3


def test_each_readme_links_to_the_other():
    assert "](README.zh-CN.md)" in (ROOT / "README.md").read_text(encoding="utf-8")
    assert "](README.md)" in (ROOT / "README.zh-CN.md").read_text(encoding="utf-8")


def test_a_command_missing_from_one_readme_is_seen():
    en = (ROOT / "README.md").read_text(encoding="utf-8")
    dropped = en.replace(".venv/bin/quantkit convert --recipe w4a16-g64-gptq --budget 7.0", "true", 1)
    assert commands(dropped) != commands(en)
