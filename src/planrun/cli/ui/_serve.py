"""Serving the viewer: bind the port, check the store, run uvicorn on a thread."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import secrets
import socket
import sys
import threading
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any

from planrun.core import ConfigError, PlanrunError, UsageError
from planrun.stores import open_store

__all__ = ["DEFAULT_PORT", "UIServer", "serve_ui"]

DEFAULT_PORT = 8765
"""The port ``planrun ui`` listens on unless told (0: any free port)."""

INSTALL = "the run viewer needs the [ui] extra: pip install 'planrun[ui]'"


def _require_extra() -> Any:
    """uvicorn, or a :class:`ConfigError` saying what to install."""
    try:
        import starlette  # noqa: F401
        import uvicorn
    except ImportError:
        raise ConfigError(INSTALL) from None
    return uvicorn


class UIServer:
    """The run viewer over the store at ``db``, served on a thread of this process.

    ``start()`` checks that the store answers and that the port is free (each a one-line
    :class:`~planrun.PlanrunError` otherwise), then serves until ``stop()``; :attr:`url`
    is the address to open, its one-time token in it. A context manager too::

        with UIServer("sqlite:///runs.db", port=0) as ui:
            print(ui.url)

    Args:
        db: the store URL (SQLite or PostgreSQL), as ``planrun runs`` takes it.
        host: the address to listen on (loopback unless told otherwise).
        port: the port (0: any free one).
        token: the token every request needs (default: a new random one).
    """

    def __init__(self, db: str, *, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
                 token: str | None = None) -> None:
        self.db = db
        self.host = host
        self.port = port
        self.token = token or secrets.token_urlsafe(24)
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None

    @property
    def base(self) -> str:
        """The server's address without the token."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def url(self) -> str:
        """The address to open: the runs list, with the token that sets the cookie."""
        return f"{self.base}/?token={self.token}"

    def start(self) -> UIServer:
        """Check the store and the port, then serve on a thread; return self.

        Raises:
            ConfigError: the [ui] extra is not installed.
            StoreError: the store does not answer (or is not a planrun store).
            UsageError: the port is in use, or the host cannot be listened on.
        """
        uvicorn = _require_extra()
        from planrun.cli.ui._app import make_app

        _on_a_thread(_check_store(self.db))  # this thread may run a loop (a notebook)
        sock = _bind(self.host, self.port)
        self.port = sock.getsockname()[1]
        app = make_app(self.db, self.token, cookie=f"planrun_ui_{self.port}",
                       on_startup_error=self._failed)
        config = uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._serve, args=(sock,), daemon=True,
                                        name="planrun-ui")
        self._thread.start()
        while not self._server.started and self._thread.is_alive():
            self._thread.join(0.02)
        if not self._server.started:
            sock.close()
            failure = self._failure or PlanrunError("the viewer did not start")
            raise failure
        return self

    def _failed(self, exc: BaseException) -> None:
        self._failure = exc

    def _serve(self, sock: socket.socket) -> None:
        try:
            self._server.run(sockets=[sock])
        finally:
            sock.close()

    def stop(self) -> None:
        """Stop serving (open pages stop updating); calling it twice is harmless."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(10)

    def wait(self) -> None:
        """Block until the server stops; Ctrl-C stops it."""
        try:
            while self._thread is not None and self._thread.is_alive():
                self._thread.join(0.5)
        except KeyboardInterrupt:
            self.stop()
            raise

    def __enter__(self) -> UIServer:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def serve_ui(db: str, *, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
             token: str | None = None,
             announce: Callable[[str], None] | None = None) -> None:
    """Serve the run viewer over the store at ``db`` until Ctrl-C.

    ``announce`` receives the address to open (default: printed on stdout), its one-time
    token in it. Errors as :meth:`UIServer.start`.
    """
    server = UIServer(db, host=host, port=port, token=token).start()
    (announce or _print)(server.url)
    with contextlib.suppress(KeyboardInterrupt):
        server.wait()


def _print(url: str) -> None:
    print(f"planrun ui: open {url}", flush=True)


def _on_a_thread(work: Coroutine[Any, Any, None]) -> None:
    """Run ``work`` to its end on a loop of its own, on another thread; raise what it raised."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, work).result()


async def _check_store(db: str) -> None:
    """Open and close the store once: a URL that does not answer fails here, in one line,
    before an address is printed."""
    store = open_store(db)
    await store.open()
    await store.close()


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port``; a port in use is one clear line."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise UsageError(f"cannot listen on host {host!r}: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        if sys.platform != "win32":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise UsageError(f"port {port} on {host} is in use; choose another with --port "
                             "(0: any free port)") from None
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock

