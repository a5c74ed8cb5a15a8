"""Deterministic crash points for the crash tests (``tests/workflows/test_resume.py``).

With ``QUANTKIT_TEST_KILL_AT`` set to a point's name the process kills itself there, so a
test can stop a conversion at an exact place rather than after a guessed delay:
``layer:N`` (before decoder layer N starts: N layers complete, ``layer:0`` before the first)
and ``shard:last`` (the final shard half written). SIGKILL by default;
``QUANTKIT_TEST_KILL_SIGNAL=TERM`` sends SIGTERM instead. A point fires once per process. Unset, a
point costs one look-up.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

_LOCK = threading.Lock()
_FIRED: set[str] = set()


def kill_point(name: str, partial: Path | None = None) -> None:
    """Kill this process if ``QUANTKIT_TEST_KILL_AT`` names this point; ``partial``: a file
    cut to half its size first (what a kill in the middle of writing it leaves)."""
    if os.environ.get("QUANTKIT_TEST_KILL_AT") != name:
        return
    with _LOCK:   # once: threads reaching the point together (slices scored at once) send one signal
        if name in _FIRED:
            return
        _FIRED.add(name)
    if partial is not None and partial.exists():
        os.truncate(partial, partial.stat().st_size // 2)
    os.kill(os.getpid(), getattr(signal, "SIG" + os.environ.get("QUANTKIT_TEST_KILL_SIGNAL", "KILL")))
