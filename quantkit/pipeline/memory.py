"""Giving the memory a finished layer, or a paused batch's freed temporaries, back to the operating system."""

from __future__ import annotations

import ctypes
import functools


@functools.cache
def _libc_function(name: str):
    try:
        return getattr(ctypes.CDLL(None), name)   # glibc; other C libraries have no such calls
    except (OSError, AttributeError):
        return None


def return_freed_memory() -> None:
    """Hand the C heap's free pages back to the OS (glibc's ``malloc_trim``; elsewhere a no-op).

    glibc raises its mmap threshold to the largest block freed (up to 32 MiB), so after the
    first layer a layer's weights and activations come from the heap rather than from their own
    maps, and freeing them leaves holes that a live block above them keeps from shrinking the
    heap. Without this the resident set grew by about one layer's weights per layer
    (benchmarks/memory.py); with it, what is resident between layers is what is alive.
    """
    trim = _libc_function("malloc_trim")
    if trim is not None:
        trim(0)
