"""Where a model's requests go: its SDK clients, one connection pool per event loop."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import math
import os
import threading
import urllib.parse
import weakref
from collections.abc import AsyncGenerator, Mapping
from typing import Any

import openai

from planrun.core import ConfigError, UsageError, register_secret
from planrun.model._limiter import ProviderLimits
from planrun.model._reply import _Reply

__all__ = ["DEFAULT_TIMEOUT", "UNSET", "Transport"]

DEFAULT_TIMEOUT = 60.0
"""Seconds a model request may take unless ``timeout=`` or ``$PLANRUN_TIMEOUT`` says."""


class _Unset(enum.Enum):
    UNSET = "unset"


UNSET = _Unset.UNSET
"""A ``timeout`` not given: ``$PLANRUN_TIMEOUT``, else :data:`DEFAULT_TIMEOUT`."""


def request_timeout(value: float | _Unset | None) -> float | None:
    """The request timeout: as given, else from the environment, else the default."""
    if value is not UNSET:
        if value is not None and not value > 0:
            raise UsageError(f"timeout must be a positive number of seconds (or None), "
                             f"got {value!r}")
        return value
    text = os.environ.get("PLANRUN_TIMEOUT", "").strip()
    if not text:
        return DEFAULT_TIMEOUT
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not (seconds > 0 and math.isfinite(seconds)):
        raise UsageError(f"PLANRUN_TIMEOUT must be a positive number of seconds, not {text!r}")
    return seconds


class _LoopClient:
    """The SDK client of one event loop, closed when that loop shuts down."""

    def __init__(self, client: openai.AsyncOpenAI) -> None:
        self.client = client
        self.closer = self._close_at_shutdown()

    async def _close_at_shutdown(self) -> AsyncGenerator[None, None]:
        # Started once on its loop, this generator is finalised by the loop's
        # shutdown_asyncgens() (asyncio.run, VirtualClock.run and asyncio.Runner call it
        # before closing), which closes the pooled connections while the loop still runs.
        try:
            yield
        finally:
            await self.client.close()


class Transport:
    """Where a model's requests go: the SDK client of each event loop (made on the loop's
    first call from one template, a given client or one made from the key and address),
    and :meth:`send`, the single place planrun's traffic to the model API leaves.

    One client per loop: each synchronous entry point (:func:`planrun.decompose`,
    :func:`planrun.plan_and_run`, a notebook cell) runs on a loop of its own, and an HTTP/1.1
    connection pool belongs to the loop that opened it, so sharing one pool across loops
    breaks ("Event loop is closed"). A single long-lived loop thread behind the sync API
    would not do: waits (backoff, ``Retry-After``, the rate limiter, timeouts) must run on
    the caller's loop, where a :class:`~planrun.runtime.VirtualClock` can skip them, and a
    request in flight on another thread would be invisible to that clock.

    Args:
        api_key: the key (default ``$OPENAI_API_KEY``; none raises :class:`ConfigError`).
        base_url: the address (default ``$OPENAI_BASE_URL``, else OpenAI's).
        client: a ready ``openai.AsyncOpenAI`` to use instead (its SDK retries off).
        timeout: seconds a request may take (the SDK client's default).
        responses: send to the Responses API rather than Chat Completions.
    """

    def __init__(self, *, api_key: str | None, base_url: str | None,
                 client: openai.AsyncOpenAI | None, timeout: float | None,
                 responses: bool) -> None:
        self._template = (client.with_options(max_retries=0) if client is not None
                          else _new_client(api_key, base_url, timeout))
        self.secrets = tuple(
            s for s in (api_key, getattr(self._template, "api_key", None))
            if isinstance(s, str) and s)
        for secret in self.secrets:
            register_secret(secret)
        self.responses = responses
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopClient] = (
            weakref.WeakKeyDictionary())
        self._template_used = False
        self._lock = threading.Lock()

    @property
    def base_url(self) -> str:
        """Where requests go."""
        return str(self._template.base_url)

    @property
    def server(self) -> str:
        """The server as errors name it: scheme, host and port of the base URL (no path,
        no user information)."""
        parts = urllib.parse.urlsplit(self.base_url)
        return f"{parts.scheme}://{parts.hostname}{f':{parts.port}' if parts.port else ''}"

    async def client(self) -> openai.AsyncOpenAI:
        """The SDK client of the running loop (made on the loop's first call)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            entry = self._clients.get(loop)
            if entry is not None:
                return entry.client
            for old in [k for k in self._clients if k.is_closed()]:
                del self._clients[old]
            if self._template_used:
                client = self._template.copy(
                    http_client=openai.DefaultAsyncHttpxClient(timeout=self._template.timeout)
                )
            else:
                client, self._template_used = self._template, True
            entry = self._clients[loop] = _LoopClient(client)
        await entry.closer.__anext__()
        return entry.client

    async def aclose(self) -> None:
        """Close the HTTP client of the running loop (other loops close theirs at shutdown)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            entry = self._clients.pop(loop, None)
        if entry is not None:
            await entry.closer.aclose()
        elif not self._template_used:
            await self._template.close()

    async def send(self, params: Mapping[str, Any], timeout: float | None) -> _Reply:
        """One HTTP request to the model API, with the keyword arguments ``params``; the
        reply read (with the provider's ``x-ratelimit-*`` view, when the client shows the
        response's headers, and the seconds it took). Whatever fails is raised as it is."""
        client = await self.client()
        api: Any = client.responses if self.responses else client.chat.completions
        loop = asyncio.get_running_loop()
        sent = loop.time()
        if not hasattr(api, "with_raw_response"):  # a client of the caller's own making
            raw = await asyncio.wait_for(api.create(**params), timeout)
            return dataclasses.replace(_Reply.of(raw, self.base_url),
                                       latency_s=loop.time() - sent)
        response = await asyncio.wait_for(api.with_raw_response.create(**params), timeout)
        # The provider counted the request on arrival, so its view is as old as the
        # request's time in flight.
        took = loop.time() - sent
        limits = ProviderLimits.from_headers(response.headers, age=took)
        return dataclasses.replace(_Reply.of(response.parse(), self.base_url, limits),
                                   latency_s=took)


def _new_client(api_key: str | None, base_url: str | None,
                timeout: float | None) -> openai.AsyncOpenAI:
    key = api_key or os.environ.get("OPENAI_API_KEY")
    if not key:
        raise ConfigError(
            "OPENAI_API_KEY is not set: pass api_key= to Model or set the OPENAI_API_KEY "
            "environment variable (a local server takes any key)"
        )
    url = base_url or os.environ.get("OPENAI_BASE_URL") or None
    return openai.AsyncOpenAI(api_key=key, base_url=url, timeout=timeout, max_retries=0)
