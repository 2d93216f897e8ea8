"""Parsing Ostiary's JSON into exceptions: every kind of docs/design.md §5, and every bad
input (not JSON, no kind, an unknown kind, fields of the wrong type, JSON-RPC shapes) gives a
clear exception — never a KeyError or a TypeError from inside the SDK."""

from __future__ import annotations

import json

import httpx
import pytest

import ostiary
from ostiary.errors import from_body, from_jsonrpc, from_response

OWN = {"ostiary-request-id": "req-1", "content-type": "application/json"}


def parse(status: int, body: object, headers: dict[str, str] | None = None) -> object:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return from_response(status, httpx.Headers(OWN if headers is None else headers), raw)


@pytest.mark.parametrize(
    ("status", "kind", "cls"),
    [
        (407, "unauthenticated", ostiary.Unauthenticated),
        (400, "bad_request", ostiary.BadRequest),
        (421, "misdirected_request", ostiary.BadRequest),
        (403, "denied", ostiary.Denied),
        (403, "approval_required", ostiary.ApprovalRequired),
        (403, "destination_blocked", ostiary.DestinationBlocked),
        (202, "approval_pending", ostiary.ApprovalPending),
        (403, "approval_denied", ostiary.ApprovalDenied),
        (403, "approval_expired", ostiary.ApprovalExpired),
        (429, "limit_exceeded", ostiary.LimitExceeded),
        (423, "session_paused", ostiary.SessionPaused),
        (422, "check_failed", ostiary.CheckFailed),
        (503, "credential_unavailable", ostiary.CredentialUnavailable),
        (502, "upstream_error", ostiary.UpstreamError),
        (504, "upstream_timeout", ostiary.UpstreamTimeout),
        (503, "audit_unavailable", ostiary.Unavailable),
        (503, "state_unavailable", ostiary.Unavailable),
        (404, "not_found", ostiary.NotFound),
        (409, "not_pending", ostiary.Conflict),
    ],
)
def test_every_kind_has_its_class(status: int, kind: str, cls: type) -> None:
    error = parse(status, {"error": kind, "message": "why", "request_id": "req-9"})
    assert type(error) is cls
    assert isinstance(error, ostiary.OstiaryError)
    assert error.kind == kind
    assert error.status == status
    assert error.message == "why"
    # The body's request id wins over the header's: it is the audit record's.
    assert error.request_id == "req-9"
    assert str(error) == f"{kind} (HTTP {status}): why [request req-9]"


def test_details_are_typed_attributes() -> None:
    denied = parse(
        403,
        {
            "error": "denied",
            "message": "Denied by policy.",
            "policies": ["no-secrets", "other"],
            "action": 'Ostiary::Action::"tool:demo.secret"',
            "resource": 'Ostiary::Tool::"demo.secret"',
        },
    )
    assert isinstance(denied, ostiary.Denied)
    assert denied.policies == ("no-secrets", "other")
    assert denied.action == 'Ostiary::Action::"tool:demo.secret"'
    assert denied.resource == 'Ostiary::Tool::"demo.secret"'
    assert denied.request_id == "req-1", "the header's id when the body has none"

    limit = parse(
        429,
        {"error": "limit_exceeded", "limit": "rate:agent", "used": 10, "max": 10, "retry_after": 3},
    )
    assert isinstance(limit, ostiary.LimitExceeded)
    assert (limit.limit, limit.used, limit.max, limit.retry_after) == ("rate:agent", 10, 10, 3)
    cost = parse(429, {"error": "limit_exceeded", "limit": "cost", "used": 1.5, "max": 2.0})
    assert isinstance(cost, ostiary.LimitExceeded)
    assert (cost.used, cost.max, cost.retry_after) == (1.5, 2.0, None)

    pending = parse(
        202,
        {
            "error": "approval_pending",
            "approval_id": "apr_1",
            "status_url": "http://127.0.0.1:1/v1/approvals/apr_1",
            "expires_at": "2026-12-01T10:00:00Z",
            "status": "pending",
        },
    )
    assert isinstance(pending, ostiary.ApprovalPending)
    assert pending.approval_id == "apr_1"
    assert pending.status_url == "http://127.0.0.1:1/v1/approvals/apr_1"
    assert pending.expires_at == "2026-12-01T10:00:00Z"
    assert pending.approval_status == "pending"

    checked = parse(422, {"error": "check_failed", "check": "dlp", "detail": "a GitHub token"})
    assert isinstance(checked, ostiary.CheckFailed)
    assert (checked.check, checked.detail) == ("dlp", "a GitHub token")
    cred = parse(503, {"error": "credential_unavailable", "credential": "gh", "reason": "down"})
    assert isinstance(cred, ostiary.CredentialUnavailable)
    assert (cred.credential, cred.reason) == ("gh", "down")
    paused = parse(423, {"error": "session_paused", "reason": "12 identical calls"})
    assert isinstance(paused, ostiary.SessionPaused)
    assert paused.reason == "12 identical calls"
    no = parse(403, {"error": "approval_denied", "approval_id": "apr_2", "approver": "bob"})
    assert isinstance(no, ostiary.ApprovalDenied)
    assert (no.approval_id, no.approver, no.reason) == ("apr_2", "bob", None)


