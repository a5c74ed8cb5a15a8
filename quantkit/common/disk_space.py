"""A full disk is the user's to fix, so it is one line naming the folder and the bytes, not the
writer library's traceback. safetensors reports it as its own error type with the OS's text; the
standard library as an ``OSError`` with errno ENOSPC (or EDQUOT past a quota)."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

from quantkit.errors import QuantkitError

_FULL = (errno.ENOSPC, errno.EDQUOT)


def is_disk_full(e: BaseException) -> bool:
    if isinstance(e, OSError):
        return e.errno in _FULL
    text = str(e)
    return "No space left on device" in text or "Disk quota exceeded" in text


def free_bytes(folder: Path) -> int | None:
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def disk_full_error(folder: Path, needed: int | None = None, what: str = "writing") -> QuantkitError:
    """The one line: where, how much was being written, how much is free."""
    free = free_bytes(Path(folder))
    need = f"{needed} bytes to write, " if needed is not None else ""
    return QuantkitError(f"{folder}: no space left on the device while {what} ({need}"
                         f"{'unknown' if free is None else free} bytes free); free some space or write elsewhere")
