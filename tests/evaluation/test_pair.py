"""Baseline and candidate run side by side on a CPU with two or more threads, each on half of
them, and the evaluation's numbers do not change with it."""
import threading

import torch
from tiny import _take, fake_quant_linears

from quantkit.evaluation.evaluator import evaluate
from quantkit.evaluation.pair import both, pair
from quantkit.evaluation.slices import SuiteOptions, load_suite


class _Threads:
    def __init__(self, n: int) -> None:
        self.n = n

    def __enter__(self):
        self.old = torch.get_num_threads()
        torch.set_num_threads(self.n)

    def __exit__(self, *exc):
        torch.set_num_threads(self.old)


def test_two_threads_run_both_models_at_once_on_half_the_threads(base):
    # Each side waits for the other at a barrier: run one after the other, the first would
    # time out there (BrokenBarrierError).
    barrier = threading.Barrier(2, timeout=20)
    seen = {}

    def job(name):
        barrier.wait()
        seen[name] = (threading.current_thread().name, torch.get_num_threads())
        return name

    with _Threads(4):
        assert pair(lambda: job("base"), lambda: job("cand"), base, base) == ("base", "cand")
        assert torch.get_num_threads() == 4          # the caller's count is left alone
    assert seen["base"][1] == seen["cand"][1] == 2
    assert seen["base"][0] != seen["cand"][0] != threading.current_thread().name


def test_one_thread_runs_them_in_turn_on_the_caller(base):
    order = []
    with _Threads(1):
        out = both(lambda m: order.append(threading.current_thread().name) or len(order), base, base)
    assert out == (1, 2)
    assert order == [threading.current_thread().name] * 2


def test_an_error_on_one_side_reaches_the_caller(base):
    def boom():
        raise ValueError("candidate failed")
    with _Threads(2):
        try:
            pair(lambda: 1, boom, base, base)
        except ValueError as e:
            assert "candidate failed" in str(e)
        else:
            raise AssertionError("the error was swallowed")


def test_side_by_side_gives_the_sequential_numbers(base, tok):
    # every kind of measure: teacher-forced text (and its generation prompts), multiple
    # choice, extraction, a long slice
    suite = [_take(s, 3) for s in load_suite("numbers-en,knowledge-en,long-en")]
    cand = fake_quant_linears(base, 4)
    opts = SuiteOptions(gen_prompts=2, gen_tokens=6, extract_tokens=6, mc_items=3)
    with _Threads(1):
        one = evaluate(base, cand, tok, suite=suite, max_len=256, options=opts, progress=False).slices
    with _Threads(2):
        two = evaluate(base, cand, tok, suite=suite, max_len=256, options=opts, progress=False).slices
    assert set(one) == {"numbers-en", "knowledge-en", "long-en"}
    assert "gen_agreement" in one["numbers-en"] and "extract_f1_cand" in one["numbers-en"]
    assert "mc_accuracy_cand" in one["knowledge-en"]
    for name in one:
        for k, v in one[name].items():
            if isinstance(v, float):
                assert abs(v - two[name][k]) <= 1e-6 * max(1.0, abs(v)), (name, k, v, two[name][k])
            else:
                assert v == two[name][k], (name, k)
