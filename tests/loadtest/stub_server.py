"""A stub OpenAI-compatible server with known timings, for testing the load generator.

It streams ``/v1/completions`` and ``/v1/chat/completions`` (server-sent events, the usage in
the final chunk when ``stream_options.include_usage`` asks for it, as vLLM does), and answers
``/v1/models`` and ``/health``. Each request waits for one of ``slots`` (beyond them requests
queue, as a server whose batch is full), sleeps ``ttft_s`` before its first token and
``token_s`` before each next one. Without ``ignore_eos`` a request stops after ``eos_after``
tokens, as a model that ends its reply early: a client that does not enforce the output length
gets fewer tokens than it asked for.

``share``: instead of queueing, every request runs at once and they share the server's time, as
one batch on a compute-bound engine: with more than ``slots`` running, each sleep is stretched by
running / slots, so throughput stops growing at ``slots`` while time per token grows (the shape
the knee rule in loadtest/ramp.py looks for; behind a plain queue, time per token stays flat).

``die_after``: when request ``die_after + 1`` arrives the server stops, closing every open
connection mid-stream and refusing new ones (a server that crashes mid-step).
``fail_every``: every that many-th request is answered HTTP 500.
A request that does not ask to stream (quantkit's timed probe) gets a plain JSON answer after the
same delays and is not counted among the requests.
"""
from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass(frozen=True)
class StubTimings:
    ttft_s: float = 0.05
    token_s: float = 0.02
    slots: int = 4
    eos_after: int = 3
    share: bool = False
    die_after: int | None = None
    fail_every: int | None = None
    model: str = "stub-model"


def _prompt_tokens(body: dict) -> int:
    """Token ids count as themselves; text counts one token per whitespace-separated word."""
    if "messages" in body:
        return sum(len(str(m.get("content", "")).split()) for m in body["messages"])
    prompt = body.get("prompt", "")
    if isinstance(prompt, list):
        return len(prompt)
    return len(str(prompt).split())


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "_Server"

    def log_message(self, *args) -> None:   # the test's output stays the test's
        pass

    def _json(self, code: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        path = self.path.split("?")[0].rstrip("/")
        if path == "/health":
            self._json(200, {})
        elif path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": self.server.timings.model, "object": "model",
                                                         "max_model_len": 4096}]})
        else:
            self._json(404, {"error": {"message": f"no route {path}"}})

    def do_POST(self) -> None:
        path = self.path.split("?")[0].rstrip("/")
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if path not in ("/v1/completions", "/v1/chat/completions"):
            self._json(404, {"error": {"message": f"no route {path}"}})
            return
        t = self.server.timings
        if not body.get("stream"):   # a plain answer (quantkit's timed probe): not one of the counted requests
            n = int(body.get("max_tokens") or 16)
            time.sleep(t.ttft_s + t.token_s * (n - 1))
            self._json(200, {"choices": [{"index": 0, "text": " x" * n, "finish_reason": "length"}],
                             "usage": {"prompt_tokens": _prompt_tokens(body), "completion_tokens": n}})
            return
        number = self.server.arrived()
        if self.server.dead.is_set():
            self._cut()
            return
        if t.fail_every and number % t.fail_every == 0:
            self._json(500, {"error": {"message": "planted failure"}})
            return
        wanted = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        n = wanted if body.get("ignore_eos") else min(wanted, t.eos_after)
        with self.server.slots if not t.share else contextlib.nullcontext():
            self.server.hold(+1)
            try:
                self._stream(path, body, n, _prompt_tokens(body))
            finally:
                self.server.hold(-1)

    def _cut(self) -> None:
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _chunk(self, payload: dict | str) -> None:
        text = payload if isinstance(payload, str) else json.dumps(payload)
        data = f"data: {text}\n\n".encode()
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _stream(self, path: str, body: dict, n: int, prompt_tokens: int) -> None:
        chat = path.endswith("chat/completions")
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.server.track(self.connection)
        due = time.monotonic()
        try:
            for i in range(n):
                # tokens are due on a schedule, so the stub's own work between them does not add up
                due += self.server.pace(self.server.timings.ttft_s if i == 0 else self.server.timings.token_s)
                time.sleep(max(0.0, due - time.monotonic()))
                if self.server.dead.is_set():
                    self._cut()
                    return
                choice = {"index": 0, "finish_reason": "length" if i == n - 1 else None}
                choice.update({"delta": {"content": f" t{i}"}} if chat else {"text": f" t{i}"})
                self._chunk({"id": "stub", "object": "chat.completion.chunk" if chat else "text_completion",
                             "model": self.server.timings.model, "choices": [choice]})
            if (body.get("stream_options") or {}).get("include_usage"):
                self._chunk({"id": "stub", "model": self.server.timings.model, "choices": [],
                             "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": n,
                                       "total_tokens": prompt_tokens + n}})
            self._chunk("[DONE]")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        finally:
            self.server.untrack(self.connection)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        pass   # clients that drop a kept-alive connection are normal; a test checks answers, not this log

    def __init__(self, timings: StubTimings) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.timings = timings
        self.slots = threading.BoundedSemaphore(timings.slots)
        self.dead = threading.Event()
        self.lock = threading.Lock()
        self.requests = 0
        self.running = 0
        self.peak = 0
        self.open: set[socket.socket] = set()

    def arrived(self) -> int:
        with self.lock:
            self.requests += 1
            number = self.requests
        if self.timings.die_after is not None and number > self.timings.die_after and not self.dead.is_set():
            self.dead.set()
            threading.Thread(target=self.die, daemon=True).start()
        return number

    def pace(self, seconds: float) -> float:
        if not self.timings.share:
            return seconds
        with self.lock:
            return seconds * max(1.0, self.running / self.timings.slots)

    def hold(self, step: int) -> None:
        with self.lock:
            self.running += step
            self.peak = max(self.peak, self.running)

    def track(self, conn: socket.socket) -> None:
        with self.lock:
            self.open.add(conn)

    def untrack(self, conn: socket.socket) -> None:
        with self.lock:
            self.open.discard(conn)

    def die(self) -> None:
        """Close every open stream mid-way and stop listening."""
        with self.lock:
            conns = list(self.open)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.shutdown()
        self.server_close()


class StubServer:
    """``with StubServer(StubTimings(...)) as stub: stub.url`` (``http://127.0.0.1:PORT``)."""

    def __init__(self, timings: StubTimings = StubTimings()) -> None:
        self.timings = timings
        self._server = _Server(timings)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    @property
    def requests(self) -> int:
        return self._server.requests

    @property
    def peak(self) -> int:
        """The most requests that held a slot at once."""
        return self._server.peak

    def __enter__(self) -> StubServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if not self._server.dead.is_set():
            self._server.dead.set()
            self._server.die()
