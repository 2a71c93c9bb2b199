"""An offline model that knows your app: plans over its kinds, valid results for its schemas.

:class:`TestModel` is a real :class:`~planrun.model.Model` (the ``openai`` SDK, httpx2, real
HTTP) whose endpoint is a small server on 127.0.0.1 started for it, answering as the
OpenAI API does (:class:`~planrun.dev.testing.FakeOpenAI`) with content made here:

* a plan request (the decomposer's, schema ``plan``) gets a plan built from the app's
  registry (:func:`build_plan`): a task of every kind the plan can hold, each kind a task
  needs wired as its contract says (``needs``, ``inputs``), every task leading to a kind
  that ``delivers`` when one does, ``max_count`` and ``unique`` kept, as many tasks as the
  request allows, and payloads valid against their schemas with strings filled from the
  goal;
* any other structured request gets a valid instance of its schema (:func:`instance`);
* a plain text request gets ``"ok"``.

Usage is counted as the API counts it (tokens from the text lengths), at no cost: the
model is called ``test``, priced 0. The answers depend on the request only, so a goal gets
the same plan every time, and since the traffic is real HTTP, ``planrun run ... --model
test --record mine.json`` records a cassette that replays without the server::

    report = plan_and_run("a goal", app, model=TestModel(app))
"""

from __future__ import annotations

import re
import threading
import weakref
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx2

from planrun._facade import App
from planrun.core import Registry, producers_of
from planrun.dev.fixtures import TEST_MODEL
from planrun.dev.testing import ChatRequest, FakeOpenAI
from planrun.model import Model

__all__ = ["TestModel", "build_plan", "instance", "model_named"]


PLAN_SCHEMA = "plan"
"""The schema name of the decomposer's requests."""


# ---------------------------------------------------------------------------- instances


def instance(schema: Mapping[str, Any], text: str = "example",
             root: Mapping[str, Any] | None = None, index: int = 0) -> Any:
    """A valid instance of a JSON Schema (the subset structured output and pydantic use):
    required properties only, every string ``text`` (kept to its ``pattern``, ``format``
    and length bounds), numbers within their bounds, arrays as short as allowed."""
    root = root if root is not None else schema
    if index:  # the index-th of several: its strings say so (unique items, unique tasks)
        text, index = f"{text} ({index + 1})", 0
    if "$ref" in schema:
        node: Any = root
        for part in str(schema["$ref"]).lstrip("#/").split("/"):
            node = node[part]
        return instance(node, text, root)
    if "allOf" in schema:
        merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
        for part in schema["allOf"]:
            merged.update(part)
        return instance(merged, text, root)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf"):
        if schema.get(key):
            options = [o for o in schema[key] if o.get("type") != "null"] or schema[key]
            return instance(options[0], text, root)
    kind = schema.get("type", "object" if "properties" in schema else None)
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        props = schema.get("properties") or {}
        return {name: instance(props[name], text, root)
                for name in schema.get("required", []) if name in props}
    if kind == "array":
        return _array(schema, text, root)
    if kind == "string":
        return _string(schema, text)
    if kind in ("integer", "number"):
        return _number(schema, kind == "integer")
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    return text  # any value will do: a string says where it came from


def _array(schema: Mapping[str, Any], text: str, root: Mapping[str, Any]) -> list[Any]:
    low = int(schema.get("minItems", 1))
    count = min(max(low, 1), int(schema.get("maxItems", max(low, 1))))
    items = schema.get("items") or {}
    return [instance(items, text, root, index=i) for i in range(count)]


_FORMATS = {
    "date-time": "2025-01-01T00:00:00Z", "date": "2025-01-01", "time": "00:00:00Z",
    "email": "test@example.com", "uri": "https://example.com/", "url": "https://example.com/",
    "uuid": "00000000-0000-4000-8000-000000000000", "hostname": "example.com",
    "ipv4": "127.0.0.1", "ipv6": "::1", "duration": "P1D",
}


