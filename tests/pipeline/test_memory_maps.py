"""quantkit/pipeline/memory.py and the lockstep pass: a paused batch's freed temporaries leave the resident set
once they outgrow the slack."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest
import torch

from quantkit.pipeline import passes as passes_module
from quantkit.pipeline.memory import bound_freed_memory, freed_resident, return_freed_memory
from quantkit.pipeline.passes import CalibrationPasses

MIB = 2**20


def anon_resident() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    pytest.skip("no RssAnon in /proc/self/status")


def glibc() -> None:
    try:
        ctypes.CDLL(None).malloc_trim
    except AttributeError:
        pytest.skip("not glibc")


def holes(n: int = 16) -> list[torch.Tensor]:
    """``n`` freed 8 MiB temporaries, each below a survivor (a paused batch's live block).

    All are allocated before any is freed, so each survivor is carved from the heap's top right
    above its temporary: a tiny survivor could come from a free chunk anywhere, and then the
    temporaries merged with the top and were trimmed by glibc itself (seen: 1 run in 3)."""
    temporaries, keep = [], []
    for _ in range(n):
        temporaries.append(torch.ones(2 * MIB))   # 8 MiB
        keep.append(torch.ones(64 * 1024))         # 256 KiB
    del temporaries
    return keep


def resident_holes(tries: int = 3) -> tuple[list[torch.Tensor], int]:
    """``holes()`` that stayed resident, and the anonymous resident bytes before them.

    Where tests before this one left free chunks in the heap, the survivors can still come from
    one of them and the temporaries merge and are trimmed by glibc itself (seen after
    tests/evaluation/test_context.py, about 1 run in 2): the next try starts from a trimmed heap
    and the first try's survivors, so the free chunks it met are used up."""
    kept: list[torch.Tensor] = []
    for _ in range(tries):
        # raise glibc's sliding threshold, as a layer's freed weights do, so blocks come from the
        # heap; 16 MiB: a freed map above glibc's 32 MiB ceiling would leave the threshold where it was
        torch.ones(4 * MIB).sum()
        return_freed_memory()
        before = anon_resident()
        keep = holes()
        if anon_resident() - before > 32 * MIB:
            return keep, before
        kept += keep
    return keep, before   # the caller's control assertion says what was seen


def test_freed_blocks_between_live_ones_leave_the_resident_set():
    glibc()
    keep, before = resident_holes()
    untrimmed = anon_resident() - before
    return_freed_memory()
    trimmed = anon_resident() - before
    # without the trim the holes stay (the control: else this test could not fail)
    assert untrimmed > 32 * MIB, f"only {untrimmed / MIB:.0f} MiB of holes stayed: the test sees nothing"
    assert trimmed < 8 * MIB, f"{trimmed / MIB:.0f} MiB stayed resident after the temporaries were freed"
    assert len(keep) == 16


def test_the_bound_trims_only_past_its_slack():
    glibc()
    if freed_resident() is None:
        pytest.skip("no mallinfo2")
    keep, before = resident_holes()   # 128 MiB of holes
    grown = freed_resident()
    assert not bound_freed_memory(slack=256 * MIB)
    kept = anon_resident() - before
    assert kept > 32 * MIB, f"only {kept / MIB:.0f} MiB of holes stayed: the test sees nothing"
    assert freed_resident() >= grown - 8 * MIB   # not trimmed: still counted as grown
    assert bound_freed_memory(slack=64 * MIB)
    trimmed = anon_resident() - before
    assert trimmed < 8 * MIB, f"{trimmed / MIB:.0f} MiB stayed resident past the slack"
    # the trim is the new reference: nothing has grown since
    assert not bound_freed_memory(slack=32 * MIB)
    assert len(keep) == 16


def test_the_heap_is_walked_only_once_the_resident_set_grew_by_the_slack(monkeypatch):
    """``mallinfo2`` walks every free chunk: below the slack of resident growth it is not called."""
    from quantkit.pipeline import memory

    glibc()
    if freed_resident() is None:
        pytest.skip("no mallinfo2")
    return_freed_memory()
    walks = []
    real = memory.freed_resident
    monkeypatch.setattr(memory, "freed_resident", lambda: walks.append(1) or real())
    assert not bound_freed_memory(slack=64 * MIB)
    assert walks == []
    grown = torch.ones(32 * MIB)   # 128 MiB alive: the resident set grew, though nothing is free
    assert not bound_freed_memory(slack=64 * MIB)
    assert len(walks) == 1          # walked, found no holes, and took this level as the new reference
    assert not bound_freed_memory(slack=64 * MIB)
    assert len(walks) == 1
    del grown


class _Store:
    folder = None   # in memory: nothing parked
    count = 3


def test_every_pausing_batch_bounds_the_freed_memory(monkeypatch):
    bounds = []
    monkeypatch.setattr(passes_module, "bound_freed_memory", lambda: bounds.append(passes._batch))
    passes = CalibrationPasses([], _Store(), None)
    actions = []

    def call(j: int) -> None:
        passes.sync("a", lambda: actions.append("a"))
        passes.sync("b", lambda: actions.append("b"))

    passes.interleaver.run([lambda j=j: call(j) for j in range(3)],
                           before=lambda k: setattr(passes, "_batch", k))
    assert actions == ["a", "b"]
    assert bounds == [0, 1, 2, 0, 1, 2]
    # outside a lockstep pass a sync runs its action at once: nothing pauses, nothing is bounded
    passes._batch = None
    passes.sync("c", lambda: actions.append("c"))
    assert actions[-1] == "c" and len(bounds) == 6



class _Hidden:
    folder = None
    count = 3

    def __init__(self):
        self.next = {}

    def get(self, j):
        return torch.full((2, 4), float(j))

    def put_next(self, j, t):
        self.next[j] = t


class _Calls:
    def get(self, i, j):
        return (), {}


class _PausingLayer(torch.nn.Module):
    def __init__(self, passes):
        super().__init__()
        self.passes = passes

    def forward(self, x):
        self.passes.sync("a", lambda: None)
        return (x + 1,)


@pytest.mark.parametrize("interleaved", [True, False])
def test_a_finishing_lockstep_batch_bounds_the_freed_memory(monkeypatch, interleaved):
    """After the last pause the batches finish one by one: each bounds what it freed."""
    bounds = []
    monkeypatch.setattr(passes_module, "bound_freed_memory", lambda: bounds.append(passes._batch))
    hidden = _Hidden()
    passes = CalibrationPasses([], hidden, _Calls())
    passes.run(_PausingLayer(passes), 0, propagate=True, interleaved=interleaved)
    assert sorted(hidden.next) == [0, 1, 2] and float(hidden.next[2][0, 0]) == 3.0
    # lockstep: three pauses at "a", then three batch ends; one after another: nothing pauses
    assert bounds == ([0, 1, 2, 0, 1, 2] if interleaved else [])


def _heap_flags() -> list[tuple[int, int, bool]]:
    """(start, end, advised) of each ``[heap]`` mapping in ``/proc/self/smaps``."""
    found, current = [], None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if "-" in head[0] and len(head) >= 5:
            current = None
            if line.rstrip().endswith("[heap]"):
                a, b = (int(v, 16) for v in head[0].split("-"))
                current = [a, b]
        elif current is not None and line.startswith("VmFlags:"):
            found.append((current[0], current[1], "hg" in head[1:]))
            current = None
    return found


def test_the_heap_is_advised_to_use_huge_pages_where_the_kernel_waits_to_be_asked(monkeypatch):
    from quantkit.pipeline import memory

    glibc()
    # forced: whether a cap turns it off is tests/pipeline/test_memory_cap.py's, in a capped process
    monkeypatch.setenv("QUANTKIT_HEAP_HUGE_PAGES", "1")
    memory._huge_page_size.cache_clear()
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    asked = thp.exists() and "[madvise]" in thp.read_text()
    grown = [torch.ones(MIB) for _ in range(64)]   # 256 MiB of the heap's growth, none of it advised yet
    assert memory.advise_huge_pages() is asked
    heap = _heap_flags()
    assert heap, "no [heap] mapping"
    size = memory._huge_page_size() or 2 * MIB
    # every mapping past the first aligned huge page is advised (or none is, where asking does nothing)
    advised = [ok for a, b, ok in heap if b > -(-heap[0][0] // size) * size]
    assert advised and all(ok is asked for ok in advised), heap
    del grown
    memory._huge_page_size.cache_clear()   # decided again under the restored environment


def test_a_bad_heap_huge_pages_setting_is_refused(monkeypatch):
    from quantkit.errors import QuantkitError
    from quantkit.pipeline import memory

    monkeypatch.setenv("QUANTKIT_HEAP_HUGE_PAGES", "yes")
    memory._huge_page_size.cache_clear()
    with pytest.raises(QuantkitError, match="QUANTKIT_HEAP_HUGE_PAGES"):
        memory.advise_huge_pages()
    monkeypatch.setenv("QUANTKIT_HEAP_HUGE_PAGES", "0")
    memory._huge_page_size.cache_clear()
    assert not memory.advise_huge_pages()
    monkeypatch.delenv("QUANTKIT_HEAP_HUGE_PAGES")
    memory._huge_page_size.cache_clear()