def test_fields_of_the_wrong_type_read_as_absent() -> None:
    denied = parse(403, {"error": "denied", "policies": "no-secrets", "action": 7})
    assert isinstance(denied, ostiary.Denied)
    assert denied.policies == ()
    assert denied.action is None
    mixed = parse(403, {"error": "denied", "policies": ["ok", 3, None, {"x": 1}]})
    assert isinstance(mixed, ostiary.Denied)
    assert mixed.policies == ("ok",)
    limit = parse(
        429, {"error": "limit_exceeded", "limit": 5, "used": "many", "max": True, "retry_after": "x"}
    )
    assert isinstance(limit, ostiary.LimitExceeded)
    assert (limit.limit, limit.used, limit.max, limit.retry_after) == (None, None, None, None)
    pending = parse(202, {"error": "approval_pending", "approval_id": ["apr_1"]})
    assert isinstance(pending, ostiary.ApprovalPending)
    assert pending.approval_id is None
    # No message: one is made from the kind, not left empty.
    bare = parse(423, {"error": "session_paused"})
    assert isinstance(bare, ostiary.SessionPaused)
    assert bare.message == "Ostiary refused the request (session_paused)"


def test_an_unknown_kind_is_a_plain_ostiary_error_that_keeps_it() -> None:
    error = parse(418, {"error": "teapot_policy", "message": "short and stout", "spout": 1})
    assert type(error) is ostiary.OstiaryError
    assert error.kind == "teapot_policy"
    assert error.message == "short and stout"
    assert error.details == {"spout": 1}
    assert "teapot_policy" in str(error) and "418" in str(error)


def test_bodies_that_are_not_ostiarys_json_are_protocol_errors() -> None:
    html = parse(502, b"<html><body>Bad gateway</body></html>", {**OWN, "content-type": "text/html"})
    assert isinstance(html, ostiary.ProtocolError)
    assert html.status == 502 and html.request_id == "req-1"
    assert "not JSON" in html.message and "text/html" in html.message
    assert "Bad gateway" in html.message, "a snippet helps whoever reads it"
    empty = parse(503, b"", OWN)
    assert isinstance(empty, ostiary.ProtocolError)
    assert "(empty)" in empty.message
    assert isinstance(parse(500, [1, 2]), ostiary.ProtocolError)
    no_kind = parse(500, {"message": "no kind"})
    assert isinstance(no_kind, ostiary.ProtocolError)
    assert "no error kind" in no_kind.message
    assert isinstance(parse(500, {"error": ""}), ostiary.ProtocolError)
    assert isinstance(parse(500, {"error": {"nested": True}}), ostiary.ProtocolError)
    # A long body is quoted, not copied whole into the message.
    long = parse(500, b"x" * 10_000)
    assert isinstance(long, ostiary.ProtocolError)
    assert len(long.message) < 400


def test_a_quoted_body_never_carries_a_secret() -> None:
    token = "eyJhbGciOi.session-token-value.sig"
    body = f"<h1>proxy said: Proxy-Authorization Basic agent:{token}</h1>".encode()
    error = from_response(502, httpx.Headers(OWN), body, secrets=[token])
    assert isinstance(error, ostiary.ProtocolError)
    assert token not in str(error) and token not in repr(error)
    assert "***" in error.message


def test_what_the_upstream_answered_is_never_ostiarys() -> None:
    # Without Ostiary-Request-Id the answer is the upstream's own, whatever it says.
    assert parse(403, {"error": "denied", "policies": ["x"]}, {"content-type": "application/json"}) is None
    assert parse(500, b"not json", {}) is None
    # Ostiary's own successes are not refusals.
    assert parse(200, {"status": "ok"}) is None
    assert parse(200, b"not json at all") is None
    assert parse(204, b"") is None
    # A 202 that is not a held request.
    assert parse(202, {"accepted": True}) is None


def test_mcp_refusals_are_parsed_from_the_jsonrpc_error_data() -> None:
    data = {"error": "denied", "message": "Denied by policy.", "request_id": "r7", "policies": ["p"]}
    message = {"jsonrpc": "2.0", "id": 3, "error": {"code": -32001, "message": "m", "data": data}}
    error = parse(200, message)
    assert isinstance(error, ostiary.Denied)
    assert error.policies == ("p",) and error.request_id == "r7"
    held = {"error": "approval_pending", "approval_id": "apr_9", "status_url": "http://x/"}
    pending = from_jsonrpc({"jsonrpc": "2.0", "id": 1, "error": {"code": -32002, "data": held}})
    assert isinstance(pending, ostiary.ApprovalPending)
    assert pending.approval_id == "apr_9"
    # A result, a server's own error, a batch: not a refusal to raise.
    assert parse(200, {"jsonrpc": "2.0", "id": 1, "result": {}}) is None
    assert from_jsonrpc({"jsonrpc": "2.0", "id": 1, "error": {"code": -32601, "message": "nope"}}) is None
    assert from_jsonrpc({"error": {"code": -32001, "data": {"error": 5}}}) is None
    assert from_jsonrpc({"error": "flat"}) is None
    assert from_jsonrpc(["not", "a", "message"]) is None
    assert parse(200, [message, message]) is None


def test_from_body_rejects_what_is_not_an_object() -> None:
    assert isinstance(from_body("denied"), ostiary.ProtocolError)
    assert isinstance(from_body(None), ostiary.ProtocolError)
    error = from_body({"error": "denied", "message": 5}, status=403)
    assert isinstance(error, ostiary.Denied)
    assert error.message == "Ostiary refused the request (denied)"
