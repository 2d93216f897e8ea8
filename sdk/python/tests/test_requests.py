"""The ``requests`` adapter against the real proxy: the same refusals as the ``httpx``
transports, and a held request waited for while a human approves it from the CLI."""

from __future__ import annotations

from datetime import timedelta

import pytest
import requests

import ostiary
from _approver import CliApprover
from _proxy import Proxy
from _rig import unique, url
from _upstream import Upstream
from ostiary.requests_adapter import OstiaryAdapter


def test_requests_allowed_denied_and_the_upstreams_own(
    control_env: Proxy, upstream: Upstream
) -> None:
    item = unique("rq")
    with ostiary.session(agent="requests-agent", max_calls=3) as s:
        with s.requests_session() as http:
            response = http.get(url(upstream.port, f"/items/{item}"), timeout=30)
            assert response.status_code == 200 and response.json()["id"] == item
            own = http.get(url(upstream.port, "/own-refusal"), timeout=30)
            assert own.status_code == 403
            with pytest.raises(ostiary.Denied) as denied:
                http.get(url(upstream.port, f"/secrets/{item}"), timeout=30)
            assert denied.value.policies == ("no-secrets",)
            http.get(url(upstream.port, f"/items/{unique('rq')}"), timeout=30)
            http.post(url(upstream.port, f"/items/{unique('rq')}"), json={}, timeout=30)
            with pytest.raises(ostiary.LimitExceeded) as limit:
                http.get(url(upstream.port, f"/items/{unique('rq')}"), timeout=30)
            assert (limit.value.limit, limit.value.max) == ("calls", 3)


def test_requests_waits_for_the_cli_approval(control_env: Proxy, upstream: Upstream) -> None:
    item = unique("rqdel")
    with ostiary.session(agent="requests-cleaner") as s:
        with CliApprover(control_env, s.id) as human:
            with s.requests_session(wait_for_approval=timedelta(seconds=60)) as http:
                response = http.delete(url(upstream.port, f"/items/{item}"), timeout=10)
        assert response.status_code == 200
        assert response.json() == {"deleted": item, "applied": 1}
        assert response.headers["ostiary-approval"] == human.approval_id
    assert upstream.count("DELETE", f"/items/{item}") == 1


def test_requests_without_a_wait_raises_approval_pending(
    control_env: Proxy, upstream: Upstream
) -> None:
    with ostiary.session(agent="requests-holder") as s, s.requests_session() as http:
        with pytest.raises(ostiary.ApprovalPending) as caught:
            http.delete(url(upstream.port, f"/items/{unique('rqh')}"), timeout=30)
        assert caught.value.approval_id and caught.value.status_url


def test_a_plain_requests_session_with_the_adapter_mounted(
    control_env: Proxy, upstream: Upstream
) -> None:
    """The adapter on a session the user configured from the environment, as an existing
    tool would: ``trust_env`` reads ``HTTPS_PROXY`` and ``REQUESTS_CA_BUNDLE``."""
    with ostiary.session(agent="env-requests") as s:
        http = requests.Session()
        http.mount("https://", OstiaryAdapter(secrets=[s.token]))
        with pytest.raises(ostiary.Denied):
            http.get(url(upstream.port, f"/secrets/{unique('x')}"), timeout=30)
        token, proxy_url = s.token, s.proxy_url
    # After the teardown the tunnel itself is refused: 407 at CONNECT.
    with pytest.raises(ostiary.Unauthenticated) as caught:
        http.get(
            url(upstream.port, f"/items/{unique('late')}"),
            proxies={"https": proxy_url},
            timeout=30,
        )
    assert caught.value.status == 407
    assert token not in str(caught.value) and token not in repr(caught.value)
