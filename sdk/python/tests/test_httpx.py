"""``s.client()`` / ``s.async_client()`` against the real proxy: allowed calls come back as
the upstream answered them, every refusal is raised as its class with its details, and a
held request is waited for while a human approves it from the CLI."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import timedelta

import httpx
import pytest

import ostiary
from _approver import CliApprover
from _proxy import Proxy
from _rig import APPROVER, MCP, SECURE, unique, url
from _upstream import McpUpstream, Upstream


def test_an_allowed_call_is_the_upstreams_answer(control_env: Proxy, upstream: Upstream) -> None:
    item = unique("read")
    with ostiary.session(agent="reader") as s, s.client() as http:
        response = http.get(url(upstream.port, f"/items/{item}"))
        assert response.status_code == 200
        assert response.json() == {"id": item, "method": "GET"}
        # The TLS the client verified was Ostiary's (the upstream's CA is not trusted here).
        assert upstream.count("GET", f"/items/{item}") == 1
        # An upstream's own refusal is not Ostiary's: handed back, not raised.
        own = http.get(url(upstream.port, "/own-refusal"))
        assert own.status_code == 403
        assert own.json()["message"] == "the upstream's own refusal"


def test_a_denial_names_its_policies(control_env: Proxy, upstream: Upstream) -> None:
    item = unique("secret")
    with ostiary.session(agent="snoop") as s, s.client() as http:
        with pytest.raises(ostiary.Denied) as caught:
            http.get(url(upstream.port, f"/secrets/{item}"))
    denied = caught.value
    assert type(denied) is ostiary.Denied
    assert denied.status == 403 and denied.kind == "denied"
    assert denied.policies == ("no-secrets",)
    assert denied.action == 'Ostiary::Action::"tool:demo.secret"'
    assert denied.request_id, "the id an operator finds the audit record by"
    assert upstream.count("GET", f"/secrets/{item}") == 0, "nothing reached the upstream"
    # The audit record of that refusal carries the id the agent saw.
    with ostiary.ControlClient() as control:
        records = control.audit(decision="deny")
    assert any(r.get("request_id") == denied.request_id for r in records), records[-3:]


def test_the_session_budget_is_a_limit_exceeded(control_env: Proxy, upstream: Upstream) -> None:
    with ostiary.session(agent="budgeted", max_calls=2) as s, s.client() as http:
        for _ in range(2):
            assert http.get(url(upstream.port, f"/items/{unique('b')}")).status_code == 200
        third = unique("b")
        with pytest.raises(ostiary.LimitExceeded) as caught:
            http.get(url(upstream.port, f"/items/{third}"))
    limit = caught.value
    assert limit.status == 429
    assert (limit.limit, limit.used, limit.max, limit.retry_after) == ("calls", 2, 2, None)
    assert upstream.count("GET", f"/items/{third}") == 0


def test_a_paused_session_is_session_paused_until_resumed(
    control_env: Proxy, upstream: Upstream
) -> None:
    same = url(upstream.port, f"/items/{unique('loop')}")
    with ostiary.session(agent="looper") as s, s.client() as http:
        # [tiers.write] repeat_max = 3: the third identical write trips the watchdog.
        for _ in range(3):
            assert http.post(same, json={"again": True}).status_code == 201
        with pytest.raises(ostiary.SessionPaused) as caught:
            http.post(same, json={"again": True})
        assert caught.value.status == 423
        assert caught.value.reason and "demo.write" in caught.value.reason
        # Every request of the session is refused now, not only the repeated one.
        with pytest.raises(ostiary.SessionPaused):
            http.get(url(upstream.port, f"/items/{unique('other')}"))
        status = s.status()
        assert status.paused and status.paused_reason == caught.value.reason
        with ostiary.ControlClient() as control:
            letters = control.dead_letters(session=s.id)
            assert [letter["kind"] for letter in letters] == ["repeat"]
            control.resume(s.id)
            assert http.get(url(upstream.port, f"/items/{unique('after')}")).status_code == 200
            with pytest.raises(ostiary.Conflict):
                control.resume(s.id)  # not paused any more


def test_a_failed_check_and_a_missing_credential(control_env: Proxy, upstream: Upstream) -> None:
    with ostiary.session(agent="leaky") as s, s.client() as http:
        token = "gho_" + "a1B2" * 9
        with pytest.raises(ostiary.CheckFailed) as failed:
            http.post(url(upstream.port, f"/items/{unique('dlp')}"), json={"note": token})
        assert failed.value.status == 422
        assert failed.value.check == "dlp"
        assert token not in str(failed.value), "the check names the kind, never the secret"
        with pytest.raises(ostiary.CredentialUnavailable) as missing:
            http.get(url(upstream.port, f"/items/{unique('v')}", host=SECURE))
        assert missing.value.status == 503
        assert missing.value.credential == "vaulted"


def test_a_held_request_waits_for_the_cli_approval(control_env: Proxy, upstream: Upstream) -> None:
    item = unique("del")
    target = url(upstream.port, f"/items/{item}")
    with ostiary.session(agent="cleaner") as s:
        with CliApprover(control_env, s.id) as human:
            with s.client(wait_for_approval=timedelta(seconds=60)) as http:
                response = http.delete(target)
        assert "approved" in human.output
        assert response.status_code == 200
        assert response.json() == {"deleted": item, "applied": 1}
        assert response.headers["ostiary-approval"] == human.approval_id
        assert upstream.count("DELETE", f"/items/{item}") == 1, "executed exactly once"
        seen = upstream.requests_to(f"/items/{item}")[0]
        assert seen.headers["idempotency-key"] == f"ostiary-{human.approval_id}"
        with ostiary.ControlClient() as control:
            assert control.approval(human.approval_id or "")["status"] == "executed"


def test_a_denied_approval_is_approval_denied(control_env: Proxy, upstream: Upstream) -> None:
    item = unique("del")
    with ostiary.session(agent="cleaner", wait_for_approval=timedelta(seconds=60)) as s:
        with CliApprover(control_env, s.id, verdict="deny") as human, s.client() as http:
            with pytest.raises(ostiary.ApprovalDenied) as caught:
                http.delete(url(upstream.port, f"/items/{item}"))
    assert type(caught.value) is ostiary.ApprovalDenied
    assert caught.value.approval_id == human.approval_id
    assert caught.value.approver == APPROVER
    assert caught.value.reason == "checked by the test"
    assert upstream.count("DELETE", f"/items/{item}") == 0


def test_without_a_wait_a_hold_is_approval_pending_and_collectable_later(
    control_env: Proxy, upstream: Upstream
) -> None:
    item = unique("del")
    target = url(upstream.port, f"/items/{item}")
    with ostiary.session(agent="cleaner") as s:
        with s.client() as http:
            with pytest.raises(ostiary.ApprovalPending) as caught:
                http.delete(target)
            pending = caught.value
            assert pending.status == 202
            assert pending.approval_id and pending.approval_id.startswith("apr_")
            assert pending.status_url and pending.status_url.endswith(pending.approval_id)
            assert pending.approval_status == "pending"
            # A short wait that runs out raises the same pending approval, after the wait.
            started = time.monotonic()
            with s.client(wait_for_approval=timedelta(seconds=2)) as waiting:
                with pytest.raises(ostiary.ApprovalPending) as again:
                    waiting.delete(target)
            took = time.monotonic() - started
            assert again.value.approval_id == pending.approval_id, "the identical hold joined"
            assert 2 <= took < 20, took
            with ostiary.ControlClient() as control:
                control.approve(pending.approval_id, APPROVER)
            # Collected later with the header, as docs/approvals.md says.
            collected = http.delete(
                target, headers={"ostiary-approval": pending.approval_id, "prefer": "wait=30"}
            )
            assert collected.status_code == 200
            assert collected.json() == {"deleted": item, "applied": 1}
    assert upstream.count("DELETE", f"/items/{item}") == 1


def test_an_mcp_refusal_through_a_plain_client_is_raised(
    control_env: Proxy, mcp_upstream: McpUpstream
) -> None:
    port = mcp_upstream.port
    call = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "write_file", "arguments": {"path": "/x", "content": "y"}},
    }
    with ostiary.session(agent="mcp-raw") as s, s.client() as http:
        with pytest.raises(ostiary.Denied) as caught:
            http.post(
                f"https://{MCP}:{port}/mcp",
                content=json.dumps(call),
                headers={
                    "content-type": "application/json",
                    "accept": "application/json, text/event-stream",
                },
            )
    # HTTP 200 on the wire; the refusal is the JSON-RPC error's data.
    assert caught.value.policies == ("no-mcp-writes",)
    assert caught.value.kind == "denied"


def test_the_async_client_raises_and_waits_the_same(
    control_env: Proxy, upstream: Upstream
) -> None:
    item = unique("adel")

    async def main() -> None:
        async with ostiary.session(agent="async-agent") as s:
            async with s.async_client() as http:
                response = await http.get(url(upstream.port, f"/items/{item}"))
                assert response.json() == {"id": item, "method": "GET"}
                with pytest.raises(ostiary.Denied) as denied:
                    await http.get(url(upstream.port, f"/secrets/{item}"))
                assert denied.value.policies == ("no-secrets",)

            async def approve_when_held() -> str:
                async with ostiary.AsyncControlClient() as control:
                    for _ in range(300):
                        held = await control.approvals(session=s.id)
                        if held:
                            await control.approve(held[0].approval_id, APPROVER)
                            return held[0].approval_id
                        await asyncio.sleep(0.1)
                raise AssertionError("nothing was held")

            async with s.async_client(wait_for_approval=timedelta(seconds=60)) as http:
                approver = asyncio.ensure_future(approve_when_held())
                response = await http.delete(url(upstream.port, f"/items/{item}"))
                approval_id = await approver
            assert response.status_code == 200
            assert response.json() == {"deleted": item, "applied": 1}
            assert response.headers["ostiary-approval"] == approval_id

    asyncio.run(main())
    assert upstream.count("DELETE", f"/items/{item}") == 1


def test_a_torn_down_sessions_client_is_unauthenticated(
    control_env: Proxy, upstream: Upstream
) -> None:
    with ostiary.session(agent="short-lived") as s:
        http = s.client()
        token = s.token
    with http, pytest.raises(ostiary.Unauthenticated) as caught:
        http.get(url(upstream.port, f"/items/{unique('late')}"))
    assert caught.value.status == 407
    assert token not in str(caught.value) and token not in repr(caught.value)
    # And a plain-http request, whose 407 has a JSON body, says the same.
    with httpx.Client(
        transport=ostiary.RaisingTransport(httpx.HTTPTransport(proxy=s.created.proxy_url)),
        trust_env=False,
    ) as plain, pytest.raises(ostiary.Unauthenticated) as caught_plain:
        plain.get(f"http://api.example.test:{upstream.port}/items/x")
    assert caught_plain.value.kind == "unauthenticated"
    assert caught_plain.value.request_id


def test_a_proxy_that_is_down_fails_without_showing_the_token() -> None:
    token = "session-token-that-must-never-show-0123"
    proxy = f"http://agent:{token}@127.0.0.1:1"
    transport = ostiary.RaisingTransport(httpx.HTTPTransport(proxy=proxy), secrets=[token])
    with httpx.Client(transport=transport, trust_env=False) as http:
        with pytest.raises(httpx.ConnectError) as caught:
            http.get("https://api.example.test/items/x")
    assert token not in str(caught.value) and token not in repr(caught.value)
