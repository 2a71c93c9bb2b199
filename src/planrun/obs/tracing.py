"""OpenTelemetry spans and metrics for runs, task attempts, model calls and decomposition.

Install the extra (``pip install "planrun[otel]"``) and configure a tracer provider, either
the global one (``opentelemetry.trace.set_tracer_provider``) or planrun's own with
:func:`instrument`. With neither, or without the extra, every hook here is a no-op that
returns at once: nothing is allocated per event.

The span tree of a run::

    run <run id>                         planrun.run.id, planrun.run.status
    ├── decompose                        planrun.decompose.attempts / .repairs / .code_repairs;
    │   │                                a ``plan.problem`` event per problem code, a
    │   │                                ``plan.repaired`` event per code repair
    │   └── chat gpt-4o-mini             GenAI semantic conventions (below)
    └── task <kind>                      one per attempt: planrun.task.id, .kind, .attempt,
        └── chat gpt-4o-mini             planrun.worker, planrun.task.status, error.type

Run and attempt spans are built from the ledger's event stream (:class:`RunTracer` is an
``on_event`` observer; spans carry the events' own timestamps), so the supervisor knows
nothing of tracing. A model call span follows the GenAI conventions: its name is
``{gen_ai.operation.name} {gen_ai.request.model}``, with ``gen_ai.provider.name``,
``gen_ai.request.model``, ``gen_ai.response.model``, ``gen_ai.response.id``,
``gen_ai.response.finish_reasons`` and ``gen_ai.usage.input_tokens``/``output_tokens``. It
covers one logical call, retries included, as the conventions ask. Prompt and completion
text (``gen_ai.input.messages``/``gen_ai.output.messages``) are recorded only when asked for,
by ``instrument(capture_content=True)`` or ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT
=true``, and are redacted: no API key reaches an attribute.

The run's W3C trace context is stored in the run's meta (``meta["trace"]``), so a worker
process on DBOS (:class:`~planrun.runtime.DBOSWorker`) opens its attempt spans in the run's
trace and a resumed run joins the trace of the run it carries on.

Metrics (instrument names): ``planrun.tasks`` (tasks by ``planrun.task.status``),
``planrun.worker.active`` (attempts running per ``planrun.worker``),
``planrun.tasks.oldest_unfinished_age`` (seconds), ``gen_ai.client.token.usage`` (by
``gen_ai.token.type``), ``gen_ai.client.operation.duration`` and ``planrun.cost`` (USD).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import time
import weakref
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

try:
    from opentelemetry import context as otel_context
    from opentelemetry import metrics as otel_metrics
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    AVAILABLE = True
    """True when the ``otel`` extra (opentelemetry-api) is installed."""
except ImportError:  # pragma: no cover - exercised only without the extra
    AVAILABLE = False

from planrun.core import FINAL, Status

if TYPE_CHECKING:
    from planrun.core import Event, Plan, Problem, RunResult, Task

__all__ = [
    "AVAILABLE",
    "RunTracer",
    "enabled",
    "instrument",
    "trace_meta",
    "uninstrument",
]


class _Clock(Protocol):
    """What a tracer reads of a run's clock (a :class:`planrun.runtime.Clock`)."""

    def now(self) -> float: ...


SCOPE = "planrun"
CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
TRACE_KEY = "trace"
"""The key of the run's meta that holds its W3C trace context."""

_KEY_PATTERN = re.compile(r"\bsk-[A-Za-z0-9_\-*]{6,}")
_ENDED = ("completed", "failed", "dead", "reclaimed", "cancelled", "waiting")
"""Events that end an open attempt span (``waiting``: the attempt ran; its effect waits)."""
T = TypeVar("T")


@dataclass
class _Config:
    tracer_provider: Any = None
    meter_provider: Any = None
    capture_content: bool | None = None


_config = _Config()
_instruments: dict[int, _Instruments] = {}
_live: weakref.WeakSet[RunTracer] = weakref.WeakSet()


def instrument(
    *,
    tracer_provider: Any = None,
    meter_provider: Any = None,
    capture_content: bool | None = None,
) -> None:
    """Send planrun's spans and metrics to these providers (default: the global ones).

    ``capture_content`` records prompt and completion text on model call spans (redacted);
    ``None`` reads ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``.
    """
    _config.tracer_provider = tracer_provider
    _config.meter_provider = meter_provider
    _config.capture_content = capture_content


