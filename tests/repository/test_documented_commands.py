"""Every ``quantkit`` command shown in the documentation parses against the CLI: the command
exists, every flag is one of its options, and a flag whose values are a fixed set is given one
of them. The fenced blocks of README*.md, docs/ and calibration/README.md are walked; a
bracketed alternative (``[--policy traffic|sqrt|balanced]``) is checked value by value."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([*ROOT.glob("README*.md"), *(ROOT / "docs").rglob("*.md"), ROOT / "calibration" / "README.md"])
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
SPAN = re.compile(r"(?<!`)`(--[a-z][^`]*)`(?!`)")   # an inline flag, as prose cites one: `--policy balanced`
INVOKE = re.compile(r"(?:^|[\s/])quantkit\s+(?=[a-z])")   # quantkit, .venv/bin/quantkit, not quantkit/...


def _choices() -> dict[tuple[str, str], tuple[str, ...]]:
    """The flags whose values the product fixes, from the constants the code checks them against."""
    from quantkit.calibration.allocate import POLICIES
    from quantkit.calibration.config import LONG_POLICIES
    from quantkit.common.i18n import LANGUAGES
    from quantkit.serving.engines import ENGINES

    return {("calibrate", "--policy"): POLICIES, ("calibrate", "--long"): LONG_POLICIES,
            ("convert", "--lang"): LANGUAGES, ("eval", "--lang"): LANGUAGES,
            ("eval", "--engine"): tuple(ENGINES), ("loadtest", "--engine"): tuple(ENGINES)}


def commands(text: str) -> list[str]:
    """The quantkit invocations of a page's fenced blocks, continuation lines joined."""
    found = []
    for block in FENCE.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#\s.*$", "", line).strip()
            match = INVOKE.search(line)
            if match and not line.lstrip("$ ").startswith(("pip", "git", "cd ")):
                found.append(line[match.end():])
    return found


def problems(argv_text: str, group, choices) -> list[str]:
    """What in one invocation (the text after ``quantkit``) the CLI would not accept."""
    try:
        argv = shlex.split(argv_text.replace("[", " ").replace("]", " "))
    except ValueError:
        return [f"cannot split {argv_text!r}"]
    name = argv[0]
    if name not in group.commands:
        return [f"unknown command {name!r}"]
    params = {o: p for p in group.commands[name].params for o in (*p.opts, *p.secondary_opts)}
    found = []
    for i, token in enumerate(argv[1:], 1):
        flag, eq, value = token.partition("=")
        if not flag.startswith("-") or flag == "-" or flag.lstrip("-")[:1].isdigit():
            continue
        param = params.get(flag)
        if param is None:
            found.append(f"{name}: unknown flag {flag}")
            continue
        fixed = choices.get((name, param.opts[0] if param.opts[0].startswith("--") else flag))
        given = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
        if fixed and not getattr(param, "is_flag", False):
            found += [f"{name} {flag}: {v!r} is not one of {', '.join(fixed)}" for v in given.split("|")
                      if v and v not in fixed and not v.isupper()]   # an upper-case word is a placeholder
    return found


def inline_problems(text: str, group, choices) -> list[str]:
    """The fixed-set flags prose cites in inline code (outside fenced blocks) with a value: the
    value one of the flag's. Other flags in prose may be another tool's (vLLM's, bubblewrap's)."""
    fixed: dict[str, set[str]] = {}
    for (_, flag), values in choices.items():
        fixed.setdefault(flag, set()).update(values)
    found = []
    for span in SPAN.findall(FENCE.sub("", text)):
        flag, *rest = span.replace("=", " ").split()
        if rest and flag in fixed and rest[0] not in fixed[flag] and not rest[0].isupper():
            found.append(f"{flag}: {rest[0]!r} is not one of {', '.join(sorted(fixed[flag]))} (in `{span}`)")
    return found


def test_the_walk_finds_the_documented_commands():
    found = [c for page in PAGES for c in commands(page.read_text(encoding="utf-8"))]
    assert len(found) >= 30 and any(c.startswith("calibrate") for c in found)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_documented_command_parses(page):
    import typer

    from quantkit.cli import app

    group, choices = typer.main.get_command(app), _choices()
    text = page.read_text(encoding="utf-8")
    bad = [f"{p}  <-  quantkit {c}" for c in commands(text) for p in problems(c, group, choices)]
    assert not bad + inline_problems(text, group, choices), "\n".join(bad + inline_problems(text, group, choices))


def test_a_wrong_choice_and_an_unknown_flag_are_caught():
    import typer

    from quantkit.cli import app

    group, choices = typer.main.get_command(app), _choices()
    assert problems("calibrate logs.jsonl --out d --policy proportional", group, choices)
    assert problems("convert m --recipe w8a16 --no-such-flag", group, choices)
    assert not problems("calibrate LOGS --out DIR [--policy traffic|sqrt|balanced]", group, choices)
    assert inline_problems("the rest follows (`--policy proportional`)", group, choices)
    assert not inline_problems("or is spread evenly (`--policy balanced`)", group, choices)


def test_the_cheap_documented_commands_run(smollm2_dir):
    """``quantkit plan`` reads a config and headers only: every documented one runs, its model
    placeholder (an upper-case word) standing for the embedded default's folder."""
    from typer.testing import CliRunner

    from quantkit.cli import app

    ran = 0
    for page in PAGES:
        for text in commands(page.read_text(encoding="utf-8")):
            argv = shlex.split(text)
            if argv[0] != "plan":
                continue
            argv = [str(smollm2_dir) if a.isupper() and a.isalpha() else a for a in argv]
            result = CliRunner().invoke(app, argv)
            assert result.exit_code == 0, f"{page.name}: quantkit {text}\n{result.output[-400:]}"
            ran += 1
    assert ran >= 1
