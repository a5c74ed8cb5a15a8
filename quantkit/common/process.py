"""A process that must not outlive its parent (Linux's parent-death signal)."""

from __future__ import annotations

import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1

def die_with_parent(parent: int, sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent (pid ``parent``) exits;
    sent at once when that parent is already gone. Linux only; elsewhere it does nothing."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:   # the parent died before the request was made
        os.kill(os.getpid(), sig)

