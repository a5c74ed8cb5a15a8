"""The sampler's output folder, written all at once.

    DIR/samples.jsonl   one sample a line: text, token ids and where it came from
    DIR/manifest.json   counts, cells, histogram, provenance (see manifest.py)
    DIR/report.md, report.html, report.json

Files are written into ``DIR.tmp-<pid>`` and the folder is renamed into place when complete, so a
crash never leaves a half-written calibration set that a later ``convert --calib`` would trust.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from quantkit.calibration.manifest import MANIFEST_FORMAT
from quantkit.errors import QuantkitError
from quantkit.common.jsonio import dumps_strict
from quantkit.common.outputs import OutputPolicy, ordinary_permissions

SAMPLES_FILE = "samples.jsonl"
MANIFEST_FILE = "manifest.json"


def samples_bytes(samples: list[dict[str, Any]]) -> bytes:
    return "".join(dumps_strict(s, ensure_ascii=False, separators=(",", ":")) + "\n"
                   for s in samples).encode("utf-8")


def json_bytes(data: Any) -> bytes:
    return (dumps_strict(data, ensure_ascii=False, indent=1) + "\n").encode("utf-8")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def is_sampler_output(path: Path) -> bool:
    return path.is_dir() and (path / MANIFEST_FILE).is_file()


def write_output(out: str | Path, files: dict[str, bytes], policy: OutputPolicy, overwrite: bool = False) -> Path:
    """Write ``files`` (name -> bytes) as the folder ``out``: staged beside it, marked as
    ``quantkit calibrate``'s output and renamed into place; an existing folder is replaced only
    under ``policy`` (an earlier calibration output, with ``overwrite``)."""
    out = Path(out)
    policy.check(out, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        for name, data in files.items():
            (tmp / name).write_bytes(data)
        policy.stamp(tmp)
        ordinary_permissions(tmp)
        return policy.replace(tmp, out, overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def read_output(path: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The manifest and samples of a sampler output folder, checked against each other."""
    path = Path(path)
    try:
        manifest = json.loads((path / MANIFEST_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise QuantkitError(f"{path / MANIFEST_FILE}: unreadable ({type(exc).__name__})") from None
    if manifest.get("format") != MANIFEST_FORMAT:
        raise QuantkitError(f"{path / MANIFEST_FILE}: not a quantkit calibration manifest")
    data = (path / SAMPLES_FILE).read_bytes() if (path / SAMPLES_FILE).is_file() else None
    if data is None:
        raise QuantkitError(f"{path / SAMPLES_FILE}: missing")
    if sha256(data) != manifest.get("samples_sha256"):
        raise QuantkitError(f"{path / SAMPLES_FILE}: sha256 differs from the manifest (edited or truncated)")
    samples = [json.loads(line) for line in data.decode("utf-8").splitlines() if line]
    return manifest, samples
