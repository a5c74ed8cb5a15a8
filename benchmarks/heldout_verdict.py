"""Benchmark: the verdict's default limits on texts they were not derived from.

    python benchmarks/heldout_verdict.py [--src DIR] [--work DIR] [--max-len 4096]
        [--json tests/evaluation/smollm2_heldout_measured.json]

The default limits (quantkit/evaluation/verdict.py) were set on the default suite's figures for
SmolLM2's RTN checkpoints. This builds four English slices from texts that neither the default
suite (eval/slices) nor the calibration set (calibration/default.jsonl) reads, converts the
embedded SmolLM2 with the RTN recipes w8a16, fp8-dynamic and w4a16-g64, evaluates each against
the baseline on those slices with the default ``SuiteOptions`` and writes every slice's figures
with a ``source`` saying how they were made:

- heldout-numbers-en: the 12 English news documents with the most digits per character among
  those nobody else reads (gensim's Lee corpus: the background documents calibration does not
  cite, the test documents eval/ does not take), focus on the numbers, plus "list the numbers"
  prompts from their sentences;
- heldout-names-en: the next 12 such documents with at least 3 multi-word capitalised names;
- heldout-code-en: two functions of 13-46 lines from each of six standard-library modules that
  neither eval/ nor calibration reads, focus on the brackets;
- long-heldout-en: IDLE's documentation (idlelib/help.html as text), one long document.

The gensim wheel is the one eval/build_slices.py pins (downloaded into --src when missing, its
sha256 checked). The standard-library texts are those of the running Python.
"""
from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
import sysconfig
import time
from html.parser import HTMLParser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CANDIDATES = {"w8a16": "w8a16", "fp8_dynamic": "fp8-dynamic", "w4a16-g64": "w4a16-g64"}  # key -> recipe
CODE_MODULES = ("copy.py", "fnmatch.py", "graphlib.py", "quopri.py", "reprlib.py", "timeit.py")
LEE = "gensim/test/test_data/lee.cor"
LEE_BACKGROUND = "gensim/test/test_data/lee_background.cor"
TEXT_ITEMS = 12
LONG_CHARS = 48000   # more than 8k tokens; the harness cuts at --max-len


def build_slices_module():
    """eval/build_slices.py: the pinned archives and the selection helpers the default suite uses."""
    sys.path.insert(0, str(ROOT / "eval"))
    import build_slices
    return build_slices


def unread_news(bs, src: Path) -> tuple[list[tuple[str, str]], str]:
    """(id, text) of the Lee documents neither calibration cites nor eval/ takes, and the wheel's sha256."""
    b = bs.Builder(src)
    background = b.read("gensim", LEE_BACKGROUND).decode("utf-8", "replace").splitlines()
    cited = {int(n) for s in bs.CALIBRATION if s.startswith(f"gensim:{LEE_BACKGROUND}#L")
             for n in s.split("#L", 1)[1].split(",")}
    docs = [(f"lee-background-{n}", d.strip()) for n, d in enumerate(background, 1)
            if n not in cited and d.strip()]
    taken = {json.loads(line)["id"] for name in ("numbers-en", "names-en")
             for line in (ROOT / "eval" / "slices" / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()}
    test = b.read("gensim", LEE).decode("utf-8", "replace").splitlines()
    docs += [(f"lee-test-{i}", d.strip()) for i, d in enumerate([d for d in test if d.strip()])
             if f"lee-{i}" not in taken]
    return docs, bs.ARCHIVES["gensim"][4]


def news_slices(bs, docs: list[tuple[str, str]]) -> dict[str, list[dict]]:
    """The numbers and names slices, chosen as eval/build_slices.py chooses the default's."""
    density = sorted(docs, key=lambda d: (-len(bs.NUM_RE.findall(d[1])) / len(d[1]), d[0]))
    numeric, rest = density[:TEXT_ITEMS], density[TEXT_ITEMS:]
    number = re.compile(r"\$?\d+(?:[.,]\d+)*%?")
    items = [{"id": i, "kind": "text", "text": t, "focus": bs.spans(number, t)} for i, t in numeric]
    sentences = [s for _, t in numeric for s in re.split(r"(?<=[.!?])\s+", t)
                 if 2 <= len(bs.numbers_in(s)) <= 5 and len(s) < 260]
    items += [{"id": f"extract-{k}", "kind": "extract",
               "prompt": f"List every number in this sentence, separated by commas.\n\n{s}",
               "reference": bs.numbers_in(s)} for k, s in enumerate(sentences[:TEXT_ITEMS])]
    named = [(i, t) for i, t in sorted(rest) if len(bs.NAME_RE.findall(t)) >= 3][:TEXT_ITEMS]
    return {"heldout-numbers-en": items,
            "heldout-names-en": [{"id": i, "kind": "text", "text": t, "focus": bs.spans(bs.NAME_RE, t)}
                                 for i, t in named]}


def code_slice(bs) -> list[dict]:
    """The first two functions of 13-46 lines of each module in CODE_MODULES, fenced."""
    import ast

    lib = Path(sysconfig.get_paths()["stdlib"])
    reads = {s.split("#")[0] for s in bs.CALIBRATION}
    items = []
    for name in CODE_MODULES:
        if f"cpython-stdlib:Lib/{name}" in reads or name in bs.STDLIB_MODULES:
            raise SystemExit(f"Lib/{name} is read by calibration or eval/: not held out")
        src = (lib / name).read_text(encoding="utf-8")
        funcs = sorted((n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.FunctionDef)
                        and 12 <= n.end_lineno - n.lineno <= 45), key=lambda n: n.lineno)
        for n in funcs[:2]:
            text = "```python\n" + "\n".join(src.splitlines()[n.lineno - 1:n.end_lineno]) + "\n```"
            items.append({"id": f"{name[:-3]}.{n.name}", "kind": "text", "text": text,
                          "focus": bs.spans(re.compile(r"[()\[\]{}:]"), text)})
    return items


