"""Ostiary's refusals as Python exceptions, parsed from the JSON it answers with.

Every answer Ostiary produces itself carries an ``Ostiary-Request-Id`` header and a body
``{"error": <kind>, "message": <sentence>, "request_id": ..., ...details}`` (docs/design.md
§5); MCP calls get the same body as the ``data`` of a JSON-RPC error. An agent should not
have to learn that shape by hand, so each kind becomes a class with its details as typed
attributes, and every parse is total: a field of the wrong type reads as absent, an unknown
kind is a plain :class:`OstiaryError` that keeps its kind, and a body that is not JSON is a
:class:`ProtocolError` — never a ``KeyError`` from deep inside the SDK.

Messages are built only from what the body says and from values the caller passes in;
:func:`redact` removes secrets (session and admin tokens) from anything that could echo one.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "ApprovalDenied",
    "ApprovalExpired",
    "ApprovalPending",
    "ApprovalRequired",
    "BadRequest",
    "CheckFailed",
    "Conflict",
    "ControlUnavailable",
    "CredentialUnavailable",
    "Denied",
    "DestinationBlocked",
    "LimitExceeded",
    "NotFound",
    "OstiaryError",
    "ProtocolError",
    "SessionPaused",
    "Unauthenticated",
    "Unavailable",
    "UpstreamError",
    "UpstreamTimeout",
    "from_body",
    "from_jsonrpc",
    "from_response",
    "redact",
]

#: The header on every answer Ostiary produces itself (and on none it forwards).
REQUEST_ID_HEADER = "ostiary-request-id"
#: The header naming an approval: on the ``202`` that holds a request, and on the retry
#: that collects its outcome.
APPROVAL_HEADER = "ostiary-approval"

#: How much of a body that is not JSON an exception message quotes.
_QUOTE_LIMIT = 200


def redact(text: str, secrets: Iterable[str | None]) -> str:
    """``text`` with every secret replaced by ``***``.

    Used on anything an exception message quotes that did not come from the SDK itself (a
    body that is not JSON, a transport error's text), because a misconfigured server or a
    proxy URL in an error could echo the very token the SDK holds.
    """
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "***")
    return text


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: object) -> int | None:
    # bool is an int in Python; a JSON `true` is not a count.
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value) if isinstance(value, int) or value.is_integer() else None


def _number(value: object) -> int | float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


class OstiaryError(Exception):
    """Anything Ostiary refused or could not do, and anything the SDK could not make sense of.

    ``kind`` is Ostiary's ``error`` field (``None`` when there was no answer to read it
    from), ``status`` the HTTP status (``None`` likewise), ``request_id`` the id to quote to
    an operator (it finds the audit record), ``details`` every other field of the body.
    A kind this SDK does not know yet is raised as this class, so ``except OstiaryError``
    catches what a newer proxy says too.
    """

    kind: str | None
    status: int | None
    message: str
    request_id: str | None
    details: Mapping[str, Any]

    def __init__(
        self,
        message: str,
        *,
        kind: str | None = None,
        status: int | None = None,
        request_id: str | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind
        self.status = status
        self.request_id = request_id
        self.details = dict(details or {})

    def __str__(self) -> str:
        head = self.kind or type(self).__name__
        where = f" (HTTP {self.status})" if self.status is not None else ""
        rid = f" [request {self.request_id}]" if self.request_id else ""
        return f"{head}{where}: {self.message}{rid}"

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(kind={self.kind!r}, status={self.status!r}, "
            f"message={self.message!r}, request_id={self.request_id!r})"
        )


class ProtocolError(OstiaryError):
    """An answer the SDK cannot read: not JSON, no ``error`` kind, or a success body
    without the fields the call promises. Says what was wrong, never guesses a kind."""


class ControlUnavailable(OstiaryError):
    """The control API could not be reached at all (refused, timed out, DNS): nothing was
    decided, so retrying later is safe."""


class Unauthenticated(OstiaryError):
    """No, an invalid or an expired token: the session token at the proxy (``407``), or the
    admin token at the control API (``401``). A torn-down session's token gets this too."""

    @property
    def reason(self) -> str | None:
        return _str(self.details.get("reason"))


class BadRequest(OstiaryError):
    """A request the proxy will not read (smuggling shapes, bad JSON-RPC, an
    ``Ostiary-Approval`` for another request): ``reason`` names which."""

    @property
    def reason(self) -> str | None:
        return _str(self.details.get("reason"))


class Denied(OstiaryError):
    """A policy said no (``403 denied``). ``policies`` are the ids of the policies that
    decided it (``@id`` in the Cedar files; empty for the default deny), so an agent can
    tell which rule to ask about."""

    @property
    def policies(self) -> tuple[str, ...]:
        value = self.details.get("policies")
        if not isinstance(value, list):
            return ()
        return tuple(p for p in value if isinstance(p, str))

    @property
    def action(self) -> str | None:
        return _str(self.details.get("action"))

    @property
    def resource(self) -> str | None:
        return _str(self.details.get("resource"))

    @property
    def reason(self) -> str | None:
        return _str(self.details.get("reason"))


