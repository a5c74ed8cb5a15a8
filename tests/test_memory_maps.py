"""quantkit/pipeline/memory.py: inside ``own_maps`` a freed large block leaves the resident set."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest
import torch

from quantkit.pipeline.memory import own_maps

MIB = 2**20


def anon_resident() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    pytest.skip("no RssAnon in /proc/self/status")


def test_freed_blocks_between_live_ones_leave_the_resident_set():
    try:
        ctypes.CDLL(None).mallopt
    except AttributeError:
        pytest.skip("not glibc")
    # raise glibc's sliding threshold, as a layer's freed weights do, so blocks come from the heap
    torch.ones(8 * MIB).sum()
    with own_maps():
        before = anon_resident()
        keep = []
        for _ in range(16):   # a paused batch's small survivor after each freed temporary
            temporary = torch.ones(2 * MIB)   # 8 MiB
            keep.append(torch.ones(8))
            del temporary
        grown = anon_resident() - before
    assert grown < 8 * MIB, f"{grown / MIB:.0f} MiB stayed resident after the temporaries were freed"
    assert len(keep) == 16
