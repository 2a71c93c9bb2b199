"""A deterministic OpenAI Batch API: files, batches, polls and result files, in its wire format.

:class:`FakeBatchAPI` answers ``POST /v1/files`` (a multipart upload, purpose ``batch``),
``GET /v1/files/{id}`` and ``GET /v1/files/{id}/content``, ``POST /v1/batches``,
``GET /v1/batches/{id}``, ``POST /v1/batches/{id}/cancel`` and ``GET /v1/batches`` (newest
first, cursor pages with ``first_id``, ``last_id`` and ``has_more``) the way the API does.
It is called with an ``httpx2.Request`` and returns an ``httpx2.Response`` (httpx2 is the
HTTP stack the ``openai`` SDK sends through), like :class:`~planrun.dev.testing.FakeOpenAI`:
served with :func:`~planrun.testing.answered_by`, or behind the stand-in server
(``tools/standin.py``).

Each line of a batch is answered by the :class:`~planrun.dev.testing.FakeOpenAI` given
(through its ``__call__``: the same body, usage and ``x-request-id`` a live request gets,
and it counts in its ``requests``) when the batch's time comes: ``complete_after`` seconds
after creation (with ``progress``, lines complete steadily until then). Time is read from
``clock`` when the batch is read, so nothing runs in the background. On the wire:

* a done line, in the output file: ``{"id": "batch_req_…", "custom_id": …, "response":
  {"status_code": 200, "request_id": "req_…", "body": {chat.completion or response}},
  "error": null}``;
* a line failed by ``fail_lines`` (or by the fake's own script), in the error file:
  ``{"response": {"status_code": 500, "request_id": …, "body": {"error": {…}}},
  "error": null}``, as the API writes a request it answered with an error;
* an expired batch (``expire_after``): status ``expired``, the lines done before the expiry
  in the output file, every other line in the error file as ``{"response": null, "error":
  {"code": "batch_expired", "message": …}}``;
* a cancelled batch: ``cancelling`` as the cancel's answer, ``cancelled`` at the next read;
  the lines done before the cancel are in the output file, the others in no file;
* an input file the API would refuse (a line that is not JSON, without ``custom_id``, a
  ``custom_id`` twice, a ``url`` other than the endpoint, two models, no line), or
  ``fail_batch``: status ``failed`` with ``errors: {"object": "list", "data": [{"code",
  "message", "param", "line"}]}`` (codes ``invalid_json_line``, ``duplicate_custom_id``,
  ``url_mismatch``, ``model_mismatch``, ``empty_file``, ...) and no result files;
* an unknown file or batch: 404 with the API's error body.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx2

__all__ = ["LATE_HEADER", "FakeBatchAPI", "LineFailure", "LineFailures", "json_object"]

Answerer = Callable[[httpx2.Request], httpx2.Response]
"""What answers one line as a live request: a :class:`~planrun.dev.testing.FakeOpenAI`."""
LineFailure = Callable[[str, Mapping[str, Any]], "tuple[int, Mapping[str, Any]] | None"]
"""``(custom_id, body) -> (status, error body)`` to fail that line, or None to answer it."""
LineFailures = LineFailure | Mapping[str, int | tuple[int, Mapping[str, Any]]]
"""``fail_lines``: a :data:`LineFailure`, or ``custom_id -> status`` (the API's error body
for that status, see :meth:`FakeBatchAPI.failure`) or ``-> (status, error body)``."""

ENDPOINTS = ("/v1/chat/completions", "/v1/responses")
WINDOW_S = 24 * 3600
MAX_LINES = 50_000
_FINAL = ("completed", "failed", "expired", "cancelled")
_EXPIRED = {"code": "batch_expired",
            "message": "This request could not be executed before the completion window "
                       "expired."}
_FAILURES: dict[int, tuple[str, str, str | None]] = {
    400: ("invalid_request_error", "Invalid request.", None),
    401: ("invalid_request_error", "Incorrect API key provided.", "invalid_api_key"),
    429: ("requests", "Rate limit reached for requests. Please try again later.",
          "rate_limit_exceeded"),
    500: ("server_error", "The server had an error while processing your request. Sorry "
          "about that!", None),
    503: ("server_error", "The server is overloaded or not ready yet.", None),
}


@dataclass
class _Batch:
    """One batch: its API object, its input lines and the results so far."""

    data: dict[str, Any]
    lines: list[dict[str, Any]]
    created: float
    done: dict[str, dict[str, Any]] = field(default_factory=dict)
    failed: dict[str, dict[str, Any]] = field(default_factory=dict)
    cancelled: bool = False


LATE_HEADER = "x-standin-answer-after"
"""A header of the fake's answer: the server sends the answer this many seconds late (and
drops the header)."""


class FakeBatchAPI:
    """The Batch API's endpoints over ``fake`` (see the module's docstring).

    Args:
        fake: answers each line as a live request (a :class:`FakeOpenAI`).
        complete_after: seconds from creation until a batch is completed (default 0: it is
            completed when it is first read after its creation).
        progress: lines complete steadily over ``complete_after`` (a cancel or an expiry
            then keeps the lines done so far); otherwise all at its end.
        expire_after: seconds from creation after which an unfinished batch expires.
        fail_lines: fails chosen lines (:data:`LineFailures`): they go to the error file.
        fail_batch: every batch fails validation with this message (code
            ``invalid_request``), or with ``(code, message)``.
        answer_create_after: seconds the answer to ``POST /v1/batches`` is held back after
            the batch is created (a client whose timeout is shorter has lost the answer);
            the stand-in server holds it back, told by the :data:`LATE_HEADER` header.
        clock: epoch seconds now (default ``time.time``); ids never depend on it.

    Counters a test reads: ``uploads`` (files uploaded), ``submitted`` (batches created),
    ``retrieves`` (batch reads), ``cancelled`` (cancels accepted); ``batches``: id -> the
    batch object as the API would serve it now; ``files``: id -> (filename, purpose,
    content, created_at). Ids are digests of the content and a counter: the same calls in
    the same order get the same ids.
    """

    def __init__(
        self,
        fake: Answerer,
        *,
        complete_after: float = 0.0,
        progress: bool = False,
        expire_after: float | None = None,
        fail_lines: LineFailures | None = None,
        fail_batch: str | tuple[str, str] | None = None,
        answer_create_after: float = 0.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.fake = fake
        self.complete_after = complete_after
        self.progress = progress
        self.expire_after = expire_after
        self.fail_lines = fail_lines
        self.fail_batch = fail_batch
        self.answer_create_after = answer_create_after
        self.clock = clock
        self.files: dict[str, tuple[str, str, bytes, int]] = {}
        """File id -> (filename, purpose, content, created_at)."""
        self._batches: dict[str, _Batch] = {}
        self._served = 0
        self.uploads = self.submitted = self.retrieves = self.cancelled = 0

    @property
    def batches(self) -> dict[str, dict[str, Any]]:
        """Batch id -> its object (as the API would serve it now: reading it advances
        time's work, as a retrieve does, without counting as one)."""
        return {bid: self._advance(b) for bid, b in self._batches.items()}

    @staticmethod
    def failure(status: int, message: str | None = None, *,
                code: str | None = None) -> tuple[int, dict[str, Any]]:
        """``(status, error body)`` of a line the API answered with an error, for
        ``fail_lines``: e.g. ``failure(429)`` (``rate_limit_exceeded``), ``failure(500)``
        (``server_error``), ``failure(400, "bad", code="invalid_value")``."""
        kind, default, default_code = _FAILURES.get(
            status, ("invalid_request_error" if status < 500 else "server_error",
                     f"Request failed with status {status}.", None))
        return status, {"error": {"message": message or default, "type": kind,
                                  "param": None, "code": code or default_code}}

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        """Answer one request to a files or batches endpoint."""
        self._served += 1
        response = self._route(request)
        response.headers["x-request-id"] = _hex(
            "req", f"{self._served}:{request.method}:{request.url.path}")
        return response

    def _route(self, request: httpx2.Request) -> httpx2.Response:
        parts = [p for p in request.url.path.removeprefix("/v1").split("/") if p]
        method = request.method
        if parts == ["files"] and method == "POST":
            return self._upload(request)
        if len(parts) in (2, 3) and parts[0] == "files" and method == "GET" \
                and parts[2:] in ([], ["content"]):
            return self._file(parts[1], content=len(parts) == 3)
        if parts == ["batches"]:
            return self._create(request) if method == "POST" else self._list(request)
        if len(parts) == 2 and parts[0] == "batches" and method == "GET":
            return self._retrieve(parts[1])
        if len(parts) == 3 and parts[0] == "batches" and parts[2] == "cancel" \
                and method == "POST":
            return self._cancel(parts[1])
        return _error(404, f"Invalid URL ({method} {request.url.path})")

    # -- files

    def _upload(self, request: httpx2.Request) -> httpx2.Response:
        fields = multipart_fields(request.content)
        upload = fields.get("file")
        if not isinstance(upload, tuple):
            return _error(400, "Missing required parameter: 'file'.", param="file")
        purpose = str(fields.get("purpose") or "")
        if purpose != "batch":
            return _error(400, f"Invalid value for purpose: {purpose!r}", param="purpose")
        name, content = upload
        self.uploads += 1
        fid = self._id("file", content)
        created = int(self.clock())
        self.files[fid] = (name, purpose, content, created)
        return httpx2.Response(200, json=_file_object(fid, name, purpose, len(content), created))

    def _file(self, fid: str, *, content: bool) -> httpx2.Response:
        if fid not in self.files:
            return _error(404, f"No such File object: {fid}", param="id")
        name, purpose, data, created = self.files[fid]
        if content:
            return httpx2.Response(200, content=data,
                                   headers={"content-type": "application/octet-stream"})
        return httpx2.Response(200, json=_file_object(fid, name, purpose, len(data), created))

    def _new_file(self, name: str, lines: list[dict[str, Any]]) -> str | None:
        if not lines:
            return None
        content = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
        fid = self._id("file", content)
        self.files[fid] = (name, "batch_output", content, int(self.clock()))
        return fid

    # -- batches

    def _create(self, request: httpx2.Request) -> httpx2.Response:
        body = json_object(request.content)
        fid = body.get("input_file_id")
        if not isinstance(fid, str) or fid not in self.files:
            return _error(404, f"No such File object: {fid}", param="input_file_id")
        if self.files[fid][1] != "batch":
            return _error(400, f"File {fid} has purpose {self.files[fid][1]!r}, not 'batch'.",
                          param="input_file_id")
        endpoint = body.get("endpoint")
        if endpoint not in ENDPOINTS:
            return _error(400, f"Invalid value for endpoint: {endpoint!r}", param="endpoint")
        if body.get("completion_window") != "24h":
            return _error(400, "Invalid value for completion_window: only '24h' is supported",
                          param="completion_window")
        now = self.clock()
        self.submitted += 1
        bid = self._id("batch", f"{fid}:{self.submitted}".encode())
        lines, errors = read_lines(self.files[fid][2], str(endpoint))
        data = _batch_object(bid, body, fid, int(now), lines)
        if self.fail_batch:
            code, message = (self.fail_batch if isinstance(self.fail_batch, tuple)
                             else ("invalid_request", self.fail_batch))
            errors = [_batch_error(code, message)]
        if errors:
            data.update(status="failed", failed_at=int(now),
                        errors={"object": "list", "data": errors},
                        request_counts={"total": 0, "completed": 0, "failed": 0})
        self._batches[bid] = _Batch(data, lines, now)
        late = ({LATE_HEADER: f"{self.answer_create_after:g}"} if self.answer_create_after
                else None)
        return httpx2.Response(200, json=data, headers=late)

    def _retrieve(self, bid: str) -> httpx2.Response:
        if bid not in self._batches:
            return _error(404, f"No batch found with id '{bid}'.", param="batch_id")
        self.retrieves += 1
        return httpx2.Response(200, json=self._advance(self._batches[bid]))

    def _cancel(self, bid: str) -> httpx2.Response:
        if bid not in self._batches:
            return _error(404, f"No batch found with id '{bid}'.", param="batch_id")
        batch = self._batches[bid]
        data = self._advance(batch)
        if data["status"] in (*_FINAL, "cancelling"):
            return _error(409, f"Cannot cancel a batch with status '{data['status']}'.")
        self.cancelled += 1
        batch.cancelled = True  # the lines done by now are all it does
        data.update(status="cancelling", cancelling_at=int(self.clock()))
        return httpx2.Response(200, json=data)

    def _list(self, request: httpx2.Request) -> httpx2.Response:
        limit = int(request.url.params.get("limit") or 20)
        if not 1 <= limit <= 100:
            return _error(400, f"Invalid 'limit': {limit}; it must be between 1 and 100.",
                          param="limit")
        after = request.url.params.get("after")
        ordered = list(reversed(self._batches))  # newest first
        start = ordered.index(after) + 1 if after in ordered else 0
        page = ordered[start:start + limit]
        data = [self._advance(self._batches[bid]) for bid in page]
        return httpx2.Response(200, json={
            "object": "list", "data": data, "first_id": page[0] if page else None,
            "last_id": page[-1] if page else None,
            "has_more": start + limit < len(ordered)})

    # -- time passing

    def _advance(self, batch: _Batch) -> dict[str, Any]:
        """Bring ``batch`` to where it is now: lines done, status, counts, result files."""
        data = batch.data
        if data["status"] in _FINAL:
            return data
        now = self.clock()
        age = now - batch.created
        data["in_progress_at"] = data["in_progress_at"] or data["created_at"]
        if batch.cancelled:
            self._finish(batch, "cancelled", now)
            return data
        expiry = self.expire_after
        expired = expiry is not None and age >= expiry and self._due(batch, expiry) < len(
            batch.lines)
        self._answer(batch, self._due(batch, expiry if expired and expiry is not None
                                      else age))
        if len(batch.done) + len(batch.failed) == len(batch.lines):
            self._finish(batch, "completed",
                         batch.created + min(age, max(self.complete_after, 0.0)))
        elif expired and expiry is not None:
            for line in batch.lines:
                cid = line["custom_id"]
                if cid not in batch.done and cid not in batch.failed:
                    batch.failed[cid] = _result(cid, None, _EXPIRED)
            self._finish(batch, "expired", batch.created + expiry)
        else:
            data["status"] = "in_progress"
            _count(batch)
        return data

    def _due(self, batch: _Batch, age: float) -> int:
        """How many lines are done ``age`` seconds after creation."""
        total = len(batch.lines)
        if self.complete_after <= 0 or age >= self.complete_after:
            return total
        return math.floor(total * age / self.complete_after) if self.progress else 0

    def _answer(self, batch: _Batch, count: int) -> None:
        """Answer the first ``count`` lines not answered yet."""
        for line in batch.lines[:count]:
            cid = line["custom_id"]
            if cid in batch.done or cid in batch.failed:
                continue
            failure = self._failure_of(cid, line["body"])
            if failure is not None:
                status, body = failure
                batch.failed[cid] = _result(cid, {"status_code": status, "request_id":
                                                  _hex("req", cid), "body": dict(body)}, None)
                continue
            request = httpx2.Request("POST", f"http://batch{line['url']}",
                                     content=json.dumps(line["body"]).encode(),
                                     headers={"content-type": "application/json"})
            reply = self.fake(request)
            response = {"status_code": reply.status_code,
                        "request_id": reply.headers.get("x-request-id") or _hex("req", cid),
                        "body": reply.json()}
            (batch.done if reply.status_code == 200 else batch.failed)[cid] = _result(
                cid, response, None)

    def _failure_of(self, cid: str,
                    body: Mapping[str, Any]) -> tuple[int, Mapping[str, Any]] | None:
        rule = self.fail_lines
        if rule is None:
            return None
        if callable(rule):
            return rule(cid, body)
        given = rule.get(cid)
        if given is None:
            return None
        return self.failure(given) if isinstance(given, int) else given

    def _finish(self, batch: _Batch, status: str, at: float) -> None:
        data, bid = batch.data, batch.data["id"]
        data["status"] = status
        data[f"{status}_at"] = int(at)
        data["finalizing_at"] = int(at)
        data["output_file_id"] = self._new_file(f"{bid}_output.jsonl", list(batch.done.values()))
        data["error_file_id"] = self._new_file(f"{bid}_error.jsonl", list(batch.failed.values()))
        _count(batch)

    def _id(self, prefix: str, content: bytes) -> str:
        """``file-…`` or ``batch_…``: a digest of ``content`` and how many exist."""
        digest = hashlib.sha256(content + str(len(self.files) + len(self._batches)).encode())
        return f"file-{digest.hexdigest()[:24]}" if prefix == "file" else \
            f"batch_{digest.hexdigest()[:24]}"


def multipart_fields(content: bytes) -> dict[str, str | tuple[str, bytes]]:
    """The fields of a ``multipart/form-data`` body: name -> text, or (filename, bytes) for a
    file. The boundary is read from the body's first line; {} when it is no such body."""
    first, _, _ = content.partition(b"\r\n")
    if not first.startswith(b"--") or len(first) < 3:
        return {}
    fields: dict[str, str | tuple[str, bytes]] = {}
    for part in content.split(first)[1:]:
        if part.startswith(b"--"):
            break
        part = part.removeprefix(b"\r\n").removesuffix(b"\r\n")  # the framing's own
        head, _, value = part.partition(b"\r\n\r\n")
        disposition = next((h for h in head.decode(errors="replace").split("\r\n")
                            if h.lower().startswith("content-disposition")), "")
        params = dict(_param(p) for p in disposition.split(";")[1:])
        name = params.get("name", "")
        if "filename" in params:
            fields[name] = (params["filename"], value)
        else:
            fields[name] = value.decode(errors="replace")
    return fields


def _param(text: str) -> tuple[str, str]:
    key, _, value = text.strip().partition("=")
    return key, value.strip('"')


def read_lines(content: bytes, endpoint: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """An input file's request lines, and the API's errors for it (``errors.data`` items):
    the lines are checked as the API checks them before a batch starts."""
    lines: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    models: set[str] = set()
    for n, text in enumerate(content.decode(errors="replace").splitlines(), 1):
        if not text.strip():
            continue
        try:
            line = json.loads(text)
        except json.JSONDecodeError:
            line = None
        error = _line_error(line, n, endpoint, seen)
        if error is not None:
            errors.append(error)
            continue
        seen.add(line["custom_id"])
        models.add(str(line["body"].get("model")))
        lines.append(line)
    if len(models) > 1:
        errors.append(_batch_error("model_mismatch", "The requests in a batch must all use "
                                   f"the same model; this file uses {sorted(models)}.",
                                   param="body.model"))
    if not lines and not errors:
        errors.append(_batch_error("empty_file", "The batch input file is empty."))
    if len(lines) > MAX_LINES:
        errors.append(_batch_error("too_many_tasks", f"The batch input file has more than "
                                   f"{MAX_LINES} requests."))
    return lines, errors


def _line_error(line: Any, n: int, endpoint: str, seen: set[str]) -> dict[str, Any] | None:
    """The API's error for input line ``n`` (parsed: ``line``), or None when it is good."""
    if not isinstance(line, dict):
        return _batch_error("invalid_json_line", "This line is not parseable as valid JSON.",
                            line=n)
    cid = line.get("custom_id")
    if not isinstance(cid, str) or not cid:
        return _batch_error("missing_required_parameter", "Missing required parameter: "
                            "'custom_id'.", param="custom_id", line=n)
    if cid in seen:
        return _batch_error("duplicate_custom_id", f"The custom_id {cid!r} is used by more "
                            "than one request: each must be unique within the batch.",
                            param="custom_id", line=n)
    if line.get("url") != endpoint:
        return _batch_error("url_mismatch", f"The url {line.get('url')!r} does not match "
                            f"the batch's endpoint {endpoint!r}.", param="url", line=n)
    if line.get("method") != "POST" or not isinstance(line.get("body"), dict):
        return _batch_error("invalid_request", "Each request must have method 'POST' and a "
                            "JSON object as its body.", param="body", line=n)
    return None


def _batch_error(code: str, message: str, *, param: str | None = None,
                 line: int | None = None) -> dict[str, Any]:
    return {"code": code, "message": message, "param": param, "line": line}


def _count(batch: _Batch) -> None:
    """The batch's ``request_counts`` and ``usage`` from the lines answered so far."""
    batch.data["request_counts"] = {"total": len(batch.lines), "completed": len(batch.done),
                                    "failed": len(batch.failed)}
    usage = _no_usage()
    for result in batch.done.values():
        given = (result["response"]["body"] or {}).get("usage") or {}
        into = given.get("input_tokens", given.get("prompt_tokens", 0))
        out = given.get("output_tokens", given.get("completion_tokens", 0))
        cached = (given.get("input_tokens_details") or given.get("prompt_tokens_details")
                  or {}).get("cached_tokens", 0)
        reasoning = (given.get("output_tokens_details") or given.get(
            "completion_tokens_details") or {}).get("reasoning_tokens", 0)
        usage["input_tokens"] += into
        usage["output_tokens"] += out
        usage["total_tokens"] += into + out
        usage["input_tokens_details"]["cached_tokens"] += cached
        usage["output_tokens_details"]["reasoning_tokens"] += reasoning
    batch.data["usage"] = usage


def _no_usage() -> dict[str, Any]:
    return {"input_tokens": 0, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 0, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 0}


def _result(cid: str, response: dict[str, Any] | None,
            error: Mapping[str, Any] | None) -> dict[str, Any]:
    return {"id": _hex("batch_req", cid), "custom_id": cid, "response": response,
            "error": dict(error) if error else None}


def _hex(prefix: str, text: str) -> str:
    return f"{prefix}_{hashlib.sha256(text.encode()).hexdigest()[:24]}"


def json_object(content: bytes) -> dict[str, Any]:
    """A request body's JSON object, or ``{}`` when it is empty, not JSON or not an object."""
    try:
        value = json.loads(content or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return value if isinstance(value, dict) else {}


def _file_object(fid: str, name: str, purpose: str, size: int, created: int) -> dict[str, Any]:
    return {"id": fid, "object": "file", "bytes": size, "created_at": created,
            "filename": name, "purpose": purpose, "status": "processed",
            "status_details": None, "expires_at": None}


def _batch_object(bid: str, body: Mapping[str, Any], fid: str, now: int,
                  lines: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": bid, "object": "batch", "endpoint": body["endpoint"], "errors": None,
        "input_file_id": fid, "completion_window": "24h", "status": "validating",
        "output_file_id": None, "error_file_id": None, "created_at": now,
        "in_progress_at": None, "expires_at": now + WINDOW_S, "finalizing_at": None,
        "completed_at": None, "failed_at": None, "expired_at": None, "cancelling_at": None,
        "cancelled_at": None,
        "request_counts": {"total": len(lines), "completed": 0, "failed": 0},
        "metadata": dict(body.get("metadata") or {}),
        "model": str(lines[0]["body"].get("model")) if lines else None,
        "usage": _no_usage(),
    }


def _error(status: int, message: str, param: str | None = None) -> httpx2.Response:
    """The API's error answer: the body :func:`planrun.dev.testing.error_body` makes (that
    module imports this one, so its shape is written here)."""
    kind = "conflict_error" if status == 409 else "invalid_request_error"
    return httpx2.Response(status, json={"error": {"message": message, "type": kind,
                                                   "param": param, "code": None}})
