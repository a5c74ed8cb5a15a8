import socket
import time

from quantkit.evaluation.code_exec import humaneval_program, run_program, truncate_completion

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


def test_no_network_even_to_a_local_listener():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    try:
        for src in (f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\n",
                    f"import _socket\ns = _socket.socket()\ns.settimeout(2)\ns.connect(('127.0.0.1', {port}))\n"):
            r = run_program(src, timeout_s=5)
            assert not r.passed, src
    finally:
        srv.close()


def test_no_subprocess_and_no_deleting_files():
    assert not run_program("import subprocess\nsubprocess.run(['true'])\n").passed
    assert not run_program("import os\nos.system('true')\n").passed
    assert not run_program("import os\nopen('f', 'w').close()\nos.remove('f')\n").passed


def test_environment_is_empty():
    assert run_program("import os\nassert 'HOME' not in os.environ and 'PYTHONPATH' not in os.environ\n").passed