def uninstrument() -> None:
    """Forget what :func:`instrument` set: back to the global providers, if any."""
    instrument()


def enabled() -> bool:
    """True when spans would go somewhere: the extra is installed and a provider is set."""
    if not AVAILABLE:
        return False
    if _config.tracer_provider is not None:
        return True
    provider = trace.get_tracer_provider()
    return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)


def _tracer() -> Any:
    provider = _config.tracer_provider or trace.get_tracer_provider()
    return provider.get_tracer(SCOPE, _version())


@functools.cache
def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("planrun")
    except metadata.PackageNotFoundError:  # pragma: no cover - a source tree
        return "0.0.0"


def _capture() -> bool:
    if _config.capture_content is not None:
        return _config.capture_content
    return os.environ.get(CONTENT_ENV, "").strip().lower() in ("1", "true", "yes")


def redact(text: str, secrets: Sequence[str] = ()) -> str:
    """``text`` without any of ``secrets`` and without anything shaped like an API key."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "[redacted]")
    return _KEY_PATTERN.sub("sk-[redacted]", text)


# ---- metrics ----------------------------------------------------------------------------------


class _Instruments:
    """The instruments of one meter provider, made once."""

    def __init__(self, provider: Any) -> None:
        meter = provider.get_meter(SCOPE, _version())
        # Counted in process and observed at collection time: an event costs a dict update.
        meter.create_observable_up_down_counter(
            "planrun.tasks", callbacks=[_tasks_by_status], unit="{task}",
            description="Tasks of the runs in progress, by status")
        meter.create_observable_up_down_counter(
            "planrun.worker.active", callbacks=[_active_per_worker], unit="{task}",
            description="Attempts running per worker")
        self.tokens = meter.create_histogram(
            "gen_ai.client.token.usage", unit="{token}",
            description="Tokens used per model call, by gen_ai.token.type")
        self.duration = meter.create_histogram(
            "gen_ai.client.operation.duration", unit="s",
            description="Duration of one model call, retries included")
        self.cost = meter.create_counter(
            "planrun.cost", unit="USD", description="Cost of model calls")
        meter.create_observable_gauge(
            "planrun.tasks.oldest_unfinished_age", callbacks=[_oldest_unfinished], unit="s",
            description="Age of the oldest task of a run that has not finished")


def _meters() -> _Instruments:
    provider = _config.meter_provider or otel_metrics.get_meter_provider()
    found = _instruments.get(id(provider))
    if found is None:
        found = _instruments[id(provider)] = _Instruments(provider)
    return found


def _tasks_by_status(_options: Any) -> Iterator[Any]:
    for tracer in list(_live):
        for status, count in tracer.counts().items():
            yield otel_metrics.Observation(count, {"planrun.run.id": tracer.run_id,
                                                   "planrun.task.status": status})


_worker_active: Counter[str] = Counter()
"""Attempts running in this process per worker name (worker processes and runs alike)."""


def _active_per_worker(_options: Any) -> Iterator[Any]:
    for worker, count in list(_worker_active.items()):
        yield otel_metrics.Observation(count, {"planrun.worker": worker})


def _oldest_unfinished(_options: Any) -> Iterator[Any]:
    for tracer in list(_live):
        age = tracer.oldest_unfinished_age()
        if age is not None:
            yield otel_metrics.Observation(age, {"planrun.run.id": tracer.run_id})


# ---- runs and task attempts -----------------------------------------------------------------


def trace_meta(context: Any = None) -> dict[str, Any]:
    """The W3C trace context of the current span (or of ``context``), for a run's meta.

    Empty when tracing is off. A run started inside a span of the caller's passes it as
    ``meta=trace_meta()`` so the run and its worker processes join that trace.
    """
    if not enabled():
        return {}
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, context=context)
    return {TRACE_KEY: carrier} if carrier else {}


def _extract(meta: Mapping[str, Any] | None) -> Any:
    carrier = (meta or {}).get(TRACE_KEY)
    if not isinstance(carrier, Mapping):
        return None
    return TraceContextTextMapPropagator().extract({str(k): str(v) for k, v in carrier.items()})


class RunTracer:
    """An ``on_event`` observer that turns a run's ledger events into spans and metrics.

    The run span is opened by :meth:`start` (a child of ``parent`` context, or of the
    current span) and ended by :meth:`finish`; each ``started`` event opens an attempt span
    that the attempt's end event (``completed``, ``failed``, ``dead``, ``reclaimed``,
    ``cancelled``) closes, both at the events' own times. ``progress`` is called with every
    event after it is recorded, so the observer can stand where a user callback stood.
    """

    def __init__(
        self,
        run_id: str,
        *,
        clock: _Clock | None = None,
        goal: str = "",
        parent: Any = None,
        resumed: bool = False,
        progress: Callable[[Event, Task], None] | None = None,
    ) -> None:
        self.run_id = run_id
        self.goal = goal
        self.progress = progress
        self._clock = clock
        self._offset = time.time() - clock.now() if clock is not None else 0.0
        self._parent = parent
        self._resumed = resumed
        self._tracer = _tracer()
        self._meters = _meters()
        self._span: Any = None
        self._context: Any = None
        self._open: dict[str, Any] = {}
        self._status: dict[str, str] = {}
        self._unfinished: dict[str, float] = {}
        self._counts: Counter[str] = Counter()
        self._result_status: str | None = None

    def _ns(self, at: float) -> int:
        return int((at + self._offset) * 1e9)

    def _now(self) -> float:
        return self._clock.now() if self._clock is not None else time.time()

    def start(self) -> None:
        """Open the run span (its context is what the run's meta stores)."""
        attributes: dict[str, Any] = {"planrun.run.id": self.run_id}
        if self._resumed:
            attributes["planrun.run.resumed"] = True
        if self.goal and _capture():
            attributes["planrun.goal"] = redact(self.goal)
        self._span = self._tracer.start_span(
            f"run {self.run_id}", context=self._parent, attributes=attributes,
            start_time=max(time.time_ns(), self._ns(self._now())))
        self._context = trace.set_span_in_context(self._span, self._parent)
        _live.add(self)

    @property
    def context(self) -> Any:
        """The OpenTelemetry context with the run span current."""
        return self._context

    @property
    def meta(self) -> dict[str, Any]:
        """The run's trace context, to store in its meta."""
        return trace_meta(self._context)

    def on_event(self, event: Event, task: Task) -> None:
        """Record one ledger event (the supervisor's ``on_event`` signature)."""
        self._count(task)
        name = event.event
        if name == "started":
            self._open_attempt(event, task)
        elif name in _ENDED and task.id in self._open:
            self._close_attempt(event, task)
        elif name in ("cancelled", "dead", "rejected", "reclaimed", "waiting", "approved") \
                and self._span is not None:
            self._span.add_event(f"task {name}", {"planrun.task.id": task.id,
                                                  "planrun.task.kind": task.kind},
                                 timestamp=self._ns(event.at))
        if self.progress is not None:
            self.progress(event, task)

    def _count(self, task: Task) -> None:
        status = task.status.value
        before = self._status.get(task.id)
        if before == status:
            return
        if before is not None:
            self._counts[before] -= 1
        self._counts[status] += 1
        self._status[task.id] = status
        if task.status in FINAL or task.status is Status.WAITING:
            self._unfinished.pop(task.id, None)  # a wait for a person is not an alarming age
        else:
            self._unfinished.setdefault(task.id, task.created_at or self._now())

    def _open_attempt(self, event: Event, task: Task) -> None:
        worker = event.worker or task.assigned_to or ""
        span = self._tracer.start_span(
            f"task {task.kind}", context=self._context, start_time=self._ns(event.at),
            attributes={
                "planrun.run.id": self.run_id,
                "planrun.task.id": task.id,
                "planrun.task.kind": task.kind,
                "planrun.task.attempt": task.attempts + 1,
                "planrun.task.token": event.attempt,
                "planrun.worker": worker,
            })
        self._open[task.id] = (span, worker)
        _worker_active[worker] += 1
        # The supervisor starts the attempt's coroutine right after this event, in this
        # context: making the span current here makes it the parent of the attempt's
        # model calls. RunTracer.run keeps this from leaking out of the run.
        otel_context.attach(trace.set_span_in_context(span, self._context))

    def _close_attempt(self, event: Event, task: Task) -> None:
        span, worker = self._open.pop(task.id)
        _worker_active[worker] -= 1
        _outcome(span, event.event, task)
        span.end(end_time=self._ns(event.at))

    async def run(self, work: Awaitable[T]) -> T:
        """Await the run in a task of its own with the run span current; what the attempt
        spans make current stays inside it."""
        import asyncio

        async def inside() -> T:
            otel_context.attach(self._context)
            return await work

        return await asyncio.ensure_future(inside())

    def set_result(self, result: RunResult) -> None:
        """Put the run's outcome on the run span."""
        if self._span is None:
            return
        self._result_status = "aborted" if result.aborted_by else "finished"
        for status, count in result.counts.items():
            self._span.set_attribute(f"planrun.run.tasks.{status}", count)
        if result.budget_exhausted:
            self._span.set_attribute("planrun.run.budget_exhausted", True)

    def finish(self, status: str, error: BaseException | None = None) -> None:
        """End the attempt spans still open and the run span."""
        at = self._now()
        for task_id in list(self._open):
            span, worker = self._open.pop(task_id)
            _worker_active[worker] -= 1
            span.set_attribute("planrun.task.status", "unfinished")
            span.end(end_time=self._ns(at))
        self._status.clear()
        self._unfinished.clear()
        _live.discard(self)
        if self._span is None:
            return
        self._span.set_attribute("planrun.run.status", self._result_status or status)
        if error is not None:  # no stack trace: its text could quote what the message did
            _error(self._span, error, ())
        self._span.end(end_time=max(time.time_ns(), self._ns(at)))

    def counts(self) -> dict[str, int]:
        """Tasks of this run by status, as the events so far tell."""
        return {status: n for status, n in self._counts.items() if n}

    def oldest_unfinished_age(self) -> float | None:
        """Seconds since the oldest unfinished task was created, or None."""
        if not self._unfinished:
            return None
        return max(0.0, self._now() - min(self._unfinished.values()))


def _outcome(span: Any, name: str, task: Task) -> None:
    span.set_attribute("planrun.task.status", name)
    if name in ("completed", "waiting"):  # waiting: the attempt succeeded, its effect waits
        span.set_status(trace.StatusCode.OK)
        return
    if task.error:
        error_type = task.error.split(":", 1)[0].strip()
        span.set_attribute("error.type", error_type)
        span.set_status(trace.StatusCode.ERROR, error_type)
    if task.error_class is not None:
        span.set_attribute("planrun.error.class", str(task.error_class))
    if task.cause:
        span.set_attribute("planrun.task.cause", redact(task.cause))


@contextlib.contextmanager
def traced_run(
    run_id: str,
    *,
    clock: _Clock | None = None,
    goal: str = "",
    meta: Mapping[str, Any] | None = None,
    progress: Callable[[Event, Task], None] | None = None,
) -> Iterator[RunTracer | None]:
    """A run span around the body, or None when tracing is off.

    ``meta`` is a stored run's meta: the new span joins the trace it names (a resume).
    """
    if not enabled():
        yield None
        return
    parent = _extract(meta)
    tracer = RunTracer(run_id, clock=clock, goal=goal, parent=parent,
                       resumed=parent is not None, progress=progress)
    tracer.start()
    token = otel_context.attach(tracer.context)
    status, error = "finished", None
    try:
        yield tracer
    except BaseException as exc:
        status, error = "failed", exc
        raise
    finally:
        otel_context.detach(token)
        tracer.finish(status, error)


# ---- worker processes ---------------------------------------------------------------------------


_run_contexts: dict[tuple[int, str], Any] = {}


async def worker_attempt(
    work: Awaitable[None], store: Any, run_id: str, task: Task, worker: str
) -> None:
    """Await one attempt of a worker process inside an attempt span in the run's trace."""
    if not enabled():
        await work
        return
    key = (id(store), run_id)
    if key not in _run_contexts:
        state = await store.load_tasks(run_id)
        _run_contexts[key] = _extract(state.run.meta)
    _meters()
    attributes = {"planrun.run.id": run_id, "planrun.task.id": task.id,
                  "planrun.task.kind": task.kind, "planrun.task.attempt": task.attempts + 1,
                  "planrun.task.token": task.token, "planrun.worker": worker}
    _worker_active[worker] += 1
    try:
        with _tracer().start_as_current_span(f"task {task.kind}", context=_run_contexts[key],
                                             attributes=attributes):
            await work
    finally:
        _worker_active[worker] -= 1


def attempt_outcome(outcome: Task, name: str) -> None:
    """Record an attempt's outcome on the current attempt span (a worker process's)."""
    if not enabled():
        return
    span = trace.get_current_span()
    if span.is_recording():
        _outcome(span, name, outcome)


# ---- model calls ---------------------------------------------------------------------------


class _NullCall:
    """What :func:`model_call` yields when tracing is off."""

    def done(self, completion: T) -> T:
        return completion


_NULL_CALL = _NullCall()


class _ModelCall(_NullCall):
    def __init__(self, span: Any, request_model: str, secrets: Sequence[str]) -> None:
        self.span = span
        self.request_model = request_model
        self.secrets = secrets
        self.started = time.monotonic()

    def done(self, completion: T) -> T:
        c: Any = completion
        usage = c.usage
        span = self.span
        span.set_attribute("gen_ai.response.model", c.model or self.request_model)
        span.set_attribute("gen_ai.response.finish_reasons", [c.finish_reason])
        if c.request_id:
            span.set_attribute("gen_ai.response.id", c.request_id)
        span.set_attribute("gen_ai.usage.input_tokens", usage.prompt_tokens)
        span.set_attribute("gen_ai.usage.output_tokens", usage.completion_tokens)
        span.set_attribute("planrun.model.attempts", c.attempts)
        span.set_attribute("planrun.cost_usd", float(usage.cost_usd))
        span.set_attribute("openai.response.service_tier", usage.tier)
        if usage.cached_tokens:
            span.set_attribute("gen_ai.usage.cache_read.input_tokens", usage.cached_tokens)
        if c.prompt_hash:
            span.set_attribute("planrun.prompt.hash", c.prompt_hash)
        if _capture():
            output = [{"role": "assistant", "parts": [{"type": "text", "content": c.text}],
                       "finish_reason": c.finish_reason}]
            span.set_attribute("gen_ai.output.messages",
                               redact(json.dumps(output), self.secrets))
        base = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai",
                "gen_ai.request.model": self.request_model,
                "gen_ai.response.model": c.model or self.request_model}
        meters = _meters()
        meters.tokens.record(usage.prompt_tokens, {**base, "gen_ai.token.type": "input"})
        meters.tokens.record(usage.completion_tokens, {**base, "gen_ai.token.type": "output"})
        meters.duration.record(time.monotonic() - self.started, base)
        if usage.cost_usd:
            meters.cost.add(float(usage.cost_usd), {"gen_ai.request.model": self.request_model})
        return completion


