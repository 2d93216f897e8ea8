"""``httpx`` transports (blocking and ``async``) that raise Ostiary's refusals as exceptions.

They wrap another transport (normally ``httpx.HTTPTransport(proxy=..., verify=...)``) and look
at each answer: one that Ostiary produced itself (it carries ``Ostiary-Request-Id``) is read
and raised as its :mod:`ostiary.errors` class — a ``403 denied``, a ``429``, a ``423``, a held
``202``, and an MCP call's JSON-RPC error with Ostiary's body in ``data``; anything the
upstream answered is handed back untouched, whatever its status. With ``wait_for_approval``
a held request is collected (see :mod:`ostiary.approval`) and its stored answer returned as
if it had come back at once.

Why a transport and not a response hook: a transport sees the request it may have to
re-send, and it works for every ``httpx`` client, including ones a library builds for you
when it accepts ``transport=``.

For ``https://`` URLs, a destination the proxy refuses outright is refused at ``CONNECT``,
before any TLS, and ``httpx`` reports only ``httpx.ProxyError("403 Forbidden")``: those
become :class:`~ostiary.errors.Unauthenticated` (``407``) and
:class:`~ostiary.errors.Denied` (``403``) without details, because the body is gone.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Generic, TypeVar

import anyio
import httpx

from .approval import ApprovalWait, Collecting, settle
from .errors import (
    REQUEST_ID_HEADER,
    Denied,
    OstiaryError,
    Unauthenticated,
    from_response,
)

__all__ = ["AsyncRaisingTransport", "RaisingTransport"]

_TUNNEL_STATUS = re.compile(r"^(\d{3})\b")

#: The transport wrapped: blocking or ``async``.
I = TypeVar("I", httpx.BaseTransport, httpx.AsyncBaseTransport)


def tunnel_refusal(message: str, url: str) -> OstiaryError | None:
    """The exception for a ``CONNECT`` the proxy answered with ``status`` (``message`` as
    the HTTP client words it: "407 Proxy Authentication Required"), or ``None``."""
    found = _TUNNEL_STATUS.match(message.strip())
    if not found:
        return None
    status = int(found.group(1))
    host = httpx.URL(url).host
    if status == 407:
        return Unauthenticated(
            f"the proxy refused the session token when opening the tunnel to {host} "
            "(the session may have ended, expired or never existed)",
            kind="unauthenticated",
            status=407,
        )
    if status == 403:
        return Denied(
            f"the proxy refused to open a tunnel to {host}: a policy or the egress guard "
            "forbids this destination (refused at CONNECT, so no details)",
            kind="denied",
            status=403,
        )
    return None


@contextmanager
def _tunnel_refusals(url: str) -> Iterator[None]:
    """Raises the :func:`tunnel_refusal` of a ``CONNECT`` the proxy refused to ``url``."""
    try:
        yield
    except httpx.ProxyError as exc:
        refusal = tunnel_refusal(str(exc), url)
        if refusal is None:
            raise
        raise refusal from None


def _retry(request: httpx.Request, approval_id: str, wait_seconds: int) -> httpx.Request:
    """The held request again, with the headers that collect its outcome."""
    headers = request.headers.copy()
    headers.update(ApprovalWait.headers(approval_id, wait_seconds))
    extensions = dict(request.extensions)
    timeout = dict(extensions.get("timeout") or {})
    timeout["read"] = ApprovalWait.read_timeout(timeout.get("read"), wait_seconds)
    extensions["timeout"] = timeout
    return httpx.Request(
        request.method,
        request.url,
        headers=headers,
        content=request.content,
        extensions=extensions,
    )


class _Raising(Generic[I]):
    """What both transports hold, and how they tell Ostiary's refusals from the rest."""

    def __init__(
        self,
        inner: I,
        *,
        wait_for_approval: timedelta | None = None,
        secrets: Iterable[str] = (),
    ) -> None:
        self._inner: I = inner
        self._wait = wait_for_approval
        self._secrets = tuple(secrets)

    def _error(self, response: httpx.Response) -> OstiaryError | None:
        """The refusal ``response`` (read already) stands for, or ``None``."""
        return from_response(
            response.status_code, response.headers, response.content, secrets=self._secrets
        )


def _ours(response: httpx.Response) -> bool:
    """Whether Ostiary answered ``response`` itself (an upstream's answer is handed back)."""
    return REQUEST_ID_HEADER in response.headers


class RaisingTransport(_Raising[httpx.BaseTransport], httpx.BaseTransport):
    """Raises Ostiary's refusals; optionally waits up to ``wait_for_approval`` for a held
    request. ``secrets`` are strings never to quote in a message (the session token)."""

    def _refusal(self, response: httpx.Response) -> OstiaryError | None:
        if not _ours(response):
            return None
        response.read()
        error = self._error(response)
        if error is not None:
            response.close()
        return error

    def _send(self, request: httpx.Request) -> httpx.Response:
        with _tunnel_refusals(str(request.url)):
            return self._inner.handle_request(request)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self._wait is not None:
            request.read()  # a held request is re-sent: its body must be at hand
        return settle(
            self._send(request),
            self._refusal,
            lambda approval_id, seconds: self._send(_retry(request, approval_id, seconds)),
            self._wait,
        )

    def close(self) -> None:
        self._inner.close()


class AsyncRaisingTransport(_Raising[httpx.AsyncBaseTransport], httpx.AsyncBaseTransport):
    """The ``async`` twin of :class:`RaisingTransport` (asyncio or trio, through anyio)."""

    async def _refusal(self, response: httpx.Response) -> OstiaryError | None:
        if not _ours(response):
            return None
        await response.aread()
        error = self._error(response)
        if error is not None:
            await response.aclose()
        return error

    async def _send(self, request: httpx.Request) -> httpx.Response:
        with _tunnel_refusals(str(request.url)):
            return await self._inner.handle_async_request(request)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """:func:`~ostiary.approval.settle`, awaited."""
        if self._wait is not None:
            await request.aread()
        response = await self._send(request)
        error = await self._refusal(response)
        if error is None:
            return response
        held = Collecting(error, self._wait)
        while (seconds := held.next_wait()) is not None:
            response = await self._send(_retry(request, held.approval_id, seconds))
            error = await self._refusal(response)
            if error is None:
                return response
            pause = held.pause_after(error)
            if pause > 0:
                await anyio.sleep(pause)
        raise held.pending

    async def aclose(self) -> None:
        await self._inner.aclose()
