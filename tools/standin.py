"""A local OpenAI-compatible stand-in server, used to synthesise the project's fixtures.

It answers ``POST /v1/chat/completions`` and ``POST /v1/responses`` on 127.0.0.1 over
HTTP/1.1 with keep-alive in the exact wire format of the
OpenAI API by delegating to :class:`planrun.dev.testing.FakeOpenAI` with the synthetic
answerers of :mod:`planrun.examples.answers`, after serving a scenario's scripted replies
(429 with Retry-After, 500, a refusal, a permanent 400; see :mod:`planrun.dev.scenarios`).
Every request must carry ``Authorization: Bearer ...``; a key listed in ``reject_keys``
gets the API's 401, whose message quotes the key as the real API does (which is what the
recorder's scrubbing must remove). ``emulate=`` (``--emulate``) makes it refuse response
schemas the way OpenAI, vLLM, Ollama, llama.cpp's server or llama-cpp-python's server do
(see :data:`EMULATIONS`), so the JSON-mode fallback is tested over real HTTP.

``rpm_limit=N`` (``--rpm-limit N``) makes it enforce a rate limit the way the API does,
counted over every client: beyond N requests per minute (with ``rpm_burst`` requests, by
default one second's worth, allowed back to back) a chat request gets the API's 429 with
``retry-after``, ``retry-after-ms`` and ``x-ratelimit-*`` headers. ``tpm_limit=N``
(``--tpm-limit N``) does the same for tokens per minute, counting each request as the API
does: the prompt's estimated tokens plus its output bound (1,024 when it sets none), with
``tpm_burst`` tokens (default one second's worth) allowed back to back; every answer
under a limit carries the ``x-ratelimit-limit/remaining/reset-*`` headers. ``rate_limited``
counts the 429s, ``admitted`` holds the arrival time of every request let through and
``counted`` the tokens each took, so a test can show that a client-side limiter prevents
429s while using the whole limit. ``slots=N`` and ``latency=S`` make it answer like a model
server with N parallel sequences, each answer taking S seconds (``most_busy`` says how many
were generated at once).

Tiers: a request's ``service_tier`` is served as the OpenAI API serves it. ``flex`` answers
take ``flex_latency`` seconds (default ten times ``latency``) with room for ``flex_slots``
at once (its own capacity, apart from ``slots``); a flex request beyond that room is refused
at once with the API's 429 ``resource_unavailable`` (``flex_refused`` counts them), which is
not billed. ``priority`` answers take ``priority_latency`` (default half of ``latency``). The
answer's ``service_tier`` names the tier that served it (see
:class:`planrun.dev.testing.FakeOpenAI`'s ``tiers`` and ``reject_tiers``), and ``billed``
logs what each answer cost at it (``cost_usd`` sums them; ``--log-cost`` prints each).

The Batch API's endpoints are served by :class:`planrun.dev.testing.FakeBatchAPI`
(``batch_api=``, by default one over the same fake; ``server.batch_api``): ``POST /v1/files``
(the SDK's multipart upload), ``GET /v1/files/{id}`` and ``/v1/files/{id}/content`` (the
JSONL bytes, ``application/octet-stream``), ``POST /v1/batches``, ``GET /v1/batches`` (newest
first, ``limit``/``after`` pages), ``GET /v1/batches/{id}`` and ``POST
/v1/batches/{id}/cancel``. Their lines are answered by the same fake, so each body is the one
a live request gets. The Batch API has its own pool: ``rpm_limit``, ``tpm_limit``,
``malformed``, ``slots`` and ``latency`` apply to live chat requests only.
``--batch-complete-after S`` makes a batch take S seconds, its lines done steadily meanwhile
(a cancel keeps those done), and ``--batch-expire-after S`` expires an unfinished batch S
seconds after its creation (the lines not done are ``batch_expired`` in its error file).

    python tools/standin.py --scenario rate_limited      # serve until Ctrl-C
    python tools/standin.py --rpm-limit 600              # 429 beyond 600 requests/minute
    python tools/standin.py --tpm-limit 120000           # 429 beyond 120k tokens/minute
    python tools/standin.py --malformed 0.05             # 5 % of answers cut short
    python tools/standin.py --batch-complete-after 30    # batches take 30 s
    OPENAI_BASE_URL=http://127.0.0.1:PORT/v1 OPENAI_API_KEY=sk-anything planrun ...

    with StandIn(FakeOpenAI(answers())) as server:       # from Python
        Model(api_key="sk-...", base_url=server.base_url)
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import socket
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx2

from planrun.dev.scenarios import get_scenario
from planrun.dev.testing import (
    LATE_HEADER,
    ChatRequest,
    FakeBatchAPI,
    FakeOpenAI,
    error_body,
    json_object,
    prompt_tokens_of,
)
from planrun.examples.answers import answers
from planrun.model import FLEX_REFUSED_CODE, PriceTable

__all__ = ["EMULATIONS", "Billed", "StandIn", "eval_planner", "for_scenario", "main"]

CHAT_PATH = "/v1/chat/completions"
DROP = None
"""In ``raw``: close the connection instead of answering."""
Raw = tuple[int, dict[str, str], bytes] | None
_NO_RAW = object()
RESPONSES_PATH = "/v1/responses"
BATCH_PATHS = ("/v1/files", "/v1/batches")
"""Served by :class:`planrun.dev.testing.FakeBatchAPI`."""

_OPENAI_REJECTS = (
    "Invalid parameter: 'response_format' of type 'json_schema' is not supported with this "
    "model. Learn more about supported models at the Structured Outputs guide: "
    "https://platform.openai.com/docs/guides/structured-outputs"
)
_LLAMA_CPP_PYTHON_REJECTS = (
    "1 validation error:\n"
    "  {'type': 'literal_error', 'loc': ('body', 'response_format', 'type'), 'msg': "
    "\"Input should be 'text' or 'json_object'\", 'input': 'json_schema', 'ctx': "
    "{'expected': \"'text' or 'json_object'\"}}"
)
EMULATIONS: dict[str, str] = {
    "openai": "400 naming response_format for json_schema, and for response_format.schema",
    "vllm": "400 'The provided JSON schema contains features not supported by xgrammar.'",
    "ollama": "500 'invalid JSON schema in format'",
    "llama.cpp": "400 'Failed to initialize samplers: failed to parse grammar'",
    "llama-cpp-python": "500 pydantic literal_error on ('body', 'response_format', 'type')",
}
"""Servers whose refusal of a response schema the stand-in can imitate (``emulate=``)."""



STRICT_MARKER = "must be smaller than its own index"
"""A sentence of the shipped ``strict`` decomposition prompt (how the planner tells it)."""


def eval_planner(goal_file: str | Path) -> Any:
    """A synthetic planner for the eval goal sets: a plan answerer keyed by the goal.

    It finds the goal of the request in ``goal_file`` and answers with the goal's reference
    plan, changed by fixed rules so that two prompt versions measure differently: under the
    shipped prompt every second goal's first plan has a dependency on a later task (or on
    itself), repaired when asked; under the ``strict`` variant (which names the rule) every
    first plan validates. Under the shipped prompt the first plan of every fourth goal (index
    3 mod 4) also leaves out its last task, the one that delivers the result (contract
    problems, not shape problems), repaired when asked. Some final plans have one extra
    dependency (goal index 1 mod 3 under
    the shipped prompt, 2 mod 3 under ``strict``): the last task that waits for others
    also waits for the first task (a link the reference does not have, which keeps every
    contract), so the link F1 is not always 1.
    """
    goals = [json.loads(line) for line in Path(goal_file).read_text().splitlines() if line]

    def answer(req: Any) -> Any:
        prompt = req.messages[0]["content"] if req.messages else ""
        found = [i for i, g in enumerate(goals) if f"\n{g['goal']}\n" in prompt]
        if not found:
            return {"tasks": []}
        index = found[0]
        strict = STRICT_MARKER in prompt
        # The tasks only: the model is not asked for the goal (the plan keeps the user's).
        plan = {"tasks": copy.deepcopy(goals[index]["reference"]["tasks"])}
        tasks = plan["tasks"]
        if not strict and index % 2 == 0 and req.repairs == 0:
            tasks[0]["depends_on"] = [len(tasks) - 1]
            return plan
        if not strict and index % 4 == 3 and req.repairs == 0:
            del tasks[-1]
            return plan
        if index % 3 == (2 if strict else 1):
            needing = [t for t in tasks if t["depends_on"]]
            if needing and 0 not in needing[-1]["depends_on"]:
                needing[-1]["depends_on"] = [*needing[-1]["depends_on"], 0]
        return plan

    return answer


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
        emulate: str | None = None,
        raw: Iterable[Raw] = (),
        rpm_limit: float | None = None,
        rpm_burst: float | None = None,
        tpm_limit: float | None = None,
        tpm_burst: float | None = None,
        malformed: float = 0.0,
        slots: int | None = None,
        latency: float = 0.0,
        batch_api: FakeBatchAPI | None = None,
        flex_latency: float | None = None,
        flex_slots: int | None = None,
        priority_latency: float | None = None,
        log_cost: bool = False,
    ) -> None:
        if not 0.0 <= malformed < 1.0:
            raise ValueError(f"malformed must be a fraction in [0, 1), got {malformed!r}")
        if emulate is not None and emulate not in EMULATIONS:
            raise ValueError(f"emulate must be one of {sorted(EMULATIONS)}, got {emulate!r}")
        self.fake = fake
        self.batch_api = batch_api if batch_api is not None else FakeBatchAPI(fake)
        """The Batch API's endpoints (``/v1/files``, ``/v1/batches``): their lines are
        answered by ``fake``."""
        self.reject_keys = frozenset(reject_keys)
        self.extra_headers = dict(extra_headers or {})
        self.emulate = emulate
        self.raw: list[Raw] = list(raw)
        """Answers served first, as they are: ``(status, headers, body)``, or ``DROP`` to close
        the connection without answering (what a crashed proxy or server does)."""
        self.requests = 0
        self.connections = 0
        """TCP connections accepted: fewer than ``requests`` proves keep-alive reuse."""
        self.rejected = 0
        """Requests refused because of their response schema (``emulate``)."""
        self.rate = (_ServerRateLimit(rpm_limit, rpm_burst, tpm_limit, tpm_burst)
                     if rpm_limit or tpm_limit else None)
        self.rate_limited = 0
        """Chat requests answered 429 by ``rpm_limit`` or ``tpm_limit``."""
        self.admitted: list[float] = []
        """``time.monotonic()`` of every chat request let through under a limit."""
        self.limited_at: list[float] = []
        """``time.monotonic()`` of every chat request answered 429 under a limit."""
        self.counted: list[int] = []
        """The tokens each admitted request took from ``tpm_limit`` (:func:`counted_tokens`)."""
        self.malformed_every = round(1 / malformed) if malformed else 0
        """Every n-th answer of 200 is cut short (``malformed``: the fraction of them)."""
        self.malformed_sent = 0
        """Answers cut short: complete HTTP messages whose JSON body stops half-way."""
        self._answered = 0
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(slots) if slots else None
        self.latency = latency
        """Seconds each answer takes, spent holding one of ``slots`` (a model generating)."""
        self.busy = 0
        """Answers being generated now; ``most_busy`` is the most seen at once."""
        self.most_busy = 0
        self.flex_latency = 10 * latency if flex_latency is None else flex_latency
        self.priority_latency = latency / 2 if priority_latency is None else priority_latency
        self._flex = threading.BoundedSemaphore(flex_slots) if flex_slots else None
        self.flex_refused = 0
        """Flex requests refused for want of room (429 ``resource_unavailable``)."""
        self.flex_busy = 0
        """Flex answers being generated now; ``most_flex_busy`` the most seen at once."""
        self.most_flex_busy = 0
        self.billed: list[Billed] = []
        """What each answer cost, at the tier that served it."""
        self.log_cost = log_cost
        self._prices = PriceTable()
        self._server = _QuietServer((host, port), self._handler_class())
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
            if path.startswith(BATCH_PATHS):  # the Batch API's own pool: no rate limit
                response = self.batch_api(httpx2.Request(method, f"http://standin{path}",
                                                         headers=headers, content=body))
                return (response.status_code,
                        {k: v for k, v in response.headers.items()
                         if k.lower() != "content-length"}, response.content)
            if method != "POST" or path.split("?")[0] not in (CHAT_PATH, RESPONSES_PATH):
                return _error(404, f"Invalid URL ({method} {path})", None)
            rejection = self._rejection(body)
            if rejection is not None:
                self.rejected += 1
                return rejection
            limit_headers: dict[str, str] = {}
            if self.rate is not None:
                now = time.monotonic()
                cost = counted_tokens(json_object(body))
                wait, unit, limit_headers = self.rate.take(now, cost)
                if wait > 0:
                    self.rate_limited += 1
                    self.limited_at.append(now)
                    bucket = self.rate.requests if unit == "requests" else self.rate.tokens
                    assert bucket is not None
                    status, headers, content = _error(
                        429, f"Rate limit reached for {unit} on this stand-in: limit "
                        f"{bucket.per_minute:g} per minute. Please try again in "
                        f"{wait * 1000:.0f}ms.", "rate_limit_exceeded")
                    return status, {**headers, **limit_headers,
                                    "retry-after": str(max(1, math.ceil(wait))),
                                    "retry-after-ms": f"{wait * 1000:.0f}"}, content
                self.admitted.append(now)
                self.counted.append(cost)
            request = httpx2.Request(method, f"http://standin{path}", headers=headers,
                                     content=body)
            response = self.fake(request)
            out = {k: v for k, v in response.headers.items()
                   if k.lower() not in ("content-length", "content-type")}
            content = response.content
            if response.status_code == 200:
                self._bill(content)
            if response.status_code == 200 and self.malformed_every:
                self._answered += 1
                if self._answered % self.malformed_every == 0:
                    self.malformed_sent += 1  # cut somewhere in its second to fourth fifth
                    cut = (self._answered * 7919) % (len(content) * 3 // 5) + len(content) // 5
                    content = content[:cut]
            return (response.status_code, {**out, **limit_headers, **self.extra_headers},
                    content)

    @property
    def cost_usd(self) -> float:
        """What every answer cost, summed."""
        with self._lock:
            return sum(b.cost_usd for b in self.billed)

    @contextmanager
    def slot(self, tier: str | None = None) -> Iterator[bool]:
        """Hold one of ``slots`` (waiting for one) for ``latency`` seconds, as a server with
        that many parallel sequences generates; without ``slots``, no wait beyond latency.
        At ``tier`` ``flex``: one of ``flex_slots`` for ``flex_latency`` (False, at once,
        when none is free: the request is refused); ``priority``: ``priority_latency``."""
        if tier in self.fake.reject_tiers:
            yield True  # answered at once: the fake refuses it
            return
        if tier == "flex":
            with self._flex_slot() as free:
                yield free
            return
        if self._slots is not None:
            self._slots.acquire()
        with self._lock:
            self.busy += 1
            self.most_busy = max(self.most_busy, self.busy)
        try:
            latency = self.priority_latency if tier == "priority" else self.latency
            if latency:
                time.sleep(latency)
            yield True
        finally:
            with self._lock:
                self.busy -= 1
            if self._slots is not None:
                self._slots.release()

    @contextmanager
    def _flex_slot(self) -> Iterator[bool]:
        if self._flex is not None and not self._flex.acquire(blocking=False):
            with self._lock:
                self.flex_refused += 1
            yield False
            return
        with self._lock:
            self.flex_busy += 1
            self.most_flex_busy = max(self.most_flex_busy, self.flex_busy)
        try:
            if self.flex_latency:
                time.sleep(self.flex_latency)
            yield True
        finally:
            with self._lock:
                self.flex_busy -= 1
            if self._flex is not None:
                self._flex.release()

    def _bill(self, content: bytes) -> None:
        """Log what one answer (a chat completion or a response) cost (under the lock)."""
        try:
            answer = json.loads(content)
        except json.JSONDecodeError:
            return
        usage = answer.get("usage") or {}
        prompt = usage.get("prompt_tokens", usage.get("input_tokens", 0))
        details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
        cached = details.get("cached_tokens") or 0
        output = usage.get("completion_tokens", usage.get("output_tokens", 0))
        tier = str(answer.get("service_tier") or "default")
        model = str(answer.get("model") or "")
        cost = self._prices.cost(model, prompt, cached, output, tier=tier) or 0.0
        self.billed.append(Billed(tier, model, prompt, cached, output, cost))
        if self.log_cost:
            print(f"answer at {tier}: {prompt} prompt ({cached} cached) + {output} output "
                  f"tokens = ${cost:.6f}", flush=True)

    def _take_raw(self) -> Raw | object:
        with self._lock:
            if not self.raw:
                return _NO_RAW
            self.requests += 1
            return self.raw.pop(0)

    def _rejection(self, body: bytes) -> tuple[int, dict[str, str], bytes] | None:
        """The emulated server's refusal of this request's response schema, if it refuses."""
        if self.emulate is None:
            return None
        try:
            fmt = ChatRequest(json.loads(body or b"{}")).format
        except json.JSONDecodeError:
            return None
        strict = fmt.get("type") == "json_schema"
        schema_in_json_mode = fmt.get("type") == "json_object" and "schema" in fmt
        if self.emulate == "openai" and strict:
            return _error(400, _OPENAI_REJECTS, None, param="response_format")
        if self.emulate == "openai" and schema_in_json_mode:
            return _error(400, "Unknown parameter: 'response_format.schema'.",
                          "unknown_parameter", param="response_format.schema")
        if not strict:
            return None
        if self.emulate == "vllm":
            return _error(400, "The provided JSON schema contains features not supported by "
                          "xgrammar.", None, type="BadRequestError")
        if self.emulate == "ollama":
            return _error(500, "invalid JSON schema in format", None, type="api_error")
        if self.emulate == "llama.cpp":
            return _error(400, "Failed to initialize samplers: failed to parse grammar", None)
        return _error(500, _LLAMA_CPP_PYTHON_REJECTS, None, type="internal_server_error")

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body are separate small writes

            def setup(self) -> None:
                super().setup()
                with server._lock:
                    server.connections += 1

            def _serve(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = {k.lower(): v for k, v in self.headers.items()}
                raw = server._take_raw()
                if raw is DROP:
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if isinstance(raw, tuple):
                    status, extra, content = raw
                elif self.path.startswith(BATCH_PATHS):  # no model slot: its own pool
                    status, extra, content = server.answer(self.command, self.path, headers,
                                                           body)
                    late = extra.pop(LATE_HEADER, None)
                    if late:
                        time.sleep(float(late))  # outside the lock: others are answered
                else:
                    with server.slot(_asked_tier(body)) as admitted:
                        if admitted:
                            status, extra, content = server.answer(self.command, self.path,
                                                                   headers, body)
                        else:
                            status, extra, content = _flex_refusal()
                # JSON unless the answer says otherwise (a file's content: its bytes)
                extra = {"content-type": "application/json", **extra}
                self.send_response(status)
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


@dataclass(frozen=True)
class Billed:
    """What one answer cost, at the tier that served it."""

    tier: str
    model: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    cost_usd: float


def _asked_tier(body: bytes) -> str | None:
    """The ``service_tier`` a request asks for (None: none, or no JSON body)."""
    if b"service_tier" not in body:
        return None
    try:
        asked = json.loads(body).get("service_tier")
    except (json.JSONDecodeError, AttributeError):
        return None
    return str(asked) if asked else None


def _flex_refusal() -> tuple[int, dict[str, str], bytes]:
    """The API's answer to a flex request when flex has no room: 429, not billed."""
    return _error(429, "Resource unavailable: flex processing has no capacity for this "
                  "request now. Retry later, or send it at the default tier.",
                  FLEX_REFUSED_CODE)


