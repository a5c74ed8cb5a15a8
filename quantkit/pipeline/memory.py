"""Giving the memory a finished layer, or a finished temporary, freed back to the operating system."""

from __future__ import annotations

import contextlib
import ctypes
import functools
from typing import Iterator

#: glibc's ``mallopt`` parameter for the size from which a block gets a map of its own.
_M_MMAP_THRESHOLD = -3
#: The largest threshold glibc's own sliding adjustment reaches on 64-bit systems (32 MiB).
_GLIBC_MMAP_THRESHOLD_MAX = 32 * 2**20
#: From this size a block lives in its own map while a lockstep pass runs (see ``own_maps``).
LOCKSTEP_MMAP_THRESHOLD = 2**20


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


@contextlib.contextmanager
def own_maps(threshold: int = LOCKSTEP_MMAP_THRESHOLD) -> Iterator[None]:
    """Inside it, every block of at least ``threshold`` bytes is a map of its own, unmapped when freed.

    In a lockstep pass every paused batch keeps its intermediates on the heap while the
    next batch allocates and frees its own temporaries of the same sizes around them: the
    freed blocks become holes between live ones, which the heap never hands back and later
    sizes do not fit. On SmolLM2 (GPTQ, 16 batches of 4096 tokens, one thread) the resident
    anonymous memory rose 2293 MiB at its peak in the first layer, 1652 MiB with blocks of
    1 MiB and more in maps of their own (the live tensors were the same: only the holes went),
    at about the same speed (a map's first touch costs page faults; the heap's holes cost the
    same when reused). The numbers computed do not change. On exit the threshold is set to
    32 MiB, where glibc's own sliding threshold stops (setting it switches the sliding off).
    A no-op outside glibc.
    """
    mallopt = _libc_function("mallopt")
    if mallopt is None or not mallopt(_M_MMAP_THRESHOLD, threshold):
        yield
        return
    try:
        yield
    finally:
        mallopt(_M_MMAP_THRESHOLD, _GLIBC_MMAP_THRESHOLD_MAX)
