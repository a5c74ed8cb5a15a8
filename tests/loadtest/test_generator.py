"""The load generator (vLLM's benchmark client, run from the engine's Python) against a stub
server with planted timings on 127.0.0.1, and once against vLLM serving SmolLM2.

These tests need the engine environment (.venv-vllm, with pandas for the tool's custom dataset):
they fail without it, never skip."""
from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from quantkit.loadtest.generator import LoadRequest, engine_python, prompt_texts, run_step
from quantkit.loadtest.lengths import fit_lognormal
from quantkit.loadtest.ramp import find_knee, step_summary
from quantkit.loadtest.slo import parse_slo
from quantkit.serving.client import EngineError
from quantkit.serving.vllm import ServeOptions, find_engine, free_port, serve
from stub_server import StubServer, StubTimings

# the time to first token, as measured, also holds the request's trip through HTTP (1-5 ms here,
# more on a loaded machine): 100 ms keeps that well inside the 10% the test allows
TTFT, TOKEN, SLOTS = 0.1, 0.02, 4


def _requests(n: int, words: int = 8, vary: bool = True) -> list[LoadRequest]:
    """Text prompts (the stub counts words) and output lengths that differ request to request
    (``vary``), else 16 tokens each."""
    return [LoadRequest(" ".join(["word"] * words), words, 12 + (i * 3) % 9 if vary else 16) for i in range(n)]


def _step(url, reqs, concurrency, tmp_path, tokenizer_dir, **kw):
    return run_step(url, "stub-model", reqs, concurrency, timeout_s=kw.pop("timeout_s", 300),
                    workdir=tmp_path / f"c{concurrency}", tokenizer_dir=tokenizer_dir, **kw)


def _left(marker: str) -> list[str]:
    """Live processes whose command line mentions ``marker``."""
    out = []
    for entry in os.listdir("/proc"):
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker in cmd and state != "Z":
            out.append(cmd[:200])
    return out


def test_the_engine_environment_is_there():
    python = engine_python()
    assert python.exists(), f"{python}: build it with bash scripts/setup-engine.sh"


@pytest.fixture(scope="module")
def ramp(smollm2_dir, tmp_path_factory):
    """Steps at 1, 2, 4 and 8 against a stub whose capacity is 4 requests (beyond it they share
    its time), each step four waves of 16-token requests. Uneven lengths would leave slots idle
    at the end of the steps up to 4, and not beyond, where the requests left share the time:
    measured, that alone made the step at 8 up to 10% faster than the step at 4."""
    tmp = tmp_path_factory.mktemp("ramp")
    with StubServer(StubTimings(ttft_s=TTFT, token_s=TOKEN, slots=SLOTS, share=True)) as stub:
        yield {c: _step(stub.url, _requests(4 * c, vary=False), c, tmp, smollm2_dir) for c in (1, 2, 4, 8)}


