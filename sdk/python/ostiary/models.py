"""What the control API answers, as frozen dataclasses read once from its JSON.

Each reader checks the fields the SDK relies on and raises :class:`~ostiary.errors.ProtocolError`
naming the one missing, rather than letting a ``KeyError`` escape later; the full JSON stays
in ``raw`` for fields a newer proxy adds. A created session holds its token: the token, the
proxy URL (which embeds it) and the CA are kept out of ``repr`` so that logging a session never
logs its credential.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from .errors import ProtocolError

__all__ = ["Approval", "CreatedSession", "SessionStatus"]


def _require_str(body: Mapping[str, Any], name: str, what: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value:
        raise ProtocolError(f"the control API's answer to {what} has no {name!r} string")
    return value


def _opt_str(body: Mapping[str, Any], name: str) -> str | None:
    value = body.get(name)
    return value if isinstance(value, str) else None


def _opt_int(body: Mapping[str, Any], name: str, default: int = 0) -> int:
    value = body.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _mapping(value: object) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


@dataclass(frozen=True)
class CreatedSession:
    """A session as ``POST /v1/sessions`` created it: who it is and how to use it.

    ``proxy_url`` is ``http://agent:<token>@host:port``, the form every HTTP client takes
    for ``HTTPS_PROXY``; ``proxy_address`` is the same without the token, for messages.
    """

    session_id: str
    agent: str
    tenant: str
    token: str = field(repr=False)
    proxy_url: str = field(repr=False)
    ca_pem: str = field(repr=False)
    expires_at: int | str | None = None
    parent: str | None = None
    depth: int = 0
    #: Placeholder variables for the credentials the session may use
    #: (``GITHUB_TOKEN=ostiary:github``): worthless outside the proxy.
    placeholders: Mapping[str, str] = field(default_factory=dict)
    #: The limits the session got (``max_calls``, ``max_cost``, ...): what it named, its
    #: parent's carving, or the proxy's defaults.
    limits: Mapping[str, Any] = field(default_factory=dict)

    @property
    def proxy_address(self) -> str:
        parts = urlsplit(self.proxy_url)
        netloc = parts.hostname or ""
        if ":" in netloc:
            netloc = f"[{netloc}]"
        if parts.port is not None:
            netloc = f"{netloc}:{parts.port}"
        return urlunsplit((parts.scheme, netloc, "", "", ""))

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> CreatedSession:
        what = "POST /v1/sessions"
        expires = body.get("expires_at")
        placeholders = {
            k: v for k, v in _mapping(body.get("placeholders")).items() if isinstance(v, str)
        }
        return cls(
            session_id=_require_str(body, "session_id", what),
            agent=_opt_str(body, "agent") or "",
            tenant=_opt_str(body, "tenant") or "",
            token=_require_str(body, "token", what),
            proxy_url=_require_str(body, "proxy_url", what),
            ca_pem=_require_str(body, "ca_pem", what),
            expires_at=expires if isinstance(expires, int | str) else None,
            parent=_opt_str(body, "parent"),
            depth=_opt_int(body, "depth"),
            placeholders=placeholders,
            limits=_mapping(body.get("limits")),
        )


@dataclass(frozen=True)
class SessionStatus:
    """``GET /v1/sessions/{id}``: whether the session is live or paused (and why), what it
    used against its limits, and its live children."""

    session_id: str
    agent: str
    tenant: str
    state: str
    parent: str | None
    depth: int
    #: Why the watchdog paused it, while it is paused.
    paused_reason: str | None
    usage: Mapping[str, Any]
    limits: Mapping[str, Any]
    children: tuple[str, ...]
    raw: Mapping[str, Any] = field(repr=False)

    @property
    def paused(self) -> bool:
        return self.state == "paused"

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> SessionStatus:
        what = "GET /v1/sessions/{id}"
        paused = _mapping(body.get("paused"))
        children = body.get("children")
        return cls(
            session_id=_require_str(body, "session_id", what),
            agent=_opt_str(body, "agent") or "",
            tenant=_opt_str(body, "tenant") or "",
            state=_require_str(body, "state", what),
            parent=_opt_str(body, "parent"),
            depth=_opt_int(body, "depth"),
            paused_reason=_opt_str(paused, "reason"),
            usage=_mapping(body.get("usage")),
            limits=_mapping(body.get("limits")),
            children=tuple(c for c in children if isinstance(c, str))
            if isinstance(children, list)
            else (),
            raw=dict(body),
        )


@dataclass(frozen=True)
class Approval:
    """One approval as the queue lists it (``GET /v1/approvals``, and the answer to approve
    and deny): enough to pick it and decide it; ``raw`` has the rest."""

    approval_id: str
    status: str
    tool: str | None
    agent: str | None
    session: str | None
    summary: str | None
    approver: str | None
    raw: Mapping[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> Approval:
        what = "an approvals call"
        return cls(
            approval_id=_require_str(body, "approval_id", what),
            status=_require_str(body, "status", what),
            tool=_opt_str(body, "tool"),
            agent=_opt_str(body, "agent"),
            session=_opt_str(body, "session"),
            summary=_opt_str(body, "summary"),
            approver=_opt_str(body, "approver"),
            raw=dict(body),
        )
