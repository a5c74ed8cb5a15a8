"""The boundary that generated and suite code runs behind: bubblewrap, an OS-level sandbox.

A blocklist inside Python cannot hold (``import posix; posix.system(...)`` walks around
it), so the boundary is the kernel's, set up by Debian's ``bubblewrap`` (the tool Flatpak
uses) rather than by hand. Each program runs in a process that has:

- its own root: a read-only view of the system folders (``/usr`` and the ``/bin``, ``/lib``
  links) and of the Python installation, nothing else (no ``/home``, ``/root``, the
  repository, the models or the user's data); a private size-capped ``/tmp``, its only
  writable place, gone when it exits;
- no network (an empty network namespace: even 127.0.0.1 is refused), its own pid, ipc,
  uts and cgroup namespaces, a new session (no typing into quantkit's terminal), and death
  with quantkit (``--die-with-parent``); when its first process ends, the pid namespace
  ends and every process it started is killed;
- an unprivileged identity: as root, bwrap mounts as root and ``setpriv`` drops to nobody
  (65534), no groups, every capability gone, before the program starts; as any other user
  it keeps that user's uid inside bwrap's user namespace, without capabilities;
- limits (``prlimit``): CPU seconds, address space, processes, file size, open files, no
  core dumps; the wall clock is enforced here by killing the whole tree.

``find_sandbox()`` probes the whole chain once and raises ``SandboxUnavailable`` (with the
reason) when it cannot be set up; the caller then skips code tasks and says so, unless the
user asked for ``Unsandboxed`` (``--unsafe-code-exec``).
"""
from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Protocol

from quantkit.errors import QuantkitError

NOBODY = 65534
BWRAP = "bwrap"             # looked up on PATH; tests point it elsewhere to simulate its absence
PROGRAM = "/tmp/program.py"
ENV = {"PATH": "/usr/bin:/bin"}
# Top-level system entries: on merged-/usr systems these are links into /usr (recreated as
# links); elsewhere they are folders (bound read-only).
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# Passes only where the boundary holds: not root, an empty network namespace.
PROBE = ("import os, socket\n"
         "assert os.getuid() != 0, 'still root'\n"
         "assert [n for _, n in socket.if_nameindex()] == ['lo'], 'network visible'\n")


class SandboxUnavailable(QuantkitError):
    """No sandbox could be set up here; the message says why."""


@dataclass(frozen=True)
class Limits:
    wall_s: float = 5.0
    mem_bytes: int = 1 << 30        # address space (RLIMIT_AS) per process
    procs: int = 32                 # RLIMIT_NPROC: per real uid (root is exempt, so root drops to
                                    # nobody, whose other processes on the host count too)
    file_bytes: int = 1 << 20       # RLIMIT_FSIZE: largest file written, stderr included
    tmp_bytes: int = 16 << 20       # the private /tmp
    open_files: int = 64

    @property
    def cpu_s(self) -> int:
        return math.ceil(self.wall_s) + 1


@dataclass(frozen=True)
class Outcome:
    returncode: int | None          # None: the wall clock ran out and the tree was killed
    stderr_tail: str = ""

    @property
    def signal(self) -> int | None:
        """The signal that ended the program (bwrap reports 128 + n, a direct child -n)."""
        rc = self.returncode
        if rc is None:
            return None
        return -rc if rc < 0 else rc - 128 if rc > 128 else None


class Runner(Protocol):
    sandboxed: bool

    def run(self, source: str, limits: Limits) -> Outcome: ...


def _prlimit(prlimit: str, lim: Limits) -> list[str]:
    return [prlimit, f"--cpu={lim.cpu_s}", f"--as={lim.mem_bytes}", f"--nproc={lim.procs}",
            f"--fsize={lim.file_bytes}", f"--nofile={lim.open_files}", "--core=0", "--"]


def _run(argv: list[str], wall_s: float, cwd: str, pass_fds: tuple[int, ...] = ()) -> Outcome:
    # stderr goes to a file, not a pipe: RLIMIT_FSIZE caps it, where a pipe read into memory
    # would let a program fill quantkit's memory.
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, cwd=cwd, env=ENV, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=err, pass_fds=pass_fds, start_new_session=True)
        try:
            rc: int | None = proc.wait(timeout=wall_s)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            # the session's whole group: for bwrap its death ends the pid namespace, for an
            # unsandboxed program it reaches the children that did not start a session of their own
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        size = err.seek(0, os.SEEK_END)
        err.seek(max(0, size - 4000))
        tail = err.read().decode("utf-8", "replace")[-400:]
    return Outcome(rc, tail)


def _within(path: str, folders) -> bool:
    return any(path == f or path.startswith(f + "/") for f in folders)


