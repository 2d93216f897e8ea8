"""Ostiary's Python SDK: sessions, the control API, and HTTP clients that raise
Ostiary's refusals as exceptions.

An agent's runtime needs three things from Ostiary: a session (a token for the proxy and its
CA), clients that send everything through the proxy, and readable errors when the proxy says
no. So::

    import ostiary

    with ostiary.session(agent="triage-bot", max_calls=50) as s:
        with s.client() as http:            # httpx, proxy + CA + raising transport
            http.get("https://api.github.com/repos/o/r/issues")
        subprocess.run(["curl", "https://api.github.com/"])   # HTTPS_PROXY etc. are set

Layout — one module per concern:

- :mod:`ostiary.errors` — the exceptions, parsed from Ostiary's JSON bodies.
- :mod:`ostiary.control` — :class:`ControlClient` / :class:`AsyncControlClient`.
- :mod:`ostiary.models` — what the control API answers (:class:`CreatedSession`, ...).
- :mod:`ostiary.session` — :func:`session` and :class:`Session`, the context manager.
- :mod:`ostiary.environment` — the proxy and CA variables set for a block.
- :mod:`ostiary.transport` — ``httpx`` transports that raise (and wait for approvals).
- :mod:`ostiary.approval` — how a held request is waited for.
- :mod:`ostiary.requests_adapter` — the same for ``requests`` (imports ``requests``).
- :mod:`ostiary.mcp` — the MCP Python SDK's client through the proxy (imports ``mcp``).
"""

from .control import AsyncControlClient, ConfigurationError, ControlClient
from .errors import (
    ApprovalDenied,
    ApprovalExpired,
    ApprovalPending,
    ApprovalRequired,
    BadRequest,
    CheckFailed,
    Conflict,
    ControlUnavailable,
    CredentialUnavailable,
    Denied,
    DestinationBlocked,
    LimitExceeded,
    NotFound,
    OstiaryError,
    ProtocolError,
    SessionPaused,
    Unauthenticated,
    Unavailable,
    UpstreamError,
    UpstreamTimeout,
)
from .models import Approval, CreatedSession, SessionStatus
from .session import Session, session
from .transport import AsyncRaisingTransport, RaisingTransport

__version__ = "0.1.0"

__all__ = [
    "Approval",
    "ApprovalDenied",
    "ApprovalExpired",
    "ApprovalPending",
    "ApprovalRequired",
    "AsyncControlClient",
    "AsyncRaisingTransport",
    "BadRequest",
    "CheckFailed",
    "ConfigurationError",
    "Conflict",
    "ControlClient",
    "ControlUnavailable",
    "CreatedSession",
    "CredentialUnavailable",
    "Denied",
    "DestinationBlocked",
    "LimitExceeded",
    "NotFound",
    "OstiaryError",
    "ProtocolError",
    "RaisingTransport",
    "Session",
    "SessionPaused",
    "SessionStatus",
    "Unauthenticated",
    "Unavailable",
    "UpstreamError",
    "UpstreamTimeout",
    "session",
]
