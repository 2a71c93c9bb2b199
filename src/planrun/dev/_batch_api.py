"""A deterministic OpenAI Batch API: files, batches, polls and result files, in its wire format.

:class:`FakeBatchAPI` answers ``POST /v1/files`` (a multipart upload, purpose ``batch``),
``GET /v1/files/{id}/content``, ``POST /v1/batches``, ``GET /v1/batches/{id}``,
``POST /v1/batches/{id}/cancel`` and ``GET /v1/batches`` (newest first, cursor pages) the
way the API does. Each line of a batch is answered by a :class:`FakeOpenAI` (the same body a
live request gets), when the batch's time comes: ``complete_after`` seconds after it was
created (``progress``: lines complete steadily until then). ``fail_lines`` fails chosen
lines with an HTTP status and error body (they go to the error file); ``expire_after``
expires the batch (lines done are kept, the rest are ``batch_expired`` errors);
``fail_batch`` fails its validation. It is called with an ``httpx.Request`` and returns an
``httpx.Response``, like :class:`FakeOpenAI`: a respx side effect, or behind the stand-in
server (``tools/standin.py``).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

__all__ = ["FakeBatchAPI", "LineFailure"]

Answerer = Callable[[httpx.Request], httpx.Response]
"""What answers one line as a live request: a :class:`~planrun.dev.testing.FakeOpenAI`."""
LineFailure = Callable[[str, Mapping[str, Any]], "tuple[int, Mapping[str, Any]] | None"]
"""``(custom_id, body) -> (status, error body)`` to fail that line, or None to answer it."""

ENDPOINTS = ("/v1/chat/completions", "/v1/responses")
WINDOW_S = 24 * 3600
_EXPIRED = {"code": "batch_expired",
            "message": "This request could not be executed before the completion window "
                       "expired."}


@dataclass
class _Batch:
    """One batch: its API object, its input lines and the results so far."""

    data: dict[str, Any]
    lines: list[dict[str, Any]]
    created: float
    done: dict[str, dict[str, Any]] = field(default_factory=dict)
    failed: dict[str, dict[str, Any]] = field(default_factory=dict)


class FakeBatchAPI:
    """The Batch API's endpoints over ``fake`` (see the module's docstring).

    Args:
        fake: answers each line as a live request (a :class:`FakeOpenAI`).
        complete_after: seconds from creation until a batch is completed (0: at once).
        progress: lines complete steadily over ``complete_after`` (a cancel or an expiry
            then keeps the lines done so far); otherwise all at its end.
        expire_after: seconds from creation after which an unfinished batch expires.
        fail_lines: fails chosen lines (:data:`LineFailure`).
        fail_batch: a message: every batch fails validation with it.
        clock: epoch seconds now (default ``time.time``).

    Counters a test reads: ``uploads``, ``submitted``, ``retrieves``, ``cancelled``;
    ``batches``: id -> the batch object as last served.
    """

    def __init__(
        self,
        fake: Answerer,
        *,
        complete_after: float = 0.0,
        progress: bool = False,
        expire_after: float | None = None,
        fail_lines: LineFailure | None = None,
        fail_batch: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.fake = fake
        self.complete_after = complete_after
        self.progress = progress
        self.expire_after = expire_after
        self.fail_lines = fail_lines
        self.fail_batch = fail_batch
        self.clock = clock
        self.files: dict[str, tuple[str, str, bytes, int]] = {}
        """File id -> (filename, purpose, content, created_at)."""
        self._batches: dict[str, _Batch] = {}
        self.uploads = self.submitted = self.retrieves = self.cancelled = 0

    @property
    def batches(self) -> dict[str, dict[str, Any]]:
        """Batch id -> its object (as the API would serve it now)."""
        return {bid: self._advance(b) for bid, b in self._batches.items()}

    def __call__(self, request: httpx.Request) -> httpx.Response:
        """Answer one request to a files or batches endpoint."""
        path = request.url.path.removeprefix("/v1")
        parts = [p for p in path.split("/") if p]
        method = request.method
        if parts == ["files"] and method == "POST":
            return self._upload(request)
        if len(parts) == 3 and parts[0] == "files" and parts[2] == "content":
            return self._content(parts[1])
        if parts == ["batches"]:
            return self._create(request) if method == "POST" else self._list(request)
        if len(parts) == 2 and parts[0] == "batches":
            return self._retrieve(parts[1])
        if len(parts) == 3 and parts[0] == "batches" and parts[2] == "cancel":
            return self._cancel(parts[1])
        return _error(404, f"Invalid URL ({method} {request.url.path})")

    # -- files

    def _upload(self, request: httpx.Request) -> httpx.Response:
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
        return httpx.Response(200, json=_file_object(fid, name, purpose, len(content), created))

    def _content(self, fid: str) -> httpx.Response:
        if fid not in self.files:
            return _error(404, f"No such File object: {fid}", param="id")
        return httpx.Response(200, content=self.files[fid][2],
                              headers={"content-type": "application/octet-stream"})

    def _new_file(self, name: str, lines: list[dict[str, Any]]) -> str | None:
        if not lines:
            return None
        content = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
        fid = self._id("file", content)
        self.files[fid] = (name, "batch_output", content, int(self.clock()))
        return fid

    # -- batches

    def _create(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content or b"{}")
        fid = body.get("input_file_id")
        if fid not in self.files:
            return _error(404, f"No such File object: {fid}", param="input_file_id")
        endpoint = body.get("endpoint")
        if endpoint not in ENDPOINTS:
            return _error(400, f"Invalid value for endpoint: {endpoint!r}", param="endpoint")
        if body.get("completion_window") != "24h":
            return _error(400, "Invalid value for completion_window: only '24h' is supported",
                          param="completion_window")
        now = self.clock()
        self.submitted += 1
        bid = self._id("batch", f"{fid}:{self.submitted}".encode())
        lines, errors = _read_lines(self.files[fid][2], endpoint)
        data = _batch_object(bid, body, fid, int(now), len(lines))
        if self.fail_batch or errors:
            messages = [self.fail_batch] if self.fail_batch else errors
            data.update(status="failed", failed_at=int(now), errors={"object": "list", "data": [
                {"code": "invalid_request", "message": m, "param": None, "line": None}
                for m in messages]})
        self._batches[bid] = _Batch(data, lines, now)
        return httpx.Response(200, json=data)

    def _retrieve(self, bid: str) -> httpx.Response:
        if bid not in self._batches:
            return _error(404, f"No batch found with id '{bid}'.", param="batch_id")
        self.retrieves += 1
        return httpx.Response(200, json=self._advance(self._batches[bid]))

    def _cancel(self, bid: str) -> httpx.Response:
        if bid not in self._batches:
            return _error(404, f"No batch found with id '{bid}'.", param="batch_id")
        batch = self._batches[bid]
        data = self._advance(batch)
        if data["status"] in ("completed", "failed", "expired", "cancelled"):
            return _error(409, f"Cannot cancel a batch with status '{data['status']}'.")
        self.cancelled += 1
        data.update(status="cancelling", cancelling_at=int(self.clock()))
        return httpx.Response(200, json=data)

    def _list(self, request: httpx.Request) -> httpx.Response:
        limit = int(request.url.params.get("limit") or 20)
        after = request.url.params.get("after")
        ordered = list(reversed(self._batches))  # newest first
        start = ordered.index(after) + 1 if after in ordered else 0
        page = ordered[start:start + limit]
        data = [self._advance(self._batches[bid]) for bid in page]
        return httpx.Response(200, json={
            "object": "list", "data": data, "first_id": page[0] if page else None,
            "last_id": page[-1] if page else None,
            "has_more": start + limit < len(ordered)})

    # -- time passing

    def _advance(self, batch: _Batch) -> dict[str, Any]:
        """Bring ``batch`` to where it is now: lines done, status, result files."""
        data = batch.data
        if data["status"] in ("completed", "failed", "expired", "cancelled"):
            return data
        now = self.clock()
        age = now - batch.created
        self._answer(batch, self._due(batch, age))
        expired = self.expire_after is not None and age >= self.expire_after
        if data["status"] == "cancelling":
            self._finish(batch, "cancelled", now)
        elif len(batch.done) + len(batch.failed) == len(batch.lines):
            self._finish(batch, "completed", now)
        elif expired:
            for line in batch.lines:
                if line["custom_id"] not in batch.done and line["custom_id"] not in batch.failed:
                    batch.failed[line["custom_id"]] = _result(line["custom_id"], None, _EXPIRED)
            self._finish(batch, "expired", now)
        else:
            data.update(status="in_progress", in_progress_at=data["in_progress_at"] or int(now))
        return data

    def _due(self, batch: _Batch, age: float) -> int:
        """How many lines are done ``age`` seconds after creation."""
        total = len(batch.lines)
        if self.complete_after <= 0 or age >= self.complete_after:
            return total
        return math.floor(total * age / self.complete_after) if self.progress else 0

    def _answer(self, batch: _Batch, count: int) -> None:
        for line in batch.lines[:count]:
            cid = line["custom_id"]
            if cid in batch.done or cid in batch.failed:
                continue
            failure = self.fail_lines(cid, line["body"]) if self.fail_lines else None
            if failure is not None:
                status, body = failure
                batch.failed[cid] = _result(cid, {"status_code": status, "request_id":
                                                  _hex("req", cid), "body": dict(body)}, None)
                continue
            request = httpx.Request("POST", f"http://batch{line['url']}",
                                    content=json.dumps(line["body"]).encode())
            reply = self.fake(request)
            response = {"status_code": reply.status_code,
                        "request_id": reply.headers.get("x-request-id"), "body": reply.json()}
            (batch.done if reply.status_code == 200 else batch.failed)[cid] = _result(
                cid, response, None)

    def _finish(self, batch: _Batch, status: str, now: float) -> None:
        data, bid = batch.data, batch.data["id"]
        data["status"] = status
        data[f"{status}_at"] = int(now)
        if status in ("completed", "expired", "cancelled"):
            data["finalizing_at"] = int(now)
        data["output_file_id"] = self._new_file(f"{bid}_output.jsonl", list(batch.done.values()))
        data["error_file_id"] = self._new_file(f"{bid}_error.jsonl", list(batch.failed.values()))
        data["request_counts"] = {"total": len(batch.lines), "completed": len(batch.done),
                                  "failed": len(batch.failed)}

    def _id(self, prefix: str, content: bytes) -> str:
        digest = hashlib.sha256(content + str(len(self.files) + len(self._batches)).encode())
        return f"{prefix}-{digest.hexdigest()[:24]}" if prefix == "file" else \
            f"batch_{digest.hexdigest()[:24]}"


def multipart_fields(content: bytes) -> dict[str, str | tuple[str, bytes]]:
    """The fields of a ``multipart/form-data`` body: name -> text, or (filename, bytes) for a
    file. The boundary is read from the body's first line."""
    first, _, _ = content.partition(b"\r\n")
    if not first.startswith(b"--"):
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


