"""Code says the fact, not where it came from: no .py file cites a work session, an issue number
or FACTS.md (a file outside the repository; facts the code relies on are in docs/)."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("quantkit", "tests", "benchmarks", "scripts")
PATTERN = re.compile(r"session \d+|issue \d+|FACTS\.md", re.IGNORECASE)


def test_no_history_words_in_code():
    found = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.resolve() == Path(__file__).resolve():
                continue
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if PATTERN.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not found, "history words (session N, issue N, FACTS.md) in code:\n" + "\n".join(found)
