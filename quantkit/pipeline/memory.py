"""Giving the memory a finished layer, or a paused batch's freed temporaries, back to the operating system."""

from __future__ import annotations

import ctypes
import functools
import os
from quantkit.errors import QuantkitError
import psutil

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
    anon = _anonymous_resident() if info is not None else None
    if anon is None:
        return None
    heap = info()
    return anon - heap.uordblks - heap.hblkhd


def _anonymous_resident() -> int | None:
    """Resident less file-backed bytes (``/proc/self/statm``): one small read, unlike ``mallinfo2``,
    which walks every free chunk of the heap (about 1 ms a call on SmolLM2's lockstep pass)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            fields = f.read().split()
    except OSError:
        return None
    return (int(fields[1]) - int(fields[2])) * _PAGE


#: ``madvise`` advice asking for transparent huge pages (linux/mman.h).
_MADV_HUGEPAGE = 14
_THP = "/sys/kernel/mm/transparent_hugepage"


@functools.cache
def _heap_start() -> int | None:
    """Where the C heap (the ``brk`` region, ``[heap]`` in ``/proc/self/maps``) begins; fixed for
    the life of the process. None without ``/proc`` or before the heap exists."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                if line.rstrip().endswith("[heap]"):
                    return int(line.split("-", 1)[0], 16)
    except OSError:
        pass
    return None


@functools.cache
def _huge_page_size() -> int | None:
    """The transparent huge page size when the heap should be advised to use them; else None.

    ``QUANTKIT_HEAP_HUGE_PAGES``: unset, advise unless a cgroup caps this process's memory;
    ``1``, advise even then; ``0``, never. Under a cap the advice costs more than it buys: a
    4 KiB page touched again after a trim brings back the whole 2 MiB page around it, so the
    trims hand back less. RTN inside tests/pipeline/test_memory_cap.py's 512 MiB cap was OOM-killed in
    1 of 3 runs with the advice and 0 of 3 without (and failed CI once). Asking changes nothing
    unless the THP mode is ``madvise`` (this machine's and the common distribution default).
    """
    setting = os.environ.get("QUANTKIT_HEAP_HUGE_PAGES", "")
    if setting not in ("", "0", "1"):
        raise QuantkitError(f"QUANTKIT_HEAP_HUGE_PAGES: {setting!r} is not 0 or 1 (unset: on unless memory is capped)")
    if setting == "0" or (setting == "" and _cgroup_memory()):
        return None
    if _libc_function("madvise") is None or _libc_function("sbrk") is None:
        return None
    try:
        mode = open(os.path.join(_THP, "enabled")).read()
        size = int(open(os.path.join(_THP, "hpage_pmd_size")).read())
    except (OSError, ValueError):
        return None
    if "[madvise]" not in mode:
        return None
    sbrk, madvise = _libc_function("sbrk"), _libc_function("madvise")
    sbrk.restype = ctypes.c_void_p
    sbrk.argtypes = [ctypes.c_long]
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return size


