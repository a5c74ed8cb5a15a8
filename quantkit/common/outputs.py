"""Where a command may write: one output policy for every command that writes a folder or a file.

Nothing the user gave quantkit is ever removed or changed, whatever the flags. So, before any
work, an output path is refused when it

- already exists, unless ``--overwrite`` is given; and even then, unless quantkit recognises it
  as its own output of the same command (a folder holding ``.quantkit-output.json`` that names
  the command, or a file whose content says which command wrote it): a folder of the user's, a
  model folder, a calibration log is never replaced;
- is, contains or lies inside any input of the same command (the model, baseline, candidate,
  calibration log or folder, recipe, suite), compared after resolving symbolic links;
- is the working directory, a parent of it, the home folder or the file-system root;
- is itself a symbolic link (replacing it would either change where the link points or what
  it points to: neither is what the user asked for).

The one exception to "inside an input" is a folder quantkit made for exactly that purpose:
``quantkit eval`` writes by default into ``CHECKPOINT/eval``, the report slot of a checkpoint
that ``quantkit convert`` wrote (the checkpoint carries the marker); no other file of the
checkpoint is touched.

Outputs are written into a staging folder beside the destination and renamed into place when
complete (``replace``), so an interrupted command leaves nothing that looks complete.

>>> OutputPolicy("convert", {"model folder": Path("/m")}).conflict(Path("/m/out"))
'lies inside the model folder /m'
>>> OutputPolicy("convert", {"model folder": Path("/m/llama")}).conflict(Path("/m"))
'contains the model folder /m/llama'

"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from quantkit.errors import QuantkitError
from quantkit import __version__

MARKER = ".quantkit-output.json"


def _real(p: Path) -> Path:
    return Path(os.path.realpath(os.path.abspath(p)))


def _within(child: Path, parent: Path) -> bool:
    return child == parent or parent in child.parents


@dataclass(frozen=True)
class OutputPolicy:
    """The policy for one command: its name (recorded in the marker) and its inputs by role."""

    command: str
    inputs: Mapping[str, "Path | str | None"] = field(default_factory=dict)
    flag: str = "--out"
    # a folder inside an input that this command may write (eval's CHECKPOINT/eval slot)
    slot: Path | None = None

    def conflict(self, out: Path) -> str | None:
        """Why ``out`` may not be written, from its place alone (None when it may)."""
        target = _real(out)
        if self.slot is not None and target == _real(self.slot):
            return None
        cwd = _real(Path.cwd())
        if _within(cwd, target):
            return "is the working directory" if target == cwd else f"contains the working directory {cwd}"
        if target == _real(Path.home()) or target.parent == target:
            return f"is {'the home folder' if target.parent != target else 'the file-system root'}"
        for role, given in self.inputs.items():
            if given is None or str(given) == "":
                continue
            src = _real(Path(given))
            what = f"the {role} {given}"
            if target == src:
                return f"is {what}"
            if _within(target, src):
                return f"lies inside {what}"
            if _within(src, target):
                return f"contains {what}"
        return None

    def check(self, out: Path, overwrite: bool, *, is_file: bool = False) -> None:
        """Refuse ``out`` before any work (one line naming the flag and the path), or return."""
        out = Path(out)
        why = self.conflict(out)
        if why is not None:
            raise QuantkitError(f"{self.flag}: {out} {why}; quantkit never writes over its inputs: choose "
                                "another output path")
        if out.is_symlink():
            raise QuantkitError(f"{self.flag}: {out} is a symbolic link; give the real path to write")
        if not out.exists():
            check_parent(out)
            return
        if not overwrite:
            raise QuantkitError(f"{self.flag}: {out}: output {'file' if is_file else 'folder'} exists (use "
                                "--overwrite to replace an earlier quantkit output)")
        if is_file != out.is_file():
            raise QuantkitError(f"{self.flag}: {out} exists and is not a {'file' if is_file else 'folder'}")
        made_by = written_by(out)
        if made_by is None:
            raise QuantkitError(f"{self.flag}: {out} exists and is not a quantkit output (no {MARKER}); "
                                "quantkit replaces only what it wrote: remove it yourself or choose another path")
        if made_by != self.command:
            raise QuantkitError(f"{self.flag}: {out} is the output of 'quantkit {made_by}', not of "
                                f"'quantkit {self.command}'; choose another path")

    def stamp(self, folder: Path) -> None:
        """Write the marker into a staged output folder (before it is renamed into place)."""
        (Path(folder) / MARKER).write_text(json.dumps(marker(self.command)) + "\n", encoding="utf-8")

    def replace(self, staged: Path, out: Path, overwrite: bool) -> Path:
        """Rename the complete ``staged`` folder to ``out``, checked again: an output made while this
        command ran (another process) is never replaced without ``overwrite`` and the marker."""
        out = Path(out)
        self.check(out, overwrite)
        if not (Path(staged) / MARKER).exists():
            self.stamp(staged)
        old = None
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.replace(out, old)
        os.replace(staged, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return out


    def write_file(self, out: Path, data: bytes, overwrite: bool) -> Path:
        """Write a one-file output (its content names its kind, ``FILE_KINDS``) through a staged
        file renamed into place."""
        out = Path(out)
        self.check(out, overwrite, is_file=True)
        tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
        try:
            tmp.write_bytes(data)
            self.check(out, overwrite, is_file=True)
            os.replace(tmp, out)
        finally:
            tmp.unlink(missing_ok=True)
        return out


def existing_path(x: object) -> Path | None:
    """``x`` as a path when it names something on disk; None for anything else (an in-memory
    model, a preset or recipe name, a missing path): what an input role holds for the policy."""
    return Path(x) if isinstance(x, (str, Path)) and str(x) and Path(x).exists() else None


def marker(command: str) -> dict:

    # no time stamp: a resumed or repeated run writes the same bytes as an uninterrupted one
    return {"kind": "quantkit-output", "command": command, "quantkit": __version__}


def written_by(path: Path) -> str | None:
    """The command that wrote ``path`` (a folder with the marker, or a JSON file quantkit wrote that
    names its ``kind``), else None."""
    path = Path(path)
    try:
        if path.is_dir():
            data = json.loads((path / MARKER).read_text(encoding="utf-8"))
            return data.get("command") if data.get("kind") == "quantkit-output" else None
        if path.is_file() and path.stat().st_size < 256 * 2**20:
            data = json.loads(path.read_text(encoding="utf-8"))
            return FILE_KINDS.get(data.get("kind")) if isinstance(data, dict) else None
    except (OSError, ValueError, AttributeError):
        return None
    return None


# the ``kind`` of a JSON file quantkit writes -> the command that writes it
FILE_KINDS = {"quantkit-sensitivity": "sensitivity"}


def check_parent(out: Path) -> None:
    """Fail when the folder ``out`` could not be created: a file stands where a parent folder
    should, or the nearest existing parent refuses a new folder (read-only, no permission).
    The probe folder it makes there is removed at once."""
    parent = Path(os.path.abspath(out)).parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise QuantkitError(f"{out}: cannot create the output folder: {parent} is a file, not a folder")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".quantkit-probe-", dir=parent))
    except OSError as e:
        raise QuantkitError(f"{out}: cannot create the output folder in {parent} ({e.strerror or e})") from None


def ordinary_permissions(root: Path) -> None:
    """Give ``root`` and everything under it the modes a plain ``mkdir`` / ``open`` gives (0777 /
    0666 less the umask): ``tempfile.mkdtemp`` makes folders 0700 and safetensors writes its
    files 0600, which a serving process running as another user could not read."""
    mask = current_umask()
    for p in [Path(root), *Path(root).rglob("*")]:
        if not p.is_symlink():
            os.chmod(p, (0o777 if p.is_dir() else 0o666) & ~mask)


def current_umask() -> int:
    try:  # Linux >= 4.7 reports it; os.umask can only read it by setting it for a moment
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
