"""Cassettes: record model HTTP traffic once, replay it in CI, fail loudly on a miss.

A cassette is one JSON file per scenario (``fixtures/<name>.json``), written with
``indent=2`` and sorted keys so a re-recording reads well in a diff::

    {"about": {"made": "synthesized", "note": "...", "date": "2025-11-30", "model": ...,
               "base_url": ..., "openai": "3.x", "planrun": "0.1.0", "scenario": "tickets",
               "command": "python tools/make_fixtures.py tickets"},
     "interactions": [{"request": {"method": "POST", "path": "/v1/chat/completions",
                                   "prompt": {"name": "classify_ticket", "hash": "1a2b..."},
                                   "body": {...}},
                       "response": {"status": 200, "headers": {"x-request-id": ...},
                                    "body": {...}}}, ...]}

* :func:`record` runs the real client against the real endpoint: it wraps
  ``httpx2.AsyncHTTPTransport.handle_async_request`` (the transport the ``openai`` SDK
  sends through), so every request really goes out and its response is copied on the way
  back. On a clean exit the cassette is written. Secrets never reach the file: request
  headers are not stored at all (only the ``X-Planrun-Prompt`` name and hash that
  :meth:`planrun.model.Model.complete` sends); response headers are reduced to
  ``retry-after``, ``retry-after-ms``, ``x-ratelimit-*`` and ``x-request-id``; and every
  string is scrubbed of the bearer token, organisation and project ids seen in the
  requests and of anything shaped like an OpenAI key (``sk-***``).
Chat Completions (``/v1/chat/completions``) and the Responses API (``/v1/responses``) are
recorded and replayed alike; a request's schema name and messages are read from either
shape (``response_format``/``messages`` or ``text.format``/``input``). So is the Batch
API's traffic: a file upload (``multipart/form-data``, whose boundary the SDK draws at
random) is kept as its fields, ``{"multipart": {"purpose": "batch", "file": {"filename",
"content"}}}``, and matched on them; a file's content (not JSON: JSONL bytes) is kept as
its ``text`` with its ``content-type`` and served back byte for byte; the polls of one
batch (identical requests) are served in the order they were recorded.

* :func:`replay` serves a cassette through httpx2's own ``MockTransport``, put in place of
  the transport of every httpx2 client (the HTTP stack the ``openai`` SDK sends through)
  for the block: nothing reaches the network, and no test library is needed. A request
  matches a recording by method, path and canonical body (sorted keys); identical requests
  are served in recorded order (a queue per key), so concurrency may reorder different
  requests freely. A request with no recording raises :class:`FixtureMiss` at once, naming
  the closest recording and what differs (the prompt template whose render changed, the
  first differing message as a diff, the response schema, a parameter) and the command that
  re-records the cassette. The ``openai`` SDK wraps transport exceptions into
  ``APIConnectionError``; :class:`~planrun.model.Model` recognises a planrun error inside
  it and re-raises it unchanged, so a miss is never retried as a connection problem. A miss
  swallowed further up (a worker's task dies of it) is raised again when the ``with
  replay(...)`` block exits.
* :func:`check` finds stale cassettes by running each cassette's scenario
  (:mod:`planrun.dev.scenarios`) against it in *check* mode: the current code renders its
  prompts and schemas and sends its requests; each request with no exact recording is
  reported (:class:`Stale`, with the reason a miss would give) and answered with the
  closest recording so the run goes on and later requests are checked too; recordings the
  run never asks for are reported as well. That detects an edited template, a changed
  result schema, a changed model or parameter, and a changed plan alike, because each of
  them changes the request body.
"""

from __future__ import annotations

import asyncio
import difflib
import importlib.metadata
import json
import logging
import os
import re
import threading
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from unittest import mock
from urllib.parse import urlsplit

import httpx2

from planrun.core import PlanrunError, UsageError
from planrun.dev._batch_api import multipart_fields

if TYPE_CHECKING:
    from planrun.model import Model

__all__ = [
    "FORMAT",
    "SYNTHESIZED_NOTE",
    "Cassette",
    "CassetteStats",
    "FixtureMiss",
    "Interaction",
    "Played",
    "PromptRef",
    "RecordedRequest",
    "RecordedResponse",
    "Recorder",
    "Stale",
    "answered_by",
    "canonical_json",
    "check",
    "explain",
    "record",
    "replay",
    "scrub",
]

log = logging.getLogger("planrun.fixtures")

FORMAT = 1
"""Version of the cassette layout."""

TEST_MODEL = "test"
"""The model name of :class:`planrun.testing.TestModel`."""
TEST_MODEL_NOTE = (
    "Recorded from planrun's test model (planrun.testing.TestModel, --model test): answers "
    "made from the app's kinds and schemas, not by a language model."
)
SYNTHESIZED_NOTE = (
    "Produced by planrun's own recorder (planrun.testing.record) running the real client "
    "against the local stand-in server (tools/standin.py, synthetic answers from "
    "planrun.examples.answers), not against the OpenAI API."
)
"""The ``note`` of a synthesized cassette."""

REPLAY_BASE_URL = "http://replay.planrun.invalid/v1"
"""Where :meth:`Cassette.model` points: a name that never resolves, should replay be off."""

REPLAY_KEY = "replay-no-key"
"""The placeholder API key of :meth:`Cassette.model`."""

PROMPT_HEADER = "x-planrun-prompt"

_KEY_SHAPE = re.compile(r"\bsk-[A-Za-z0-9_\-]{8,}")
_SECRET_HEADERS = ("authorization", "openai-organization", "openai-project", "cookie")
_KEPT_HEADER = re.compile(r"^(retry-after|retry-after-ms|x-ratelimit-.*|x-request-id)$")
_DIFF_LINES = 14
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


