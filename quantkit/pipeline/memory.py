"""Giving the memory a finished layer, or a paused batch's freed temporaries, back to the operating system."""

from __future__ import annotations

import ctypes
import functools
import os

#: Free heap pages a lockstep pass lets stay resident before it trims (``bound_freed_memory``).
#: Trimming at every pause handed back pages the next batch faulted in again at once: on SmolLM2
#: (128 x 512 tokens, 2 threads) 3x the page faults of no trim at all and about 15% of the wall
#: time; with this slack a pause trims about one time in five, and the peak is this much higher.
FREED_MEMORY_SLACK = 64 * 2**20


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


@functools.cache
def _libc_function(name: str):
    try:
        return getattr(ctypes.CDLL(None), name)   # glibc; other C libraries have no such calls
    except (OSError, AttributeError):
        return None


@functools.cache
def _mallinfo2():
    f = _libc_function("mallinfo2")   # glibc >= 2.33
    if f is not None:
        f.restype = _MallInfo2
    return f


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def freed_resident() -> int | None:
    """Bytes resident in anonymous memory beyond what the C heap has in use: mostly its free pages.

    Anonymous resident pages (``/proc/self/statm``: resident less file-backed) minus the heap's
    in-use bytes and its blocks in maps of their own (``mallinfo2``). The rest of the
    process's anonymous memory (Python's own arenas, thread stacks) changes slowly, so growth of
    this figure is growth of the heap's free resident pages. None without glibc's ``mallinfo2``
    or ``/proc``.
    """
    info = _mallinfo2()
    if info is None:
        return None
    try:
        with open("/proc/self/statm", "rb") as f:
            fields = f.read().split()
    except OSError:
        return None
    anon = (int(fields[1]) - int(fields[2])) * _PAGE
    heap = info()
    return anon - heap.uordblks - heap.hblkhd


_freed_after_trim: int | None = None   # freed_resident() right after the last trim


def return_freed_memory() -> None:
    """Hand the C heap's free pages back to the OS (glibc's ``malloc_trim``; elsewhere a no-op).

    glibc raises its mmap threshold to the largest block freed (up to 32 MiB), so after the
    first layer a layer's weights and activations come from the heap rather than from their own
    maps, and freeing them leaves holes that a live block above them keeps from shrinking the
    heap. Without this the resident set grew by about one layer's weights per layer
    (benchmarks/memory.py); with it, what is resident between layers is what is alive.
    """
    global _freed_after_trim
    trim = _libc_function("malloc_trim")
    if trim is not None:
        trim(0)
    _freed_after_trim = freed_resident()


def bound_freed_memory(slack: int = FREED_MEMORY_SLACK) -> bool:
    """``return_freed_memory`` once the heap's free resident pages have grown by more than
    ``slack`` bytes since the last trim; returns whether it trimmed.

    A paused batch's freed temporaries lie between the other paused batches' live blocks; the
    next batch mostly reuses them, so handing them back each time only makes it fault them in
    again (a page fault costs about 3 us here), while never handing them back let the holes
    grow with the calibration set. Where the growth cannot be measured it always trims.
    """
    now = freed_resident()
    if now is not None and _freed_after_trim is not None and now - _freed_after_trim <= slack:
        return False
    return_freed_memory()
    return True

