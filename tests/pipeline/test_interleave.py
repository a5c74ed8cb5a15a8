"""quantkit.pipeline.interleave: calibration batches in lockstep at sync points."""

import pytest

from quantkit.pipeline.interleave import Interleaver


def _calls(inter, log, n, keys=("k1", "k2"), first=0):
    def make(j):
        def call():
            for step, key in enumerate(keys):
                log.append(f"{j}{step}")
                assert inter.current() == j
                inter.sync(key, lambda key=key: log.append(key))
            log.append(f"{j}end")
        return call
    return [make(j) for j in range(first, first + n)]


def test_batches_pause_at_each_sync_and_the_action_runs_once_in_between():
    inter, log, resumed = Interleaver(), [], []
    inter.run(_calls(inter, log, 3), before=resumed.append)
    assert log == ["00", "10", "20", "k1", "01", "11", "21", "k2", "0end", "1end", "2end"]
    assert resumed == [0, 1, 2] * 3  # before() ahead of every resumption
    assert inter.current() is None


def test_sync_outside_a_run_acts_at_once():
    inter, log = Interleaver(), []
    inter.sync("k", lambda: log.append("now"))
    assert log == ["now"]


def test_a_failing_batch_raises_and_unwinds_the_paused_ones():
    inter, log, unwound = Interleaver(), [], []

    def paused():
        try:
            inter.sync("k1", lambda: log.append("k1"))
        finally:
            unwound.append(True)

    def failing():
        raise ValueError("batch 1 failed")

    with pytest.raises(ValueError, match="batch 1 failed"):
        inter.run([paused, failing])
    assert unwound == [True] and log == []  # the action never ran
    # usable again afterwards
    log2 = []
    inter.run(_calls(inter, log2, 2, keys=("a",)))
    assert log2 == ["00", "10", "a", "0end", "1end"]


def test_a_failing_action_raises():
    inter = Interleaver()

    def boom():
        raise RuntimeError("solve failed")

    calls = [lambda: inter.sync("k", boom) for _ in range(2)]
    with pytest.raises(RuntimeError, match="solve failed"):
        inter.run(calls)


def test_batches_on_different_paths_are_an_error():
    inter, log = Interleaver(), []
    calls = _calls(inter, log, 1, keys=("k1",)) + _calls(inter, log, 1, keys=("other",), first=1)
    with pytest.raises(RuntimeError, match="different paths"):
        inter.run(calls)
    short = [lambda: None, lambda: inter.sync("k", lambda: None)]
    with pytest.raises(RuntimeError, match="1 of 2 finished"):
        inter.run(short)
