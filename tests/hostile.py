"""Run ``quantkit`` as a user does, in a real process, and check what it leaves behind.

The hostile-input tests share these: a command runs as ``python -m quantkit.cli`` in its own
process group (so a timeout stops every process it started), its peak resident set is read from
the kernel's accounting of that child (``os.wait4``), and the inputs' bytes are hashed before and
after. The package under test is the one beside this folder (``PYTHONPATH``), whatever is
installed.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Outcome:
    returncode: int
    stdout: str
    stderr: str
    peak_rss_bytes: int
    seconds: float

    @property
    def lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip()]


def quantkit_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    env.update(extra)
    return env


# Linux keeps a process's resident high-water mark across exec, so a child forked from a large
# test process reports that process's peak as its own. quantkit is therefore started by a small
# Python that reports its child's peak (and exit status) through a file.
_MEASURE = """import os, subprocess, sys
p = subprocess.Popen(sys.argv[2:])
_, status, usage = os.wait4(p.pid, 0)
open(sys.argv[1], "w").write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status))
"""


def run_quantkit(args: list, *, cwd: Path | None = None, env: dict | None = None, timeout: float = 300,
                 stdin: bytes | None = None) -> Outcome:
    """``python -m quantkit.cli ARGS`` to completion; killed with its whole process group past
    ``timeout`` (then the test fails: a bounded command never needs that)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.TemporaryDirectory() as box:
        peak = Path(box) / "maxrss"
        start = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-c", _MEASURE, str(peak), sys.executable, "-m", "quantkit.cli",
                                 *map(str, args)], cwd=cwd,
                                env=env or quantkit_env(), stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
                                start_new_session=True)
        if stdin is not None:
            proc.stdin.write(stdin)
            proc.stdin.close()
        status, _ = _wait(proc.pid, timeout)
        seconds = time.monotonic() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        kib = int(peak.read_text()) if peak.exists() else 0
        return Outcome(proc.returncode, out.read().decode(errors="replace"), err.read().decode(errors="replace"),
                       kib * 1024, seconds)


def _wait(pid: int, timeout: float):
    deadline = time.monotonic() + timeout
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            return status, usage
        if time.monotonic() > deadline:
            kill_group(pid)
            os.wait4(pid, 0)
            raise AssertionError(f"quantkit did not finish within {timeout} s (process group killed)")
        time.sleep(0.05)


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def assert_refused(res: Outcome, *names: str) -> str:
    """Exit 2, one ``error:`` line that names each of ``names``, no traceback; the line."""
    assert res.returncode == 2, (res.returncode, res.stderr[-3000:])
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    errors = [line for line in res.lines if line.startswith("error:")]
    assert len(errors) == 1, res.stderr[-3000:]
    assert res.lines[-1] == errors[0], res.stderr[-3000:]
    for name in names:
        assert name in errors[0], (name, errors[0])
    return errors[0]


def digests(*roots: Path) -> dict[str, tuple]:
    """Every entry under ``roots`` (not following links): folders, links with their target, files
    with the sha256 of their bytes and their mode."""
    out: dict[str, tuple] = {}
    for root in roots:
        root = Path(root)
        if not root.exists() and not root.is_symlink():
            continue
        for p in [root, *sorted(root.rglob("*"))] if root.is_dir() and not root.is_symlink() else [root]:
            st = p.lstat()
            if p.is_symlink():
                out[str(p)] = ("link", os.readlink(p))
            elif p.is_dir():
                out[str(p)] = ("dir", st.st_mode)
            else:
                out[str(p)] = ("file", st.st_mode, hashlib.sha256(p.read_bytes()).hexdigest())
    return out


def entries(*roots: Path) -> set[str]:
    """The names of everything under ``roots``: what a refused command must not add to."""
    return set(digests(*roots))