def advise_huge_pages() -> bool:
    """Ask the kernel for transparent huge pages over the whole C heap (``MADV_HUGEPAGE``);
    returns whether it asked.

    A pass's large temporaries (a 4096-token batch's MLP product is 24 MiB) come from the heap
    (see ``return_freed_memory``), and every trim hands pages back that the next batch faults
    in again. In 4 KiB pages that is millions of faults a conversion, and GEMMs over 4 KiB
    pages miss the TLB more. glibc asks for huge pages itself under
    ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``, but only when that is set before the process
    starts; this does the same from inside it. It is called at every trim point, since the
    heap's growth after a trim is a new mapping that has not been advised. Measured on SmolLM2
    (6 layers, GPTQ, 2 threads, 3 runs each): page faults 2.9M -> 1.5M (medians), the same peak
    RSS; wall time 55.1 -> 53.0 s (medians), within this shared machine's noise
    (benchmarks/RESULTS.md). The advice stays on the heap for the rest of the
    process. It is not given under a cgroup memory cap, and ``QUANTKIT_HEAP_HUGE_PAGES`` overrides
    that either way (``_huge_page_size``).
    """
    size = _huge_page_size()
    start = _heap_start() if size is not None else None
    if start is None:
        return False
    end = _libc_function("sbrk")(0)
    first = -(-start // size) * size   # the kernel gives huge pages only to aligned 2 MiB spans
    if end is None or end <= first:
        return False
    _libc_function("madvise")(first, end - first, _MADV_HUGEPAGE)   # ENOMEM (a hole in the range) still advises the rest
    return True


_freed_after_trim: int | None = None   # freed_resident() right after the last trim
_anonymous_checked: int | None = None  # the anonymous resident bytes at the last trim or full check


def return_freed_memory() -> None:
    """Hand the C heap's free pages back to the OS (glibc's ``malloc_trim``; elsewhere a no-op).

    glibc raises its mmap threshold to the largest block freed (up to 32 MiB), so after the
    first layer a layer's weights and activations come from the heap rather than from their own
    maps, and freeing them leaves holes that a live block above them keeps from shrinking the
    heap. Without this the resident set grew by about one layer's weights per layer
    (benchmarks/memory.py); with it, what is resident between layers is what is alive.
    """
    global _freed_after_trim, _anonymous_checked
    trim = _libc_function("malloc_trim")
    if trim is not None:
        trim(0)
    advise_huge_pages()
    _freed_after_trim = freed_resident()
    _anonymous_checked = _anonymous_resident()


def bound_freed_memory(slack: int = FREED_MEMORY_SLACK) -> bool:
    """``return_freed_memory`` once the heap's free resident pages have grown by more than
    ``slack`` bytes since the last trim; returns whether it trimmed.

    A paused batch's freed temporaries lie between the other paused batches' live blocks; the
    next batch mostly reuses them, so handing them back each time only makes it fault them in
    again (a page fault costs about 3 us here), while never handing them back let the holes
    grow with the calibration set. Where the growth cannot be measured it always trims.

    The heap is walked (``mallinfo2``) only once the anonymous resident set has grown by
    ``slack`` since the last trim or walk: until then holes cannot have raised it by more, so
    the resident set stays within ``slack`` of its level at the last check either way. Walking
    at every pause took 2% of SmolLM2's GPTQ time (py-spy, 6 layers, 2 threads).
    """
    global _anonymous_checked
    advise_huge_pages()   # the heap may have grown since the last pause
    anon = _anonymous_resident()
    if anon is not None and _anonymous_checked is not None and anon - _anonymous_checked <= slack:
        return False
    now = freed_resident()
    if now is not None and _freed_after_trim is not None and now - _freed_after_trim <= slack:
        _anonymous_checked = anon
        return False
    return_freed_memory()
    return True


def available_memory() -> int:
    """Bytes this process can still take: the system's available memory, or less where a cgroup
    (v1 or v2) of this process or one above it caps memory (a container, a batch job's slot)."""

    free = int(psutil.virtual_memory().available)
    for limit, usage in _cgroup_memory():
        free = min(free, max(0, limit - usage))
    return free


def _cgroup_memory() -> list[tuple[int, int]]:
    """``(limit, usage)`` of every memory-capped cgroup from this process's up to the root.

    Usage leaves out the inactive file cache (what docker's ``stats`` leaves out too): the
    shards read so far sit there, and the kernel reclaims them before it kills anything."""
    try:
        lines = open("/proc/self/cgroup").read().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            root, files = "/sys/fs/cgroup/memory", ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
        elif controllers == "":
            root, files = "/sys/fs/cgroup", ("memory.max", "memory.current", "inactive_file")
        else:
            continue
        parts = [p for p in path.split("/") if p]
        for k in range(len(parts), -1, -1):
            folder = os.path.join(root, *parts[:k])
            try:
                limit = open(os.path.join(folder, files[0])).read().strip()
                usage = int(open(os.path.join(folder, files[1])).read().strip())
                stat = dict(line.split() for line in open(os.path.join(folder, "memory.stat")))
            except (OSError, ValueError):
                continue
            if limit.isdigit() and int(limit) < 2**60:   # v1 writes 2^63 rounded to pages for none
                found.append((int(limit), usage - int(stat.get(files[2], 0))))
    return found