# ---------------------------------------------------------------------------------------------
# Canonical form and scrubbing
# ---------------------------------------------------------------------------------------------


def canonical_json(value: Any) -> str:
    """The one text of a JSON value used for matching: sorted keys, no spaces, UTF-8."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def scrub(value: Any, secrets: Iterable[str] = ()) -> Any:
    """``value`` with every secret replaced by ``***`` and every ``sk-…`` key by ``sk-***``.

    Walks dicts and lists; keys and string values are both scrubbed.
    """
    known = sorted({s for s in secrets if s and len(s) >= 6}, key=len, reverse=True)

    def text(s: str) -> str:
        for secret in known:
            s = s.replace(secret, "***")
        return _KEY_SHAPE.sub("sk-***", s)

    def walk(node: Any) -> Any:
        if isinstance(node, str):
            return text(node)
        if isinstance(node, Mapping):
            return {text(str(k)): walk(v) for k, v in node.items()}
        if isinstance(node, list | tuple):
            return [walk(v) for v in node]
        return node

    return walk(value)


def _secrets_of(headers: Mapping[str, str]) -> list[str]:
    """Values of the secret-bearing request headers (the bearer token without ``Bearer``)."""
    found = []
    for name in _SECRET_HEADERS:
        value = headers.get(name)
        if value:
            found.append(value)
            if value.lower().startswith("bearer "):
                found.append(value[7:].strip())
    return found


def _parse_body(content: bytes) -> tuple[Any, bool]:
    """The JSON value of a body and True, or its text and False. A multipart form (a file
    upload) is read as JSON too: ``{"multipart": {name: text or {"filename", "content"}}}``,
    so its random boundary is not part of what a replay matches."""
    if not content:
        return None, True
    try:
        return json.loads(content), True
    except (UnicodeDecodeError, json.JSONDecodeError):
        fields = multipart_fields(content)
        if fields:
            return {"multipart": {
                name: {"filename": value[0], "content": value[1].decode("utf-8", "replace")}
                if isinstance(value, tuple) else value for name, value in fields.items()}}, True
        return content.decode("utf-8", errors="replace"), False


def _is_json_type(content_type: str) -> bool:
    """True for a JSON response (or one that names no type): its body is kept as JSON. A
    file's content (``application/octet-stream``, JSONL) is kept as its text."""
    kind = content_type.split(";")[0].strip().lower()
    return not kind or (kind.endswith("json") and not kind.endswith(("jsonl", "ndjson")))


# ---------------------------------------------------------------------------------------------
# Records
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PromptRef:
    """The prompt template a request was rendered from, and the hash of its rendering."""

    name: str
    hash: str

    @classmethod
    def from_header(cls, value: str | None) -> PromptRef | None:
        """Parse ``X-Planrun-Prompt: <name>:<hash>``."""
        if not value or ":" not in value:
            return None
        name, _, digest = value.rpartition(":")
        return cls(name, digest)

    def __str__(self) -> str:
        return f"{self.name or '?'}:{self.hash}"


@dataclass(frozen=True)
class RecordedRequest:
    """A request as a cassette keeps it: what matching looks at, plus the prompt reference."""

    method: str
    path: str
    body: Any
    """The JSON body (scrubbed), or its text when it is not JSON."""
    prompt: PromptRef | None = None
    """Not matched on; explains a miss."""

    @property
    def key(self) -> tuple[str, str, str]:
        """Method, path and canonical body: what a replayed request must equal."""
        return self.method, self.path, canonical_json(self.body)

    @property
    def format(self) -> Any:
        """The requested output format: ``response_format``, or ``text.format`` (Responses)."""
        return _format_of(self.body)

    @property
    def schema_name(self) -> str | None:
        """The response schema's name, if the request has one (either API)."""
        return _schema_name_of(self.format)

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The chat messages (Chat Completions ``messages``, Responses ``input``)."""
        body = self.body if isinstance(self.body, dict) else {}
        messages = body.get("messages", body.get("input"))
        if isinstance(messages, str):
            return [{"role": "user", "content": messages}]
        return [m for m in messages or [] if isinstance(m, dict)]

    def describe(self) -> str:
        """One line: method, path, prompt and schema."""
        parts = [f"{self.method} {self.path}"]
        if self.prompt is not None:
            parts.append(f"prompt {self.prompt}")
        if self.schema_name:
            parts.append(f"schema {self.schema_name}")
        return ", ".join(parts)

    @classmethod
    def from_http(
        cls,
        method: str,
        path: str,
        content: bytes,
        prompt_header: str | None,
        secrets: Iterable[str] = (),
    ) -> RecordedRequest:
        """Build from the wire: the body parsed (JSON when it is) and scrubbed."""
        body, _ = _parse_body(content)
        return cls(method.upper(), path, scrub(body, secrets), PromptRef.from_header(prompt_header))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        out: dict[str, Any] = {"method": self.method, "path": self.path, "body": self.body}
        if self.prompt is not None:
            out["prompt"] = {"name": self.prompt.name, "hash": self.prompt.hash}
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RecordedRequest:
        """Inverse of :meth:`to_dict`."""
        prompt = data.get("prompt")
        ref = PromptRef(str(prompt["name"]), str(prompt["hash"])) if prompt else None
        return cls(str(data["method"]), str(data["path"]), data.get("body"), ref)


@dataclass(frozen=True)
class RecordedResponse:
    """A response as a cassette keeps it: status, the headers that matter, the body."""

    status: int
    headers: Mapping[str, str] = field(default_factory=dict)
    body: Any = None
    """The JSON body; None when the body was not JSON (see ``text``)."""
    text: str | None = None
    """The body's text when it was not JSON."""

    @classmethod
    def from_http(
        cls, status: int, headers: Mapping[str, str], content: bytes, secrets: Iterable[str] = ()
    ) -> RecordedResponse:
        """Build from the wire: headers reduced to those that matter, everything scrubbed."""
        secrets = list(secrets)
        kept = {k.lower(): v for k, v in headers.items() if _KEPT_HEADER.match(k.lower())}
        kind = next((v for k, v in headers.items() if k.lower() == "content-type"), "")
        if _is_json_type(kind):
            body, is_json = _parse_body(content)
        else:  # a file's content (JSONL): kept as its text, its type with it, byte for byte
            body, is_json = content.decode("utf-8", errors="replace"), False
            kept["content-type"] = kind
        return cls(
            status,
            scrub(dict(sorted(kept.items())), secrets),
            scrub(body, secrets) if is_json else None,
            None if is_json else scrub(body, secrets),
        )

    def to_httpx(self) -> httpx2.Response:
        """The response a replay serves (a text body: its bytes as they were received)."""
        if self.text is not None:
            headers = {"content-type": "text/plain; charset=utf-8", **self.headers}
            return httpx2.Response(self.status, headers=headers,
                                   content=self.text.encode("utf-8"))
        return httpx2.Response(self.status, headers=dict(self.headers), json=self.body)

    @property
    def usage(self) -> Mapping[str, Any]:
        """The body's ``usage`` block (empty when there is none)."""
        usage = self.body.get("usage") if isinstance(self.body, dict) else None
        return usage if isinstance(usage, Mapping) else {}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        out: dict[str, Any] = {"status": self.status, "headers": dict(self.headers)}
        if self.text is not None:
            out["text"] = self.text
        else:
            out["body"] = self.body
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RecordedResponse:
        """Inverse of :meth:`to_dict`."""
        return cls(
            int(data["status"]),
            {str(k): str(v) for k, v in (data.get("headers") or {}).items()},
            data.get("body"),
            data.get("text"),
        )