@contextlib.contextmanager
def model_call(
    request_model: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    base_url: str = "",
    secrets: Sequence[str] = (),
    max_tokens: int | None = None,
    temperature: float | None = None,
    structured: bool = False,
) -> Iterator[_NullCall]:
    """A GenAI ``chat`` span around one model call; ``done(completion)`` records the reply."""
    if not enabled():
        yield _NULL_CALL
        return
    from urllib.parse import urlsplit

    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.system": "openai",
        "gen_ai.request.model": request_model,
        "gen_ai.output.type": "json" if structured else "text",
    }
    url = urlsplit(base_url)
    if url.hostname:
        attributes["server.address"] = url.hostname
        attributes["server.port"] = url.port or (443 if url.scheme == "https" else 80)
    if max_tokens is not None:
        attributes["gen_ai.request.max_tokens"] = max_tokens
    if temperature is not None:
        attributes["gen_ai.request.temperature"] = temperature
    if _capture():
        inputs = [{"role": str(m.get("role", "user")),
                   "parts": [{"type": "text", "content": str(m.get("content", ""))}]}
                  for m in messages]
        attributes["gen_ai.input.messages"] = redact(json.dumps(inputs), secrets)
    kind = trace.SpanKind.CLIENT
    with _tracer().start_as_current_span(
        f"chat {request_model}", kind=kind, attributes=attributes,
        record_exception=False, set_status_on_exception=False,
    ) as span:
        try:
            yield _ModelCall(span, request_model, secrets)
        except BaseException as exc:
            _error(span, exc, secrets)
            raise


