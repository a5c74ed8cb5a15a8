"""Runs a child so that it cannot outlive quantkit: ``python watchdog.py PARENT_PID [--remove DIR
...] -- [CMD...]``.

Started by quantkit in a new session (a server, vllm.py; the load generator, loadtest/generator.py),
it starts ``CMD`` in that session and then watches. When its parent is gone (quantkit exited,
crashed or was killed with SIGKILL, which no handler in quantkit can catch), when it is sent
SIGTERM or SIGINT, or when ``CMD`` exits, it stops every process of the session (processes.py) and
exits itself. Without ``CMD`` it only waits for the parent. Then, the parent gone, it removes each
``--remove`` folder that is still there: a quantkit temporary folder (``quantkit-*`` under the
temporary directory) and nothing else, so a killed quantkit leaves no work folder behind. Run by
path, not as a module, so that it starts in milliseconds and imports nothing of quantkit but
processes.py.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from processes import stop_session  # noqa: E402  (the folder, not the package: see the docstring)

POLL_S = 0.2


def removable(folder: str) -> bool:
    """Only a quantkit temporary folder is ever removed (never a path a user gave)."""
    real = os.path.realpath(folder)
    return (os.path.dirname(real) == os.path.realpath(tempfile.gettempdir())
            and os.path.basename(real).startswith("quantkit-") and not os.path.islink(folder))


def main(argv: list[str]) -> int:
    parent, split = int(argv[1]), argv.index("--")
    opts, cmd = argv[2:split], argv[split + 1:]
    folders = [opts[i + 1] for i, o in enumerate(opts) if o == "--remove"]
    stopping = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stopping.append(True))
    child = subprocess.Popen(cmd) if cmd else None   # inherits this session, stdout and stderr
    while not stopping and (child is None or child.poll() is None) and os.getppid() == parent:
        time.sleep(POLL_S)
    stop_session(os.getsid(0), spare=os.getpid())
    if os.getppid() != parent:
        for folder in folders:
            if removable(folder):
                shutil.rmtree(folder, ignore_errors=True)
    if child is None:
        return 0
    try:
        return child.wait(timeout=5)
    except subprocess.TimeoutExpired:
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
