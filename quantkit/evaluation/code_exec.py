"""Run generated code against its tests in a sandboxed subprocess.

The child gets: an empty temporary working folder, an empty environment, Python's
isolated mode, a wall-clock timeout (the whole process group is killed), CPU-time,
address-space, file-size and open-file limits, no core dumps, and no network: a fresh
network namespace when the kernel allows it (root, or unprivileged user namespaces),
and in every case a prelude that removes socket creation, process spawning and the
shell from the standard library before the program runs.
"""
from __future__ import annotations

import ctypes
import os
import resource
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

CLONE_NEWNET = 0x40000000

PRELUDE = r'''
import builtins, os, socket, subprocess, shutil
def _blocked(*a, **k):
    raise PermissionError("blocked by the quantkit sandbox")
for _name in ("socket", "create_connection", "create_server", "socketpair", "fromfd", "getaddrinfo"):
    setattr(socket, _name, _blocked)
for _name in ("system", "popen", "fork", "forkpty", "execv", "execve", "execl", "execvp", "spawnv",
              "spawnl", "kill", "killpg", "remove", "unlink", "rmdir", "removedirs", "rename",
              "replace", "chmod", "chown", "putenv", "setuid"):
    if hasattr(os, _name):
        setattr(os, _name, _blocked)
subprocess.Popen = _blocked
shutil.rmtree = _blocked
shutil.move = _blocked
del _name
'''


@dataclass(frozen=True)
class ExecResult:
    passed: bool
    status: str       # "passed", "failed", "timeout", or "error: ..."
    stderr_tail: str = ""


def _limits(timeout_s: float, mem_bytes: int):
    def apply() -> None:
        # Best effort: without the privilege, the prelude still blocks sockets.
        try:
            ctypes.CDLL(None, use_errno=True).unshare(CLONE_NEWNET)
        except Exception:
            pass
        cpu = int(timeout_s) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
        resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return apply


def run_program(source: str, timeout_s: float = 5.0, mem_bytes: int = 1 << 30) -> ExecResult:
    """Run ``source`` (program + tests); passed means exit status 0 within the limits.

    >>> run_program("assert 1 + 1 == 2").passed
    True
    """
    with tempfile.TemporaryDirectory(prefix="quantkit-exec-") as tmp:
        path = os.path.join(tmp, "program.py")
        with open(path, "w", encoding="utf-8") as f:
            f.write(PRELUDE + "\n" + source + "\n")
        proc = subprocess.Popen([sys.executable, "-I", "-S", path], cwd=tmp, env={"PATH": "/usr/bin:/bin"},
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                start_new_session=True, preexec_fn=_limits(timeout_s, mem_bytes))
        try:
            _, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return ExecResult(False, "timeout")
        tail = err.decode("utf-8", "replace")[-400:]
        if proc.returncode == 0:
            return ExecResult(True, "passed", tail)
        if proc.returncode < 0:
            return ExecResult(False, f"error: signal {-proc.returncode}", tail)
        return ExecResult(False, "failed", tail)


STOP = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\n```", "\nassert ")


def truncate_completion(text: str) -> str:
    """Cut a generated function body where the model starts something else."""
    cut = min((i for i in (text.find(s) for s in STOP) if i >= 0), default=len(text))
    return text[:cut]


def humaneval_program(item: dict, completion: str) -> str:
    return (item["prompt"] + truncate_completion(completion) + "\n\n" + item["test"]
            + f"\n\ncheck({item['entry_point']})\n")