@dataclass(frozen=True)
class Interaction:
    """One request and the response it got."""

    request: RecordedRequest
    response: RecordedResponse

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"request": self.request.to_dict(), "response": self.response.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Interaction:
        """Inverse of :meth:`to_dict`."""
        return cls(
            RecordedRequest.from_dict(data["request"]), RecordedResponse.from_dict(data["response"])
        )


@dataclass(frozen=True)
class Played:
    """One request served during a replay: the interaction and the loop time it was asked."""

    index: int
    at: float
    exact: bool = True
    """False when check mode answered a request with no recording with the closest one."""


@dataclass(frozen=True)
class CassetteStats:
    """How a replay went."""

    interactions: int
    played: int
    """Requests answered from the cassette."""
    missed: int
    """Requests with no recording."""
    unused: int
    """Interactions never played."""


@dataclass(frozen=True)
class Stale:
    """One way a cassette no longer matches the code (see :func:`check`)."""

    path: str
    index: int | None
    """The interaction concerned (the closest one, for a changed request), if any."""
    kind: Literal["changed", "unplayed", "failed", "unchecked"]
    reason: str

    def __str__(self) -> str:
        where = f" #{self.index}" if self.index is not None else ""
        return f"{self.path}{where}: {self.kind}: {self.reason}"


class FixtureMiss(PlanrunError):
    """A replayed request has no recording in the cassette; the message says what differs."""

    def __init__(
        self,
        message: str,
        *,
        cassette: str,
        request: RecordedRequest,
        closest: int | None,
        reasons: Sequence[str],
        command: str | None,
    ) -> None:
        super().__init__(message)
        self.cassette = cassette
        self.request = request
        self.closest = closest
        """Index of the closest recorded interaction, or None when nothing is alike."""
        self.reasons = list(reasons)
        """What differs from the closest recording, one sentence each."""
        self.command = command
        """The command that re-records the cassette, when the cassette names one."""


# ---------------------------------------------------------------------------------------------
# The cassette
# ---------------------------------------------------------------------------------------------


