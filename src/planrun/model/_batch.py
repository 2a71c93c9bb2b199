"""Batch mode: a run's model calls sent as OpenAI Batch API jobs, billed at half price.

A :class:`Batcher` gathers the calls of ready tasks (by count and by time), uploads them as
a JSON Lines file (``POST /v1/files``, purpose ``batch``), submits a batch
(``POST /v1/batches``), polls it and hands each line back to the call that is waiting for
it, matched by ``custom_id``. A line's error is raised in the call like a live request's,
so the failure policy is the same. It decides nothing about time: before gathering a call
and at every poll it asks the run whether the waiting calls must go live now to meet the
deadline (:func:`planrun.core.scheduling.batch_take_back`); when told so, and when a batch
fails or expires, it cancels, keeps the lines that came back and sends the rest live.

Durable: before a batch is submitted its key (``<run id>-b<n>``, also sent as the batch's
``metadata.planrun_batch``) is written to the run's ledger with the lines it holds
(:class:`BatchJournal`); a resumed run finds the batch again by its id, or by that key
among the batches created since, and waits for its lines instead of submitting them twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Protocol

import httpx2
import openai

from planrun.core import PermanentError, UsageError
from planrun.model._usage import BATCH_PRICE

if TYPE_CHECKING:
    from planrun.core import TaskContext
    from planrun.model._transport import Transport

__all__ = ["BATCH_PRICE", "BatchJournal", "Batcher", "Batching", "Recorded", "TakenBack",
           "custom_id", "parsed_line"]

log = logging.getLogger("planrun.model")

_DONE = frozenset({"completed", "expired", "cancelled", "failed"})
_ASK_EVERY_S = 0.5
"""How often a new call asks the deadline rule (a poll always asks)."""
_FOUND_PAGES = 20
"""At most this many pages of ``GET /v1/batches`` are read to find a batch by its key."""
_LOOK_AGAIN_S = 5.0
"""After a lost answer to a batch's creation, the batch is looked for again this long after
the first look (at most; never longer than a poll)."""


@dataclass(frozen=True)
class Batching:
    """How a run sends its tasks' model calls through the Batch API.

    Args:
        size: lines per batch at most (the API takes up to 50,000).
        wait_s: a batch is submitted this long after its first call (or when full).
        poll_s: seconds between reads of a batch's status.
        window: the batch's ``completion_window``.
        live_s: about how long one live call takes; with ``slots`` calls at once, it tells
            the deadline rule how long the waiting calls need live.
        cancel_s: how long a cancelled batch is waited for to hand back the lines it
            finished; the rule keeps this much more time in hand.
        price: the fraction of the list price a batched call costs (usage and budget).
    """

    size: int = 1000
    wait_s: float = 5.0
    poll_s: float = 30.0
    window: str = "24h"
    live_s: float = 30.0
    cancel_s: float = 60.0
    price: float = BATCH_PRICE

    def __post_init__(self) -> None:
        if isinstance(self.size, bool) or not isinstance(self.size, int) or \
                not 1 <= self.size <= 50_000:
            raise UsageError(f"Batching.size must be a whole number from 1 to 50000, got "
                             f"{self.size!r}")
        for name in ("wait_s", "poll_s", "live_s", "cancel_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise UsageError(f"Batching.{name} must be a number of seconds >= 0, got "
                                 f"{value!r}")
        if self.poll_s <= 0:
            raise UsageError(f"Batching.poll_s must be > 0, got {self.poll_s!r}")
        if not 0 <= self.price <= 1:
            raise UsageError(f"Batching.price must be a fraction from 0 to 1, got "
                             f"{self.price!r}")

    def to_meta(self) -> dict[str, Any]:
        """The settings as a run's meta keeps them, for its resume (:meth:`from_meta`)."""
        return asdict(self)

    @classmethod
    def from_meta(cls, data: Mapping[str, Any]) -> Batching:
        """The settings a run's meta keeps (:meth:`to_meta`; a setting it does not name
        keeps its default)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    @classmethod
    def of(cls, value: Batching | bool | None) -> Batching | None:
        """``True``: the defaults; ``False``/``None``: no batch mode; a Batching as it is."""
        if value is None or value is False:
            return None
        if value is True:
            return cls()
        if isinstance(value, Batching):
            return value
        raise UsageError(f"batch takes True, False or a Batching, got {value!r}")


Recorded = tuple[str, "str | None", Mapping[str, str], float]
"""A batch an earlier process of the run recorded: its key, the API's id if it was
recorded, its lines still waiting (``custom_id`` -> task id) and when it was recorded
(epoch seconds)."""


class BatchJournal(Protocol):
    """Where a run records its batches (the run's ledger: ``planrun.runtime.LedgerJournal``)."""

    async def submitting(self, key: str, lines: Mapping[str, str], at: float) -> None:
        """Record ``key`` and its lines (``custom_id`` -> task id), durably, before the
        batch is submitted."""
        ...

    async def submitted(self, key: str, batch_id: str, lines: Mapping[str, str]) -> None:
        """Record the API's id of the batch ``key``."""
        ...

    def recorded(self) -> tuple[Sequence[Recorded], int]:
        """The batches recorded earlier whose lines are still awaited, and how many batches
        the run recorded in all (keys go on from there)."""
        ...


class TakenBack(Exception):
    """A batched call that is to be sent live (the deadline, a failed or expired batch)."""


@dataclass
class _Line:
    """One call in a batch: its request line and the future its caller waits on."""

    custom_id: str
    task: str
    body: dict[str, Any]
    url: str
    future: asyncio.Future[Any]
    beat: Callable[[], None] | None = None
    late: Callable[[Mapping[str, Any]], None] | None = None
    """Counts the usage of this line if it comes back after the call went live."""


@dataclass
class _Job:
    """A submitted batch and the lines still waiting for it."""

    key: str
    batch_id: str
    lines: dict[str, _Line]
    gone_live: dict[str, _Line] = field(default_factory=dict)
    """Lines whose calls went live while the batch may still do them (billed if it does)."""
    cancel_by: float | None = None
    """Loop time until which a cancelled batch is waited for (None: not cancelled)."""


def custom_id(key: str | None, body: Mapping[str, Any]) -> str:
    """The line's ``custom_id``: the call's idempotency key and a digest of its request,
    so a resumed run's same call finds its line and a changed call does not."""
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
    return f"{key or 'call'}:{digest[:12]}"


class Batcher:
    """Sends a run's model calls as Batch API jobs; see the module's docstring.

    One Batcher serves one run on one event loop. :meth:`bind` connects it to the run (the
    deadline rule, the journal, what an earlier process submitted); :class:`Model` calls
    :meth:`send` for each request when it was made with :meth:`Model.batched`.
    """

    def __init__(self, options: Batching | None = None, *, slots: int | None = None) -> None:
        self.options = options or Batching()
        self.slots = slots
        """Calls that may be live at once (:meth:`live_gate`; None: no bound)."""
        self.run_id = "run"
        self.due: Callable[[int], bool] = lambda waiting: False
        self.journal: BatchJournal | None = None
        self.numbered_from = 0
        """Batches the run recorded before this process (keys go on from there)."""
        self.submitted = 0
        """Batches submitted by this process."""
        self.taken_back = 0
        """Calls sent live after waiting in a batch (deadline, failed or expired batch)."""
        self.late = 0
        """Lines that came back after their call went live (billed all the same)."""
        self._gathering: dict[tuple[str, str], list[_Line]] = {}
        self._timers: dict[tuple[str, str], asyncio.TimerHandle] = {}
        self._jobs: dict[str, _Job] = {}
        self._found: dict[str, asyncio.Future[Any]] = {}
        self._earlier: list[Recorded] | None = None
        self._adopting: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self._gate: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None
        self._asked: tuple[float, bool] | None = None
        self._ids: set[str] = set()
        """The ``custom_id`` of every call gathered or in a batch."""

    def bind(self, run_id: str, *, due: Callable[[int], bool] | None = None,
             journal: BatchJournal | None = None) -> None:
        """Connect to a run: its id, its deadline rule (``due(waiting)`` says whether that
        many waiting calls must go live now) and its journal (the batches an earlier
        process of the run recorded are found again on the first call)."""
        self.run_id = run_id
        if due is not None:
            self.due = due
        self.journal = journal
        self._earlier = None

    def live_gate(self) -> contextlib.AbstractAsyncContextManager[Any]:
        """Held by a call that goes live: at most ``slots`` at once (None: no bound)."""
        if self.slots is None:
            return contextlib.nullcontext()
        loop = asyncio.get_running_loop()
        if self._gate is None or self._gate[0] is not loop:
            self._gate = (loop, asyncio.Semaphore(self.slots))
        return self._gate[1]

    async def aclose(self) -> None:
        """Stop following batches and drop calls still gathering (the run is over)."""
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for lines in self._gathering.values():
            _take_back(lines, "the run is over")
        self._gathering.clear()
        handles = [*self._background, *filter(None, [self._adopting])]
        for handle in handles:
            handle.cancel()
        await asyncio.gather(*handles, return_exceptions=True)
        for job in list(self._jobs.values()):
            _take_back(list(job.lines.values()), "the run is over")
        self._jobs.clear()
        self._ids.clear()

    @property
    def waiting(self) -> int:
        """Calls gathered or in a batch, not yet answered."""
        gathered = sum(len(lines) for lines in self._gathering.values())
        return gathered + sum(len(job.lines) for job in self._jobs.values())

    async def send(self, transport: Transport, body: dict[str, Any], url: str,
                   key: str | None, task: TaskContext | None,
                   late: Callable[[Mapping[str, Any]], None] | None = None) -> Any:
        """Wait for the batch line of this request; return its parsed reply.

        ``task`` (the attempt's context) has its lease renewed at every poll and names the
        task in the journal; ``late`` counts a line that comes back after its call went
        live. Raises :class:`TakenBack` when the call must be sent live, or the API error
        the line carries (an ``openai.APIStatusError``, as a live request raises it)."""
        cid = custom_id(key, body)
        await self._adopt(transport)
        found = self._found.pop(cid, None)
        if found is None:
            if self._hurry(self.waiting + 1):
                raise TakenBack("the deadline leaves no time for a batch")
            cid = self._unique(cid)
            found = self._gather(transport, _Line(
                cid, task.task_id if task else "", body, url,
                asyncio.get_running_loop().create_future(),
                task.heartbeat if task else None, late))
        return _parsed(await found, url, transport.base_url)

    def _hurry(self, waiting: int) -> bool:
        """The run's deadline rule (:attr:`due`), asked at most every half second: it weighs
        the whole run, and a call arrives far more often than its answer changes."""
        now = asyncio.get_running_loop().time()
        if self._asked is None or now - self._asked[0] >= _ASK_EVERY_S or self._asked[1]:
            self._asked = (now, self.due(waiting))
        return self._asked[1]

    def _unique(self, cid: str) -> str:
        """``cid``, or ``cid:<n>`` while an identical call (no key of its own) waits."""
        unique, n = cid, 1
        while unique in self._ids:
            n += 1
            unique = f"{cid}:{n}"
        return unique

    # -- gathering and submitting

    def _gather(self, transport: Transport, line: _Line) -> asyncio.Future[Any]:
        group = (line.url, str(line.body.get("model", "")))
        self._ids.add(line.custom_id)
        lines = self._gathering.setdefault(group, [])
        lines.append(line)
        if len(lines) >= self.options.size:
            self._flush(transport, group)
        elif group not in self._timers:
            loop = asyncio.get_running_loop()
            self._timers[group] = loop.call_later(self.options.wait_s, self._flush, transport,
                                                  group)
        return line.future

    def _flush(self, transport: Transport, group: tuple[str, str]) -> None:
        timer = self._timers.pop(group, None)
        if timer is not None:
            timer.cancel()
        lines = self._gathering.pop(group, [])
        if lines:
            self._run(self._submit(transport, lines))

    def _run(self, coro: Any) -> None:
        handle = asyncio.ensure_future(coro)
        self._background.add(handle)
        handle.add_done_callback(self._background.discard)

    async def _submit(self, transport: Transport, lines: list[_Line]) -> None:
        if self.due(self.waiting):
            self.taken_back += len(lines)
            self._ids.difference_update(line.custom_id for line in lines)
            _take_back(lines, "the deadline leaves no time for a batch")
            return
        self.submitted += 1
        key = f"{self.run_id}-b{self.numbered_from + self.submitted}"
        tasks = {line.custom_id: line.task for line in lines}
        job = _Job(key, "", {line.custom_id: line for line in lines})
        self._jobs[key] = job
        try:
            if self.journal is not None:
                await self.journal.submitting(key, tasks, time.time())
            job.batch_id = await self._created(transport, key, lines)
            if self.journal is not None:
                await self.journal.submitted(key, job.batch_id, tasks)
        except Exception as exc:  # nothing was submitted, or we cannot tell: go live
            log.warning("batch %s could not be submitted (%s); its %d calls go live", key,
                        _short(exc), len(lines))
            self._give_up(job)
            return
        log.info("batch %s submitted as %s with %d calls", key, job.batch_id, len(lines))
        await self._follow(transport, job)

    async def _created(self, transport: Transport, key: str, lines: Sequence[_Line]) -> str:
        """Submit the batch; its id. When the answer is lost (a timeout, a dropped
        connection, a 5xx) the API may have created it anyway: it is looked for by its key
        (now and once more a moment later) before its calls go live, so they are not paid
        for twice."""
        at = time.time()
        try:
            return await _create(transport, key, lines, self.options.window)
        except (openai.APIConnectionError, openai.InternalServerError):
            client = await transport.client()
            for pause in (0.0, min(self.options.poll_s, _LOOK_AGAIN_S)):
                await asyncio.sleep(pause)
                found = await _find(client, key, at)
                if found is not None:
                    log.info("batch %s: its creation's answer was lost; found as %s", key,
                             found)
                    return found
            raise

    # -- following a batch

    async def _follow(self, transport: Transport, job: _Job) -> None:
        """:meth:`_poll` the batch; whatever goes wrong there, its calls go live."""
        try:
            await self._poll(transport, job)
        except Exception as exc:
            log.warning("following batch %s failed (%s); its calls go live", job.batch_id,
                        _short(exc))
            self._give_up(job)

    async def _poll(self, transport: Transport, job: _Job) -> None:
        """Poll the batch until it is over; hand each line to its call."""
        client = await transport.client()
        loop = asyncio.get_running_loop()
        failures = 0
        while True:
            await asyncio.sleep(self.options.poll_s if job.cancel_by is None
                                else min(self.options.poll_s, 1.0))
            try:
                batch = await client.batches.retrieve(job.batch_id)
            except Exception as exc:
                failures += 1
                log.warning("reading batch %s failed (%s)", job.batch_id, _short(exc))
                if failures < 5:
                    continue
                self._give_up(job)
                return
            failures = 0
            for line in job.lines.values():
                if line.beat is not None:
                    line.beat()
            if batch.status in _DONE:
                await self._collect(client, job, batch)
                self._give_up(job)
                return
            if job.cancel_by is None and job.lines and self.due(self.waiting):
                job.cancel_by = loop.time() + self.options.cancel_s
                await self._cancel(client, job)
            elif job.cancel_by is not None and loop.time() >= job.cancel_by and job.lines:
                self._give_up(job, keep=True)  # go live; late lines are still counted

    async def _cancel(self, client: openai.AsyncOpenAI, job: _Job) -> None:
        log.info("the deadline is near: cancelling batch %s; calls it has not done go live",
                 job.batch_id)
        try:
            await client.batches.cancel(job.batch_id)
        except Exception as exc:
            log.warning("cancelling batch %s failed (%s); its calls go live", job.batch_id,
                        _short(exc))
            self._give_up(job, keep=True)

    async def _collect(self, client: openai.AsyncOpenAI, job: _Job, batch: Any) -> None:
        """Read the output and error files of a finished batch; answer the lines in them."""
        for file_id in (batch.output_file_id, batch.error_file_id):
            if not file_id:
                continue
            try:
                content = await client.files.content(file_id)
            except Exception as exc:
                log.warning("reading file %s of batch %s failed (%s)", file_id,
                            job.batch_id, _short(exc))
                continue
            for text in content.text.splitlines():
                try:
                    result = json.loads(text) if text.strip() else None
                except json.JSONDecodeError:  # its call goes live with the batch's end
                    log.warning("batch %s: a line of file %s is not JSON", job.batch_id,
                                file_id)
                    continue
                if isinstance(result, dict):
                    self._answer(job, result)

    def _answer(self, job: _Job, result: Mapping[str, Any]) -> None:
        cid = str(result.get("custom_id"))
        line = job.lines.pop(cid, None)
        self._ids.discard(cid)
        if line is not None:
            if not line.future.done():
                line.future.set_result(result)
            return
        gone = job.gone_live.pop(cid, None)
        if gone is not None and (result.get("response") or {}).get("status_code") == 200:
            self.late += 1
            if gone.late is not None:
                gone.late(result)

    def _give_up(self, job: _Job, keep: bool = False) -> None:
        """The lines still waiting go live; with ``keep`` the batch is still followed, and
        a line that comes back later is counted (it is billed)."""
        self._ids.difference_update(job.lines)
        if job.lines:
            self.taken_back += len(job.lines)
            _take_back(list(job.lines.values()), f"batch {job.batch_id or job.key} is over")
            if keep:
                job.gone_live.update(job.lines)
            job.lines.clear()
        if not keep:
            self._jobs.pop(job.key, None)

    # -- resuming

    async def _adopt(self, transport: Transport) -> None:
        """Find the batches an earlier process submitted (once, on the first call)."""
        if self._earlier is None:
            earlier, self.numbered_from = (self.journal.recorded() if self.journal is not None
                                           else ((), 0))
            self._earlier = list(earlier)
        if not self._earlier and self._adopting is None:
            return
        if self._adopting is None:
            self._adopting = asyncio.ensure_future(self._find_all(transport))
        await asyncio.shield(self._adopting)

    async def _find_all(self, transport: Transport) -> None:
        earlier, self._earlier = self._earlier or [], []
        client = await transport.client()
        loop = asyncio.get_running_loop()
        for key, recorded_id, waiting, at in earlier:
            try:
                batch_id = recorded_id or await _find(client, key, at)
            except Exception as exc:
                log.warning("looking for batch %s failed (%s); its calls are sent again",
                            key, _short(exc))
                continue
            if batch_id is None:
                log.info("batch %s was never submitted; its calls are sent again", key)
                continue
            lines = {cid: _Line(cid, task, {}, "", loop.create_future())
                     for cid, task in waiting.items()}
            job = _Job(key, batch_id, lines)
            self._jobs[key] = job
            self._found.update({cid: line.future for cid, line in lines.items()})
            log.info("batch %s (%s) found again: waiting for its %d lines", key, batch_id,
                     len(lines))
            self._run(self._follow(transport, job))


async def _create(transport: Transport, key: str, lines: Sequence[_Line],
                  window: str) -> str:
    """Upload the lines and submit the batch; return its id."""
    client = await transport.client()
    data = b"".join(
        json.dumps({"custom_id": line.custom_id, "method": "POST", "url": line.url,
                    "body": line.body}, separators=(",", ":")).encode() + b"\n"
        for line in lines)
    uploaded = await client.files.create(file=(f"{key}.jsonl", data, "application/jsonl"),
                                         purpose="batch")
    batch = await client.batches.create(
        input_file_id=uploaded.id, endpoint=lines[0].url,  # type: ignore[arg-type]
        completion_window=window,  # type: ignore[arg-type]
        metadata={"planrun_batch": key})
    return batch.id


async def _find(client: openai.AsyncOpenAI, key: str, at: float) -> str | None:
    """The id of the batch whose ``metadata.planrun_batch`` is ``key``, among those created
    since it was recorded at ``at`` (the API lists the newest first), or None."""
    after: str | None = None
    for _ in range(_FOUND_PAGES):
        page = await (client.batches.list(limit=100, after=after) if after
                      else client.batches.list(limit=100))
        for batch in page.data:
            if (batch.metadata or {}).get("planrun_batch") == key:
                return batch.id
            if batch.created_at < at - 60:
                return None
        if not page.has_more or not page.data:
            return None
        after = page.data[-1].id
    return None


def parsed_line(body: Mapping[str, Any], url: str) -> Any:
    """A line's reply body as the SDK's object for ``url``'s endpoint, built the way the
    SDK builds a live reply (leniently: a field the API adds or leaves out is no error)."""
    responses = url.endswith("/responses")
    if not isinstance(body.get("output" if responses else "choices"), list):
        what = "response" if responses else "chat completion"
        raise PermanentError(f"a batch line's body is not a {what}: {str(body)[:200]!r}")
    if responses:
        return openai.types.responses.Response.model_construct(**body)
    return openai.types.chat.ChatCompletion.model_construct(**body)


def _take_back(lines: Sequence[_Line], why: str) -> None:
    for line in lines:
        if not line.future.done():
            line.future.set_exception(TakenBack(why))


def _parsed(result: Mapping[str, Any], url: str, base_url: str) -> Any:
    """A line as the SDK would have returned the live request: the parsed reply, or the
    ``APIStatusError`` of its error raised."""
    response = result.get("response") or {}
    status = int(response.get("status_code") or 0)
    body = response.get("body")
    if status == 200 and isinstance(body, dict):
        parsed = parsed_line(body, url)
        parsed._request_id = response.get("request_id")
        return parsed
    error = result.get("error") or (body or {}).get("error") or {}
    message = str(error.get("message") or f"batch line failed with status {status}")
    code = str(error.get("code") or "")
    if not status:  # a line the batch never did (expired, cancelled): ask again live
        raise TakenBack(f"batch line {result.get('custom_id')} not done ({code or message})")
    request = httpx2.Request("POST", base_url.rstrip("/") + url.removeprefix("/v1"))
    reply = httpx2.Response(status, request=request,
                           json=body if isinstance(body, dict) else {"error": error})
    raise _status_error(message, reply, body)


def _status_error(message: str, response: httpx2.Response, body: object) -> openai.APIError:
    """The SDK's error class for ``response``'s status, as the live request would raise."""
    kinds: dict[int, type[openai.APIStatusError]] = {
        400: openai.BadRequestError, 401: openai.AuthenticationError,
        403: openai.PermissionDeniedError, 404: openai.NotFoundError,
        409: openai.ConflictError, 422: openai.UnprocessableEntityError,
        429: openai.RateLimitError}
    status = response.status_code
    kind = kinds.get(status, openai.InternalServerError if status >= 500
                     else openai.APIStatusError)
    return kind(message, response=response, body=body)


def _short(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:200]