def _read_lines(content: bytes, endpoint: str) -> tuple[list[dict[str, Any]], list[str]]:
    """The input file's request lines and what is wrong with them, as the API checks."""
    lines: list[dict[str, Any]] = []
    errors: list[str] = []
    seen: set[str] = set()
    for n, text in enumerate(content.decode(errors="replace").splitlines(), 1):
        if not text.strip():
            continue
        try:
            line = json.loads(text)
        except json.JSONDecodeError:
            errors.append(f"Line {n}: invalid JSON")
            continue
        cid = line.get("custom_id") if isinstance(line, dict) else None
        if not isinstance(cid, str) or not cid:
            errors.append(f"Line {n}: missing custom_id")
        elif cid in seen:
            errors.append(f"Line {n}: duplicate custom_id {cid!r}")
        elif line.get("url") != endpoint:
            errors.append(f"Line {n}: url {line.get('url')!r} does not match the batch's "
                          f"endpoint {endpoint!r}")
        else:
            seen.add(cid)
            lines.append(line)
    return lines, errors


def _result(cid: str, response: dict[str, Any] | None,
            error: Mapping[str, Any] | None) -> dict[str, Any]:
    return {"id": _hex("batch_req", cid), "custom_id": cid, "response": response,
            "error": dict(error) if error else None}


