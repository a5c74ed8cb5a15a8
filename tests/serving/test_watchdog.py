"""The watchdog (quantkit/serving/watchdog.py) stops every process of its session when quantkit
goes away, however it goes: killed outright, or leaving normally."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from quantkit.serving.processes import session_members, stop_session
from quantkit.serving.vllm import WATCHDOG


def _gone(pids: list[int], within_s: float = 15.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _server_with_orphan(pid_file: Path) -> list[str]:
    """A stand-in server that starts a child which outlives it (as vLLM's engine core does)."""
    code = textwrap.dedent(f"""
        import subprocess, sys, time
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        open({str(pid_file)!r}, "w").write(str(p.pid))
        time.sleep(300)
    """)
    return [sys.executable, "-c", code]


def _wait_for(path: Path, within_s: float = 30.0) -> int:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return int(path.read_text())
        time.sleep(0.05)
    raise AssertionError(f"{path} never written")


def test_a_killed_parent_leaves_no_process_of_the_session(tmp_path):
    """quantkit killed with SIGKILL (no handler runs): the watchdog notices and stops the server
    and the server's orphaned child."""
    pid_file = tmp_path / "child.pid"
    launcher = textwrap.dedent(f"""
        import subprocess, sys, time
        w = subprocess.Popen([sys.executable, {str(WATCHDOG)!r}, str(__import__("os").getpid()), "--",
                              *{_server_with_orphan(pid_file)!r}], start_new_session=True)
        print(w.pid, flush=True)
        time.sleep(300)
    """)
    parent = subprocess.Popen([sys.executable, "-c", launcher], stdout=subprocess.PIPE, text=True)
    sid = int(parent.stdout.readline())
    child = _wait_for(pid_file)
    members = session_members(sid)
    assert child in members and sid in members and len(members) >= 3
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait(timeout=10)
    assert _gone(members), [p for p in members if _alive(p)]


def test_stop_session_stops_a_child_that_ignores_sigterm(tmp_path):
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    time.sleep(0.5)   # the handler is installed
    t0 = time.monotonic()
    assert stop_session(proc.pid, grace_s=1.0) == 1
    assert time.monotonic() - t0 < 10
    assert _gone([proc.pid])


def test_the_watchdog_stops_the_session_on_sigterm(tmp_path):
    pid_file = tmp_path / "child.pid"
    w = subprocess.Popen([sys.executable, str(WATCHDOG), str(os.getpid()), "--", *_server_with_orphan(pid_file)],
                         start_new_session=True)
    child = _wait_for(pid_file)
    members = session_members(w.pid)
    assert child in members
    w.send_signal(signal.SIGTERM)
    w.wait(timeout=30)
    assert _gone(members)