def _error(span: Any, exc: BaseException, secrets: Sequence[str]) -> None:
    name = type(exc).__name__
    span.set_attribute("error.type", name)
    span.set_status(trace.StatusCode.ERROR, name)
    span.add_event("exception", {"exception.type": name,
                                 "exception.message": redact(str(exc), secrets)})


# ---- decomposition -----------------------------------------------------------------------------


F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


def traced_decompose(fn: F) -> F:
    """Decorate the decomposer: one ``decompose`` span per call, repairs as its events."""

    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not enabled():
            return await fn(*args, **kwargs)
        with _tracer().start_as_current_span(
            "decompose", record_exception=False, set_status_on_exception=False,
            attributes={"gen_ai.operation.name": "planrun.decompose"},
        ) as span:
            try:
                plan: Plan = await fn(*args, **kwargs)
            except BaseException as exc:
                attempts = getattr(exc, "attempts", None)
                if isinstance(attempts, list):
                    span.set_attribute("planrun.decompose.attempts", len(attempts))
                    span.set_attribute("planrun.decompose.repairs", len(attempts) - 1)
                span.set_attribute("planrun.plan.valid", False)
                _error(span, exc, ())
                raise
            repairs = sum(1 for e in getattr(span, "events", ()) if e.name == "plan.invalid")
            span.set_attribute("planrun.decompose.attempts", repairs + 1)
            span.set_attribute("planrun.decompose.repairs", repairs)
            fixed = [r for r in plan.repairs if r.by == "code"]
            span.set_attribute("planrun.decompose.code_repairs", len(fixed))
            for fix in fixed:
                span.add_event("plan.repaired", {"planrun.problem.code": fix.code,
                                                 "planrun.repair.rule": fix.rule or "",
                                                 "planrun.problem.task": -1 if fix.task is None
                                                 else fix.task})
            span.set_attribute("planrun.plan.valid", True)
            span.set_attribute("planrun.plan.tasks", len(plan.tasks))
            return plan

    return wrapper  # type: ignore[return-value]


