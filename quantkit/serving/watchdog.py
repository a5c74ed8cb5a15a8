"""Runs a server so that it cannot outlive quantkit: ``python watchdog.py PARENT_PID -- CMD...``.

Started by quantkit (vllm.py) in a new session, it starts ``CMD`` in that session and then
watches. When its parent is gone (quantkit exited, crashed or was killed with SIGKILL, which no
handler in quantkit can catch), when it is sent SIGTERM or SIGINT, or when ``CMD`` exits, it
stops every process of the session (processes.py) and exits itself. Run by path, not as a
module, so that it starts in milliseconds and imports nothing of quantkit but processes.py.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from processes import stop_session  # noqa: E402  (the folder, not the package: see the docstring)

POLL_S = 0.2


def main(argv: list[str]) -> int:
    parent, cmd = int(argv[1]), argv[argv.index("--") + 1:]
    stopping = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stopping.append(True))
    server = subprocess.Popen(cmd)   # inherits this session, stdout and stderr
    while not stopping and server.poll() is None and os.getppid() == parent:
        time.sleep(POLL_S)
    stop_session(os.getsid(0), spare=os.getpid())
    try:
        return server.wait(timeout=5)
    except subprocess.TimeoutExpired:
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