class _Text(HTMLParser):
    """The visible text of an HTML page, one line per block."""

    def __init__(self):
        super().__init__()
        self.parts: list[str] = []
        self.skip = 0

    def handle_starttag(self, tag, attrs):
        self.skip += tag in ("script", "style")

    def handle_endtag(self, tag):
        self.skip -= tag in ("script", "style")

    def handle_data(self, data):
        if not self.skip:
            self.parts.append(data)


def long_slice() -> list[dict]:
    parser = _Text()
    parser.feed((Path(sysconfig.get_paths()["stdlib"]) / "idlelib" / "help.html").read_text(encoding="utf-8"))
    lines = [" ".join(line.split()) for line in "".join(parser.parts).splitlines()]
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
    text = text[text.index("IDLE¶"):]   # from the page's heading: the navigation before it is no prose
    return [{"id": "idle-help", "kind": "text", "text": text[:LONG_CHARS]}]


def write_slices(src: Path, folder: Path) -> str:
    """The four slices as JSONL files in ``folder``; returns where their texts come from."""
    bs = build_slices_module()
    docs, wheel_sha = unread_news(bs, src)
    slices = {**news_slices(bs, docs), "heldout-code-en": code_slice(bs), "long-heldout-en": long_slice()}
    folder.mkdir(parents=True, exist_ok=True)
    for name, items in slices.items():
        with open(folder / f"{name}.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps(it, ensure_ascii=False) + "\n" for it in items)
    py = sys.version.split()[0]
    return (f"news: gensim 4.4.0 wheel (sha256 {wheel_sha[:16]}...), {LEE_BACKGROUND} lines calibration does "
            f"not cite and {LEE} documents eval/ does not take ({len(docs)} documents), chosen as "
            f"eval/build_slices.py chooses numbers-en / names-en; code: CPython {py} Lib/"
            f"{{{','.join(m[:-3] for m in CODE_MODULES)}}}.py, first 2 functions of 13-46 lines each; "
            f"long: CPython {py} Lib/idlelib/help.html as text, first {LONG_CHARS} characters")


def convert(work: Path) -> dict[str, Path]:
    """The RTN checkpoints of the embedded default model (written once into ``work``)."""
    import quantkit

    out = {}
    for key, recipe in CANDIDATES.items():
        out[key] = work / key
        if not (out[key] / "config.json").exists():
            quantkit.quantize(None, recipe).save(out[key], overwrite=True)
    return out


def _rounded(v):
    """A figure as stored: numbers, and the intervals over prompts or rows (``<measure>_ci``) the verdict reads."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return round(v, 6)
    if isinstance(v, list) and len(v) == 2 and all(isinstance(x, (int, float)) for x in v):
        return [round(x, 6) for x in v]
    return None


def measure(folder: Path, checkpoints: dict[str, Path], max_len: int) -> dict:
    from quantkit.evaluation import evaluate
    from quantkit.evaluation.checkpoint import load_model, load_tokenizer, module_errors, resolve_dir
    from quantkit.evaluation.slices import load_suite

    base_dir = resolve_dir(None)
    base, tok = load_model(base_dir), load_tokenizer(base_dir)
    suite = load_suite(str(folder))
    out = {}
    for key, cdir in checkpoints.items():
        t = time.perf_counter()
        result = evaluate(base, load_model(cdir), tok, suite=suite, max_len=max_len,
                          module_errors=module_errors(cdir), progress=False)
        out[key] = {"decision": result.decision, "seconds": round(time.perf_counter() - t, 1),
                    "cpu_seconds": round(result.meta["cpu_seconds_total"], 1),
                    "slices": {s: {m: _rounded(v) for m, v in vals.items() if _rounded(v) is not None}
                               for s, vals in result.slices.items()}}
        print(key, result.decision, [r.text() for r in result.verdict.reasons], flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, default=Path("/tmp/evsrc"), help="folder for the gensim wheel")
    ap.add_argument("--work", type=Path, default=ROOT / ".cache" / "benchmarks" / "heldout",
                    help="folder for the slices and the RTN checkpoints")
    ap.add_argument("--max-len", type=int, default=4096, help="deployment length: the long slice runs to it")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = ap.parse_args()
    texts = write_slices(args.src, args.work / "slices")
    measured = measure(args.work / "slices", convert(args.work), args.max_len)
    doc = {"source": (f"python {shlex.join(sys.argv)} (max-len {args.max_len}): SmolLM2-135M-Instruct "
                      f"(the embedded default) and its RTN checkpoints (recipes {', '.join(CANDIDATES.values())}), "
                      f"evaluate() with the default SuiteOptions on four English slices; {texts}"),
           "decisions": {k: v["decision"] for k, v in measured.items()},
           "cost": {k: {"seconds": v["seconds"], "cpu_seconds": v["cpu_seconds"]} for k, v in measured.items()},
           "candidates": {k: v["slices"] for k, v in measured.items()}}
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc["decisions"]))


if __name__ == "__main__":
    main()
