"""Evaluation slices: named groups of items, loaded from JSONL files in eval/slices/.

Each line of a slice file is one item, with a ``kind``:

- ``text``: ``{"id", "text", "focus"?}``: teacher-forced perplexity, KL, top-1 agreement
  (``focus`` lists ``[start, end)`` character spans, e.g. the digits or the names, whose
  tokens are also measured on their own) and greedy generation from the text's opening;
- ``mc``: ``{"id", "question", "choices", "answer"}`` (answer = index of the right choice);
- ``extract``: ``{"id", "prompt", "reference"}`` (reference = list of strings to find);
- ``code``: ``{"id", "prompt", "test", "entry_point"}`` (HumanEval layout).

A slice is public when its text ships with quantkit; the user's own calibration log makes
private "business" slices (business.py), whose text stays out of reports unless asked for. A public
slice's language is its items' ``language`` key or its name's suffix (``-en``, ``-zh``):
see languages.py for which languages gate the verdict.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from quantkit.errors import QuantkitError
from quantkit.config.validation import json_object
from quantkit.evaluation.languages import slice_language

KINDS = {"text": ("text",), "mc": ("question", "choices", "answer"),
         "extract": ("prompt", "reference"), "code": ("prompt", "test", "entry_point")}

# The default suite: slice name -> long-context (measured at --max-len, KL by position).
DEFAULT_SUITE = ("numbers-en", "numbers-zh", "code-en", "code-zh", "names-en", "names-zh",
                 "knowledge-en", "long-en", "long-zh")


def eval_dir() -> Path:
    """The eval/ folder shipped beside the package (repository checkout)."""
    return Path(__file__).resolve().parents[2] / "eval"


@dataclass
class Slice:
    name: str
    items: list[dict]
    public: bool = True
    long_context: bool = False
    source: str = ""
    language: str | None = None     # None for a public slice: from its items or name suffix
    label_replies: tuple[str, ...] = ()   # a business task whose replies are labels (label_tasks.py)

    def __post_init__(self):
        if self.language is None and self.public:
            self.language = slice_language(self.name, self.items)

    def of_kind(self, kind: str) -> list[dict]:
        return [it for it in self.items if it["kind"] == kind]


@dataclass
class SuiteOptions:
    """How much of each slice to run; the defaults keep SmolLM2 under 10 minutes on 2 cores."""
    text_items: int | None = 12             # per slice (None: all)
    mc_items: int | None = 48
    extract_items: int | None = 12
    code_items: int | None = 12
    item_tokens: int = 192                  # short texts are cut to this many tokens
    gen_tokens: int = 32                    # greedy generation agreement over N tokens
    gen_prompts: int = 8                    # prompts per slice for generation agreement (0: none)
    prompt_tokens: int = 32                 # opening of a text used as generation prompt
    extract_tokens: int = 40
    code_tokens: int = 128
    code_timeout_s: float = 5.0
    batch_tokens: int = 2048                # padded tokens per teacher-forced batch
    gen_batch: int = 16                     # prompts per greedy batch: the 12 code problems in one (decoding is bound by weight reads)
    # business slices (business.py): rows are taken in log order, each cut to business_tokens
    # (and the deployment length), until the task holds business_scored_tokens scored tokens or
    # business_rows rows; only a chat row's assistant turns are scored. business_scored_tokens is
    # also the evidence a slice needs to decide the verdict (verdict.py): short replies (a label
    # is 2-5 tokens with its end of turn) need hundreds of rows. Generation starts from the last
    # business_prompt_tokens of a row's own prompt (8 prompts padded to the longest: at 1024
    # tokens they cost as much as the scored pass)
    business_rows: int = 256
    business_tokens: int = 1024
    business_scored_tokens: int = 1024
    business_prompt_tokens: int = 256

    def __post_init__(self) -> None:
        for name in ("business_rows", "business_scored_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise QuantkitError(f"{name}: expected a positive integer, got {v!r}")


def _check_item(item: dict, where: str) -> None:
    kind = item.get("kind")
    if kind not in KINDS:
        raise QuantkitError(f"{where}: unknown item kind {kind!r} (expected one of {sorted(KINDS)})")
    missing = [k for k in KINDS[kind] if k not in item]
    if missing:
        raise QuantkitError(f"{where}: {kind} item lacks key {missing[0]!r}")


def read_slice(path: Path, name: str | None = None, public: bool = True) -> Slice:
    path = Path(path)
    if not path.exists():
        raise QuantkitError(f"{path}: slice file not found")
    items = []
    for n, item in _objects(path):
        item.setdefault("id", f"{path.stem}-{n}")
        _check_item(item, f"{path}:{n}")
        items.append(item)
    if not items:
        raise QuantkitError(f"{path}: no items (an empty slice measures nothing)")
    name = name or path.stem
    return Slice(name, items, public=public, long_context=name.startswith("long-"), source=str(path))


def _objects(path: Path) -> list[tuple[int, dict]]:
    """The JSON objects of a JSONL file with their 1-based line numbers; any other line fails."""
    try:
        lines = path.read_bytes().decode("utf-8").split("\n")  # JSON text may hold U+2028: not a line break
    except UnicodeDecodeError as e:
        raise QuantkitError(f"{path}: not UTF-8 text (byte {e.start})") from None
    return [(n, json_object(line, f"{path}:{n}")) for n, line in enumerate(lines, 1) if line.strip()]


def load_suite(suite: str | list[str] = "default", root: Path | None = None) -> list[Slice]:
    """Slices by name ("default", a comma list of names, or a folder of .jsonl files).

    >>> [s.name for s in load_suite("numbers-en,long-en")]
    ['numbers-en', 'long-en']
    """
    root = Path(root) if root else eval_dir() / "slices"
    if isinstance(suite, str) and Path(suite).is_dir():
        files = sorted(Path(suite).glob("*.jsonl"))
        if not files:
            raise QuantkitError(f"--suite: {suite} holds no .jsonl slice files")
        return [read_slice(p) for p in files]
    names = list(DEFAULT_SUITE) if suite == "default" else (
        [s.strip() for s in suite.split(",") if s.strip()] if isinstance(suite, str) else list(suite))
    out = []
    for name in names:
        path = root / f"{name}.jsonl"
        if not path.exists():
            known = sorted(p.stem for p in root.glob("*.jsonl"))
            raise QuantkitError(f"--suite: unknown slice {name!r} (known: {', '.join(known)})")
        out.append(read_slice(path, name))
    return out
