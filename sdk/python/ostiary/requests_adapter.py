"""A ``requests`` transport adapter that raises Ostiary's refusals, like the ``httpx``
transports do (see :mod:`ostiary.transport` for what counts as a refusal and why).

``requests`` is not a dependency of the SDK: this module imports it, so import it only where
``requests`` is installed. Mount the adapter on a session (``session.mount("https://",
OstiaryAdapter())``), or let :meth:`ostiary.Session.requests_session` build one with the
proxy and the CA already set.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any

import requests
from requests.adapters import HTTPAdapter

from .approval import ApprovalWait, settle
from .errors import OstiaryError, from_response
from .transport import tunnel_refusal

__all__ = ["OstiaryAdapter"]

# urllib3 words a refused CONNECT "Tunnel connection failed: 407 Proxy Authentication Required".
_TUNNEL = re.compile(r"Tunnel connection failed: (\d{3}[^'\")]*)")

Timeout = float | tuple[float | None, float | None] | None


def _longer(timeout: Any, wait_seconds: int) -> Any:
    """``timeout`` (as ``requests`` takes it) with a read timeout that outlasts the wait."""
    if timeout is None:
        return None
    if isinstance(timeout, tuple):
        connect, read = timeout
        return (connect, ApprovalWait.read_timeout(read, wait_seconds))
    return (timeout, ApprovalWait.read_timeout(float(timeout), wait_seconds))


class OstiaryAdapter(HTTPAdapter):
    """An ``HTTPAdapter`` that raises :mod:`ostiary.errors` exceptions for Ostiary's own
    answers and, with ``wait_for_approval``, collects a held request's outcome.

    A held request is re-sent as it was prepared, so its body must be bytes or text (what
    ``data=``, ``json=`` and ``files=`` give), not a stream.
    """

    def __init__(
        self,
        *,
        wait_for_approval: timedelta | None = None,
        secrets: Iterable[str] = (),
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._wait = wait_for_approval
        self._secrets = tuple(secrets)

    def _refusal(self, response: requests.Response) -> OstiaryError | None:
        if "ostiary-request-id" not in response.headers:
            return None
        error = from_response(
            response.status_code, response.headers, response.content, secrets=self._secrets
        )
        if error is not None:
            response.close()
        return error

    def _send_once(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
        try:
            return super().send(request, **kwargs)
        except requests.exceptions.ProxyError as exc:
            found = _TUNNEL.search(str(exc))
            refusal = tunnel_refusal(found.group(1), request.url or "") if found else None
            if refusal is None:
                raise
            raise refusal from None

    def send(  # type: ignore[override]
        self,
        request: requests.PreparedRequest,
        stream: bool = False,
        timeout: Timeout = None,
        verify: bool | str = True,
        cert: str | tuple[str, str] | None = None,
        proxies: Mapping[str, str] | None = None,
    ) -> requests.Response:
        kwargs: dict[str, Any] = {
            "stream": stream,
            "timeout": timeout,
            "verify": verify,
            "cert": cert,
            "proxies": proxies,
        }

        def retry(approval_id: str, seconds: int) -> requests.Response:
            again = request.copy()
            again.headers.update(ApprovalWait.headers(approval_id, seconds))
            return self._send_once(again, **{**kwargs, "timeout": _longer(timeout, seconds)})

        return settle(self._send_once(request, **kwargs), self._refusal, retry, self._wait)
