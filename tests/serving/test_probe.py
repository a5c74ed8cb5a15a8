"""The timed probe: a server that takes too long a step is refused in one line saying the step
time it measured, within the probe's own deadline, before any long pass starts."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from quantkit.serving.client import EngineError, Endpoint
from quantkit.serving.probe import PROBE_TOKENS, timed_probe


def _server(step_s: float) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def _send(self, payload: dict) -> None:
            body = json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            self._send({"data": [{"id": "m", "max_model_len": 2048}]})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            time.sleep(step_s * body["max_tokens"])   # one step per token, the prefill giving the first
            try:
                self._send({"choices": [{"text": "x" * body["max_tokens"]}]})
            except OSError:
                pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.fixture
def endpoint_at():
    servers = []

    def start(step_s: float) -> Endpoint:
        servers.append(_server(step_s))
        return Endpoint.connect(f"http://127.0.0.1:{servers[-1].server_address[1]}")
    yield start
    for s in servers:
        s.shutdown()


def test_a_fast_server_passes_with_its_step_time(endpoint_at):
    got = timed_probe(endpoint_at(0.01), "the candidate", "use X", budget_step_s=0.5)
    assert got.steps == PROBE_TOKENS and 0.01 <= got.step_s < 0.5
    assert got.to_dict()["step_s"] == round(got.step_s, 3)


def test_a_slow_step_is_refused_with_the_measured_time_and_what_to_do(endpoint_at):
    with pytest.raises(EngineError) as e:
        timed_probe(endpoint_at(0.3), "the candidate (fp8, float-quantized) in float32", "use W8A8", budget_step_s=0.1)
    line = str(e.value)
    assert "\n" not in line and line.startswith("--endpoint: the candidate (fp8, float-quantized) in float32: ")
    measured = float(line.split(": ")[2].split(" s a step")[0])
    assert 0.25 <= measured <= 1.0 and "budget 0.1 s" in line and line.endswith("use W8A8")


def test_no_answer_within_the_deadline_is_refused_at_the_deadline(endpoint_at):
    t0 = time.monotonic()
    with pytest.raises(EngineError, match=r"no answer to a 4-step probe in 1 s \(over 0.2 s a step"):
        timed_probe(endpoint_at(5.0), "the candidate", "use W8A8", budget_step_s=0.1, timeout_s=1.0)
    assert time.monotonic() - t0 < 3.0
