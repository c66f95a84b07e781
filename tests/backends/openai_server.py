"""A scriptable OpenAI-compatible HTTP server on a real 127.0.0.1 socket, for the ``openai`` backend tests.

It speaks ``POST /v1/chat/completions`` and ``POST /v1/completions`` in OpenAI's wire format and runs in a
``ThreadingHTTPServer`` daemon thread (one thread per connection, so concurrent requests really overlap).

The "model" is a deterministic word model: it answers with ``max_tokens`` words drawn from :data:`WORDS`
(each a single token with its leading space in the Qwen tokenizer), chosen by a hash of the prompt text, and
of the seed when ``temperature > 0``. Stop strings are honoured as OpenAI does: the text is cut *before* the
first stop string (the stop string is not returned) and ``finish_reason`` is ``"stop"``; with
``report_stop=True`` the choice also names the matched stop as vLLM (``stop_reason``) and SGLang
(``matched_stop``) do; ``honour_stop=False`` ignores them, as some servers do. Usage counts words:
``prompt_tokens`` = words of the prompt text (chat: of every message's content), ``completion_tokens`` =
words of the returned text.

Tests change behaviour per request with :meth:`OpenAITestServer.push` (a FIFO of one-shot actions: an HTTP
status, a sleep, a raw body) or for every request with ``reply`` (a function of the request body returning the
text, or a dict merged into the choice).
"""

from __future__ import annotations

import hashlib
import json
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["WORDS", "Action", "OpenAITestServer", "Recorded"]

WORDS = (" the", " cat", " sat", " on", " mat", " dog", " ran", " to", " and", " it", " was", " red")


@dataclass
class Action:
    """A one-shot behaviour for the next request.

    Attributes:
        status: HTTP status to answer with (the body is an OpenAI error object); ``None`` = a normal reply.
        sleep_s: seconds to wait before answering (longer than the client's timeout = a timeout).
        body: raw bytes to answer with instead of a reply (``content_type`` says what they claim to be).
        headers: extra response headers (e.g. ``retry-after-ms``).
        message: the error message of a ``status`` answer.
    """

    status: int | None = None
    sleep_s: float = 0.0
    body: bytes | None = None
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    message: str = "scripted error"


@dataclass
class Recorded:
    """One request as the server saw it."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]


class OpenAITestServer:
    """Start with ``with OpenAITestServer() as srv:``; ``srv.base_url`` is ``http://127.0.0.1:<port>/v1``.

    Attributes:
        requests: every request received, in arrival order (retries included).
        max_in_flight: the most requests that were being handled at the same time.
    """

    def __init__(
        self,
        *,
        reply: Callable[[dict[str, Any]], str | dict[str, Any]] | None = None,
        report_stop: bool = False,
        honour_stop: bool = True,
        delay_s: float = 0.0,
    ) -> None:
        self.reply = reply
        self.report_stop = report_stop
        self.honour_stop = honour_stop
        self.delay_s = delay_s
        self.requests: list[Recorded] = []
        self.max_in_flight = 0
        self._in_flight = 0
        self._actions: deque[Action] = deque()
        self._lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the client's connection pool expects

            def log_message(self, *args: Any) -> None:  # quiet test output
                pass

            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                owner._handle(self)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        # a short poll interval: shutdown() waits up to one interval, and every test stops a server
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.02,), daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def push(self, *actions: Action) -> None:
        """Queue one-shot actions; each applies to one request, in order."""
        with self._lock:
            self._actions.extend(actions)

    def __enter__(self) -> OpenAITestServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    # -- handling ------------------------------------------------------------------------------------------

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        raw = h.rfile.read(int(h.headers.get("content-length", 0)))
        body = json.loads(raw or b"{}")
        with self._lock:
            self.requests.append(Recorded(h.path, {k.lower(): v for k, v in h.headers.items()}, body))
            action = self._actions.popleft() if self._actions else Action()
            self._in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self._in_flight)
        try:
            time.sleep(action.sleep_s + self.delay_s)
            if action.body is not None:
                self._send(h, 200, action.body, action.content_type, action.headers)
            elif action.status is not None:
                err = {"error": {"message": action.message, "type": "test", "code": None}}
                self._send(h, action.status, json.dumps(err).encode(), "application/json", action.headers)
            elif h.path.endswith("/chat/completions") or h.path.endswith("/completions"):
                payload = self._reply(h.path.endswith("/chat/completions"), body)
                self._send(h, 200, json.dumps(payload).encode(), "application/json", action.headers)
            else:
                self._send(h, 404, b'{"error": {"message": "no such route"}}', "application/json", {})
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout test)
            pass
        finally:
            with self._lock:
                self._in_flight -= 1

    @staticmethod
    def _send(
        h: BaseHTTPRequestHandler, status: int, data: bytes, ctype: str, headers: dict[str, str]
    ) -> None:
        h.send_response(status)
        h.send_header("content-type", ctype)
        h.send_header("content-length", str(len(data)))
        for k, v in headers.items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(data)

    def _reply(self, chat: bool, body: dict[str, Any]) -> dict[str, Any]:
        if chat:
            prompt = "\n".join(str(m.get("content", "")) for m in body.get("messages", []))
        else:
            prompt = str(body.get("prompt", ""))
        choice_extra: dict[str, Any] = {}
        finish = "length"
        custom = self.reply(body) if self.reply is not None else None
        if isinstance(custom, dict):
            choice_extra = dict(custom)
            text = choice_extra.pop("text", "")
            finish = choice_extra.pop("finish_reason", "stop")
        elif isinstance(custom, str):
            text, finish = custom, "stop"
        else:
            temperature = float(body.get("temperature", 1.0))
            key = prompt if temperature == 0 else f"{prompt}|{body.get('seed')}|{temperature}"
            if temperature > 0 and body.get("seed") is None:
                key += f"|{random.random()}"  # unseeded sampling differs every time
            rng = random.Random(hashlib.sha256(key.encode()).digest())
            text = "".join(rng.choice(WORDS) for _ in range(int(body.get("max_tokens") or 16)))
        stops = body.get("stop") or []
        stops = [stops] if isinstance(stops, str) else list(stops)
        hits = [(text.find(s), s) for s in stops if s in text]
        if hits and self.honour_stop:
            at, matched = min(hits)
            text, finish = text[:at], "stop"
            if self.report_stop:
                choice_extra.update(stop_reason=matched, matched_stop=matched)
        usage = {
            "prompt_tokens": len(prompt.split()),
            "completion_tokens": len(text.split()),
            "total_tokens": len(prompt.split()) + len(text.split()),
        }
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
            kind = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
            kind = "text_completion"
        choice.update(choice_extra)
        return {
            "id": f"test-{len(self.requests)}",
            "object": kind,
            "created": int(time.time()),
            "model": body.get("model", ""),
            "choices": [choice],
            "usage": usage,
        }
