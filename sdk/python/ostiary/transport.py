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
import time
from collections.abc import Iterable
from datetime import timedelta

import anyio
import httpx

from .approval import ApprovalWait
from .errors import (
    ApprovalPending,
    Denied,
    OstiaryError,
    Unauthenticated,
    from_response,
)

__all__ = ["AsyncRaisingTransport", "RaisingTransport"]

_TUNNEL_STATUS = re.compile(r"^(\d{3})\b")


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


class RaisingTransport(httpx.BaseTransport):
    """Raises Ostiary's refusals; optionally waits up to ``wait_for_approval`` for a held
    request. ``secrets`` are strings never to quote in a message (the session token)."""

    def __init__(
        self,
        inner: httpx.BaseTransport,
        *,
        wait_for_approval: timedelta | None = None,
        secrets: Iterable[str] = (),
    ) -> None:
        self._inner = inner
        self._wait = wait_for_approval
        self._secrets = tuple(secrets)

    def _refusal(self, response: httpx.Response) -> OstiaryError | None:
        if "ostiary-request-id" not in response.headers:
            return None
        content = response.read()
        error = from_response(
            response.status_code, response.headers, content, secrets=self._secrets
        )
        if error is not None:
            response.close()
        return error

    def _send(self, request: httpx.Request) -> httpx.Response:
        try:
            return self._inner.handle_request(request)
        except httpx.ProxyError as exc:
            refusal = tunnel_refusal(str(exc), str(request.url))
            if refusal is None:
                raise
            raise refusal from None

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self._wait is not None:
            request.read()  # a held request is re-sent: its body must be at hand
        response = self._send(request)
        error = self._refusal(response)
        if error is None:
            return response
        if isinstance(error, ApprovalPending) and self._wait is not None and error.approval_id:
            return self._collect(request, error, ApprovalWait(self._wait))
        raise error

    def _collect(
        self, request: httpx.Request, pending: ApprovalPending, wait: ApprovalWait
    ) -> httpx.Response:
        approval_id = pending.approval_id or ""
        while (seconds := wait.next_wait()) is not None:
            response = self._send(_retry(request, approval_id, seconds))
            error = self._refusal(response)
            if error is None:
                return response
            if not isinstance(error, ApprovalPending):
                raise error
            pending = error
            pause = wait.pause()
            if pause > 0:
                time.sleep(pause)
        raise pending

    def close(self) -> None:
        self._inner.close()


class AsyncRaisingTransport(httpx.AsyncBaseTransport):
    """The ``async`` twin of :class:`RaisingTransport` (asyncio or trio, through anyio)."""

    def __init__(
        self,
        inner: httpx.AsyncBaseTransport,
        *,
        wait_for_approval: timedelta | None = None,
        secrets: Iterable[str] = (),
    ) -> None:
        self._inner = inner
        self._wait = wait_for_approval
        self._secrets = tuple(secrets)

    async def _refusal(self, response: httpx.Response) -> OstiaryError | None:
        if "ostiary-request-id" not in response.headers:
            return None
        content = await response.aread()
        error = from_response(
            response.status_code, response.headers, content, secrets=self._secrets
        )
        if error is not None:
            await response.aclose()
        return error

    async def _send(self, request: httpx.Request) -> httpx.Response:
        try:
            return await self._inner.handle_async_request(request)
        except httpx.ProxyError as exc:
            refusal = tunnel_refusal(str(exc), str(request.url))
            if refusal is None:
                raise
            raise refusal from None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self._wait is not None:
            await request.aread()
        response = await self._send(request)
        error = await self._refusal(response)
        if error is None:
            return response
        if isinstance(error, ApprovalPending) and self._wait is not None and error.approval_id:
            return await self._collect(request, error, ApprovalWait(self._wait))
        raise error

    async def _collect(
        self, request: httpx.Request, pending: ApprovalPending, wait: ApprovalWait
    ) -> httpx.Response:
        approval_id = pending.approval_id or ""
        while (seconds := wait.next_wait()) is not None:
            response = await self._send(_retry(request, approval_id, seconds))
            error = await self._refusal(response)
            if error is None:
                return response
            if not isinstance(error, ApprovalPending):
                raise error
            pending = error
            pause = wait.pause()
            if pause > 0:
                await anyio.sleep(pause)
        raise pending

    async def aclose(self) -> None:
        await self._inner.aclose()
