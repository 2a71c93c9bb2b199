"""A local OpenAI-compatible stand-in server, used to synthesise the project's fixtures.

It answers ``POST /v1/chat/completions`` on 127.0.0.1 in the exact wire format of the
OpenAI API by delegating to :class:`planrun.testing.FakeOpenAI` with the synthetic
answerers of :mod:`planrun.examples.answers`, after serving a scenario's scripted replies
(429 with Retry-After, 500, a refusal, a permanent 400; see :mod:`planrun.scenarios`).
Every request must carry ``Authorization: Bearer ...``; a key listed in ``reject_keys``
gets the API's 401, whose message quotes the key as the real API does (which is what the
recorder's scrubbing must remove).

``rpm_limit=N`` (``--rpm-limit N``) makes it enforce a rate limit the way the API does,
counted over every client: beyond N requests per minute (with ``rpm_burst`` requests, by
default one second's worth, allowed back to back) a chat request gets the API's 429 with
``retry-after``, ``retry-after-ms`` and ``x-ratelimit-*`` headers. ``rate_limited`` counts
those answers and ``admitted`` holds the arrival time of every request let through, so a
test can show that a client-side limiter prevents 429s while using the whole rate.

    python tools/standin.py --scenario rate_limited      # serve until Ctrl-C
    python tools/standin.py --rpm-limit 600              # 429 beyond 600 requests/minute
    OPENAI_BASE_URL=http://127.0.0.1:PORT/v1 OPENAI_API_KEY=sk-anything planrun ...

    with StandIn(FakeOpenAI(answers())) as server:       # from Python
        Model(api_key="sk-...", base_url=server.base_url)
"""

from __future__ import annotations

import argparse
import json
import math
import threading
import time
from collections.abc import Iterable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

import httpx

from planrun.examples.answers import answers
from planrun.scenarios import get_scenario
from planrun.testing import FakeOpenAI, error_body

__all__ = ["StandIn", "for_scenario", "main"]

CHAT_PATH = "/v1/chat/completions"


