"""An OpenAI-compatible server that answers wrongly on purpose, one way per ``mode``.

In ``"clean"`` mode it answers as vLLM would, from a fixed made-up distribution: every prompt
token scored at log-probability -2 with a short top-k list around it, greedy continuations of
token ids. Every other mode corrupts one part of one kind of answer (see ``MODES``), so a test can
run quantkit's evaluation and load test against each and check that none of them yields a figure,
a traceback or a hang. Loopback only; ``with CorruptServer(mode) as s: s.url``."""
from __future__ import annotations

import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# mode -> what goes wrong
MODES = {
    "nan-logprobs": "every log-probability is NaN",
    "inf-logprobs": "every log-probability is -Infinity",
    "null-logprobs": "every log-probability is null",
    "no-logprobs": "no logprobs object at all",
    "short-logprobs": "token_logprobs shorter than the prompt",
    "string-logprobs": "log-probabilities as strings",
    "positive-logprobs": "log-probabilities above 0",
    "text-token-ids": "tokens as text, not token_id:N",
    "string-token-ids": "token ids as strings of letters",
    "huge-token-ids": "token ids of 10^12",
    "foreign-token-ids": "top-k token ids of 10^9: past any vocabulary, within an int32",
    "list-top-logprobs": "top_logprobs entries as lists",
    "string-choices": "choices as a string",
    "empty-choices": "an empty choices list",
    "other-tokens": "the echoed tokens are not the prompt's",
    "error-500": "every completion is HTTP 500",
    "not-json": "every completion is an HTML page",
    "models-strings": "/v1/models data as strings",
    "models-no-id": "/v1/models entries without an id",
    "models-len-abc": "max_model_len 'abc'",
    "models-len-2": "max_model_len 2",
    "models-len-negative": "max_model_len -5",
    "models-slow-loris": "/v1/models sends one byte a second, forever",
    "models-endless": "/v1/models body never ends",
    "hang": "a completion never answers",
    "hang-scoring": "answers the probe, then never answers a scoring request (echo)",
}


def _clean_choice(body: dict) -> dict:
    ids = list(body["prompt"]) if isinstance(body.get("prompt"), list) else [1, 2, 3]
    k = int(body.get("logprobs") or 0)
    if body.get("echo"):
        tops = [None] + [{f"token_id:{ids[j]}": -2.0, **{f"token_id:{(ids[j] + c + 1) % 200}": -2.5 - c
                                                          for c in range(max(k - 1, 0))}} for j in range(1, len(ids))]
        return {"text": "", "logprobs": {"tokens": [f"token_id:{t}" for t in ids],
                                         "token_logprobs": [None] + [-2.0] * (len(ids) - 1), "top_logprobs": tops}}
    n = int(body.get("max_tokens") or 1)
    out = [(7 + i) % 200 for i in range(n)]
    lp = {"tokens": [f"token_id:{t}" for t in out], "token_logprobs": [-1.0] * n,
          "top_logprobs": [{f"token_id:{t}": -1.0, "token_id:3": -3.0} for t in out]} if k else None
    return {"text": " x" * n, "token_ids": out, "logprobs": lp}


def _corrupt(mode: str, choice: dict, body: dict):
    lp = choice.get("logprobs")
    if mode == "string-choices":
        return "not a list"
    if mode == "empty-choices":
        return []
    if lp is not None:
        values = {"nan-logprobs": math.nan, "inf-logprobs": -math.inf, "null-logprobs": None,
                  "string-logprobs": "-2.0", "positive-logprobs": 3.0}
        if mode in values:
            lp["token_logprobs"] = [None] + [values[mode]] * (len(lp["token_logprobs"]) - 1)
            lp["top_logprobs"] = [None if t is None else {key: values[mode] for key in t} for t in lp["top_logprobs"]]
        elif mode == "no-logprobs":
            choice["logprobs"] = None
        elif mode == "short-logprobs":
            lp["token_logprobs"], lp["tokens"] = lp["token_logprobs"][:2], lp["tokens"][:2]
        elif mode == "text-token-ids":
            lp["tokens"] = [f"word{j}" for j in range(len(lp["tokens"]))]
        elif mode == "string-token-ids":
            lp["tokens"] = ["token_id:abc"] * len(lp["tokens"])
        elif mode in ("huge-token-ids", "foreign-token-ids"):
            big = 10**12 if mode == "huge-token-ids" else 10**9
            lp["top_logprobs"] = [None if t is None else {f"token_id:{big}": -1.0} for t in lp["top_logprobs"]]
        elif mode == "list-top-logprobs":
            lp["top_logprobs"] = [None if t is None else list(t.items()) for t in lp["top_logprobs"]]
        elif mode == "other-tokens":
            lp["tokens"] = [f"token_id:{j % 5}" for j in range(len(lp["tokens"]))]
    if mode == "string-token-ids" and choice.get("token_ids") is not None:
        choice["token_ids"] = ["abc"] * len(choice["token_ids"])
    return [choice]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "_Server"

    def log_message(self, *args) -> None:
        pass

    def _send(self, code: int, payload, content_type: str = "application/json") -> None:
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _models(self) -> None:
        mode = self.server.mode
        card = {"id": "corrupt", "object": "model", "max_model_len": 2048}
        if mode == "models-slow-loris":
            self.send_response(200)
            self.send_header("Content-Length", "100000")
            self.end_headers()
            while not self.server.stopping.is_set():
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(1.0)
            return
        if mode == "models-endless":
            self.send_response(200)
            self.end_headers()
            chunk = b'{"data": [' + b" " * 65536
            while not self.server.stopping.is_set():
                self.wfile.write(chunk)
            return
        data = {"models-strings": ["corrupt"], "models-no-id": [{"object": "model", "max_model_len": 2048}],
                "models-len-abc": [{**card, "max_model_len": "abc"}], "models-len-2": [{**card, "max_model_len": 2}],
                "models-len-negative": [{**card, "max_model_len": -5}]}.get(mode, [card])
        self._send(200, {"object": "list", "data": data})

    def do_GET(self) -> None:
        path = self.path.split("?")[0].rstrip("/")
        try:
            if path == "/v1/models":
                self._models()
            elif path in ("/health", "/version"):
                self._send(200, {"version": "corrupt"})
            else:
                self._send(404, {"error": {"message": "no route"}})
        except OSError:
            pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        mode = self.server.mode
        try:
            if mode == "hang" or (mode == "hang-scoring" and body.get("echo")):
                self.server.stopping.wait(600)
                return
            if mode == "error-500":
                self._send(500, {"error": {"message": "planted failure"}})
                return
            if mode == "not-json":
                self._send(200, b"<html>gateway</html>", "text/html")
                return
            # NaN and Infinity as Python's json writes them: what a careless server sends
            self._send(200, {"choices": _corrupt(mode, _clean_choice(body), body)})
        except OSError:
            pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256   # the evaluation keeps many requests in flight: the default backlog of 5 resets them

    def __init__(self, mode: str) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.mode, self.stopping = mode, threading.Event()

    def handle_error(self, request, client_address) -> None:
        pass


class CorruptServer:
    def __init__(self, mode: str = "clean") -> None:
        assert mode == "clean" or mode in MODES, mode
        self._server = _Server(mode)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> CorruptServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.stopping.set()
        self._server.shutdown()
        self._server.server_close()