class ApprovalRequired(Denied):
    """A policy wants a human, and this proxy has no approval queue to hold the request in
    (``403 approval_required``): nothing will become of it by waiting."""


class DestinationBlocked(Denied):
    """The destination may never be reached (private address, port not allowed): refused
    before any policy or TLS. ``address`` is what was refused."""

    @property
    def address(self) -> str | None:
        return _str(self.details.get("address"))


class ApprovalPending(OstiaryError):
    """The request is held for a human (``202 approval_pending``; JSON-RPC ``-32002``).

    Nothing was sent upstream yet. Collect the outcome by re-sending the same request with
    ``Ostiary-Approval: <approval_id>`` — the transports do it for you with
    ``wait_for_approval`` — or from ``status_url``.
    """

    @property
    def approval_id(self) -> str | None:
        return _str(self.details.get("approval_id"))

    @property
    def status_url(self) -> str | None:
        return _str(self.details.get("status_url"))

    @property
    def expires_at(self) -> str | int | None:
        value = self.details.get("expires_at")
        if isinstance(value, str):
            return value
        return _int(value)

    @property
    def approval_status(self) -> str | None:
        """``pending``, ``approved`` or ``executing``: where the approval stands now."""
        return _str(self.details.get("status"))


class ApprovalDenied(OstiaryError):
    """A human denied the held request (``403 approval_denied``); it was not executed."""

    @property
    def approval_id(self) -> str | None:
        return _str(self.details.get("approval_id"))

    @property
    def approver(self) -> str | None:
        return _str(self.details.get("approver"))

    @property
    def reason(self) -> str | None:
        return _str(self.details.get("reason"))


class ApprovalExpired(ApprovalDenied):
    """Nobody decided before the approval's deadline (``403 approval_expired``); it was not
    executed. A subclass of :class:`ApprovalDenied`: for the agent the outcome is the same."""


class LimitExceeded(OstiaryError):
    """A budget, rate or bound is reached (``429 limit_exceeded``).

    ``limit`` names it (``calls``, ``cost``, ``bytes_sent``, ``rate:agent``, ``approvals``,
    ``children``, ``depth``, ...), ``used`` and ``max`` are in its unit, and ``retry_after``
    is the seconds until it reopens — ``None`` for a budget, which never refills by itself.
    """

    @property
    def limit(self) -> str | None:
        return _str(self.details.get("limit"))

    @property
    def used(self) -> int | float | None:
        return _number(self.details.get("used"))

    @property
    def max(self) -> int | float | None:
        return _number(self.details.get("max"))

    @property
    def retry_after(self) -> int | None:
        return _int(self.details.get("retry_after"))


class SessionPaused(OstiaryError):
    """The watchdog paused the session (``423``): every request is refused until a human
    resumes or terminates it. ``reason`` says what tripped it."""

    @property
    def reason(self) -> str | None:
        return _str(self.details.get("reason"))


class CheckFailed(OstiaryError):
    """A check refused the request (``422 check_failed``): ``check`` is which (``dlp``,
    ``args_schema``, ``limits``, ``webhook``), ``detail`` what it found — never the secret."""

    @property
    def check(self) -> str | None:
        return _str(self.details.get("check"))

    @property
    def detail(self) -> str | None:
        return _str(self.details.get("detail"))


class CredentialUnavailable(OstiaryError):
    """The broker could not fetch the credential this host needs (``503``; Vault down,
    sealed, an entry missing): nothing was sent upstream, so a retry is safe."""

    @property
    def credential(self) -> str | None:
        return _str(self.details.get("credential"))

    @property
    def reason(self) -> str | None:
        return _str(self.details.get("reason"))


class Unavailable(OstiaryError):
    """Ostiary cannot keep its promises right now (``audit_unavailable``,
    ``state_unavailable``): it refused rather than forward unaudited or uncounted."""

    @property
    def component(self) -> str | None:
        return _str(self.details.get("component"))


class UpstreamError(OstiaryError):
    """The upstream failed (``502 upstream_error``), or an approved request could not be
    executed; whether it took effect is unknown, so it is not retried for you."""

    @property
    def reason(self) -> str | None:
        return _str(self.details.get("reason"))


class UpstreamTimeout(UpstreamError):
    """The upstream did not answer in time (``504 upstream_timeout``)."""


class NotFound(OstiaryError):
    """The control API has no such session or approval (``404 not_found``)."""


class Conflict(OstiaryError):
    """The state a control call assumed is not the state there is: an approval already
    decided (``not_pending``), a session that is not paused (``conflict``), a used link."""


