"""A loopback TCP proxy that can imitate a database server outage.

    with TcpProxy("127.0.0.1", 5432) as proxy:
        url = proxy.url_for(pg_url)          # the same database, through the proxy
        ...
        proxy.down()                         # refuse new connections, cut the open ones
        ...
        proxy.up()

While down, a connection attempt is accepted and closed at once (the client sees the
server hang up before it says anything) and every connection that was open is cut, as a
server restart or a network partition would. The proxy listens on 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType
from urllib.parse import urlsplit, urlunsplit


class TcpProxy:
    """Forward 127.0.0.1:<port> to ``host:port``; :meth:`down` and :meth:`up` an outage."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._down = False
        self._stop = threading.Event()
        self.refused = 0   # connection attempts turned away while down
        self.cut = 0       # open connections cut when the outage began
        self.served = 0    # connections forwarded
        self._thread = threading.Thread(target=self._accept, daemon=True)

    @classmethod
    def for_url(cls, url: str) -> TcpProxy:
        """A proxy in front of the server ``url`` names."""
        parts = urlsplit(url)
        return cls(parts.hostname or "127.0.0.1", parts.port or 5432)

    def url_for(self, url: str) -> str:
        """``url`` with its host and port replaced by the proxy's."""
        parts = urlsplit(url)
        user = parts.netloc.rpartition("@")[0]
        netloc = f"{user}@127.0.0.1:{self.port}" if user else f"127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(netloc=netloc))

    def __enter__(self) -> TcpProxy:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._listener.close()
        self._cut_all()

    def down(self) -> None:
        """Begin the outage: refuse new connections, cut every open one."""
        with self._lock:
            self._down = True
        self.cut += self._cut_all()

    def up(self) -> None:
        """End the outage."""
        with self._lock:
            self._down = False

    def _cut_all(self) -> int:
        with self._lock:
            conns, self._open = list(self._open), set()
        for s in conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()
        return len(conns) // 2

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                down = self._down
            if down:
                self.refused += 1
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            client.settimeout(None)
            with self._lock:
                self._open.update((client, upstream))
                self.served += 1
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            with self._lock:
                self._open.discard(src)
                self._open.discard(dst)
