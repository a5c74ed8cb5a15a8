"""Staging folders and their owners: which leftovers of earlier runs are dead, which are live.

A conversion writes into a staging folder beside ``--out`` (``.quantkit-tmp-<host>-<pid>-<hex>``)
and renames it into place when complete; the default model is unpacked the same way into the
cache (``.smollm2-...``). A run killed outright (SIGKILL, out of memory, power) leaves its folder
behind. The folder's name says which process made it, and ``.run/owner.json`` inside says more:

    {"pid": 4242, "host": "vm", "boot_id": "385d...", "proc_start": 1032141,
     "started": "2025-01-01T12:00:00+00:00", "out": "/abs/path/of/--out"}

A folder is *dead* when its owner ran on this host and that process is gone: no such pid, a
zombie, a pid now reused by a process that started at another tick (``proc_start``, field 22
of ``/proc/<pid>/stat``), or a reboot since (``boot_id``). A live owner's folder, or one made
on another host (a shared filesystem: liveness cannot be told), is never touched. Folders
whose name carries no owner (made before owners were recorded) are left alone too.
``.run/`` is removed before the rename, so ``owner.json`` never reaches the checkpoint; the
name alone still tells the owner until then.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from quantkit.common.jsonio import dumps_strict

PREFIX = ".quantkit-tmp-"
RUN_DIR = ".run"      # the run's bookkeeping inside a staging folder, removed before the rename
OWNER_FILE = "owner.json"

_NAME = re.compile(r"^(?P<host>.+)-(?P<pid>\d+)-(?P<token>[0-9a-f]{8})$")


@dataclass(frozen=True)
class Owner:
    pid: int
    host: str
    boot_id: str | None = None
    proc_start: int | None = None
    started: str | None = None
    out: str | None = None

    @classmethod
    def current(cls, out: Path | None = None) -> "Owner":
        pid = os.getpid()
        return cls(pid, _host(), _boot_id(), _proc_start(pid),
                   datetime.now(timezone.utc).isoformat(timespec="seconds"),
                   str(Path(out).resolve()) if out is not None else None)

    def alive(self) -> bool:
        """False only when the owner is known to be gone (see the module docstring)."""
        if self.host != _host():
            return True
        if self.boot_id and _boot_id() and self.boot_id != _boot_id():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass  # another user's process: it exists
        state = _proc_stat(self.pid)
        if state is not None:
            if state[0] == "Z":
                return False
            if self.proc_start is not None and int(state[19]) != self.proc_start:
                return False
        return True


def make_folder(parent: Path, prefix: str = PREFIX, out: Path | None = None, record: bool = True) -> Path:
    """A new folder ``<prefix><host>-<pid>-<hex>`` in ``parent``, with its owner record
    (``record``; without one the name still tells the owner).

    ``os.mkdir`` honours the umask (``tempfile.mkdtemp`` would make it 0700, unreadable to a
    serving process running as another user once renamed into place).
    """
    parent = Path(parent)
    parent.mkdir(parents=True, exist_ok=True)
    while True:
        folder = parent / f"{prefix}{_host()}-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            os.mkdir(folder)
            break
        except FileExistsError:
            continue
    if record:
        write_owner(folder, Owner.current(out))
    return folder


def write_owner(folder: Path, owner: Owner) -> None:
    run = Path(folder) / RUN_DIR
    run.mkdir(exist_ok=True)
    tmp = run / f".{OWNER_FILE}.tmp"
    tmp.write_text(dumps_strict(asdict(owner)) + "\n", encoding="utf-8")
    os.replace(tmp, run / OWNER_FILE)


def owner_of(folder: Path, prefix: str = PREFIX) -> Owner | None:
    """The recorded owner, else the one the name gives, else None (unknown: leave it alone)."""
    folder = Path(folder)
    try:
        return Owner(**json.loads((folder / RUN_DIR / OWNER_FILE).read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        pass
    m = _NAME.match(folder.name[len(prefix):]) if folder.name.startswith(prefix) else None
    return Owner(int(m["pid"]), m["host"]) if m else None


def dead_folders(parent: Path, prefix: str = PREFIX) -> list[tuple[Path, Owner]]:
    """The folders ``<prefix>*`` in ``parent`` whose owner is known to be gone, oldest first."""
    found = []
    try:
        entries = sorted(Path(parent).iterdir())
    except OSError:
        return []
    for p in entries:
        if not p.name.startswith(prefix) or not p.is_dir() or p.is_symlink():
            continue
        owner = owner_of(p, prefix)
        if owner is not None and not owner.alive():
            found.append((p, owner))
    return sorted(found, key=lambda f: _mtime(f[0]))


def claim(folder: Path, out: Path | None = None) -> Path:
    """Take over a dead run's folder: renamed to this process's name, owner record rewritten."""
    folder = Path(folder)
    new = folder.with_name(f"{PREFIX}{_host()}-{os.getpid()}-{secrets.token_hex(4)}")
    os.rename(folder, new)
    write_owner(new, Owner.current(out))
    return new


def remove(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in Path(folder).rglob("*") if f.is_file())


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except OSError:
        return 0.0


def _host() -> str:
    # the name must stay a plain file name and parse back: [-.\w] only
    return re.sub(r"[^\w.-]", "_", socket.gethostname())[:64] or "host"


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def _proc_stat(pid: int) -> list[str] | None:
    """Fields 3.. of ``/proc/<pid>/stat`` (after the command name, which may hold spaces)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()


def _proc_start(pid: int) -> int | None:
    fields = _proc_stat(pid)
    return int(fields[19]) if fields else None