#: Ostiary's ``error`` kinds and the class each is raised as.
KINDS: Mapping[str, type[OstiaryError]] = {
    "unauthenticated": Unauthenticated,
    "bad_request": BadRequest,
    "misdirected_request": BadRequest,
    "denied": Denied,
    "not_an_approver": Denied,
    "approval_required": ApprovalRequired,
    "destination_blocked": DestinationBlocked,
    "approval_pending": ApprovalPending,
    "approval_denied": ApprovalDenied,
    "approval_expired": ApprovalExpired,
    "limit_exceeded": LimitExceeded,
    "session_paused": SessionPaused,
    "check_failed": CheckFailed,
    "credential_unavailable": CredentialUnavailable,
    "audit_unavailable": Unavailable,
    "state_unavailable": Unavailable,
    "upstream_error": UpstreamError,
    "upstream_timeout": UpstreamTimeout,
    "not_found": NotFound,
    "not_pending": Conflict,
    "conflict": Conflict,
    "link_used": Conflict,
}


def from_body(
    body: object,
    *,
    status: int | None = None,
    request_id: str | None = None,
) -> OstiaryError:
    """The exception for one of Ostiary's JSON bodies (already decoded).

    ``body`` that is not an object, or has no string ``error``, is a :class:`ProtocolError`
    saying so. The request id is the body's, else the header's (``request_id``).
    """
    if not isinstance(body, Mapping):
        return ProtocolError(
            f"Ostiary's answer is JSON but not an object (a {type(body).__name__})",
            status=status,
            request_id=request_id,
        )
    kind = body.get("error")
    if not isinstance(kind, str) or not kind:
        return ProtocolError(
            "Ostiary's answer has no error kind (no string \"error\" field)",
            status=status,
            request_id=_str(body.get("request_id")) or request_id,
        )
    message = _str(body.get("message")) or f"Ostiary refused the request ({kind})"
    details = {k: v for k, v in body.items() if k not in ("error", "message", "request_id")}
    cls = KINDS.get(kind, OstiaryError)
    return cls(
        message,
        kind=kind,
        status=status,
        request_id=_str(body.get("request_id")) or request_id,
        details=details,
    )


def from_jsonrpc(message: object, *, request_id: str | None = None) -> OstiaryError | None:
    """The exception for a JSON-RPC error that Ostiary answered an MCP call with, or
    ``None`` when ``message`` is not one (a result, or another server's error).

    Ostiary refuses a ``tools/call`` with HTTP 200 and ``{"error": {"code": -32001 or
    -32002, "message", "data": <the body of docs/design.md §5>}}``: the ``data`` is what is
    parsed, so an MCP refusal raises the same class as an HTTP one.
    """
    if not isinstance(message, Mapping):
        return None
    error = message.get("error")
    if not isinstance(error, Mapping):
        return None
    data = error.get("data")
    if not isinstance(data, Mapping) or not isinstance(data.get("error"), str):
        return None
    return from_body(data, request_id=request_id)


def from_response(
    status: int,
    headers: Mapping[str, str],
    content: bytes,
    *,
    secrets: Iterable[str | None] = (),
) -> OstiaryError | None:
    """The exception for an answer that Ostiary produced itself, or ``None`` for one it
    forwarded from the upstream (which is the caller's to judge, whatever its status).

    Ostiary's own answers are told apart by the ``Ostiary-Request-Id`` header, which it sets
    on every answer it makes and on none it forwards: an upstream's own ``403`` passes
    through. ``headers`` must be looked up case-insensitively (``httpx.Headers``,
    ``requests``' ``CaseInsensitiveDict``). A ``2xx`` is a refusal only as a held request
    (``202 approval_pending``) or a single JSON-RPC error carrying Ostiary's body; a batch
    is left to the caller, whose other calls may have succeeded.
    """
    request_id = headers.get(REQUEST_ID_HEADER)
    if request_id is None:
        return None
    try:
        body: object = json.loads(content) if content.strip() else None
    except ValueError:
        body = _NOT_JSON
    if 200 <= status < 300:
        if body is _NOT_JSON or body is None:
            return None
        if status == 202 and isinstance(body, Mapping) and body.get("error") == "approval_pending":
            return from_body(body, status=status, request_id=request_id)
        return from_jsonrpc(body, request_id=request_id)
    if status < 400:
        return None
    if body is _NOT_JSON or body is None:
        ctype = headers.get("content-type") or "no content type"
        quoted = redact(content[:_QUOTE_LIMIT].decode("utf-8", "replace"), secrets)
        what = f": {quoted!r}" if quoted.strip() else " (empty)"
        return ProtocolError(
            f"Ostiary answered HTTP {status} with a body that is not JSON ({ctype}){what}",
            status=status,
            request_id=request_id,
        )
    return from_body(body, status=status, request_id=request_id)


_NOT_JSON: Any = object()