def plan_problems(attempt: int, problems: Sequence[Problem]) -> None:
    """Record an invalid attempt of the decomposer on the current ``decompose`` span."""
    if not enabled():
        return
    span = trace.get_current_span()
    if not span.is_recording():
        return
    codes = sorted({p.code for p in problems})
    span.add_event("plan.invalid", {"planrun.decompose.attempt": attempt,
                                    "planrun.problem.codes": codes})
    for problem in problems:
        span.add_event("plan.problem", {
            "planrun.decompose.attempt": attempt,
            "planrun.problem.code": problem.code,
            "planrun.problem.task": -1 if problem.task is None else problem.task,
            "planrun.problem.message": redact(problem.message),
        })


# ---- configuration at the edge -------------------------------------------------------------------


FILE_ENV = "PLANRUN_TRACE_FILE"


def configure_from_env(environ: Mapping[str, str]) -> bool:
    """Set up a tracer provider from ``PLANRUN_TRACE_FILE`` (spans as JSON Lines), for the
    CLI: a ``planrun worker`` process then writes its spans there. True when configured."""
    path = environ.get(FILE_ENV)
    if not path or not AVAILABLE:
        return False
    try:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    except ImportError:
        return False
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(file_exporter(path)))
    instrument(tracer_provider=provider)
    return True


def file_exporter(path: str) -> Any:
    """A span exporter that appends each span, as OpenTelemetry's JSON, to the file ``path``."""
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class JsonLinesSpanExporter(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            with open(path, "a", encoding="utf-8") as fh:
                for span in spans:
                    fh.write(json.dumps(json.loads(span.to_json())) + "\n")
            return SpanExportResult.SUCCESS

    return JsonLinesSpanExporter()
