"""Readers for traffic logs: JSONL, CSV, Parquet, local HF ``datasets`` folders, plain text.

Every reader returns the same thing: records (dicts) tagged with the 1-based line (or row)
number they came from, plus a ``Malformed`` tally for lines that could not be read at all.
Rows are never silently skipped: each skip is counted under a reason with its first lines.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Iterator

from quantkit.errors import QuantkitError

FIRST_LINES_KEPT = 5
TEXT_SUFFIXES = (".txt", ".md")
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")


@dataclass
class Malformed:
    """Skipped rows counted by reason, keeping the first few line numbers of each."""

    counts: dict[str, int] = field(default_factory=dict)
    first_lines: dict[str, list[int]] = field(default_factory=dict)

    def add(self, reason: str, line: int) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1
        kept = self.first_lines.setdefault(reason, [])
        if len(kept) < FIRST_LINES_KEPT:
            kept.append(line)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {r: {"count": self.counts[r], "first_lines": self.first_lines[r]} for r in sorted(self.counts)}

    def summary(self) -> str:
        return ", ".join(f"{r} {d['count']} (first lines {', '.join(map(str, d['first_lines']))})"
                         for r, d in self.to_dict().items())


@dataclass
class RawLog:
    path: Path
    kind: str
    records: list[tuple[int, dict[str, Any]]]
    malformed: Malformed


def detect_kind(path: Path) -> str:
    """The log's format from what it is (folder) or its suffix; gzip is not handled here."""
    if path.is_dir():
        if (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists() \
                or (path / "state.json").exists():
            return "hf_dataset"
        raise QuantkitError(f"{path}: folder is neither a sampler output (manifest.json) "
                            "nor a saved HF datasets folder (dataset_info.json)")
    suffix = path.suffix.lower()
    if suffix in JSONL_SUFFIXES:
        return "jsonl"
    if suffix in (".csv", ".tsv"):
        return "csv"
    if suffix == ".parquet":
        return "parquet"
    if suffix in TEXT_SUFFIXES:
        return "text"
    raise QuantkitError(f"{path}: unsupported log format {suffix!r} "
                        "(use .jsonl, .csv, .parquet, .txt or a HF datasets folder)")


#: Characters of text a token rarely exceeds: a row's text is cut at ``max_len`` times this
#: (``row_char_limit``), which keeps every token a ``max_len``-token sample can hold.
CHARS_PER_TOKEN = 16
#: Bytes of one JSONL line per character kept: JSON escapes a character in up to 6 bytes
#: (``\uXXXX``) and a chat row repeats keys and roles around its text.
LINE_BYTES_PER_CHAR = 8
#: The smallest line limit, whatever ``max_len``: a short context does not make a row of a few
#: MiB malformed.
MIN_ROW_BYTES = 4 << 20


def row_char_limit(max_len: int) -> int:
    """Characters of a row's text kept for a ``max_len``-token sample: ``max_len * 16``. A row cut
    there still holds more than ``max_len`` tokens unless its tokens average more than 16
    characters, so it is still counted (and truncated) as a long row."""
    return max_len * CHARS_PER_TOKEN


def row_byte_limit(max_len: int) -> int:
    """The longest JSONL line read for a ``max_len``-token sample: ``max(4 MiB, max_len * 128)``
    bytes (8 bytes of line per character kept). A longer line is skipped as ``line_too_long``,
    read past in 1 MiB chunks, never held whole."""
    return max(MIN_ROW_BYTES, row_char_limit(max_len) * LINE_BYTES_PER_CHAR)


def read_log(path: str | Path, max_row_bytes: int | None = None) -> RawLog:
    """Read every record of a log; unreadable lines go to the malformed tally.

    ``max_row_bytes``: JSONL lines longer than this are skipped as malformed (``line_too_long``)
    without being held in memory (see ``row_byte_limit``); None: no limit."""
    path = Path(path)
    if not path.exists():
        raise QuantkitError(f"{path}: no such file or folder")
    kind = detect_kind(path)
    reader = {"jsonl": _read_jsonl, "csv": _read_csv, "parquet": _read_parquet,
              "hf_dataset": _read_hf_dataset, "text": _read_text}[kind]
    malformed = Malformed()
    records = _read_jsonl(path, malformed, max_row_bytes) if kind == "jsonl" else reader(path, malformed)
    return RawLog(path=path, kind=kind, records=records, malformed=malformed)


def file_sha256(path: str | Path) -> str:
    """sha256 of a file, or of a folder's files (relative names and bytes, sorted)."""
    path = Path(path)
    digest = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for p in files:
        if path.is_dir():
            digest.update(str(p.relative_to(path)).encode() + b"\0")
        with open(p, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def _read_jsonl(path: Path, malformed: Malformed, max_row_bytes: int | None = None) -> list[tuple[int, dict[str, Any]]]:
    if path.suffix.lower() == ".json" and _starts_with(path, b"["):
        return _read_json_array(path, malformed)
    records = []
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(_bounded_lines(fh, max_row_bytes), start=1):
            if raw is None:
                malformed.add("line_too_long", lineno)
                continue
            if not raw.strip():
                continue  # blank lines are layout, not rows
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                malformed.add("bad_encoding", lineno)
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                malformed.add("bad_json", lineno)
                continue
            if not isinstance(obj, dict):
                malformed.add("not_an_object", lineno)
                continue
            records.append((lineno, obj))
    return records


def _bounded_lines(fh: BinaryIO, limit: int | None) -> Iterator[bytes | None]:
    """The file's lines; None for a line over ``limit`` bytes, whose rest is read past in 1 MiB
    chunks (memory stays within ``limit`` plus a chunk, however long the line)."""
    if limit is None:
        yield from fh
        return
    while True:
        line = fh.readline(limit + 1)
        if not line:
            return
        if len(line) <= limit:
            yield line
            continue
        while not line.endswith(b"\n"):
            line = fh.readline(1 << 20)
            if not line:
                break
        yield None


def _starts_with(path: Path, prefix: bytes) -> bool:
    with open(path, "rb") as fh:
        return fh.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n").startswith(prefix)


def _read_json_array(path: Path, malformed: Malformed) -> list[tuple[int, dict[str, Any]]]:
    """A .json file holding one array of records; "line" numbers are 1-based array positions."""
    try:
        items = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise QuantkitError(f"{path}: not a readable JSON array ({type(exc).__name__})") from None
    records = []
    for i, obj in enumerate(items, start=1):
        if isinstance(obj, dict):
            records.append((i, obj))
        else:
            malformed.add("not_an_object", i)
    return records


_SURROGATE = re.compile("[\udc80-\udcff]")


def _read_csv(path: Path, malformed: Malformed) -> list[tuple[int, dict[str, Any]]]:
    # surrogateescape keeps bad bytes as lone surrogates, so one bad row does not sink the file.
    text = path.read_bytes().decode("utf-8", errors="surrogateescape")
    if text.startswith("\ufeff"):
        text = text[1:]
    delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
    reader = csv.DictReader(io.StringIO(text, newline=""), delimiter=delimiter)
    if reader.fieldnames is None:
        return []
    records = []
    start = reader.line_num + 1
    for row in reader:
        lineno, start = start, reader.line_num + 1
        if None in row or any(v is None for v in row.values()):
            malformed.add("wrong_column_count", lineno)
            continue
        if any(_SURROGATE.search(v) for v in row.values()):
            malformed.add("bad_encoding", lineno)
            continue
        records.append((lineno, _parse_json_cells(row)))
    return records


def _parse_json_cells(row: dict[str, str]) -> dict[str, Any]:
    # A CSV can only hold strings: a chat column arrives as JSON text.
    out: dict[str, Any] = {}
    for key, value in row.items():
        stripped = value.lstrip()
        if stripped.startswith("[") or stripped.startswith("{"):
            try:
                out[key] = json.loads(value)
                continue
            except ValueError:
                pass
        out[key] = value
    return out


def _read_parquet(path: Path, malformed: Malformed) -> list[tuple[int, dict[str, Any]]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several types for a corrupt file
        raise QuantkitError(f"{path}: not a readable Parquet file ({type(exc).__name__})") from None
    return [(i, row) for i, row in enumerate(table.to_pylist(), start=1)]


def _read_hf_dataset(path: Path, malformed: Malformed) -> list[tuple[int, dict[str, Any]]]:
    import datasets

    try:
        ds = datasets.load_from_disk(str(path))
    except (FileNotFoundError, ValueError, KeyError, TypeError) as exc:  # a partial or foreign folder
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise QuantkitError(f"{path}: not a readable HF datasets folder ({first})") from None
    if isinstance(ds, datasets.DatasetDict):
        splits = list(ds.keys())
        if "train" in ds:
            ds = ds["train"]
        elif len(splits) == 1:
            ds = ds[splits[0]]
        else:
            raise QuantkitError(f"{path}: several splits ({', '.join(splits)}) and none named 'train'")
    return [(i, row) for i, row in enumerate(ds.to_list(), start=1)]


def _read_text(path: Path, malformed: Malformed) -> list[tuple[int, dict[str, Any]]]:
    """Documents are separated by blank lines; each record remembers its first line."""
    records: list[tuple[int, dict[str, Any]]] = []
    block: list[str] = []
    block_start, block_bad = 0, False
    with open(path, "rb") as fh:
        raw_lines = fh.read().split(b"\n")
    for lineno, raw in enumerate(raw_lines + [b""], start=1):
        try:
            line = raw.decode("utf-8").rstrip("\r")
        except UnicodeDecodeError:
            # The whole document is skipped: a partial one would be a different text.
            malformed.add("bad_encoding", lineno)
            line, block_bad = "\ufffd", True
        if line.strip():
            if not block:
                block_start = lineno
            block.append(line)
        elif block:
            if not block_bad:
                records.append((block_start, {"text": "\n".join(block)}))
            block, block_bad = [], False
    return records