def _python() -> tuple[str, list[str]]:
    """The interpreter quantkit runs on (the real binary, not a venv link) and the folders it needs."""
    exe = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    homes = {os.path.realpath(p) for p in (sys.base_prefix, sys.base_exec_prefix, os.path.dirname(exe))}
    homes = {h for h in homes if not _within(h, SYSTEM)}
    return exe, sorted(h for h in homes if not _within(h, homes - {h}))


@dataclass(frozen=True)
class Bubblewrap:
    """Programs run behind bwrap (see the module docstring for what the boundary holds)."""
    bwrap: str
    prlimit: str
    setpriv: str | None             # set when quantkit runs as root: the drop to nobody
    python: str
    python_homes: tuple[str, ...]
    sandboxed: bool = True

    def argv(self, lim: Limits, source_fd: int) -> list[str]:
        a = [self.bwrap]
        for path in SYSTEM:
            if os.path.islink(path):
                a += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                a += ["--ro-bind", path, path]
        made: set[str] = set()
        for home in self.python_homes:
            # bwrap makes missing parents 0700 (root's), which nobody could not traverse
            parts = home.strip("/").split("/")[:-1]
            for i in range(1, len(parts) + 1):
                d = "/" + "/".join(parts[:i])
                if d not in made and not _within(d, SYSTEM):
                    a += ["--perms", "0755", "--dir", d]
                    made.add(d)
            a += ["--ro-bind", home, home]
        a += ["--dev", "/dev", "--proc", "/proc",
              "--size", str(lim.tmp_bytes), "--perms", "1777", "--tmpfs", "/tmp",
              "--file", str(source_fd), PROGRAM, "--remount-ro", "/",
              "--unshare-net", "--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup",
              "--die-with-parent", "--new-session", "--clearenv", "--setenv", "PATH", ENV["PATH"],
              "--chdir", "/tmp"]
        if self.setpriv:
            # no user namespace here: setpriv needs root's real setuid to reach a real uid 65534
            a += ["--", self.setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                  "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs"]
        else:
            a += ["--unshare-user"]
        return a + ["--"] + _prlimit(self.prlimit, lim) + [self.python, "-I", "-S", PROGRAM]

    def run(self, source: str, limits: Limits) -> Outcome:
        # the source travels through a descriptor that bwrap copies into the private /tmp:
        # no host file the program's user would need to read
        with tempfile.TemporaryFile() as src:
            src.write(source.encode("utf-8"))
            src.flush()
            src.seek(0)
            return _run(self.argv(limits, src.fileno()), limits.wall_s, "/", pass_fds=(src.fileno(),))


@dataclass(frozen=True)
class Unsandboxed:
    """The explicit unsafe path (``--unsafe-code-exec``): the same limits, an empty temporary
    working folder and an empty environment, but the program can reach everything its user can."""
    prlimit: str
    python: str
    sandboxed: bool = False

    def run(self, source: str, limits: Limits) -> Outcome:
        with tempfile.TemporaryDirectory(prefix="quantkit-exec-") as tmp:
            path = os.path.join(tmp, "program.py")
            with open(path, "w", encoding="utf-8") as f:
                f.write(source)
            return _run(_prlimit(self.prlimit, limits) + [self.python, "-I", "-S", path], limits.wall_s, tmp)


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise SandboxUnavailable(f"{name} is not installed (util-linux)")
    return path


def find_sandbox() -> Bubblewrap:
    """The bubblewrap sandbox, probed end to end; ``SandboxUnavailable`` says why not.

    >>> find_sandbox().run("print('hi')", Limits()).returncode   # doctest: +SKIP
    0
    """
    bwrap = shutil.which(BWRAP)
    if bwrap is None:
        raise SandboxUnavailable("bubblewrap (bwrap) is not installed: run scripts/setup.sh "
                                 "or apt-get install bubblewrap")
    python, homes = _python()
    sb = Bubblewrap(bwrap, _tool("prlimit"), _tool("setpriv") if os.geteuid() == 0 else None,
                    python, tuple(homes))
    out = sb.run(PROBE, Limits(wall_s=20.0))
    if out.returncode != 0:
        last = (out.stderr_tail.strip().splitlines() or [f"exit status {out.returncode}"])[-1]
        raise SandboxUnavailable(f"{bwrap} failed its probe: {last}")
    return sb


def unsandboxed() -> Unsandboxed:
    return Unsandboxed(_tool("prlimit"), _python()[0])


def code_runner(unsafe: bool = False) -> Runner:
    """What runs generated and suite code: the sandbox, or with ``unsafe`` no sandbox at all."""
    return unsandboxed() if unsafe else find_sandbox()