class Cassette:
    """Recorded interactions and what is known about how they were made.

    Load one with :meth:`load`; during :func:`replay` it serves requests (``serve`` is the
    handler of the replay's transport) and keeps count: :attr:`log`, :attr:`misses`, :meth:`unused`,
    :attr:`stats`.
    """

    def __init__(
        self,
        interactions: Sequence[Interaction] = (),
        about: Mapping[str, Any] | None = None,
        *,
        path: str | os.PathLike[str] | None = None,
    ) -> None:
        self.interactions: list[Interaction] = list(interactions)
        self.about: dict[str, Any] = dict(about or {})
        self.path = Path(path) if path is not None else None
        self.log: list[Played] = []
        """Every request served, in the order asked."""
        self.misses: list[FixtureMiss] = []
        """Every request that had no recording."""
        self.stale: list[Stale] = []
        """Check mode: requests answered with the closest recording instead of their own."""
        self.checking = False
        self._lock = threading.Lock()
        self._queues: dict[tuple[str, str, str], deque[int]] = {}
        self._counts: Counter[tuple[str, str, str]] = Counter()
        self._lines: dict[int, frozenset[str]] = {}
        self.rewind()

    # -- files

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Cassette:
        """Read a cassette file, or a shipped cassette by name (``"brief"``, ``"examples"``;
        see :func:`shipped_cassette`)."""
        file = Path(path)
        if not file.exists() and isinstance(path, str) and _is_name(path):
            file = shipped_cassette(path)
        try:
            document = json.loads(file.read_text(encoding="utf-8"))
        except OSError as exc:
            raise UsageError(f"cannot read cassette {str(file)!r}: {exc.strerror or exc}") from exc
        except UnicodeDecodeError as exc:
            raise UsageError(
                f"cassette {str(file)!r} is not UTF-8 text ({exc.reason} at byte {exc.start})"
            ) from exc
        except ValueError as exc:  # not JSON, or a number no JSON reader takes
            raise UsageError(f"cassette {str(file)!r} is not valid JSON: {exc}") from exc
        except RecursionError as exc:
            raise UsageError(f"cassette {str(file)!r} is nested too deeply") from exc
        if not isinstance(document, dict) or not isinstance(document.get("interactions"), list):
            raise UsageError(f"cassette {str(file)!r} has no 'interactions' list")
        try:
            interactions = [Interaction.from_dict(item) for item in document["interactions"]]
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise UsageError(
                f"cassette {str(file)!r} holds a malformed interaction "
                f"({type(exc).__name__}: {exc})"
            ) from exc
        return cls(interactions, document.get("about"), path=file)

    def to_document(self) -> dict[str, Any]:
        """The file's content as JSON-ready data."""
        return {
            "about": dict(self.about),
            "interactions": [i.to_dict() for i in self.interactions],
        }

    def dumps(self) -> str:
        """The file's text: ``indent=2``, sorted keys, a final newline."""
        return json.dumps(self.to_document(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"

    def save(self, path: str | os.PathLike[str] | None = None) -> Path:
        """Write the cassette (atomically) to ``path`` or where it was loaded from."""
        target = Path(path) if path is not None else self.path
        if target is None:
            raise UsageError("Cassette.save() needs a path")
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.partial")
        partial.write_text(self.dumps(), encoding="utf-8")
        partial.replace(target)
        self.path = target
        return target

    @property
    def name(self) -> str:
        """The file name, or ``<cassette>`` when it has none."""
        return self.path.name if self.path is not None else "<cassette>"

    @property
    def command(self) -> str | None:
        """The command that re-records this cassette, when it was stored."""
        command = self.about.get("command")
        return str(command) if command else None

    def model(self, name: str | None = None, **options: Any) -> Model:
        """A :class:`~planrun.model.Model` for replaying this cassette.

        It asks for ``name`` or else the recorded model name (the request bodies hold it, so
        another name misses), with a placeholder key and an address that never resolves:
        only a replay can ever answer it. A cassette recorded with ``compat`` (its requests
        carry ``max_tokens``, as for a llama.cpp server) is replayed with it, and one recorded
        in JSON mode from the start (``structured="json_object"``) is replayed in it.
        """
        from planrun.model import Model

        options.setdefault("api_key", REPLAY_KEY)
        options.setdefault("base_url", REPLAY_BASE_URL)
        bodies = [i.request.body for i in self.interactions if isinstance(i.request.body, dict)]
        options.setdefault("compat", any("max_tokens" in body for body in bodies))
        formats = {(body.get("response_format") or {}).get("type") for body in bodies}
        if "json_object" in formats and "json_schema" not in formats:
            # Recorded in JSON mode from the start (a server that refuses json_schema).
            options.setdefault("structured", "json_object")
        recorded = self.about.get("model") or self._first_model()
        return Model(name or str(recorded or "gpt-4o-mini"), **options)

    def _first_model(self) -> str | None:
        """The model the first request asked for (a cassette whose ``about`` names none)."""
        for i in self.interactions:
            if isinstance(i.request.body, dict) and i.request.body.get("model"):
                return str(i.request.body["model"])
        return None

    # -- replay state

    def rewind(self) -> None:
        """Forget what was played: every interaction can be served again."""
        with self._lock:
            self._queues = {}
            for index, interaction in enumerate(self.interactions):
                self._queues.setdefault(interaction.request.key, deque()).append(index)
            self._counts = Counter(i.request.key for i in self.interactions)
            self.log, self.misses, self.stale = [], [], []

    def unused(self) -> list[Interaction]:
        """The interactions never played, in file order."""
        played = {p.index for p in self.log}
        return [i for n, i in enumerate(self.interactions) if n not in played]

    def unused_indices(self) -> list[int]:
        """Indices of :meth:`unused`."""
        played = {p.index for p in self.log}
        return [n for n in range(len(self.interactions)) if n not in played]

    @property
    def stats(self) -> CassetteStats:
        """Counts of played, missed and unused interactions."""
        return CassetteStats(
            len(self.interactions),
            len(self.log),
            len(self.misses),
            len(self.unused_indices()),
        )

    def serve(self, request: httpx2.Request) -> httpx2.Response:
        """Answer ``request`` from the cassette (the handler of the replay's transport).

        Raises :class:`FixtureMiss` when nothing matches (in check mode: answers with the
        closest recording and notes a :class:`Stale` instead).
        """
        live = RecordedRequest.from_http(
            request.method,
            _path(request.url.path, request.url.query),
            request.content,
            request.headers.get(PROMPT_HEADER),
            _secrets_of(request.headers),
        )
        with self._lock:
            queue = self._queues.get(live.key)
            if queue:
                index = queue.popleft()
                self.log.append(Played(index, _now()))
                return self.interactions[index].response.to_httpx()
            miss = self._miss(live)
            self.misses.append(miss)
            if not self.checking or miss.closest is None:
                raise miss
            return self._serve_closest(live, miss)

    def _serve_closest(self, live: RecordedRequest, miss: FixtureMiss) -> httpx2.Response:
        assert miss.closest is not None
        closest = self.interactions[miss.closest]
        queue = self._queues.get(closest.request.key)
        index = queue.popleft() if queue else miss.closest
        self.log.append(Played(index, _now(), exact=False))
        path = str(self.path) if self.path is not None else self.name
        self.stale.append(Stale(path, index, "changed", "; ".join(miss.reasons)))
        return self.interactions[index].response.to_httpx()

    # -- explaining a miss

    def _miss(self, live: RecordedRequest) -> FixtureMiss:
        recorded = self._counts.get(live.key, 0)
        if recorded:
            last = max(p.index for p in self.log
                       if self.interactions[p.index].request.key == live.key)
            reasons = [
                f"this exact request was recorded {recorded} time(s) and every recording has "
                f"been played; the code now sends it once more (an extra retry or a repeat)"
            ]
            return self._miss_error(live, last, reasons)
        index = self._closest(live)
        if index is None:
            reasons = [f"the cassette holds no {live.method} {live.path} request at all"]
        else:
            reasons = explain(self.interactions[index].request, live)
        return self._miss_error(live, index, reasons)

    def _miss_error(
        self, live: RecordedRequest, index: int | None, reasons: Sequence[str]
    ) -> FixtureMiss:
        command = self.command
        lines = [
            f"no recording in {self.name} for this request ({reasons[0].splitlines()[0]}); "
            f"re-record with: {command or 'the command that made the cassette'}",
            f"  request: {live.describe()}",
        ]
        if index is not None:
            lines.append(f"  closest recording: #{index} "
                         f"({self.interactions[index].request.describe()})")
        lines += ["  " + line for reason in reasons for line in reason.splitlines()]
        where = f" ({self.path})" if self.path is not None else ""
        lines.append(f"  re-record{where}: {command or 'no command stored in the cassette'}")
        return FixtureMiss(
            "\n".join(lines),
            cassette=str(self.path) if self.path is not None else self.name,
            request=live,
            closest=index,
            reasons=reasons,
            command=command,
        )

    def _closest(self, live: RecordedRequest) -> int | None:
        candidates = [
            n for n, i in enumerate(self.interactions)
            if i.request.method == live.method and i.request.path == live.path
        ]
        if not candidates:
            return None
        live_lines = _lines(live)
        live_prompt = live.prompt.name if live.prompt else None

        def score(n: int) -> tuple[bool, bool, float, bool]:
            request = self.interactions[n].request
            if n not in self._lines:
                self._lines[n] = _lines(request)
            lines = self._lines[n]
            union = len(lines | live_lines) or 1
            return (
                request.prompt is not None and request.prompt.name == live_prompt,
                request.schema_name == live.schema_name,
                len(lines & live_lines) / union,
                bool(self._queues.get(request.key)),
            )

        return max(candidates, key=score)

    # -- summary

    def summary(self) -> str:
        """A few lines for a person: how it was made, requests, statuses, tokens, models."""
        about = self.about
        made = str(about.get("made", "unknown"))
        lines = [f"{self.path or self.name}: {len(self.interactions)} interactions"]
        lines.append(
            f"made: {made} on {about.get('date', '?')} from {about.get('base_url', '?')} "
            f"(model {about.get('model', '?')}; openai {about.get('openai', '?')}, "
            f"planrun {about.get('planrun', '?')})"
        )
        if about.get("note"):
            lines.append(f"note: {about['note']}")
        if about.get("scenario"):
            lines.append(f"scenario: {about['scenario']}")
        statuses = Counter(i.response.status for i in self.interactions)
        lines.append("statuses: " + ", ".join(f"{s} x{n}" for s, n in sorted(statuses.items())))
        prompts = Counter(
            i.request.prompt.name if i.request.prompt else "(none)" for i in self.interactions
        )
        lines.append("prompts: " + ", ".join(f"{p} x{n}" for p, n in sorted(prompts.items())))
        totals: Counter[str] = Counter()
        for interaction in self.interactions:
            usage = interaction.response.usage
            # Chat Completions says prompt/completion; the Responses API input/output.
            totals["prompt_tokens"] += int(usage.get("prompt_tokens", usage.get("input_tokens"))
                                           or 0)
            totals["completion_tokens"] += int(
                usage.get("completion_tokens", usage.get("output_tokens")) or 0)
            totals["total_tokens"] += int(usage.get("total_tokens") or 0)
            details = (usage.get("prompt_tokens_details") or usage.get("input_tokens_details")
                       or {})
            totals["cached_tokens"] += int(details.get("cached_tokens") or 0)
        lines.append(
            f"tokens: {totals['total_tokens']} ({totals['prompt_tokens']} prompt, "
            f"{totals['cached_tokens']} cached, {totals['completion_tokens']} completion)"
        )
        models = Counter(
            str(i.response.body.get("model"))
            for i in self.interactions
            if isinstance(i.response.body, dict) and i.response.body.get("model")
        )
        lines.append("models: " + (", ".join(f"{m} x{n}" for m, n in sorted(models.items()))
                                   or "(none)"))
        if self.command:
            lines.append(f"re-record: {self.command}")
        return "\n".join(lines)


def _now() -> float:
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return time.monotonic()


def _path(path: str, query: bytes | str) -> str:
    if isinstance(query, bytes):
        query = query.decode("ascii", errors="replace")
    return f"{path}?{query}" if query else path


def _lines(request: RecordedRequest) -> frozenset[str]:
    out: set[str] = set()
    for message in request.messages:
        content = message.get("content")
        if isinstance(content, str):
            out.update(line.strip() for line in content.splitlines() if line.strip())
    return frozenset(out)


# ---------------------------------------------------------------------------------------------
# What differs
# ---------------------------------------------------------------------------------------------


def explain(recorded: RecordedRequest, live: RecordedRequest) -> list[str]:
    """What differs between a recorded request and a live one, in sentences.

    The prompt (by its name and hash), the first differing message (a short unified diff),
    the ``response_format`` schema, the model and any other parameter.
    """
    if not isinstance(recorded.body, dict) or not isinstance(live.body, dict):
        return ["the request body differs (it is not JSON on one side)"]
    reasons: list[str] = []
    if recorded.body.get("model") != live.body.get("model"):
        reasons.append(
            f"model changed: recorded {recorded.body.get('model')!r}, "
            f"now {live.body.get('model')!r}"
        )
    reasons += _explain_prompt(recorded, live)
    reasons += _explain_format(recorded.format, live.format)
    for key in sorted(set(recorded.body) | set(live.body)):
        if key in ("model", "messages", "input", "response_format", "text"):
            continue
        if recorded.body.get(key) != live.body.get(key):
            reasons.append(
                f"parameter {key!r} changed: recorded {recorded.body.get(key)!r}, "
                f"now {live.body.get(key)!r}"
            )
    return reasons or ["the request body differs"]


def _explain_prompt(recorded: RecordedRequest, live: RecordedRequest) -> list[str]:
    reasons: list[str] = []
    old, new = recorded.prompt, live.prompt
    if old is not None and new is not None and old != new:
        if old.name == new.name:
            reasons.append(
                f"the rendered prompt of {new.name} changed: recorded hash {old.hash}, "
                f"now {new.hash} (the template {new.name} or the values rendered into it)"
            )
        else:
            reasons.append(f"a different prompt: recorded {old.name}, now {new.name}")
    old_messages, new_messages = recorded.messages, live.messages
    if len(old_messages) != len(new_messages):
        reasons.append(
            f"the conversation has {len(new_messages)} message(s); the recording has "
            f"{len(old_messages)}"
        )
    for n, (a, b) in enumerate(zip(old_messages, new_messages, strict=False)):
        if a != b:
            reasons.append(f"message {n} ({b.get('role', '?')}) differs:\n" + _diff(
                _text(a.get("content")), _text(b.get("content")), f"recorded message {n}",
                f"current message {n}"))
            break
    return reasons


def _explain_format(old: Any, new: Any) -> list[str]:
    if old == new:
        return []
    old_name = _format_name(old)
    new_name = _format_name(new)
    if old_name != new_name:
        return [f"response_format changed: recorded {old_name}, now {new_name}"]
    old_text = json.dumps(old, indent=1, sort_keys=True).splitlines()
    new_text = json.dumps(new, indent=1, sort_keys=True).splitlines()
    diff = _diff("\n".join(old_text), "\n".join(new_text), "recorded schema", "current schema")
    return [f"response_format schema changed (schema {new_name}):\n{diff}"]


def _format_name(fmt: Any) -> str:
    if not isinstance(fmt, dict):
        return "none"
    name = _schema_name_of(fmt)
    return repr(name) if name is not None else str(fmt.get("type"))


def _format_of(body: Any) -> Any:
    """``response_format`` (Chat Completions) or ``text.format`` (Responses), or None."""
    if not isinstance(body, dict):
        return None
    if "response_format" in body:
        return body["response_format"]
    text = body.get("text")
    return text.get("format") if isinstance(text, dict) else None


def _schema_name_of(fmt: Any) -> str | None:
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        return None
    inner = fmt.get("json_schema") if "json_schema" in fmt else fmt  # Responses: flat
    return str((inner or {}).get("name"))


def _text(content: Any) -> str:
    return content if isinstance(content, str) else json.dumps(content, indent=1, sort_keys=True)


def _diff(old: str, new: str, old_name: str, new_name: str) -> str:
    lines = list(difflib.unified_diff(
        old.splitlines(), new.splitlines(), old_name, new_name, n=1, lineterm=""
    ))
    if len(lines) > _DIFF_LINES:
        lines = [*lines[:_DIFF_LINES], f"... ({len(lines) - _DIFF_LINES} more diff lines)"]
    return "\n".join("    " + line for line in lines)


# ---------------------------------------------------------------------------------------------
# Replay
# ---------------------------------------------------------------------------------------------


@contextmanager
def answered_by(handler: Callable[[httpx2.Request], httpx2.Response]) -> Iterator[None]:
    """Answer every request made through httpx2's own transports inside the block with
    ``handler``, through httpx2's ``MockTransport``: nothing reaches the network.

    The transport takes the place of the one every httpx2 client holds (the ``openai``
    SDK's included, whichever client a :class:`~planrun.model.Model` makes on each event
    loop), as :func:`record` takes its place to copy the traffic.
    """
    transport = httpx2.MockTransport(handler)

    async def handle_async(_: httpx2.AsyncHTTPTransport,
                           request: httpx2.Request) -> httpx2.Response:
        return _unread(await transport.handle_async_request(request))

    def handle(_: httpx2.HTTPTransport, request: httpx2.Request) -> httpx2.Response:
        return _unread(transport.handle_request(request))

    with mock.patch.object(httpx2.AsyncHTTPTransport, "handle_async_request", handle_async), \
            mock.patch.object(httpx2.HTTPTransport, "handle_request", handle):
        yield


def _unread(response: httpx2.Response) -> httpx2.Response:
    """``response`` with its body not yet read, as a transport hands one over (a response
    built from content is read already; whoever holds the transport may stream it)."""
    return httpx2.Response(response.status_code, headers=response.headers,
                           stream=httpx2.ByteStream(response.content),
                           extensions=response.extensions)


_SHIPPED = ("fixtures_data", "dev/evals/cassettes")
"""Where the wheel holds shipped cassettes: the demos' and scenarios', then the evals'."""


def _is_name(text: str) -> bool:
    return bool(text) and "/" not in text and os.sep not in text and not text.endswith(".json")


def shipped_cassette(name: str) -> Path:
    """The path of a cassette shipped with planrun, by name: a demo's or scenario's
    (``brief``, ``tickets``, ``release``, ``rate_limited``, ...) or an eval set's
    (``examples``, ``taskbench``, ``examples_smollm2``). Looked up in the installed package,
    then in a source checkout's ``fixtures/``."""
    from importlib import resources

    root = resources.files("planrun")
    for folder in _SHIPPED:
        packaged = root.joinpath(f"{folder}/{name}.json")
        if packaged.is_file():
            return Path(str(packaged))
    repo = Path(__file__).resolve().parents[3] / "fixtures" / f"{name}.json"
    if repo.is_file():
        return repo
    raise UsageError(f"no cassette {name!r}: not a file, and planrun ships none of that name "
                     f"(have {', '.join(shipped_names()) or 'none'})")


def shipped_names() -> list[str]:
    """The names :func:`shipped_cassette` knows."""
    from importlib import resources

    root = resources.files("planrun")
    folders = [root.joinpath(folder) for folder in _SHIPPED]
    repo = Path(__file__).resolve().parents[3] / "fixtures"
    names = {Path(str(entry)).stem for folder in [*folders, repo] if folder.is_dir()
             for entry in folder.iterdir() if str(entry).endswith(".json")}
    return sorted(names)


@contextmanager
def replay(
    source: str | os.PathLike[str] | Cassette, *, check: bool = False
) -> Iterator[Cassette]:
    """Serve a cassette (a path, a shipped cassette's name, or a :class:`Cassette`) to
    every HTTP request made through httpx2 inside the block.

    Nothing reaches the network: every request is answered from the cassette or fails with
    :class:`FixtureMiss`. A miss that the code under test swallowed (a task died of it) is
    raised when the block exits. With ``check=True`` a miss is answered with the closest
    recording and noted in :attr:`Cassette.stale` instead (what :func:`check` uses).

        with replay("fixtures/release.json") as cassette:
            report = plan_and_run(RELEASE_PLAN, release.make_app(), model=cassette.model())
        assert not cassette.unused()
    """
    cassette = source if isinstance(source, Cassette) else Cassette.load(source)
    cassette.rewind()
    cassette.checking = check
    try:
        with answered_by(cassette.serve):
            yield cassette
    except FixtureMiss:
        raise
    except Exception as exc:
        if cassette.misses and not check:
            raise cassette.misses[0] from exc
        raise
    if cassette.misses and not check:
        raise cassette.misses[0]


# ---------------------------------------------------------------------------------------------
# Record
# ---------------------------------------------------------------------------------------------


class Recorder:
    """Collects interactions while :func:`record` is active; :attr:`cassette` is the result."""

    def __init__(self, cassette: Cassette) -> None:
        self.cassette = cassette
        self.secrets: set[str] = set()
        self.urls: list[str] = []
        self._lock = threading.Lock()

    def add(
        self,
        request: httpx2.Request,
        content: bytes,
        status: int,
        headers: Mapping[str, str],
        body: bytes,
    ) -> None:
        """Keep one exchange (scrubbing happens when the file is written)."""
        with self._lock:
            self.secrets.update(_secrets_of(request.headers))
            self.urls.append(str(request.url))
            recorded = RecordedRequest.from_http(
                request.method,
                _path(request.url.path, request.url.query),
                content,
                request.headers.get(PROMPT_HEADER),
            )
            self.cassette.interactions.append(
                Interaction(recorded, RecordedResponse.from_http(status, headers, body))
            )

    def finish(self) -> Cassette:
        """Scrub every interaction and order them so a re-recording diffs well.

        Interactions are sorted by path, prompt name and canonical body; identical requests
        keep the order they were made in (the order replay serves them in).
        """
        cassette = self.cassette
        cleaned = [Interaction.from_dict(scrub(i.to_dict(), self.secrets))
                   for i in cassette.interactions]
        cleaned.sort(key=lambda i: (
            i.request.path, i.request.prompt.name if i.request.prompt else "",
            canonical_json(i.request.body),
        ))
        cassette.interactions = cleaned
        cassette.about = scrub(cassette.about, self.secrets)
        cassette.rewind()
        return cassette


def _package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _base_url_of(url: str) -> str:
    parts = urlsplit(url)
    path = parts.path
    for tail in ("/chat/completions", "/responses", "/embeddings"):
        if path.endswith(tail):
            path = path[: -len(tail)]
    host = parts.hostname or ""
    netloc = host if host in _LOOPBACK else parts.netloc
    return f"{parts.scheme}://{netloc}{path}"


@contextmanager
def record(
    path: str | os.PathLike[str],
    *,
    base_url: str | None = None,
    model: str | None = None,
    made: Literal["recorded", "synthesized"] = "recorded",
    note: str | None = None,
    scenario: str | None = None,
    command: str | None = None,
) -> Iterator[Recorder]:
    """Record every request made through httpx2 inside the block; write ``path`` on exit.

    The requests really go to their endpoint (the real API, with a real key, or the local
    stand-in). The file is written only when the block exits without an exception, so a
    failed recording never replaces a good cassette.

    Args:
        path: the cassette file to write.
        base_url, model: what it was recorded from (default: taken from the first request).
        made: ``"recorded"`` (a real endpoint) or ``"synthesized"`` (the stand-in).
        note: a sentence about how it was made (default for synthesized:
            :data:`SYNTHESIZED_NOTE`).
        scenario: the :mod:`planrun.dev.scenarios` name it runs, which lets :func:`check`
            re-run it.
        command: the command that re-records it, quoted in every miss.
    """
    target = Path(path)
    cassette = Cassette(path=target)
    recorder = Recorder(cassette)
    original = httpx2.AsyncHTTPTransport.handle_async_request

    async def handle(transport: httpx2.AsyncHTTPTransport, request: httpx2.Request) -> Any:
        content = await request.aread()
        response = await original(transport, request)
        try:
            raw = b"".join([chunk async for chunk in response.aiter_raw()])
        finally:
            await response.aclose()
        copy = httpx2.Response(
            response.status_code,
            headers=response.headers,
            content=raw,
            extensions=response.extensions,
            request=request,
        )
        recorder.add(request, content, copy.status_code, copy.headers, copy.content)
        return copy

    with mock.patch.object(httpx2.AsyncHTTPTransport, "handle_async_request", handle):
        yield recorder
    cassette.about = _about(recorder, base_url=base_url, model=model, made=made, note=note,
                            scenario=scenario, command=command)
    recorder.finish().save(target)
    log.info("wrote %s: %d interactions", target, len(cassette.interactions))


def _about(recorder: Recorder, *, base_url: str | None, model: str | None,
           made: Literal["recorded", "synthesized"], note: str | None, scenario: str | None,
           command: str | None) -> dict[str, Any]:
    """A recorded cassette's ``about``: how, from what and when it was made."""
    cassette = recorder.cassette
    first_url = recorder.urls[0] if recorder.urls else ""
    first_body = cassette.interactions[0].request.body if cassette.interactions else None
    first_model = first_body.get("model") if isinstance(first_body, dict) else None
    if first_model == TEST_MODEL and made == "recorded":  # answered by no real model
        made, note = "synthesized", note or TEST_MODEL_NOTE
    return {
        "format": FORMAT,
        "made": made,
        "note": note or (SYNTHESIZED_NOTE if made == "synthesized" else
                         "Recorded from a live endpoint with planrun.testing.record."),
        "base_url": base_url or (_base_url_of(first_url) if first_url else None),
        "model": model or first_model,
        "date": datetime.now(timezone.utc).date().isoformat(),
        "openai": _package_version("openai"),
        "planrun": _package_version("planrun"),
        "scenario": scenario,
        "command": command,
    }



# ---------------------------------------------------------------------------------------------
# Stale-fixture check
# ---------------------------------------------------------------------------------------------


Rerun = Callable[["Cassette"], Callable[[Any, Any], Awaitable[Any]] | None]
"""``rerun(cassette)``: how to re-run a cassette that names no scenario (an async
``entry(model, clock)`` doing what made it), or None when it cannot be."""


def check(paths: Iterable[str | os.PathLike[str]], *,
          rerun: Rerun | None = None) -> list[Stale]:
    """Every interaction of these cassettes that the current code no longer reproduces.

    Each cassette's scenario (``about.scenario``, see :mod:`planrun.dev.scenarios`), or for
    a cassette that names none what ``rerun`` gives (a user's cassette: the command line
    re-runs the ``planrun plan``/``run`` that recorded it), runs against it under
    :class:`~planrun.runtime.VirtualClock` in check mode, so every request is rendered
    again from the current prompts and schemas: a request without an exact recording is a
    ``changed`` :class:`Stale` (with the reason, e.g. the template whose render changed;
    in the order the requests were recorded) and gets the closest recording as its answer
    so the run goes on; a recording never asked for is ``unplayed``; a run that raises is
    ``failed``; a cassette that cannot be re-run is ``unchecked``. An empty list means all
    is fresh.
    """
    stale: list[Stale] = []
    for path in paths:
        stale += _check_one(Path(path), rerun)
    return stale


def _check_one(path: Path, rerun: Rerun | None = None) -> list[Stale]:
    from planrun.dev.scenarios import SCENARIOS
    from planrun.runtime import VirtualClock, run_blocking

    cassette = Cassette.load(path)
    name = cassette.about.get("scenario")
    entry = SCENARIOS[str(name)].entry if name in SCENARIOS else (
        rerun(cassette) if rerun is not None and not name else None)
    if entry is None:
        reason = (f"names no known scenario ({name!r}); it cannot be re-run, so its freshness "
                  f"is unknown") if name else "names no scenario, so it cannot be re-run"
        return [Stale(str(path), None, "unchecked", reason)]
    clock = VirtualClock()
    found: list[Stale] = []
    with replay(cassette, check=True):
        model = cassette.model()

        async def run() -> None:
            try:
                await entry(model, clock)
            finally:
                await model.aclose()

        try:
            run_blocking(clock, run)  # works inside a running loop too (a notebook cell)
        except Exception as exc:  # the scenario itself broke under replay
            what = f"the scenario {name!r}" if name else f"re-running {cassette.command!r}"
            found.append(Stale(str(path), None, "failed",
                               f"{what} raised {type(exc).__name__}: {exc}"))
    found = sorted(cassette.stale, key=lambda s: s.index or 0) + found
    for index in cassette.unused_indices():
        request = cassette.interactions[index].request
        found.append(Stale(str(path), index, "unplayed",
                           f"the current code never sends this request ({request.describe()})"))
    return found
