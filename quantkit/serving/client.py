"""An OpenAI-compatible server as quantkit talks to it: ``/v1/models``, ``/v1/completions``,
``/health``, ``/version``. Standard library HTTP only; every failure is one ``EngineError`` line
naming the URL and what the server said."""
from __future__ import annotations

import http.client
import json
import select
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass

from pydantic import ValidationError

from quantkit.errors import QuantkitError
from quantkit.serving.answers import Completion, ModelList, first_problem


# an answer larger than this is not one a completion, a model list or a health check gives: it is
# refused rather than read into memory without end (a body that never ends)
MAX_ANSWER_BYTES = 64 * 2**20
READ_CHUNK = 1 << 16
POLL_S = 0.25   # how often a request waiting on its answer looks at its deadline and its cancel event


class EngineError(QuantkitError):
    """The server cannot be reached, answered an error, or does not serve what was asked."""


class EngineTimeout(EngineError):
    """The server gave no whole answer within the request's deadline."""


class Cancelled(EngineError):
    """The request was given up because its caller stopped (an error elsewhere, Ctrl-C, SIGTERM)."""


def _http_error(code: int, raw: bytes) -> str:
    try:
        body = json.loads(raw.decode("utf-8", "replace"))
        msg = body.get("message") or (body.get("error") or {}).get("message") or body
    except (ValueError, AttributeError):
        msg = raw.decode("utf-8", "replace") or "no message"
    return f"HTTP {code}: {' '.join(str(msg).split())[:300]}"


def _connection(url: str, timeout_s: float) -> tuple[http.client.HTTPConnection, str]:
    parts = urllib.parse.urlsplit(url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return cls(parts.hostname, parts.port, timeout=timeout_s), path


def _wait_readable(conn: http.client.HTTPConnection, url: str, deadline: float,
                   cancel: threading.Event | None) -> None:
    """Until the server starts its answer: polled, so that ``cancel`` and the deadline are seen
    within ``POLL_S`` however long the server takes to compute (no read is left hanging)."""
    while True:
        if cancel is not None and cancel.is_set():
            raise Cancelled(f"{url}: given up (the run has stopped)")
        left = deadline - time.monotonic()
        if left <= 0:
            raise EngineTimeout(f"{url}: no answer in time")
        readable, _, _ = select.select([conn.sock], [], [], min(POLL_S, left))
        if readable:
            return


def _read_within(r: http.client.HTTPResponse, sock: socket.socket, url: str, deadline: float) -> bytes:
    """The whole body, read before ``deadline`` (a total, not a per-read limit: a server that
    sends one byte every few seconds is cut off) and within ``MAX_ANSWER_BYTES``."""
    chunks, size = [], 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise EngineTimeout(f"{url}: no whole answer within the deadline")
        sock.settimeout(left)
        chunk = r.read1(READ_CHUNK)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > MAX_ANSWER_BYTES:
            raise EngineError(f"{url}: an answer over {MAX_ANSWER_BYTES // 2**20} MiB: refused")
        chunks.append(chunk)


def request(url: str, body: dict | None = None, timeout_s: float = 600.0,
            cancel: threading.Event | None = None) -> dict | str:
    """GET ``url`` (or POST ``body`` as JSON) and read the whole answer within ``timeout_s``
    (given up as soon as ``cancel`` is set); the JSON answer, else its text."""
    data = None if body is None else json.dumps(body).encode()
    deadline = time.monotonic() + timeout_s
    try:
        conn, path = _connection(url, timeout_s)
    except ValueError as e:
        raise EngineError(f"{url}: not a URL ({e})") from None
    try:
        conn.request("GET" if data is None else "POST", path, data,
                     {"Content-Type": "application/json"} if data is not None else {})
        _wait_readable(conn, url, deadline, cancel)
        sock = conn.sock   # the response keeps reading it after the connection lets go of it
        sock.settimeout(max(deadline - time.monotonic(), 0.001))
        r = conn.getresponse()
        raw = _read_within(r, sock, url, deadline)
    except EngineError:
        raise
    except (socket.timeout, TimeoutError):
        raise EngineTimeout(f"{url}: no answer in time") from None
    except (OSError, http.client.HTTPException, ValueError) as e:
        reason = f"cannot connect ({e.strerror or e})" if isinstance(e, ConnectionRefusedError) else f"{type(e).__name__}: {e}"
        raise EngineError(f"{url}: {reason}") from None
    finally:
        conn.close()
    if r.status >= 400:
        raise EngineError(f"{url}: {_http_error(r.status, raw)}")
    text = raw.decode("utf-8", "replace")
    try:
        return json.loads(text)
    except ValueError:
        return text


@dataclass(frozen=True)
class Endpoint:
    """A served model: the server's base URL (``http://host:port``), the model name it serves it
    under and the longest context it accepts (None when the server does not say)."""
    url: str
    model: str
    max_model_len: int | None = None
    flag: str = "--endpoint"

    @classmethod
    def connect(cls, url: str, model: str | None = None, flag: str = "--endpoint") -> Endpoint:
        """The endpoint at ``url`` (``http://host:port``, ``#NAME`` after it names the model); ``model``
        None and no name: the one model the server serves."""
        url, _, named = url.partition("#")
        model = model or named or None
        base = url.rstrip("/")
        if base.endswith("/v1"):
            base = base[:-3]
        parsed = urllib.parse.urlsplit(base) if base.startswith(("http://", "https://")) else None
        try:
            port_ok = parsed is not None and bool(parsed.hostname) and (parsed.port or 80) > 0
        except ValueError:
            port_ok = False
        if not port_ok:
            raise EngineError(f"{flag}: {url}: expected an http:// or https:// URL with a host (http://host:port)")
        try:
            listed = request(f"{base}/v1/models", timeout_s=30)
        except EngineError as e:
            raise type(e)(f"{flag}: {e}") from None
        if not isinstance(listed, dict) or not listed.get("data"):
            raise EngineError(f"{flag}: {base}/v1/models lists no model")
        try:
            data = ModelList.model_validate(listed).data
        except ValidationError as e:
            raise EngineError(f"{flag}: {base}/v1/models: a malformed answer: {first_problem(e)}") from None
        names = [m.id for m in data]
        if model is None and len(names) > 1:
            raise EngineError(f"{flag}: {base} serves several models ({', '.join(names)}): name one")
        chosen = next((m for m in data if model in (None, m.id)), None)
        if chosen is None:
            raise EngineError(f"{flag}: {base} does not serve {model!r} (it serves {', '.join(names)})")
        return cls(base, chosen.id, chosen.max_model_len, flag)

    def completions(self, body: dict, timeout_s: float = 600.0, cancel: threading.Event | None = None) -> dict:
        try:
            answer = request(f"{self.url}/v1/completions", {"model": self.model, **body}, timeout_s, cancel)
        except EngineError as e:
            raise type(e)(f"{self.flag}: {e}") from None   # a timeout stays a timeout
        if not isinstance(answer, dict) or not answer.get("choices"):
            raise EngineError(f"{self.flag}: {self.url}/v1/completions: an answer without choices")
        try:
            Completion.model_validate(answer)
        except ValidationError as e:
            raise EngineError(f"{self.flag}: {self.url}/v1/completions: a malformed answer: {first_problem(e)}") from None
        return answer

    def version(self) -> str | None:
        try:
            v = request(f"{self.url}/version", timeout_s=10)
        except EngineError:
            return None
        return v.get("version") if isinstance(v, dict) else None
