"""Calls run side by side in threads, for work that waits on something else (a server)."""
from __future__ import annotations

from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Callable, TypeVar

T = TypeVar("T")


def at_once(calls: list[Callable[[], T]], workers: int, name: str = "quantkit") -> list[T]:
    """``[c() for c in calls]``, ``workers`` at a time (threads named ``name``). The first error is
    raised as soon as it happens, not after the calls before it; what has not started is
    cancelled, and what is running is left to end on its own (nothing waits for it).

    >>> at_once([lambda: 1, lambda: 2], workers=2)
    [1, 2]
    """
    if workers <= 1 or len(calls) < 2:
        return [c() for c in calls]
    pool = ThreadPoolExecutor(min(workers, len(calls)), thread_name_prefix=name)
    try:
        futures = [pool.submit(c) for c in calls]
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        for f in done:
            if f.exception() is not None:
                f.result()
        return [f.result() for f in futures]
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
