"""The official MCP Python SDK's client, through the proxy.

The MCP SDK (``mcp``, 2.x) speaks Streamable HTTP over its own ``httpx2`` client, so it
needs that client configured with the session's proxy and CA — it would not pick them from
the environment the way ``requests`` does. :func:`http_client` builds it, :func:`transport`
wraps it in the SDK's Streamable HTTP transport (and closes it afterwards), and :func:`client`
returns an ``mcp.Client`` on that transport; :func:`connect` gives a :class:`Connection` whose
calls raise Ostiary's refusals and can wait for a held one.

Ostiary refuses a ``tools/call`` the way MCP clients expect — HTTP 200 with a JSON-RPC error,
``-32001`` for denials and limits, ``-32002`` for a call held for approval — with the same
JSON body as an HTTP refusal in the error's ``data`` (docs/design.md §5). The SDK raises that
as ``MCPError``; :func:`refusal` reads it back into the :mod:`ostiary.errors` class, and
:func:`call_tool` raises that class directly. A held call is collected by calling the same
tool with the same arguments again with ``Ostiary-Approval`` on the connection (MCP clients
set headers per connection) — on the *same* connection, since a stateful server runs the
held call in the MCP session it came from: :meth:`Connection.call_tool` with
``wait_for_approval`` and :meth:`Connection.collect` do that until a deadline.

This module needs ``mcp`` (``pip install "ostiary[mcp]"``); the rest of the SDK does not.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult

from .approval import ApprovalWait
from .errors import ApprovalPending, OstiaryError, from_jsonrpc
from .session import Session

__all__ = ["Connection", "call_tool", "client", "connect", "http_client", "refusal", "transport"]

_UNSET: Any = object()

#: The MCP SDK's own defaults: 30 s to connect and write, 300 s to read a held-open stream.
DEFAULT_TIMEOUT = httpx2.Timeout(30.0, read=300.0)


def http_client(
    session: Session,
    *,
    headers: Mapping[str, str] | None = None,
    timeout: httpx2.Timeout | None = None,
) -> httpx2.AsyncClient:
    """An ``httpx2.AsyncClient`` for the MCP SDK: through the session's proxy, trusting its
    CA, ignoring the environment; ``headers`` go on every request of the connection."""
    return httpx2.AsyncClient(
        proxy=session.proxy_url,
        verify=session._ssl_context(),
        trust_env=False,
        timeout=timeout or DEFAULT_TIMEOUT,
        headers=dict(headers or {}),
    )


@asynccontextmanager
async def transport(
    session: Session,
    url: str,
    *,
    headers: Mapping[str, str] | None = None,
    timeout: httpx2.Timeout | None = None,
) -> AsyncIterator[Any]:
    """The SDK's Streamable HTTP transport to ``url`` through the proxy, for
    ``mcp.Client(transport(...))`` or ``ClientSession(*streams)``; the ``httpx2`` client it
    opens is closed when the transport is."""
    async with http_client(session, headers=headers, timeout=timeout) as http:
        async with streamable_http_client(url, http_client=http) as streams:
            yield streams


def client(
    session: Session,
    url: str,
    *,
    approval: str | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: httpx2.Timeout | None = None,
    **options: Any,
) -> Client:
    """An ``mcp.Client`` for the MCP server at ``url``, through the proxy; ``options`` go to
    ``mcp.Client`` (``mode=``, callbacks). ``approval`` collects a held call: the connection
    carries ``Ostiary-Approval: <approval>``, and the same call made on it gets its outcome."""
    sent = dict(headers or {})
    if approval is not None:
        sent["ostiary-approval"] = approval
    return Client(transport(session, url, headers=sent, timeout=timeout), **options)


def refusal(exc: BaseException) -> OstiaryError | None:
    """The Ostiary refusal an ``MCPError`` stands for, or ``None`` when the error is the MCP
    server's own (its ``data`` is not Ostiary's body)."""
    if not isinstance(exc, MCPError):
        return None
    return from_jsonrpc({"error": {"code": exc.code, "message": exc.message, "data": exc.data}})


async def call_tool(
    mcp: Client, name: str, arguments: dict[str, Any] | None = None, **options: Any
) -> CallToolResult:
    """``mcp.call_tool`` raising Ostiary's refusals as :mod:`ostiary.errors` exceptions
    (``Denied``, ``ApprovalPending``, ``LimitExceeded``, ...); the server's own errors stay
    ``MCPError``."""
    try:
        return await mcp.call_tool(name, arguments, **options)
    except MCPError as exc:
        refused = refusal(exc)
        if refused is None:
            raise
        raise refused from None


class Connection:
    """An MCP connection through the proxy that raises Ostiary's refusals and can wait for a
    held call (see :func:`connect`). ``client`` is the SDK's ``mcp.Client`` for everything
    else; ``http`` the ``httpx2`` client under it."""

    def __init__(self, client: Client, http: httpx2.AsyncClient, wait: timedelta | None) -> None:
        self.client = client
        self.http = http
        self._wait = wait
        # While a held call is collected its connection carries Ostiary-Approval, which
        # would not match any other call: calls on one connection take turns.
        self._turn = anyio.Lock()

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        *,
        wait_for_approval: timedelta | None = _UNSET,
        **options: Any,
    ) -> CallToolResult:
        """``tools/call``, raising Ostiary's refusals; a held call is waited for up to
        ``wait_for_approval`` (default: the connection's) and its result returned."""
        wait = self._wait if wait_for_approval is _UNSET else wait_for_approval
        async with self._turn:
            try:
                return await call_tool(self.client, name, arguments, **options)
            except ApprovalPending as pending:
                if wait is None or not pending.approval_id:
                    raise
                return await self._collect(pending, name, arguments, wait, options)

    async def collect(
        self,
        pending: ApprovalPending,
        name: str,
        arguments: dict[str, Any] | None = None,
        *,
        timeout: timedelta,
        **options: Any,
    ) -> CallToolResult:
        """The outcome of a call held earlier on this connection: the same call again with
        ``Ostiary-Approval`` and ``Prefer: wait``, until it is known or ``timeout`` passes
        (then the last ``ApprovalPending`` is raised). A stateful MCP server runs the held
        call in the MCP session it was sent in, so collect on the connection that sent it."""
        async with self._turn:
            return await self._collect(pending, name, arguments, timeout, options)

    async def _collect(
        self,
        pending: ApprovalPending,
        name: str,
        arguments: dict[str, Any] | None,
        timeout: timedelta,
        options: dict[str, Any],
    ) -> CallToolResult:
        if not pending.approval_id:
            raise pending
        wait = ApprovalWait(timeout)
        try:
            while (seconds := wait.next_wait()) is not None:
                self.http.headers.update(ApprovalWait.headers(pending.approval_id, seconds))
                try:
                    return await call_tool(self.client, name, arguments, **options)
                except ApprovalPending as still:
                    pending = still
                pause = wait.pause()
                if pause > 0:
                    await anyio.sleep(pause)
        finally:
            for header in ApprovalWait.headers("", 0):
                self.http.headers.pop(header, None)
        raise pending


@asynccontextmanager
async def connect(
    session: Session,
    url: str,
    *,
    headers: Mapping[str, str] | None = None,
    timeout: httpx2.Timeout | None = None,
    wait_for_approval: timedelta | None = _UNSET,
    **options: Any,
) -> AsyncIterator[Connection]:
    """An MCP connection to ``url`` through the proxy (``options`` go to ``mcp.Client``:
    ``mode=``, callbacks), whose :meth:`Connection.call_tool` raises Ostiary's refusals and
    waits up to ``wait_for_approval`` (default: the session's) for a held call::

        async with ostiary.mcp.connect(s, "https://files.example.com/mcp") as mcp:
            result = await mcp.call_tool("delete_file", {"path": "/x"},
                                         wait_for_approval=timedelta(minutes=10))
    """
    wait = session._wait if wait_for_approval is _UNSET else wait_for_approval
    async with http_client(session, headers=headers, timeout=timeout) as http:
        streams = streamable_http_client(url, http_client=http)
        async with Client(streams, **options) as mcp:
            yield Connection(mcp, http, wait)