def _string(schema: Mapping[str, Any], text: str) -> str:
    value = _FORMATS.get(str(schema.get("format")), text)
    pattern = schema.get("pattern")
    if pattern:
        candidates = [value, text.replace(" ", "_"), "example", "test", "a", "A", "abc",
                      "x1", "0", "1", "2025-01-01"]
        value = next((c for c in candidates if re.search(str(pattern), c)), value)
    low, high = int(schema.get("minLength", 0)), schema.get("maxLength")
    if len(value) < low:
        value = value + "." * (low - len(value))
    if high is not None and len(value) > int(high):
        value = value[: int(high)]
    return value


def _number(schema: Mapping[str, Any], integer: bool) -> int | float:
    low = schema.get("minimum")
    if schema.get("exclusiveMinimum") is not None:
        low = schema["exclusiveMinimum"] + (1 if integer else 0.5)
    high = schema.get("maximum")
    if schema.get("exclusiveMaximum") is not None:
        high = schema["exclusiveMaximum"] - (1 if integer else 0.5)
    value = low if low is not None else (min(1, high) if high is not None else 1)
    step = schema.get("multipleOf")
    if step:
        value = -(-value // step) * step
    return int(value) if integer else float(value)


# -------------------------------------------------------------------------------- plans


@dataclass(frozen=True)
class _Kind:
    """A kind as the plan builder sees it: its payload schema and its contract."""

    name: str
    payload: Mapping[str, Any]
    needs: tuple[tuple[str, ...], ...] = ()
    delivers: bool = False
    max_count: int | None = None
    unique: bool = False


def _kinds_of(registry: Registry) -> list[_Kind]:
    kinds = []
    for spec in registry:
        needs = [(n,) if isinstance(n, str) else tuple(n) for n in spec.needs]
        needs += [tuple(producers_of(model, registry)) for model in spec.inputs]
        kinds.append(_Kind(spec.name, spec.payload_schema(), tuple(needs), spec.delivers,
                           spec.max_count, spec.unique))
    return kinds


def _kinds_in_schema(schema: Mapping[str, Any]) -> list[_Kind]:
    """The kinds a plan schema offers (no contracts: a schema does not state them)."""
    items = ((schema.get("properties") or {}).get("tasks") or {}).get("items") or {}
    kinds = []
    for option in items.get("anyOf") or [items]:
        props = option.get("properties") or {}
        for name in (props.get("kind") or {}).get("enum") or []:
            payload = dict(props.get("payload") or {})
            if "$defs" in schema:
                payload.setdefault("$defs", schema["$defs"])
            kinds.append(_Kind(str(name), payload))
    return kinds


class _Builder:
    """A plan under construction: tasks in creation order, each with its dependencies."""

    def __init__(self, kinds: Sequence[_Kind], goal: str, max_tasks: int) -> None:
        self.kinds = {k.name: k for k in kinds}
        self.goal = goal
        self.max_tasks = max_tasks
        self.tasks: list[tuple[str, Any, set[int]]] = []
        self.count: Counter[str] = Counter()

    def add(self, name: str, stack: frozenset[str] = frozenset()) -> int | None:
        """A new task of kind ``name`` with what it needs (reusing tasks of needed kinds),
        or None (nothing added) when its contract cannot be kept within the bounds."""
        kind = self.kinds.get(name)
        if kind is None or name in stack or len(self.tasks) >= self.max_tasks or (
                kind.max_count is not None and self.count[name] >= kind.max_count):
            return None
        saved = (list(self.tasks), Counter(self.count))
        deps: set[int] = set()
        for options in kind.needs:
            found = self.latest(options)
            for option in options if found is None else ():
                found = self.add(option, stack | {name})
                if found is not None:
                    break
            if found is None or len(self.tasks) >= self.max_tasks:
                self.tasks, self.count = saved
                return None
            deps.add(found)
        payload = instance(kind.payload, self.goal, index=self.count[name])
        if kind.unique and any(k == name and p == payload for k, p, _ in self.tasks):
            self.tasks, self.count = saved
            return None
        self.tasks.append((name, payload, deps))
        self.count[name] += 1
        return len(self.tasks) - 1

    def latest(self, options: Sequence[str]) -> int | None:
        found = [i for i, (kind, _, _) in enumerate(self.tasks) if kind in options]
        return found[-1] if found else None

    def leads_to(self, start: int, target: int) -> bool:
        """Whether ``target`` is ``start`` or among what it (transitively) depends on."""
        todo, seen = [start], set()
        while todo:
            i = todo.pop()
            if i == target:
                return True
            if i not in seen:
                seen.add(i)
                todo.extend(self.tasks[i][2])
        return False

    def document(self) -> list[dict[str, Any]]:
        """The tasks in an order where each depends on earlier ones only (creation order
        where it can be), indices renumbered."""
        placed: list[int] = []
        left = list(range(len(self.tasks)))
        while left:
            ready = next(i for i in left if self.tasks[i][2] <= set(placed))
            placed.append(ready)
            left.remove(ready)
        at = {old: new for new, old in enumerate(placed)}
        return [{"kind": self.tasks[i][0], "payload": self.tasks[i][1],
                 "depends_on": sorted(at[d] for d in self.tasks[i][2])} for i in placed]


def build_plan(registry: Registry, goal: str, *, min_tasks: int = 1,
               max_tasks: int = 8) -> dict[str, Any]:
    """A plan document ``{"tasks": [...]}`` over the kinds of ``registry`` for ``goal``
    that keeps every contract: a deliverable (when a kind delivers) with what it needs,
    then a task of each other kind (led to the deliverable), then more tasks up to
    ``min_tasks``, never more than ``max_tasks``. Deterministic: the same kinds and goal
    give the same plan."""
    return _build(_kinds_of(registry), goal, min_tasks, max_tasks)


def _build(kinds: Sequence[_Kind], goal: str, min_tasks: int, max_tasks: int) -> dict[str, Any]:
    plan = _Builder(kinds, goal, max_tasks)
    delivering = [k.name for k in kinds if k.delivers]
    sink = plan.add(delivering[0]) if delivering else None
    for kind in kinds:
        if plan.latest((kind.name,)) is None:
            _add_leading(plan, kind.name, sink)
    rounds = 0
    while len(plan.tasks) < min_tasks and rounds < min_tasks * len(kinds) + 1:
        rounds += 1
        before = len(plan.tasks)
        for kind in kinds:
            if len(plan.tasks) < min_tasks:
                _add_leading(plan, kind.name, sink)
        if len(plan.tasks) == before:
            break
    return {"tasks": plan.document()}


def _add_leading(plan: _Builder, name: str, sink: int | None) -> None:
    """Add a task of ``name`` that leads to the deliverable ``sink`` (it delivers itself,
    or the sink then depends on it); nothing when that would make a cycle."""
    before = len(plan.tasks)
    added = plan.add(name)
    if added is None or sink is None or plan.kinds[name].delivers:
        return
    if plan.leads_to(added, sink):  # it needs the deliverable: the sink cannot wait for it
        del plan.tasks[before:]  # with what was made for it
        plan.count = Counter(kind for kind, _, _ in plan.tasks)
        return
    plan.tasks[sink][2].add(added)


_GOAL = re.compile(r"^#+\s*Goal\s*\n+(.+?)(?:\n#+\s|\Z)", re.S | re.M)


def goal_of(prompt: str) -> str:
    """The goal a decompose prompt states (its ``## Goal`` section's first paragraph), else
    the prompt's first line."""
    found = _GOAL.search(prompt)
    text = found.group(1) if found else prompt
    return next((p.strip() for p in text.split("\n\n") if p.strip()), "the goal")[:200]


# ---------------------------------------------------------------------- the endpoint


class _Answers(FakeOpenAI):
    """The fake endpoint's content: plans from the registry, instances of schemas."""

    def __init__(self, registry: Registry | None) -> None:
        super().__init__(model_suffix="")
        self.registry = registry

    def content_for(self, chat: ChatRequest) -> str:
        import json

        schema = chat.schema
        if chat.schema_name == PLAN_SCHEMA and schema is not None:
            value: Any = self.plan_for(chat, schema)
        elif schema is not None:
            value = instance(schema, "test")
        else:
            value = "ok"
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)

    def plan_for(self, chat: ChatRequest, schema: Mapping[str, Any]) -> dict[str, Any]:
        tasks = (schema.get("properties") or {}).get("tasks") or {}
        offered = _kinds_in_schema(schema)
        known = self.registry is not None and {k.name for k in offered} <= {
            spec.name for spec in self.registry}
        kinds = _kinds_of(self.registry) if known and self.registry is not None else offered
        return _build(kinds, goal_of(chat.prompt), int(tasks.get("minItems", 1)),
                      int(tasks.get("maxItems", 8)))


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        request = httpx2.Request(self.command, f"http://127.0.0.1{self.path}",
                                 headers=list(self.headers.items()), content=body)
        reply = self.server.answers(request)
        content = reply.content
        self.send_response(reply.status_code)
        for name, value in reply.headers.items():
            if name.lower() not in ("content-length", "transfer-encoding", "content-encoding",
                                    "connection"):
                self.send_header(name, value)
        self.send_header("content-length", str(len(content)))
        self.end_headers()
        self.wfile.write(content)

    do_POST = do_GET = _answer

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: a test model's traffic is no news."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, answers: _Answers) -> None:
        self.answers = answers
        super().__init__(("127.0.0.1", 0), _Handler)


