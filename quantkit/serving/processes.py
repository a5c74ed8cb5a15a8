"""Finding and stopping every process of a session.

A server quantkit starts runs in a session of its own (``start_new_session``), led by the
watchdog (watchdog.py). vLLM's API server starts an engine-core process, which starts workers;
when a parent dies its children are re-parented but stay in the session, so the session id finds
them all, where a walk of the process tree from the leader would miss the orphans."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def session_members(sid: int) -> list[int]:
    """The live (not zombie) processes whose session id is ``sid``."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()   # state ppid pgrp session ...
        if int(fields[3]) == sid and fields[0] != "Z":
            pids.append(int(entry))
    return pids


def stop_session(sid: int, grace_s: float = 10.0, spare: int | None = None) -> int:
    """SIGTERM every member of session ``sid``, SIGKILL what is left after ``grace_s``; returns
    how many were signalled. ``spare`` (the caller, when it is a member) is left alone. A killed
    process holding gigabytes can take seconds to go on a loaded machine: it is waited for."""
    signalled = 0
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 60.0)):
        members = [p for p in session_members(sid) if p != spare]
        if not members:
            break
        for pid in members:
            try:
                os.kill(pid, sig)
                signalled += sig == signal.SIGTERM
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and [p for p in session_members(sid) if p != spare]:
            time.sleep(0.1)
    return signalled


WATCHDOG = Path(__file__).with_name("watchdog.py")


@contextmanager
def guarded(folder: Path) -> Iterator[Path]:
    """``folder`` (a quantkit temporary folder) watched for the block: a watchdog (watchdog.py, in a
    session of its own) removes it if this process dies without doing so itself (SIGKILL). Left
    normally, the watchdog is stopped and the folder is the caller's to remove."""
    dog = subprocess.Popen([sys.executable, str(WATCHDOG), str(os.getpid()), "--remove", str(folder), "--"],
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True)
    try:
        yield folder
    finally:
        dog.terminate()
        try:
            dog.wait(timeout=10)
        except subprocess.TimeoutExpired:
            dog.kill()