DEFAULT_BOUND = 1024
"""The output tokens the stand-in counts for a request that sets no bound."""


def counted_tokens(body: Mapping[str, Any]) -> int:
    """Tokens a request takes from the token limit, counted the way the API counts them:
    the prompt's estimated tokens (the stand-in's own estimate, the one its replies report
    as ``prompt_tokens``) plus the request's output bound (:data:`DEFAULT_BOUND` when it
    sets none), whatever the reply will use."""
    prompt = prompt_tokens_of(ChatRequest(body))
    bound = (body.get("max_completion_tokens") or body.get("max_tokens")
             or body.get("max_output_tokens") or DEFAULT_BOUND)
    return prompt + int(bound)


class _Bucket:
    """One limit as a GCRA: the time the bucket is full again."""

    def __init__(self, per_minute: float, capacity: float) -> None:
        self.per_minute = per_minute
        self.rate = per_minute / 60
        self.capacity = capacity
        self.full_at = float("-inf")

    def wait(self, now: float, cost: float) -> float:
        return max(0.0, self.full_at - (self.capacity - min(cost, self.capacity)) / self.rate
                   - now)

    def take(self, now: float, cost: float) -> None:
        self.full_at = max(self.full_at, now) + cost / self.rate

    def headers(self, unit: str, now: float) -> dict[str, str]:
        behind = max(0.0, self.full_at - now)
        return {
            f"x-ratelimit-limit-{unit}": f"{self.per_minute:g}",
            f"x-ratelimit-remaining-{unit}": str(max(0, math.floor(
                self.capacity - behind * self.rate))),
            f"x-ratelimit-reset-{unit}": f"{behind * 1000:.0f}ms",
        }