def _hex(prefix: str, text: str) -> str:
    return f"{prefix}_{hashlib.sha256(text.encode()).hexdigest()[:24]}"


def _file_object(fid: str, name: str, purpose: str, size: int, created: int) -> dict[str, Any]:
    return {"id": fid, "object": "file", "bytes": size, "created_at": created,
            "filename": name, "purpose": purpose, "status": "processed",
            "status_details": None, "expires_at": None}


def _batch_object(bid: str, body: Mapping[str, Any], fid: str, now: int,
                  total: int) -> dict[str, Any]:
    return {
        "id": bid, "object": "batch", "endpoint": body["endpoint"], "errors": None,
        "input_file_id": fid, "completion_window": "24h", "status": "validating",
        "output_file_id": None, "error_file_id": None, "created_at": now,
        "in_progress_at": None, "expires_at": now + WINDOW_S, "finalizing_at": None,
        "completed_at": None, "failed_at": None, "expired_at": None, "cancelling_at": None,
        "cancelled_at": None,
        "request_counts": {"total": total, "completed": 0, "failed": 0},
        "metadata": dict(body.get("metadata") or {}),
    }


def _error(status: int, message: str, param: str | None = None) -> httpx.Response:
    kind = {404: "invalid_request_error", 409: "conflict_error"}.get(
        status, "invalid_request_error")
    return httpx.Response(status, json={"error": {"message": message, "type": kind,
                                                  "param": param, "code": None}})
