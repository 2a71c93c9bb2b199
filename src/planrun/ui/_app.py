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

from planrun.core import PlanrunError, StoreError, UnknownRun, UsageError, redact
from planrun.stores import Store, open_store
from planrun.ui._data import Loaded, Samples, decide, run_view, runs_page, task_view

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
    state: dict[str, Any] = {"samples": Samples()}

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        store = open_store(db)
        try:
            await store.open()
        except BaseException as exc:
            if on_startup_error is not None:
                on_startup_error(exc)
            raise
        state["store"] = store
        state["runs"] = Loaded(store)
        try:
            yield
        finally:
            await store.close()

    def store() -> Store:
        opened: Store = state["store"]
        return opened

    def where() -> str:
        return str(store().url)

    async def runs(request: Request) -> Response:
        page = _int(request.query_params.get("page"), 1)
        data = await runs_page(state["runs"], page, time.time())
        return _page("runs", "planrun runs", where(), data)

    async def api_runs(request: Request) -> Response:
        page = _int(request.query_params.get("page"), 1)
        return JSONResponse(await runs_page(state["runs"], page, time.time()))

    async def run_page(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        try:
            data = await run_view(state["runs"], run_id, time.time(), state["samples"])
        except UnknownRun:
            return _message("No such run", f"the store {where()} holds no run {run_id!r}",
                            404, where())
        return _page("run", f"run {run_id}", where(), data)

    async def api_run(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        data = await run_view(state["runs"], run_id, time.time(), state["samples"],
                              since=request.query_params.get("since"))
        return JSONResponse(data)

    async def api_task(request: Request) -> Response:
        p = request.path_params
        return JSONResponse(await task_view(state["runs"], p["run_id"], p["task_id"]))

    async def api_decide(request: Request) -> Response:
        p = request.path_params
        if p["decision"] not in ("approve", "reject"):
            return JSONResponse({"error": "approve or reject"}, status_code=404)
        body = await request.body()
        if len(body) > MAX_BODY:
            return JSONResponse({"error": "the request is too large"}, status_code=413)
        try:
            given = json.loads(body or b"{}")
        except ValueError:
            return JSONResponse({"error": "the request is not JSON"}, status_code=400)
        if not isinstance(given, dict) or not all(
                isinstance(given.get(k), str | type(None)) for k in ("by", "note")):
            return JSONResponse({"error": "send {\"by\": name, \"note\": text}"},
                                status_code=400)
        approve = p["decision"] == "approve"
        task = await decide(store(), p["run_id"], p["task_id"], approve, given.get("by"),
                            given.get("note"), time.time())
        return JSONResponse({"task": task.id, "decision": p["decision"] + "d",
                             "note": redact(task.error or ""),
                             "status": task.status.value})

    async def usage_error(request: Request, exc: Exception) -> Response:
        code = 409 if request.method == "POST" else 404
        return JSONResponse({"error": redact(str(exc))}, status_code=code)

    async def unknown_run(request: Request, exc: Exception) -> Response:
        text = f"the store {where()} holds no run {request.path_params.get('run_id')!r}"
        return JSONResponse({"error": text}, status_code=404)

    async def store_error(request: Request, exc: Exception) -> Response:
        text = redact(" ".join(str(exc).split())) or type(exc).__name__
        if _wants_json(request):
            return JSONResponse({"error": text}, status_code=503)
        return _message("The store did not answer", text, 503, where())

    return Starlette(
        routes=[
            Route("/", runs),
            Route("/runs/{run_id}", run_page),
            Route("/api/runs", api_runs),
            Route("/api/runs/{run_id}", api_run),
            Route("/api/runs/{run_id}/tasks/{task_id}", api_task),
            Route("/api/runs/{run_id}/tasks/{task_id}/{decision:str}", api_decide,
                  methods=["POST"]),
            Mount("/static", StaticFiles(packages=[("planrun.ui", "static")]), name="static"),
        ],
        middleware=[Middleware(_TokenCheck, token=token, cookie=cookie)],
        exception_handlers={UnknownRun: unknown_run, UsageError: usage_error,
                            StoreError: store_error, PlanrunError: store_error},
        lifespan=lifespan,
    )


def _int(text: str | None, default: int) -> int:
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default