class _Loopback:
    """The server of one test model (and its copies), stopped when none is left."""

    def __init__(self, answers: _Answers) -> None:
        server = _Server(answers)
        thread = threading.Thread(target=server.serve_forever, name="planrun-test-model",
                                  daemon=True)
        thread.start()
        self.answers = answers
        self.base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        self.stop = weakref.finalize(self, _stop, server)


def _stop(server: ThreadingHTTPServer) -> None:
    server.shutdown()
    server.server_close()


class TestModel(Model):
    """A model for any app that needs no key, no server and no network.

    Args:
        app: the :class:`~planrun.App` (or :class:`~planrun.Registry`) it plans for; plans
            keep its kinds' payload schemas and contracts. Without one, a plan request is
            answered from the kinds its schema offers (no contracts).
        options: any other :class:`~planrun.Model` keyword (``retry``, ``meter``,
            ``limiter``, ``structured``, ...).
    """

    __test__ = False  # a model, not a test class for pytest to collect

    def __init__(self, app: App | Registry | None = None, **options: Any) -> None:
        registry = app.registry if isinstance(app, App) else app
        self._loopback = _Loopback(_Answers(registry))
        options.setdefault("api_key", "test")
        super().__init__(TEST_MODEL, base_url=self._loopback.base_url, **options)

    @property
    def requests(self) -> list[ChatRequest]:
        """Every request its server received, oldest first (copies of the model share it)."""
        return list(self._loopback.answers.requests)

    def close(self) -> None:
        """Stop the local server now (it stops by itself once the model is gone)."""
        self._loopback.stop()


def model_named(name: str | None, app: App | Registry | None = None, **options: Any) -> Model:
    """The model a command line's ``--model NAME`` means: :class:`TestModel` for ``test``
    (planning for ``app``), else a :class:`~planrun.Model` of that name (``None``: from the
    environment)."""
    if name == TEST_MODEL:
        return TestModel(app, **options)
    return Model(name, **options)
