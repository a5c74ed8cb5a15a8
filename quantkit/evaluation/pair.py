"""Run one measurement on the baseline and the candidate side by side.

Every measure runs the same inputs through both models, and the two runs are independent.
On a CPU, two Python threads with half the intra-op threads each beat one model after the
other with all of them: a small model's matmuls are too short for one OpenMP team to keep
two cores busy (greedy decoding above all: one token a step, bound by weight reads), and
ATen releases the GIL inside its kernels. With it (and code generation's early stop) the main
job's default evaluation of SmolLM2 on the 2-core CI machine went from 693 s to 475 s
(benchmarks/RESULTS.md, "The main job"). The outputs are bit-identical to the sequential ones
(each model's ops run on one thread either way, in the same order).

Each worker sets its own thread count: OpenMP's thread count is per calling thread, so the
caller's setting is left as it was.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

import torch
from torch import nn

from quantkit.evaluation.causal_lm import model_device

T = TypeVar("T")


def side_by_side(threads: int | None = None) -> bool:
    """Whether ``both`` runs the two models concurrently: at least 2 intra-op threads to split."""
    return (threads if threads is not None else torch.get_num_threads()) >= 2


def both(fn: Callable[[nn.Module], T], base: nn.Module, cand: nn.Module) -> tuple[T, T]:
    """``(fn(base), fn(cand))``, concurrently on a CPU with at least two threads to split."""
    return pair(lambda: fn(base), lambda: fn(cand), base, cand)


def pair(run_base: Callable[[], T], run_cand: Callable[[], T], base: nn.Module, cand: nn.Module) -> tuple[T, T]:
    """``(run_base(), run_cand())``: concurrently when both models are on the CPU and there are
    at least two intra-op threads to split, else one after the other (on an accelerator the
    device is the bottleneck, and one model at a time keeps one model's activations in memory)."""
    threads = torch.get_num_threads()
    if not side_by_side(threads) or model_device(base).type != "cpu" or model_device(cand).type != "cpu":
        return run_base(), run_cand()
    per = threads // 2

    def job(run: Callable[[], T]) -> T:
        torch.set_num_threads(per)
        return run()

    with ThreadPoolExecutor(2, thread_name_prefix="quantkit-eval") as pool:
        fb, fc = pool.submit(job, run_base), pool.submit(job, run_cand)
        return fb.result(), fc.result()