class _ServerRateLimit:
    """The server side of the rate limits, over every client: requests per minute (a
    request each) and tokens per minute (:func:`counted_tokens` each), each a GCRA."""

    def __init__(self, rpm: float | None, burst: float | None, tpm: float | None = None,
                 token_burst: float | None = None) -> None:
        self.requests = None if rpm is None else _Bucket(
            rpm, max(1.0, burst if burst is not None else rpm / 60))
        self.tokens = None if tpm is None else _Bucket(
            tpm, max(1.0, token_burst if token_burst is not None else tpm / 60))

    def take(self, now: float, tokens: float) -> tuple[float, str, dict[str, str]]:
        """``(0, "", headers)`` when a request may pass now (and it is counted), else
        ``(wait, which limit, headers)``."""
        waits = [(b.wait(now, cost), unit) for b, cost, unit in (
            (self.requests, 1.0, "requests"), (self.tokens, tokens, "tokens")) if b]
        wait, unit = max(waits)
        if wait <= 0:
            for bucket, cost in ((self.requests, 1.0), (self.tokens, tokens)):
                if bucket is not None:
                    bucket.take(now, cost)
        headers: dict[str, str] = {}
        for bucket, name in ((self.requests, "requests"), (self.tokens, "tokens")):
            if bucket is not None:
                headers.update(bucket.headers(name, now))
        return (wait, unit, headers) if wait > 0 else (0.0, "", headers)