def test_planted_timings_are_measured_at_concurrency_1(ramp):
    step = ramp[1]
    assert all(t["ok"] for t in step.timings)
    ttft = sorted(t["ttft"] for t in step.timings)[len(step.timings) // 2]
    tpot = sorted(t["tpot"] for t in step.timings)[len(step.timings) // 2]
    assert abs(ttft - TTFT) / TTFT < 0.10, ttft
    assert abs(tpot - TOKEN) / TOKEN < 0.10, tpot
    assert abs(step.timings[0]["itl"] - TOKEN) / TOKEN < 0.10, step.timings[0]
    # one stream cannot beat one token per TPOT
    assert sum(t["output_tokens"] for t in step.timings) / step.seconds <= 1 / TOKEN
    assert step.tool.startswith("vllm bench serve ") and step.startup_s > 0


def test_every_request_gets_the_output_length_asked(ramp):
    """The stub ends a reply after 3 tokens unless ignore_eos is sent: the counts prove it was."""
    for c, step in ramp.items():
        assert [t["output_tokens"] for t in step.timings] == [16] * 4 * c, c
        assert [t["prompt_tokens"] for t in step.timings] == [8] * 4 * c


def test_throughput_grows_to_the_capacity_and_the_knee_is_found_there(ramp):
    slo = parse_slo("e2e=60s")
    steps = [step_summary(c, s.timings, s.seconds, slo) for c, s in sorted(ramp.items())]
    tps = {s["concurrency"]: s["output_tokens_per_s"] for s in steps}
    assert 1.7 < tps[2] / tps[1] < 2.1 and 3.3 < tps[4] / tps[1] < 4.2, tps
    assert tps[8] / tps[4] < 1.10, tps
    assert find_knee(steps) == SLOTS


def test_a_full_server_queues_the_rest(smollm2_dir, tmp_path):
    """Behind a queue of 4 slots, 8 at a time: the stub never holds more than 4, throughput is
    that of 4 streams and the queued requests wait for their first token."""
    reqs = _requests(16)
    with StubServer(StubTimings(ttft_s=TTFT, token_s=TOKEN, slots=SLOTS)) as stub:
        step = _step(stub.url, reqs, 8, tmp_path, smollm2_dir)
        assert stub.peak == SLOTS
    # each its own length, in the order sent
    assert [t["output_tokens"] for t in step.timings] == [r.output_tokens for r in reqs]
    tokens = sum(t["output_tokens"] for t in step.timings)
    per_stream = (TTFT + TOKEN * 15) / 16   # seconds per token of one stream (16 tokens on average)
    assert tokens / step.seconds < 1.1 * SLOTS / per_stream
    assert max(t["ttft"] for t in step.timings) > 3 * TTFT


def test_failed_requests_are_counted_with_their_reason(smollm2_dir, tmp_path):
    with StubServer(StubTimings(ttft_s=0.01, token_s=0.005, fail_every=3)) as stub:
        step = _step(stub.url, _requests(6), 2, tmp_path, smollm2_dir)
    failed = [t for t in step.timings if not t["ok"]]
    assert len(failed) == 2 and all(t["error"] and t["ttft"] is None for t in failed)
    assert all(t["output_tokens"] == r.output_tokens for t, r in zip(step.timings, _requests(6)) if t["ok"])


def test_a_server_that_dies_mid_step_is_an_engine_error(smollm2_dir, tmp_path):
    with StubServer(StubTimings(ttft_s=0.01, token_s=0.02, die_after=3)) as stub:
        with pytest.raises(EngineError, match=r"stopped answering during the step: .*(Error|error)"):
            _step(stub.url, _requests(8), 2, tmp_path, smollm2_dir)


def test_an_unreachable_server_is_named(smollm2_dir, tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(EngineError, match=rf"^{url}/v1/models: cannot connect"):
        _step(url, _requests(2), 1, tmp_path, smollm2_dir)


def test_a_model_the_server_does_not_serve_is_named(smollm2_dir, tmp_path):
    with StubServer() as stub:
        with pytest.raises(EngineError, match=r"does not serve 'other' \(it serves stub-model\)"):
            run_step(stub.url, "other", _requests(2), 1, timeout_s=60, workdir=tmp_path, tokenizer_dir=smollm2_dir)


def test_a_python_without_the_tool_is_named(smollm2_dir, tmp_path):
    with StubServer() as stub:
        with pytest.raises(EngineError, match=r"vllm bench serve failed: .*No module named 'vllm'.*setup-engine.sh") as e:
            _step(stub.url, _requests(2), 1, tmp_path, smollm2_dir, python=sys.executable)
    # the log the line names outlives the step's work folder (the command removes that one)
    log = Path(str(e.value).split("(log: ", 1)[1].split(";")[0].rstrip(")"))
    assert log.is_file() and tmp_path not in log.parents and "No module named" in log.read_text()


def test_the_tool_is_stopped_at_its_timeout(smollm2_dir, tmp_path):
    with StubServer(StubTimings(ttft_s=0.01, token_s=0.5)) as stub:
        start = time.monotonic()
        with pytest.raises(EngineError, match=r"no result after 3 s: stopped"):
            _step(stub.url, _requests(4), 1, tmp_path, smollm2_dir, timeout_s=3)
        assert time.monotonic() - start < 20
    assert not _left(str(tmp_path / "c1"))


INTERRUPTED = """
import sys
from pathlib import Path
from quantkit.loadtest.generator import LoadRequest, run_step
from stub_server import StubServer, StubTimings
with StubServer(StubTimings(ttft_s=0.01, token_s=0.5)) as stub:
    try:
        run_step(stub.url, "stub-model", [LoadRequest("a b", 2, 50)] * 4, 1, timeout_s=600,
                 workdir=Path(sys.argv[1]), tokenizer_dir=Path(sys.argv[2]))
    except KeyboardInterrupt:
        print("interrupted", flush=True)
"""


def test_ctrl_c_stops_the_tool(smollm2_dir, tmp_path):
    """Ctrl-C while the tool runs (its requests take 25 s each) stops it and all it started."""
    work = tmp_path / "step"
    tool = str(work / "requests-c1.jsonl")   # on the tool's command line only
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path])}
    proc = subprocess.Popen([sys.executable, "-c", INTERRUPTED, str(work), str(smollm2_dir)], env=env,
                            stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not _left(tool) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _left(tool), "the tool never started"
    time.sleep(2)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert "interrupted" in out
    assert not _left(tool)


def test_token_id_prompts_go_as_the_text_that_tokenizes_back_to_them(smollm2_dir):
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    ids = tok("Quantization keeps the weights small.")["input_ids"]
    assert prompt_texts([LoadRequest(ids, len(ids), 4)], tok) == ["Quantization keeps the weights small."]
    split = tok("hel", add_special_tokens=False)["input_ids"] + tok("lo", add_special_tokens=False)["input_ids"]
    assert len(tok("hello")["input_ids"]) != len(split)
    with pytest.raises(Exception, match=r"request 0: its 2 token ids decode to a text that tokenizes otherwise"):
        prompt_texts([LoadRequest(split, 2, 4)], tok)


def _fitted_requests(tokenizer, n: int) -> list[LoadRequest]:
    """``n`` requests whose lengths are drawn from log-normals fitted to a small log's lengths;
    each prompt a slice of real text, as token ids."""
    text = (Path(sysconfig.get_paths()["stdlib"]) / "pydoc_data" / "topics.py").read_text()[:200_000]
    source = tokenizer(text, add_special_tokens=False)["input_ids"]
    prompt_fit = fit_lognormal([40, 55, 60, 75, 90, 120, 150, 210, 260, 300])
    output_fit = fit_lognormal([8, 12, 15, 18, 20, 24, 30, 40, 48, 64])
    prompts = prompt_fit.draw(n, seed=3, lo=8, hi=400)
    outputs = output_fit.draw(n, seed=4, lo=2, hi=64)
    return [LoadRequest(source[1000 * i:1000 * i + p], p, o) for i, (p, o) in enumerate(zip(prompts, outputs))]


def test_vllm_receives_the_fitted_lengths_exactly(smollm2_dir, tmp_path):
    """vLLM's usage counts for every request equal the lengths drawn from the fit."""
    reqs = _fitted_requests(AutoTokenizer.from_pretrained(smollm2_dir), 6)
    assert len({r.prompt_tokens for r in reqs}) > 3 and len({r.output_tokens for r in reqs}) > 3
    with serve(find_engine(), smollm2_dir, ServeOptions(max_model_len=1024)) as served:
        step = run_step(served.endpoint.url, served.endpoint.model, reqs, 2, timeout_s=900,
                        workdir=tmp_path, tokenizer_dir=smollm2_dir)
    assert all(t["ok"] for t in step.timings), [t["error"] for t in step.timings]
    assert [t["prompt_tokens"] for t in step.timings] == [r.prompt_tokens for r in reqs]
    assert [t["output_tokens"] for t in step.timings] == [r.output_tokens for r in reqs]
    assert all(0 < t["ttft"] < t["e2e"] and t["tpot"] > 0 and math.isfinite(t["itl_max"]) for t in step.timings)


def test_a_loadtest_killed_outright_leaves_no_tool_and_no_work_folder(smollm2_dir, tmp_path):
    """SIGKILL of ``quantkit loadtest`` mid-step (nothing in it can react): the load generator and
    what it started go with it (its watchdog), and so does the command's temporary work folder."""
    import glob
    import json

    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps({"prompt": "why " * (5 + i % 20), "completion": "because " * (3 + i % 9)}) + "\n"
                           for i in range(40)))
    private = tmp_path / "tmp"   # the command's own temporary directory: nothing else running writes there
    private.mkdir()
    pattern = str(private / "quantkit-loadtest-*")
    before = set(glob.glob(pattern))
    with StubServer(StubTimings(ttft_s=0.01, token_s=0.5)) as stub:
        proc = subprocess.Popen([sys.executable, "-m", "quantkit.cli", "loadtest", str(smollm2_dir), "--endpoint",
                                 stub.url, "--traffic", str(log), "--slo", "ttft=5s", "--max-concurrency", "2",
                                 "--min-requests", "4", "--max-model-len", "2048", "--out", str(tmp_path / "lt")],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env={**os.environ, "TMPDIR": str(private)})
        tool = f"--base-url {stub.url} "   # the tool's own command line (a port is no prefix of another's)
        deadline = time.monotonic() + 120
        while not stub.requests and time.monotonic() < deadline:   # the tool has started sending
            time.sleep(0.2)
        assert stub.requests, "the load generator never sent a request"
        mine = set(glob.glob(pattern)) - before
        assert len(mine) == 1 and _left(tool), (mine, _left(tool))
        proc.kill()
        proc.wait(timeout=30)
        gone_by = time.monotonic() + 20
        while (_left(tool) or any(os.path.exists(m) for m in mine)) and time.monotonic() < gone_by:
            time.sleep(0.2)
    assert not _left(tool), _left(tool)
    assert not any(os.path.exists(m) for m in mine)
