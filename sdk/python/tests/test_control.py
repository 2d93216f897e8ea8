"""The control client against the real control API (configuration from the environment,
sessions, approvals, audit), and against listeners that misbehave: down, answering something
that is not JSON, or JSON without what the call promises. Every failure is a clear
exception, and none carries the admin token or a session token."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

import ostiary
from _proxy import Proxy, free_port
from _rig import APPROVER, unique, url
from _upstream import Upstream

ADMIN = "admin-token-that-must-never-show-0123456789"


def assert_no_secret(error: BaseException, *secrets: str) -> None:
    texts = []
    e: BaseException | None = error
    while e is not None:  # the whole chain a traceback would print
        texts += [str(e), repr(e), *getattr(e, "__notes__", [])]
        e = e.__cause__ or e.__context__
    for secret in secrets:
        assert all(secret not in t for t in texts), texts


def test_configured_from_the_environment_and_explicitly(
    proxy: Proxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ostiary.ControlClient() as default:
        assert default.url == "http://127.0.0.1:8081", "the documented default"
    monkeypatch.setenv("OSTIARY_CONTROL_URL", proxy.control_url + "/")
    monkeypatch.setenv("OSTIARY_ADMIN_TOKEN", proxy.admin_token + "\n")  # as read from a file
    with ostiary.ControlClient() as control:
        assert control.url == proxy.control_url
        created = control.create_session("env-configured", ttl="5m", max_calls=3)
        assert created.session_id.startswith("ses_")
        assert created.agent == "env-configured"
        assert created.proxy_url.startswith("http://agent:")
        assert created.proxy_address == f"http://127.0.0.1:{proxy.proxy_port}"
        shown = control.session(created.session_id)
        assert (shown.session_id, shown.state, shown.agent) == (
            created.session_id, "live", "env-configured",
        )
        assert shown.usage["calls"] == 0 and shown.limits["max_calls"] == 3
        control.teardown(created.session_id)
        with pytest.raises(ostiary.NotFound) as caught:
            control.session(created.session_id)
        assert caught.value.status == 404
        with pytest.raises(ostiary.NotFound):
            control.teardown(created.session_id)
    # Explicit arguments win over the environment.
    monkeypatch.setenv("OSTIARY_CONTROL_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("OSTIARY_ADMIN_TOKEN", "wrong")
    with ostiary.ControlClient(proxy.control_url, proxy.admin_token) as control:
        created = control.create_session("explicit")
        control.terminate(created.session_id, reason="done with it")
        with pytest.raises(ostiary.NotFound):
            control.session(created.session_id)


def test_approvals_listed_shown_approved_and_denied(control_env: Proxy, upstream: Upstream) -> None:
    with ostiary.ControlClient() as control, ostiary.session(agent="asker") as s, s.client() as http:
        for _ in range(2):
            with pytest.raises(ostiary.ApprovalPending):
                http.delete(url(upstream.port, f"/items/{unique('ap')}"))
        held = control.approvals(session=s.id)
        assert len(held) == 2 and all(a.status == "pending" for a in held)
        assert {a.tool for a in held} == {"demo.delete"} and held[0].agent == "asker"
        assert held[0].session == s.id and held[0].summary
        first, second = held
        details = control.approval(first.approval_id)
        assert details["approval_id"] == first.approval_id
        assert details["policies"] == ["irreversible-needs-human"]
        approved = control.approve(first.approval_id, APPROVER, reason="fine")
        assert approved.approval_id == first.approval_id and approved.approver == APPROVER
        denied = control.deny(second.approval_id, APPROVER)
        assert denied.status == "denied"
        with pytest.raises(ostiary.Conflict) as again:
            control.deny(first.approval_id, APPROVER)
        assert again.value.kind == "not_pending"
        with pytest.raises(ostiary.Denied) as stranger:
            control.approve(hold(http, upstream), "mallory@example.com")
        assert stranger.value.kind == "not_an_approver"
        with pytest.raises(ostiary.NotFound):
            control.approval("apr_000000000000000000000000")
        with pytest.raises(ostiary.BadRequest):
            control.approvals("no-such-status")
        everything = control.approvals("all", session=s.id)
        assert {a.status for a in everything} >= {"denied"}


def hold(http: Any, upstream: Upstream) -> str:
    """A new held request of the session ``http`` belongs to: its approval id."""
    with pytest.raises(ostiary.ApprovalPending) as caught:
        http.delete(url(upstream.port, f"/items/{unique('ap')}"))
    assert caught.value.approval_id
    return caught.value.approval_id


def test_the_audit_trail_of_a_session(control_env: Proxy, upstream: Upstream) -> None:
    before = datetime.now(timezone.utc) - timedelta(seconds=5)
    with ostiary.ControlClient() as control, ostiary.session(agent="audited") as s, s.client() as http:
        http.get(url(upstream.port, f"/items/{unique('au')}"))
        with pytest.raises(ostiary.Denied) as denied:
            http.get(url(upstream.port, f"/secrets/{unique('au')}"))
        records = control.audit(session=s.id)
        assert records and all(r["session"] == s.id for r in records), records
        denials = control.audit(session=s.id, decision="deny")
        assert [r["request_id"] for r in denials if r.get("tool")] == [denied.value.request_id]
        assert control.audit(session=s.id, since=before, limit=1)
        assert control.audit(session=s.id, since=timedelta(minutes=5))
        assert control.audit(session=s.id, since=int(before.timestamp() * 1000))
        with pytest.raises(ostiary.BadRequest):
            control.audit(since="not a time")
        with pytest.raises(ostiary.ConfigurationError):
            control.audit(since=datetime.now())  # naive: which zone?


def test_the_async_control_client(control_env: Proxy) -> None:
    async def main() -> None:
        async with ostiary.AsyncControlClient() as control:
            created = await control.create_session("async-control", max_calls=1)
            status = await control.session(created.session_id)
            assert status.state == "live"
            assert await control.dead_letters(session=created.session_id) == []
            assert await control.approvals(session=created.session_id) == []
            await control.teardown(created.session_id)
            with pytest.raises(ostiary.NotFound):
                await control.session(created.session_id)

    asyncio.run(main())


def test_a_wrong_admin_token_is_unauthenticated_and_never_echoed(proxy: Proxy) -> None:
    with ostiary.ControlClient(proxy.control_url, ADMIN) as control:
        with pytest.raises(ostiary.Unauthenticated) as caught:
            control.approvals()
        # Creating a session, a wrong bearer is taken for a session token (a child's parent).
        with pytest.raises(ostiary.Unauthenticated) as created:
            control.create_session("nobody")
    assert caught.value.status == 401 and created.value.status == 401
    assert "admin token" in caught.value.message
    assert_no_secret(caught.value, ADMIN)
    assert_no_secret(created.value, ADMIN)
    assert ADMIN not in repr(control)


def test_no_admin_token_is_a_configuration_error_before_anything_is_sent() -> None:
    with ostiary.ControlClient("http://127.0.0.1:1") as control:
        with pytest.raises(ostiary.ConfigurationError, match="OSTIARY_ADMIN_TOKEN"):
            control.create_session("nobody")
        with pytest.raises(ostiary.ConfigurationError):
            control.approvals()
    assert isinstance(ostiary.ConfigurationError("x"), ValueError)


@pytest.mark.parametrize(
    "bad",
    ["ftp://127.0.0.1:8081", "127.0.0.1:8081", "http://", "not a url"],
)
def test_a_control_url_that_is_not_http_is_refused(
    bad: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ostiary.ConfigurationError, match="http"):
        ostiary.ControlClient(bad)
    monkeypatch.setenv("OSTIARY_CONTROL_URL", bad)
    with pytest.raises(ostiary.ConfigurationError, match="OSTIARY_CONTROL_URL"):
        ostiary.ControlClient()


def test_credentials_in_the_control_url_are_refused_without_echoing_them() -> None:
    with pytest.raises(ostiary.ConfigurationError) as caught:
        ostiary.ControlClient(f"http://admin:{ADMIN}@127.0.0.1:8081")
    assert_no_secret(caught.value, ADMIN)


def test_a_control_api_that_is_down_is_control_unavailable() -> None:
    down = f"http://127.0.0.1:{free_port()}"
    with ostiary.ControlClient(down, ADMIN, timeout=5) as control:
        with pytest.raises(ostiary.ControlUnavailable) as caught:
            control.create_session("nobody")
    assert down in caught.value.message and "POST /v1/sessions" in caught.value.message
    assert caught.value.status is None and caught.value.kind is None
    assert_no_secret(caught.value, ADMIN)
    with pytest.raises(ostiary.ControlUnavailable):
        with ostiary.session(agent="nobody", control_url=down, admin_token=ADMIN):
            pytest.fail("no session without a control API")

    async def main() -> None:
        async with ostiary.AsyncControlClient(down, ADMIN) as control:
            await control.approvals()

    with pytest.raises(ostiary.ControlUnavailable) as async_caught:
        asyncio.run(main())
    assert_no_secret(async_caught.value, ADMIN)


class FakeControl:
    """A listener that answers every request with one canned status, type and body."""

    def __init__(self) -> None:
        self.answers: dict[tuple[str, str], tuple[int, str, bytes]] = {}
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                self.rfile.read(length)
                key = (self.command, self.path.split("?")[0])
                status, ctype, body = fake.answers.get(key, (404, "text/plain", b"no"))
                self.send_response(status)
                self.send_header("content-type", ctype)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_DELETE = _handle

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def answer(self, method: str, path: str, status: int, body: object, ctype: str = "application/json") -> None:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.answers[(method, path)] = (status, ctype, raw)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def fake() -> Iterator[FakeControl]:
    server = FakeControl()
    yield server
    server.stop()


SESSION = {
    "session_id": "ses_fake",
    "agent": "fake",
    "tenant": "default",
    "token": "session-token-that-must-never-show-abcdef",
    "proxy_url": "http://agent:session-token-that-must-never-show-abcdef@127.0.0.1:9",
    "ca_pem": "-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n",
    "expires_at": 1,
}


def test_answers_that_are_not_the_control_apis_json(fake: FakeControl) -> None:
    with ostiary.ControlClient(fake.url, ADMIN) as control:
        check_bad_answers(fake, control)


def check_bad_answers(fake: FakeControl, control: ostiary.ControlClient) -> None:
    fake.answer("POST", "/v1/sessions", 502, b"<html>Bad Gateway " + ADMIN.encode() + b"</html>", "text/html")
    with pytest.raises(ostiary.ProtocolError) as html:
        control.create_session("x")
    assert html.value.status == 502 and "not JSON" in html.value.message
    assert "Bad Gateway" in html.value.message
    assert_no_secret(html.value, ADMIN)

    fake.answer("POST", "/v1/sessions", 201, {"session_id": "ses_1", "token": SESSION["token"]})
    with pytest.raises(ostiary.ProtocolError, match="'proxy_url'") as partial:
        control.create_session("x")
    assert_no_secret(partial.value, str(SESSION["token"]), ADMIN)

    fake.answer("POST", "/v1/sessions", 201, b"[1, 2]")
    with pytest.raises(ostiary.ProtocolError, match="not a JSON object"):
        control.create_session("x")

    fake.answer("POST", "/v1/sessions", 201, b"{not json")
    with pytest.raises(ostiary.ProtocolError, match="not JSON"):
        control.create_session("x")

    fake.answer("GET", "/v1/approvals", 200, {"approvals": "none"})
    with pytest.raises(ostiary.ProtocolError, match="approvals list"):
        control.approvals()

    fake.answer("GET", "/v1/approvals", 200, {"approvals": [{"status": "pending"}]})
    with pytest.raises(ostiary.ProtocolError, match="'approval_id'"):
        control.approvals()

    fake.answer("GET", "/v1/audit", 200, b'{"seq": 1}\nnot json\n', "application/x-ndjson")
    with pytest.raises(ostiary.ProtocolError, match="line 2"):
        control.audit()

    fake.answer("GET", "/v1/sessions/ses_1", 500, {"error": "brand_new_kind", "message": "new"})
    with pytest.raises(ostiary.OstiaryError) as unknown:
        control.session("ses_1")
    assert type(unknown.value) is ostiary.OstiaryError
    assert unknown.value.kind == "brand_new_kind" and unknown.value.status == 500

    fake.answer("GET", "/v1/sessions/ses_1", 500, {"message": "no kind"})
    with pytest.raises(ostiary.ProtocolError, match="no error kind"):
        control.session("ses_1")

    with pytest.raises(ostiary.ConfigurationError):
        control.session("")


def test_a_teardown_that_fails_is_raised_or_noted(fake: FakeControl) -> None:
    fake.answer("POST", "/v1/sessions", 201, SESSION)
    fake.answer("DELETE", "/v1/sessions/ses_fake", 500, {"error": "internal_error", "message": "store down"})
    # The block succeeded: the failed teardown is the error.
    with pytest.raises(ostiary.OstiaryError) as caught:
        with ostiary.session(agent="fake", control_url=fake.url, admin_token=ADMIN):
            pass
    assert caught.value.kind == "internal_error"
    assert_no_secret(caught.value, ADMIN, str(SESSION["token"]))

    # The block raised: its exception wins, the failed teardown is a note on it.
    class Boom(Exception):
        pass

    with pytest.raises(Boom) as boom:
        with ostiary.session(agent="fake", control_url=fake.url, admin_token=ADMIN) as s:
            assert repr(s) == "Session(id='ses_fake', agent='fake', proxy='http://127.0.0.1:9')"
            raise Boom()
    notes = getattr(boom.value, "__notes__", [])
    assert len(notes) == 1 and "ses_fake" in notes[0] and "store down" in notes[0]
    assert_no_secret(boom.value, ADMIN, str(SESSION["token"]))