class _QuietServer(ThreadingHTTPServer):
    """A client dropping its keep-alive connection is normal, not a traceback on stderr."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        error = sys.exc_info()[1]
        if not isinstance(error, ConnectionError | TimeoutError):
            super().handle_error(request, client_address)


def _error(status: int, message: str, code: str | None, *, param: str | None = None,
           type: str | None = None) -> tuple[int, dict[str, str], bytes]:
    body = json.dumps(error_body(status, message, code=code, param=param, type=type)).encode()
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
    parser.add_argument("--emulate", choices=sorted(EMULATIONS),
                        help="refuse response schemas the way this server does")
    parser.add_argument("--rpm-limit", type=float, metavar="N",
                        help="answer 429 beyond N requests per minute, over all clients")
    parser.add_argument("--tpm-limit", type=float, metavar="N",
                        help="answer 429 beyond N tokens per minute (prompt estimate plus "
                        "output bound), over all clients")
    parser.add_argument("--malformed", type=float, default=0.0, metavar="F",
                        help="cut this fraction of answers short (their JSON stops half-way)")
    parser.add_argument("--batch-complete-after", type=float, default=0.0, metavar="S",
                        help="a batch completes S seconds after it is created, its lines "
                        "steadily meanwhile (default: at once)")
    parser.add_argument("--batch-expire-after", type=float, metavar="S",
                        help="an unfinished batch expires S seconds after it is created")
    parser.add_argument("--latency", type=float, default=0.0, metavar="S",
                        help="seconds a default-tier answer takes")
    parser.add_argument("--flex-latency", type=float, metavar="S",
                        help="seconds a flex answer takes (default ten times --latency)")
    parser.add_argument("--flex-slots", type=int, metavar="N",
                        help="flex answers generated at once; a flex request beyond them is "
                        "refused (429 resource_unavailable)")
    parser.add_argument("--priority-latency", type=float, metavar="S",
                        help="seconds a priority answer takes (default half of --latency)")
    parser.add_argument("--log-cost", action="store_true",
                        help="print what each answer cost, at the tier that served it")
    args = parser.parse_args(argv)
    for flag, value in (("--rpm-limit", args.rpm_limit), ("--tpm-limit", args.tpm_limit)):
        if value is not None and not value > 0:
            parser.error(f"{flag} must be > 0, got {value}")
    if not 0.0 <= args.malformed < 1.0:
        parser.error(f"--malformed must be a fraction in [0, 1), got {args.malformed}")
    for flag, value in (("--batch-complete-after", args.batch_complete_after),
                        ("--batch-expire-after", args.batch_expire_after)):
        if value is not None and value < 0:
            parser.error(f"{flag} must be >= 0 seconds, got {value}")
    for flag, value in (("--latency", args.latency), ("--flex-latency", args.flex_latency),
                        ("--priority-latency", args.priority_latency)):
        if value is not None and value < 0:
            parser.error(f"{flag} must be >= 0 seconds, got {value}")
    if args.flex_slots is not None and args.flex_slots < 1:
        parser.error(f"--flex-slots must be >= 1, got {args.flex_slots}")
    server = for_scenario(args.scenario, port=args.port, emulate=args.emulate,
                          rpm_limit=args.rpm_limit, tpm_limit=args.tpm_limit,
                          malformed=args.malformed, latency=args.latency,
                          flex_latency=args.flex_latency, flex_slots=args.flex_slots,
                          priority_latency=args.priority_latency, log_cost=args.log_cost)
    server.batch_api = FakeBatchAPI(server.fake, complete_after=args.batch_complete_after,
                                    progress=True, expire_after=args.batch_expire_after)
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
