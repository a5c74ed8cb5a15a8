"""Programs built from a problem and a completion, and how their end becomes a status; the
boundary they run behind is tested in test_sandbox.py."""
import time

from quantkit.evaluation.code_exec import humaneval_program, run_program, truncate_completion, using_runner
from quantkit.evaluation.sandbox import Outcome

ITEM = {"prompt": "def add(a, b):\n    \"\"\"Sum.\"\"\"\n", "test": "def check(f):\n    assert f(2, 3) == 5\n",
        "entry_point": "add"}


def test_right_and_wrong_completions():
    assert run_program(humaneval_program(ITEM, "    return a + b\n")).passed
    bad = run_program(humaneval_program(ITEM, "    return a - b\n"))
    assert not bad.passed and bad.status == "failed" and "AssertionError" in bad.stderr_tail


def test_completion_is_cut_where_the_model_starts_something_else():
    text = "    return a + b\n\ndef other():\n    while True: pass\n"
    assert truncate_completion(text) == "    return a + b\n"
    assert run_program(humaneval_program(ITEM, text), timeout_s=3).passed


def test_timeout_kills_the_program():
    t = time.perf_counter()
    r = run_program("while True:\n    pass\n", timeout_s=1.0)
    assert r.status == "timeout" and time.perf_counter() - t < 5


def test_memory_is_limited():
    r = run_program("x = bytearray(3 * 2**30)\n", mem_bytes=512 * 2**20)
    assert not r.passed and "MemoryError" in r.stderr_tail


def test_a_program_killed_by_a_signal_is_an_error():
    r = run_program("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    assert not r.passed and r.status == "error: signal 9"


def test_the_runner_in_scope_is_used():
    seen = []

    class Recording:
        sandboxed = True

        def run(self, source, limits):
            seen.append((source, limits.wall_s))
            return Outcome(0)

    with using_runner(Recording()):
        assert run_program("anything", timeout_s=2.5).passed
    assert seen == [("anything", 2.5)]


def test_environment_is_empty():
    assert run_program("import os\nassert 'HOME' not in os.environ and 'PYTHONPATH' not in os.environ\n").passed
