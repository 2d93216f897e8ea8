"""The control API client (docs/design.md §6): sessions, child sessions, teardown,
approvals, dead letters and the audit trail — in a blocking and an ``async`` flavour.

Both are configured from ``OSTIARY_CONTROL_URL`` (default ``http://127.0.0.1:8081``) and
``OSTIARY_ADMIN_TOKEN`` unless given explicitly, and both talk to the control listener
directly: ``trust_env=False``, because the control API is never reachable through the proxy
and the environment of an Ostiary session points every other client at the proxy.

Each call is declared once, on the clients' common base: a pure function of the caller's
arguments to a :class:`_Call` (method, path, query, body, which token) and the reader of its
answer (:func:`_read`). :class:`_Endpoint` makes it a method of both clients, which differ
only in how they send it: blocking, or awaited.

Failures are :mod:`ostiary.errors` exceptions: the control API's JSON refusals by kind (a
child past its parent's budget is :class:`~ostiary.errors.LimitExceeded`, as on the data
plane), a listener that cannot be reached :class:`~ostiary.errors.ControlUnavailable`, an
answer that cannot be read :class:`~ostiary.errors.ProtocolError`. No message ever carries a
token.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import ssl
import types
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Concatenate, Generic, ParamSpec, TypeAlias, TypeVar, overload
from urllib.parse import quote, urlsplit

import httpx

from .errors import (
    ControlUnavailable,
    OstiaryError,
    ProtocolError,
    from_body,
    redact,
)
from .models import Approval, CreatedSession, SessionStatus

__all__ = [
    "AsyncControlClient",
    "ConfigurationError",
    "ControlClient",
    "DEFAULT_CONTROL_URL",
]

DEFAULT_CONTROL_URL = "http://127.0.0.1:8081"
CONTROL_URL_ENV = "OSTIARY_CONTROL_URL"
ADMIN_TOKEN_ENV = "OSTIARY_ADMIN_TOKEN"

T = TypeVar("T")
P = ParamSpec("P")
#: The ``httpx`` client a control client sends with: blocking or ``async``.
H = TypeVar("H", httpx.Client, httpx.AsyncClient)
Verify = ssl.SSLContext | str | bool


class ConfigurationError(OstiaryError, ValueError):
    """The SDK was given something it cannot use: a control URL that is not ``http(s)``,
    or no admin token for a call that needs one. Raised before anything is sent."""


def _control_url(url: str | None) -> str:
    chosen = url if url is not None else os.environ.get(CONTROL_URL_ENV) or DEFAULT_CONTROL_URL
    parts = urlsplit(chosen)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        source = "the url argument" if url is not None else CONTROL_URL_ENV
        raise ConfigurationError(
            f"the control API URL ({source}) must be http:// or https:// with a host, "
            f"got {redact(chosen, [parts.password])!r}"
        )
    if parts.username or parts.password:
        raise ConfigurationError(
            "the control API URL must not carry credentials: pass admin_token= "
            f"or set {ADMIN_TOKEN_ENV}"
        )
    return chosen.rstrip("/")


def _duration(value: str | timedelta | None) -> str | None:
    if value is None or isinstance(value, str):
        return value
    seconds = value.total_seconds()
    if seconds <= 0:
        raise ConfigurationError(f"a duration must be positive, got {value}")
    return f"{int(seconds)}s" if seconds == int(seconds) else f"{int(seconds * 1000)}ms"


def _since(value: str | int | datetime | timedelta | None) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        raise ConfigurationError("since must be a datetime, a timedelta, epoch ms or a string")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, timedelta):
        return f"{int(value.total_seconds())}s"
    if value.tzinfo is None:
        raise ConfigurationError("since must be an aware datetime (with a tzinfo)")
    return str(int(value.timestamp() * 1000))


@dataclass(frozen=True)
class _Call:
    """One control API request, described independently of how it is sent."""

    method: str
    path: str
    params: Mapping[str, str] | None = None
    body: Mapping[str, Any] | None = None
    #: The bearer token: the admin token, or a session's own (creating its child). Out of
    #: ``repr``: a traceback that shows locals must not show it.
    token: str | None = field(default=None, repr=False)
    #: Whether the answer is JSON lines (the audit trail) rather than one JSON object.
    lines: bool = False

    def what(self) -> str:
        return f"{self.method} {self.path}"


def _read(call: _Call, response: httpx.Response, secrets: tuple[str | None, ...]) -> Any:
    """The decoded answer to ``call``, or the exception its refusal stands for."""
    status = response.status_code
    request_id = response.headers.get("ostiary-request-id")
    content = response.content
    if status >= 400:
        try:
            body = json.loads(content)
        except ValueError:
            quoted = redact(content[:200].decode("utf-8", "replace"), secrets)
            return ProtocolError(
                f"the control API answered {call.what()} with HTTP {status} and a body that "
                f"is not JSON: {quoted!r}",
                status=status,
                request_id=request_id,
            )
        return from_body(body, status=status, request_id=request_id)
    if call.lines:
        records = []
        for n, line in enumerate(content.decode("utf-8", "replace").splitlines(), 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except ValueError:
                return ProtocolError(
                    f"line {n} of the answer to {call.what()} is not JSON", status=status
                )
        return records
    try:
        return json.loads(content) if content.strip() else {}
    except ValueError:
        return ProtocolError(
            f"the control API answered {call.what()} with HTTP {status} and a body that is "
            "not JSON",
            status=status,
            request_id=request_id,
        )


#: A call and the reader that turns its decoded answer into what the method returns.
_Spec: TypeAlias = tuple[_Call, Callable[[Any], T]]


def _object(call: _Call, value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ProtocolError(f"the answer to {call.what()} is not a JSON object")
    return value


F = TypeVar("F", bound=Callable[..., Any])


def _named_like(describe: Callable[..., Any], method: F, owner: str) -> F:
    """``method`` of the class ``owner`` with the name, docstring and signature of the
    function describing it — without its return annotation, a spec rather than what the
    method answers."""
    functools.update_wrapper(method, describe)
    method.__qualname__ = f"{owner}.{describe.__name__}"
    signature = inspect.signature(describe).replace(return_annotation=inspect.Signature.empty)
    setattr(method, "__signature__", signature)
    return method


class _Endpoint(Generic[P, T]):
    """One control API call as a method of both clients, declared once by the function that
    describes it (its signature and docstring are the method's): ``describe`` turns the
    arguments into a :data:`_Spec`, which a :class:`ControlClient` sends and answers at once
    and an :class:`AsyncControlClient` in a coroutine."""

    def __init__(self, describe: Callable[Concatenate[_Calls[Any], P], _Spec[T]]) -> None:
        def sent(client: ControlClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
            return client._send(describe(client, *args, **kwargs))

        async def awaited(client: AsyncControlClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
            return await client._send(describe(client, *args, **kwargs))

        self._sent = _named_like(describe, sent, "ControlClient")
        self._awaited = _named_like(describe, awaited, "AsyncControlClient")

    @overload
    def __get__(
        self, client: None, owner: type[AsyncControlClient]
    ) -> Callable[Concatenate[AsyncControlClient, P], Coroutine[Any, Any, T]]: ...

    @overload
    def __get__(
        self, client: None, owner: type[ControlClient]
    ) -> Callable[Concatenate[ControlClient, P], T]: ...

    @overload
    def __get__(
        self, client: AsyncControlClient, owner: object = None
    ) -> Callable[P, Coroutine[Any, Any, T]]: ...

    @overload
    def __get__(self, client: ControlClient, owner: object = None) -> Callable[P, T]: ...

    def __get__(self, client: _Calls[Any] | None, owner: object = None) -> Any:
        kind = type(client) if client is not None else owner
        method: Callable[..., Any] = (
            self._awaited
            if isinstance(kind, type) and issubclass(kind, AsyncControlClient)
            else self._sent
        )
        return method if client is None else types.MethodType(method, client)


class _Calls(Generic[H]):
    """The control API's calls, each described once (an :class:`_Endpoint`), and everything
    about sending them but the sending itself."""

    def __init__(
        self,
        url: str | None = None,
        admin_token: str | None = None,
        *,
        timeout: float = 30.0,
        verify: Verify = True,
    ) -> None:
        self.url = _control_url(url)
        token = admin_token if admin_token is not None else os.environ.get(ADMIN_TOKEN_ENV)
        self._admin_token = token.strip() if token else None
        self._http: H = self._connect(timeout=timeout, verify=verify, trust_env=False)

    def _connect(self, **options: Any) -> H:
        """The ``httpx`` client to send with, made with ``options``."""
        raise NotImplementedError

    def __repr__(self) -> str:
        has = "set" if self._admin_token else "none"
        return f"{type(self).__name__}(url={self.url!r}, admin_token={has})"

    def _admin(self) -> str:
        if not self._admin_token:
            raise ConfigurationError(
                f"this control API call needs the admin token: pass admin_token= or set "
                f"{ADMIN_TOKEN_ENV}"
            )
        return self._admin_token

    def _secrets(self, call: _Call) -> tuple[str | None, ...]:
        return (self._admin_token, call.token)

    @staticmethod
    def _seg(value: str) -> str:
        if not value:
            raise ConfigurationError("an id must not be empty")
        return quote(value, safe="")

    def _request(self, spec: _Spec[Any]) -> httpx.Request:
        call = spec[0]
        headers = {"accept": "application/json"}
        if call.token:
            headers["authorization"] = f"Bearer {call.token}"
        return self._http.build_request(
            call.method,
            self.url + call.path,
            params=call.params,
            json=call.body,
            headers=headers,
        )

    def _unreachable(self, spec: _Spec[Any], exc: Exception) -> ControlUnavailable:
        call = spec[0]
        detail = redact(str(exc) or type(exc).__name__, self._secrets(call))
        return ControlUnavailable(
            f"the control API at {self.url} cannot be reached for {call.what()}: {detail}"
        )

    def _answer(self, spec: _Spec[T], response: httpx.Response) -> T:
        """What the method returns for ``response``, or the exception its refusal stands for."""
        call, convert = spec
        value = _read(call, response, self._secrets(call))
        if isinstance(value, OstiaryError):
            raise value
        return convert(value)

    # ------------------------------------------------------------------ the calls

    @_Endpoint
    def create_session(
        self,
        agent: str | None = None,
        *,
        parent: str | CreatedSession | None = None,
        tenant: str | None = None,
        ttl: str | timedelta | None = None,
        max_calls: int | None = None,
        max_cost: float | None = None,
        max_bytes_sent: int | None = None,
        max_bytes_received: int | None = None,
        max_pending_approvals: int | None = None,
        profile: str | None = None,
    ) -> _Spec[CreatedSession]:
        """``POST /v1/sessions``. ``parent`` as a :class:`CreatedSession` creates a child
        with that session's own token (budgets carved out of its remaining ones); as a
        session id, an operator creates the child on its behalf (admin token)."""
        body: dict[str, Any] = {
            k: v
            for k, v in {
                "agent": agent,
                "tenant": tenant,
                "ttl": _duration(ttl),
                "max_calls": max_calls,
                "max_cost": max_cost,
                "max_bytes_sent": max_bytes_sent,
                "max_bytes_received": max_bytes_received,
                "max_pending_approvals": max_pending_approvals,
                "profile": profile,
            }.items()
            if v is not None
        }
        if isinstance(parent, CreatedSession):
            # The parent's own token: the way an agent spawns a sub-agent, no admin needed.
            token = parent.token
        else:
            if agent is None and parent is None:
                raise ConfigurationError("a root session needs an agent name")
            if parent is not None:
                body["parent"] = parent
            token = self._admin()
        call = _Call("POST", "/v1/sessions", body=body, token=token)
        return call, lambda v: CreatedSession.from_json(_object(call, v))

    @_Endpoint
    def session(self, session_id: str) -> _Spec[SessionStatus]:
        """``GET /v1/sessions/{id}``: state, pause reason, usage, limits, children."""
        call = _Call("GET", f"/v1/sessions/{self._seg(session_id)}", token=self._admin())
        return call, lambda v: SessionStatus.from_json(_object(call, v))

    @_Endpoint
    def teardown(self, session_id: str) -> _Spec[None]:
        """``DELETE /v1/sessions/{id}``: the session and its descendants are refused from
        now on, their leases revoked and cached credentials dropped."""
        call = _Call("DELETE", f"/v1/sessions/{self._seg(session_id)}", token=self._admin())
        return call, lambda v: None

    @_Endpoint
    def terminate(self, session_id: str, reason: str | None = None) -> _Spec[None]:
        """``POST /v1/sessions/{id}/terminate``: a teardown with a reason for the audit."""
        body = {"reason": reason} if reason else {}
        path = f"/v1/sessions/{self._seg(session_id)}/terminate"
        return _Call("POST", path, body=body, token=self._admin()), lambda v: None

    @_Endpoint
    def resume(self, session_id: str) -> _Spec[None]:
        """``POST /v1/sessions/{id}/resume``: lift a watchdog pause."""
        path = f"/v1/sessions/{self._seg(session_id)}/resume"
        return _Call("POST", path, token=self._admin()), lambda v: None

    @_Endpoint
    def dead_letters(self, session: str | None = None) -> _Spec[list[dict[str, Any]]]:
        """``GET /v1/dead-letters``: what the watchdog recorded when it paused sessions."""
        params = {"session": session} if session else None
        call = _Call("GET", "/v1/dead-letters", params=params, token=self._admin())

        def read(v: Any) -> list[dict[str, Any]]:
            letters = _object(call, v).get("dead_letters")
            if not isinstance(letters, list):
                raise ProtocolError(f"the answer to {call.what()} has no dead_letters list")
            return [dict(x) for x in letters if isinstance(x, Mapping)]

        return call, read

    @_Endpoint
    def approvals(
        self,
        status: str | None = "pending",
        *,
        session: str | None = None,
        limit: int | None = None,
    ) -> _Spec[list[Approval]]:
        """``GET /v1/approvals`` (``status="all"`` for every state)."""
        params = {
            k: v
            for k, v in {
                # The API's own spelling of "every state" is no status at all.
                "status": None if status == "all" else status,
                "session": session,
                "limit": None if limit is None else str(limit),
            }.items()
            if v is not None
        }
        call = _Call("GET", "/v1/approvals", params=params, token=self._admin())

        def read(v: Any) -> list[Approval]:
            listed = _object(call, v).get("approvals")
            if not isinstance(listed, list):
                raise ProtocolError(f"the answer to {call.what()} has no approvals list")
            return [Approval.from_json(a) for a in listed if isinstance(a, Mapping)]

        return call, read

    @_Endpoint
    def approval(self, approval_id: str) -> _Spec[dict[str, Any]]:
        """``GET /v1/approvals/{id}``: everything, including notification delivery."""
        call = _Call("GET", f"/v1/approvals/{self._seg(approval_id)}", token=self._admin())
        return call, lambda v: dict(_object(call, v))

    @_Endpoint
    def approve(
        self, approval_id: str, approver: str, reason: str | None = None
    ) -> _Spec[Approval]:
        """``POST /v1/approvals/{id}/approve``: the held request then runs exactly once."""
        return self._decide(approval_id, "approve", approver, reason)

    @_Endpoint
    def deny(self, approval_id: str, approver: str, reason: str | None = None) -> _Spec[Approval]:
        """``POST /v1/approvals/{id}/deny``."""
        return self._decide(approval_id, "deny", approver, reason)

    def _decide(
        self, approval_id: str, verdict: str, approver: str, reason: str | None
    ) -> _Spec[Approval]:
        if not approver:
            raise ConfigurationError("deciding an approval needs the approver's name")
        body: dict[str, Any] = {"approver": approver}
        if reason is not None:
            body["reason"] = reason
        path = f"/v1/approvals/{self._seg(approval_id)}/{verdict}"
        call = _Call("POST", path, body=body, token=self._admin())
        return call, lambda v: Approval.from_json(_object(call, v))

    @_Endpoint
    def audit(
        self,
        *,
        session: str | None = None,
        since: str | int | datetime | timedelta | None = None,
        decision: str | None = None,
        limit: int | None = None,
    ) -> _Spec[list[dict[str, Any]]]:
        """``GET /v1/audit``: the audit records, oldest first. ``since`` is epoch ms, an
        aware ``datetime``, a ``timedelta`` back from now, or the API's own string."""
        params = {
            k: v
            for k, v in {
                "session": session,
                "since": _since(since),
                "decision": decision,
                "limit": None if limit is None else str(limit),
            }.items()
            if v is not None
        }
        call = _Call("GET", "/v1/audit", params=params, token=self._admin(), lines=True)

        def read(v: Any) -> list[dict[str, Any]]:
            return [dict(r) for r in v if isinstance(r, Mapping)]

        return call, read


class ControlClient(_Calls[httpx.Client]):
    """A blocking control API client.

    ``url`` defaults to ``$OSTIARY_CONTROL_URL``, then ``http://127.0.0.1:8081``;
    ``admin_token`` to ``$OSTIARY_ADMIN_TOKEN``. Without an admin token only a session
    creating its own child (``create_session(parent=<CreatedSession>)``) can be called.
    Use it as a context manager, or :meth:`close` it, to release its connections.
    """

    def _connect(self, **options: Any) -> httpx.Client:
        return httpx.Client(**options)

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _send(self, spec: _Spec[T]) -> T:
        try:
            response = self._http.send(self._request(spec))
        except httpx.TransportError as exc:
            raise self._unreachable(spec, exc) from None
        return self._answer(spec, response)


class AsyncControlClient(_Calls[httpx.AsyncClient]):
    """The ``async`` twin of :class:`ControlClient`: the same calls, awaited."""

    def _connect(self, **options: Any) -> httpx.AsyncClient:
        return httpx.AsyncClient(**options)

    async def __aenter__(self) -> AsyncControlClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _send(self, spec: _Spec[T]) -> T:
        try:
            response = await self._http.send(self._request(spec))
        except httpx.TransportError as exc:
            raise self._unreachable(spec, exc) from None
        return self._answer(spec, response)