class StandIn:
    """A ThreadingHTTPServer on 127.0.0.1 (port 0: any free port) serving ``fake``.

    ``requests`` counts every HTTP request received, on any path (tests use it to prove
    that a replay reached no server). ``extra_headers`` go on every response (tests send
    cookies and organisation ids that must not be recorded).
    """

    def __init__(
        self,
        fake: FakeOpenAI,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        reject_keys: Iterable[str] = (),
        extra_headers: Mapping[str, str] | None = None,
        rpm_limit: float | None = None,
        rpm_burst: float | None = None,
    ) -> None:
        self.fake = fake
        self.reject_keys = frozenset(reject_keys)
        self.extra_headers = dict(extra_headers or {})
        self.requests = 0
        self.rate = _ServerRateLimit(rpm_limit, rpm_burst) if rpm_limit else None
        self.rate_limited = 0
        """Chat requests answered 429 by ``rpm_limit``."""
        self.admitted: list[float] = []
        """``time.monotonic()`` of every chat request let through under ``rpm_limit``."""
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((host, port), self._handler_class())
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        """The OpenAI-style base URL, ``http://127.0.0.1:PORT/v1``."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def start(self) -> StandIn:
        """Serve in a background thread."""
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="planrun-standin")
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> StandIn:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def answer(self, method: str, path: str, headers: dict[str, str],
               body: bytes) -> tuple[int, dict[str, str], bytes]:
        """Status, headers and body for one request (thread-safe; FakeOpenAI is not)."""
        with self._lock:
            self.requests += 1
            auth = headers.get("authorization", "")
            if not auth.lower().startswith("bearer "):
                return _error(401, "You didn't provide an API key.", None)
            key = auth[7:].strip()
            if key in self.reject_keys:
                return _error(401, f"Incorrect API key provided: {key}. You can find your API "
                              "key at https://platform.openai.com/account/api-keys.",
                              "invalid_api_key")
            if method != "POST" or path.split("?")[0] != CHAT_PATH:
                return _error(404, f"Invalid URL ({method} {path})", None)
            limit_headers: dict[str, str] = {}
            if self.rate is not None:
                now = time.monotonic()
                wait, limit_headers = self.rate.take(now)
                if wait > 0:
                    self.rate_limited += 1
                    status, headers, content = _error(
                        429, f"Rate limit reached for requests on this stand-in: limit "
                        f"{self.rate.rpm:g} per minute. Please try again in "
                        f"{wait * 1000:.0f}ms.", "rate_limit_exceeded")
                    return status, {**headers, **limit_headers,
                                    "retry-after": str(max(1, math.ceil(wait))),
                                    "retry-after-ms": f"{wait * 1000:.0f}"}, content
                self.admitted.append(now)
            request = httpx.Request(method, f"http://standin{path}", headers=headers,
                                    content=body)
            response = self.fake(request)
            out = {k: v for k, v in response.headers.items()
                   if k.lower() not in ("content-length", "content-type")}
            return (response.status_code, {**out, **limit_headers, **self.extra_headers},
                    response.content)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = {k.lower(): v for k, v in self.headers.items()}
                status, extra, content = server.answer(self.command, self.path, headers, body)
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(content)))
                for name, value in extra.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(content)

            do_POST = _serve
            do_GET = _serve

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler


class _ServerRateLimit:
    """The server side of a requests-per-minute limit: a GCRA over every client."""

    def __init__(self, rpm: float, burst: float | None) -> None:
        self.rpm = rpm
        self.interval = 60.0 / rpm
        self.burst = max(1.0, burst if burst is not None else rpm / 60)
        self._tat = float("-inf")  # theoretical arrival time of the next request

    def take(self, now: float) -> tuple[float, dict[str, str]]:
        """(0, headers) when a request may pass now (and it is counted), else (wait, headers)."""
        tolerance = (self.burst - 1) * self.interval
        tat = max(self._tat, now)
        wait = tat - tolerance - now
        if wait <= 0:
            self._tat = tat = tat + self.interval
        remaining = max(0, math.floor((tolerance - (tat - now)) / self.interval) + 1)
        headers = {
            "x-ratelimit-limit-requests": f"{self.rpm:g}",
            "x-ratelimit-remaining-requests": str(remaining),
            "x-ratelimit-reset-requests": f"{max(0.0, tat - now) * 1000:.0f}ms",
        }
        return max(0.0, wait), headers


def _error(status: int, message: str, code: str | None) -> tuple[int, dict[str, str], bytes]:
    body = json.dumps(error_body(status, message, code=code)).encode()
    return status, {"x-request-id": f"req_standin_{status}"}, body


def for_scenario(name: str | None = None, **options: Any) -> StandIn:
    """A stand-in with every example's answers and, for ``name``, that scenario's script."""
    script = get_scenario(name).script if name else ()
    return StandIn(FakeOpenAI(answers(), script=script), **options)


def main(argv: list[str] | None = None) -> int:
    """Serve until interrupted."""
    parser = argparse.ArgumentParser(description="Local OpenAI-compatible stand-in server")
    parser.add_argument("--port", type=int, default=0, help="port (default: any free one)")
    parser.add_argument("--scenario", help="serve this scenario's scripted replies first")
    parser.add_argument("--rpm-limit", type=float, metavar="N",
                        help="answer 429 beyond N requests per minute, over all clients")
    args = parser.parse_args(argv)
    if args.rpm_limit is not None and not args.rpm_limit > 0:
        parser.error(f"--rpm-limit must be > 0, got {args.rpm_limit}")
    server = for_scenario(args.scenario, port=args.port, rpm_limit=args.rpm_limit)
    print(f"stand-in serving at {server.base_url}", flush=True)
    try:
        server._server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server._server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
