"""The viewer's web application (Starlette): pages, a JSON API, the token check.

Every request needs the token: in the address ``planrun ui`` prints (``?token=...``, which
sets a cookie and redirects to the same page without it), or in that cookie afterwards. A
request without it is refused (401; 403 for a wrong token or a state change sent from
another origin) and changes nothing.
"""

from __future__ import annotations

import hmac
import html
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from importlib import metadata
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from planrun.cli.ui._data import Loaded, decide, run_view, runs_page, task_view
from planrun.core import PlanrunError, StoreError, UnknownRun, UsageError, redact
from planrun.stores import open_store

__all__ = ["make_app"]

MAX_BODY = 16_384
"""Bytes a decision's body may have (a name and a note)."""


def _asset_version() -> str:
    try:
        return metadata.version("planrun")
    except metadata.PackageNotFoundError:  # pragma: no cover - run from a source tree
        return "0"


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<link rel="stylesheet" href="/static/ui.css?v={v}">
</head><body data-page="{page}">
<header><a href="/" class="brand">planrun</a><span class="store">{store}</span></header>
<main id="main">{body}</main>
<script id="data" type="application/json">{data}</script>
{script}</body></html>
"""


def _page(page: str, title: str, store: str, data: Any, body: str = "",
          status_code: int = 200) -> HTMLResponse:
    text = json.dumps(data, separators=(",", ":"), default=str).replace("</", "<\\/")
    script = f'<script src="/static/{page}.js?v={_asset_version()}"></script>\n' \
        if data is not None else ""
    return HTMLResponse(_PAGE.format(title=html.escape(title), v=_asset_version(), page=page,
                                     store=html.escape(store), body=body, data=text,
                                     script=script), status_code=status_code)


def _message(title: str, text: str, status_code: int, store: str = "") -> HTMLResponse:
    body = (f'<section class="message"><h1>{html.escape(title)}</h1>'
            f"<p>{html.escape(redact(text))}</p><p><a href=\"/\">All runs</a></p></section>")
    return _page("message", title, store, None, body, status_code)


def _wants_json(request: Request) -> bool:
    return request.url.path.startswith("/api/")


def _refusal(request: Request, status_code: int, text: str) -> Response:
    if _wants_json(request):
        return JSONResponse({"error": text}, status_code=status_code)
    return _message("Not allowed", text, status_code)


class _TokenCheck(BaseHTTPMiddleware):
    """The token, from the address once and from the cookie it sets afterwards."""

    def __init__(self, app: Any, token: str, cookie: str) -> None:
        super().__init__(app)
        self.token = token
        self.cookie = cookie

    def _matches(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), self.token.encode())

    async def dispatch(self, request: Request,
                       call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        given = request.query_params.get("token")
        if given is not None:
            if not self._matches(given):
                return _refusal(request, 403, "this token is not the one planrun ui printed")
            rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
            target = request.url.path + ("?" + "&".join(f"{k}={v}" for k, v in rest)
                                         if rest else "")
            response: Response = RedirectResponse(target, status_code=303)
            response.set_cookie(self.cookie, self.token, httponly=True, samesite="strict")
            return response
        if not self._matches(request.cookies.get(self.cookie)):
            return _refusal(request, 401, "open the address planrun ui printed: it carries "
                            "the token this page needs")
        if request.method not in ("GET", "HEAD"):
            origin = request.headers.get("origin")
            host = request.headers.get("host")
            if origin is not None and origin.split("://", 1)[-1] != host:
                return _refusal(request, 403, "a change must come from the viewer's own page")
        return await call_next(request)


def make_app(db: str, token: str, *, cookie: str = "planrun_ui",
             on_startup_error: Callable[[BaseException], None] | None = None) -> Starlette:
    """The viewer over the store at ``db``, guarded by ``token``.

    The store is opened when the server starts and closed when it stops.
    """
    viewer = _Viewer(db, on_startup_error)
    return Starlette(
        routes=[
            Route("/", viewer.runs),
            Route("/runs/{run_id:path}", viewer.run_page),
            Route("/api/runs", viewer.api_runs),
            Route("/api/run", viewer.api_run),
            Route("/api/task", viewer.api_task),
            Route("/api/approve", viewer.api_decide, methods=["POST"]),
            Route("/api/reject", viewer.api_decide, methods=["POST"]),
            Mount("/static", StaticFiles(packages=[("planrun.cli.ui", "static")]),
                  name="static"),
        ],
        middleware=[Middleware(_TokenCheck, token=token, cookie=cookie)],
        exception_handlers={UsageError: viewer.usage_error, StoreError: viewer.store_error,
                            PlanrunError: viewer.store_error},
        lifespan=viewer.lifespan,
    )


class _Viewer:
    """The pages and the API over one store, opened for the server's lifetime."""

    def __init__(self, db: str,
                 on_startup_error: Callable[[BaseException], None] | None) -> None:
        self.db = db
        self.on_startup_error = on_startup_error
        self._runs: Loaded | None = None

    @asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        store = open_store(self.db)
        try:
            await store.open()
        except BaseException as exc:
            if self.on_startup_error is not None:
                self.on_startup_error(exc)
            raise
        self._runs = Loaded(store)
        try:
            yield
        finally:
            await store.close()

    @property
    def loaded(self) -> Loaded:
        assert self._runs is not None, "the store opens when the server starts"
        return self._runs

    @property
    def where(self) -> str:
        return str(self.loaded.store.url)

    async def runs(self, request: Request) -> Response:
        page = _int(request.query_params.get("page"), 1)
        data = await runs_page(self.loaded, page, time.time())
        return _page("runs", "planrun runs", self.where, data)

    async def api_runs(self, request: Request) -> Response:
        page = _int(request.query_params.get("page"), 1)
        return JSONResponse(await runs_page(self.loaded, page, time.time()))

    async def run_page(self, request: Request) -> Response:
        run_id = request.path_params["run_id"]
        try:
            data = await run_view(self.loaded, run_id, time.time())
        except UnknownRun:
            return _message("No such run", self._no_run(run_id), 404, self.where)
        return _page("run", f"run {run_id}", self.where, data)

    def _no_run(self, run_id: str) -> str:
        return f"the store {self.where} holds no run {run_id!r}"

    async def api_run(self, request: Request) -> Response:
        q = request.query_params
        run_id = q.get("id", "")
        try:
            data = await run_view(self.loaded, run_id, time.time(), since=q.get("since"))
        except UnknownRun:
            return JSONResponse({"error": self._no_run(run_id)}, status_code=404)
        return JSONResponse(data)

    async def api_task(self, request: Request) -> Response:
        q = request.query_params
        run_id = q.get("run", "")
        try:
            return JSONResponse(await task_view(self.loaded, run_id, q.get("id", "")))
        except UnknownRun:
            return JSONResponse({"error": self._no_run(run_id)}, status_code=404)

    async def api_decide(self, request: Request) -> Response:
        given = await _decision_body(request)
        if isinstance(given, Response):
            return given
        decision = request.url.path.rsplit("/", 1)[-1]
        try:
            task = await decide(self.loaded.store, given["run"], given["task"],
                                decision == "approve", given.get("by"), given.get("note"),
                                time.time())
        except UnknownRun:
            return JSONResponse({"error": self._no_run(given["run"])}, status_code=404)
        return JSONResponse({"task": task.id, "decision": decision + "d",
                             "note": redact(task.error or ""), "status": task.status.value})

    async def usage_error(self, request: Request, exc: Exception) -> Response:
        code = 409 if request.method == "POST" else 404
        return JSONResponse({"error": redact(str(exc))}, status_code=code)

    async def store_error(self, request: Request, exc: Exception) -> Response:
        text = redact(" ".join(str(exc).split())) or type(exc).__name__
        if _wants_json(request):
            return JSONResponse({"error": text}, status_code=503)
        return _message("The store did not answer", text, 503, self.where)


async def _decision_body(request: Request) -> dict[str, Any] | Response:
    """A decision's JSON body (``run``, ``task``, ``by``, ``note``), or the answer that
    refuses it."""
    body = await request.body()
    if len(body) > MAX_BODY:
        return JSONResponse({"error": "the request is too large"}, status_code=413)
    try:
        given = json.loads(body or b"{}")
    except ValueError:
        return JSONResponse({"error": "the request is not JSON"}, status_code=400)
    if not isinstance(given, dict) or not all(
            isinstance(given.get(k), str) for k in ("run", "task")) or not all(
            isinstance(given.get(k), str | type(None)) for k in ("by", "note")):
        return JSONResponse({"error": 'send {"run", "task", "by", "note"}'}, status_code=400)
    return given


def _int(text: str | None, default: int) -> int:
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default
