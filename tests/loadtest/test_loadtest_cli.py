"""``quantkit loadtest``'s bad inputs: one line naming the flag or file, exit 2, no report, nothing
the user gave changed; and a whole run against the stub server on 127.0.0.1 (a server with a
known speed and a known number of slots), through the command."""
from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from stub_server import StubServer, StubTimings
from quantkit.cli import app

ROOT = Path(__file__).resolve().parents[2]


def _run(*args):
    from typer.testing import CliRunner

    return CliRunner().invoke(app, ["loadtest", *map(str, args)])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def log(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("traffic") / "log.jsonl"
    rows = [{"messages": [{"role": "user", "content": f"Question {i}: " + "why " * (5 + i % 40)},
                          {"role": "assistant", "content": "Because " * (1 + i % 12)}]} for i in range(60)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("case", ["slo", "empty", "no replies", "no server", "both targets", "bad lang"])
def test_bad_input_is_one_line_exit_2_and_no_report(case, log, tmp_path):
    out = tmp_path / "out"
    traffic, slo, target = log, "ttft=2s,tpot=50ms", ["--endpoint", f"http://127.0.0.1:{_free_port()}"]
    expected = {"slo": "--slo: 'tpot=fast': expected NAME=NUMBER(ms|s)", "empty": "--traffic: ",
                "no replies": "row(s) with a reply: output lengths need at least two",
                "no server": "cannot connect", "both targets": "--engine / --endpoint: name exactly one",
                "bad lang": "--lang: expected one of en, zh, got 'fr'"}[case]
    extra = []
    if case == "slo":
        slo = "ttft=2s,tpot=fast"
    elif case == "empty":
        traffic = tmp_path / "empty.jsonl"
        traffic.write_text("")
    elif case == "no replies":
        traffic = tmp_path / "prompts.jsonl"
        traffic.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"q {i}"}]}) + "\n"
                                   for i in range(5)))
    elif case == "both targets":
        target = [*target, "--engine", "vllm"]
    elif case == "bad lang":
        extra = ["--lang", "fr"]
    before = traffic.read_bytes()
    res = _run("--traffic", traffic, "--slo", slo, *target, "--out", out, *extra)
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert lines[-1].startswith("error: ") and expected in lines[-1], res.output
    assert not out.exists() and traffic.read_bytes() == before


def test_a_ramp_against_the_stub_server_finds_its_knee(log, tmp_path):
    out = tmp_path / "lt"
    # a plain queue of 4 slots: past 4 requests wait (TTFT grows), the streams keep their pace
    with StubServer(StubTimings(ttft_s=0.05, token_s=0.02, slots=4)) as stub:
        url = stub.url
        res = _run("--traffic", log, "--slo", "ttft=2s,tpot=50ms", "--endpoint", url, "--min-requests", "8",
                   "--max-concurrency", "16", "--out", out)
    assert res.exit_code == 0, res.output
    data = json.loads((out / "report.json").read_text())
    assert data["complete"] and data["knee"] == 4 and data["recommended_concurrency"] == 2
    one = data["steps"][0]
    assert one["tpot_ms"]["p50"] == pytest.approx(20, rel=0.1) and one["ttft_ms"]["p50"] == pytest.approx(50, rel=0.5)
    assert data["engine"]["endpoint"] == url and data["ramps"][0]["tool"].startswith("vllm bench serve")


def test_a_finished_run_leaves_no_watchdog_behind(log, tmp_path):
    """The work folder's watchdog goes with the run, so a long-lived process that runs many load
    tests (the Python API, this test session) does not gather them."""
    import os

    def watchdogs() -> set[int]:
        found = set()
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(c.endswith(b"watchdog.py") for c in cmd) and str(os.getpid()).encode() in cmd:
                found.add(int(pid))
        return found

    before = watchdogs()
    with StubServer(StubTimings()) as stub:
        res = _run("--traffic", log, "--slo", "ttft=2s", "--endpoint", stub.url, "--max-concurrency", "1",
                   "--min-requests", "2", "--out", tmp_path / "out")
    assert res.exit_code == 0, res.output
    assert watchdogs() <= before


def test_engine_python_is_the_generators_with_an_endpoint_too(log, tmp_path):
    """--engine-python names the Python the load generator (vLLM's) runs from, also against a
    server the user runs: a Python that is not there is named, not passed over."""
    missing = tmp_path / "no-such-venv" / "bin" / "python"
    with StubServer(StubTimings()) as stub:
        res = _run("--traffic", log, "--slo", "ttft=2s", "--endpoint", stub.url, "--engine-python", missing,
                   "--max-concurrency", "1", "--min-requests", "2", "--out", tmp_path / "out")
    assert res.exit_code == 2, res.output
    line = res.output.strip().splitlines()[-1]
    assert line.startswith("error: ") and f"{missing}: not found" in line, line
