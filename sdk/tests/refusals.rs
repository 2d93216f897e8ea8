//! Reading Ostiary's JSON with the SDK's public parsers (`Refusal::from_body`,
//! `Refusal::from_jsonrpc`): every error kind, details of the wrong type, bodies that are
//! not Ostiary's, JSON-RPC errors. No proxy is needed; tests/tests/sdk_rust.rs reads the
//! same refusals from a real one.

use std::time::Duration;

use ostiary_sdk::{ApprovalStatus, Refusal, SdkError};
use serde_json::json;

#[test]
fn every_kind_reads_as_its_refusal() {
    let read = |kind: &str| {
        Refusal::from_body(Some(400), &json!({ "error": kind, "message": "m" }), None)
            .unwrap_or_else(|| panic!("{kind} is a refusal"))
    };
    assert!(matches!(
        read("unauthenticated"),
        Refusal::Unauthenticated(_)
    ));
    for kind in ["bad_request", "misdirected_request"] {
        assert!(matches!(read(kind), Refusal::BadRequest(_)), "{kind}");
    }
    for kind in [
        "denied",
        "approval_required",
        "destination_blocked",
        "not_an_approver",
    ] {
        assert!(matches!(read(kind), Refusal::Denied(_)), "{kind}");
    }
    assert!(matches!(
        read("approval_pending"),
        Refusal::ApprovalPending(_)
    ));
    for kind in ["approval_denied", "approval_expired"] {
        assert!(matches!(read(kind), Refusal::ApprovalDenied(_)), "{kind}");
    }
    assert!(matches!(read("limit_exceeded"), Refusal::LimitExceeded(_)));
    assert!(matches!(read("session_paused"), Refusal::SessionPaused(_)));
    assert!(matches!(read("check_failed"), Refusal::CheckFailed(_)));
    assert!(matches!(
        read("credential_unavailable"),
        Refusal::CredentialUnavailable(_)
    ));
    for kind in ["audit_unavailable", "state_unavailable"] {
        assert!(matches!(read(kind), Refusal::Unavailable(_)), "{kind}");
    }
    for kind in ["upstream_error", "upstream_timeout"] {
        assert!(matches!(read(kind), Refusal::Upstream(_)), "{kind}");
    }
    assert!(matches!(read("not_found"), Refusal::NotFound(_)));
    for kind in ["not_pending", "conflict", "link_used"] {
        assert!(matches!(read(kind), Refusal::Conflict(_)), "{kind}");
    }
    // A kind from a newer proxy is still a refusal, and keeps its kind.
    let newer = read("quota_of_the_future");
    assert!(matches!(newer, Refusal::Other(_)));
    assert_eq!(newer.kind(), "quota_of_the_future");
    match read("approval_expired") {
        Refusal::ApprovalDenied(a) => assert!(a.expired()),
        other => panic!("{other:?}"),
    }
}

#[test]
fn details_are_typed_and_those_of_the_wrong_type_read_as_absent() {
    let body = json!({
        "error": "limit_exceeded", "message": "The session reached its calls limit.",
        "request_id": "req_1", "limit": "calls", "used": 2, "max": 2.5, "retry_after": 7.0,
    });
    match Refusal::from_body(Some(429), &body, Some("req_header")).unwrap() {
        Refusal::LimitExceeded(l) => {
            assert_eq!(l.limit(), Some("calls"));
            assert_eq!(
                (l.used(), l.max(), l.retry_after()),
                (Some(2.0), Some(2.5), Some(7))
            );
            // The body's own id wins over the header's.
            assert_eq!(l.problem().request_id(), Some("req_1"));
            assert_eq!(l.problem().details()["limit"], "calls");
        }
        other => panic!("{other:?}"),
    }
    let wrong = json!({
        "error": "limit_exceeded", "limit": 5, "used": "two", "max": true, "retry_after": -3,
    });
    match Refusal::from_body(Some(429), &wrong, Some("req_header")).unwrap() {
        Refusal::LimitExceeded(l) => {
            assert_eq!(
                (l.limit(), l.used(), l.max(), l.retry_after()),
                (None, None, None, None)
            );
            assert_eq!(l.problem().request_id(), Some("req_header"));
            // No message: the SDK says one, naming the kind.
            assert!(l.problem().message().contains("limit_exceeded"));
        }
        other => panic!("{other:?}"),
    }
    let fractional = json!({ "error": "limit_exceeded", "retry_after": 1.5 });
    match Refusal::from_body(None, &fractional, None).unwrap() {
        Refusal::LimitExceeded(l) => assert_eq!(l.retry_after(), None),
        other => panic!("{other:?}"),
    }
    let denied = json!({ "error": "denied", "policies": ["a", 7, null, "b"], "action": 3 });
    match Refusal::from_body(Some(403), &denied, None).unwrap() {
        Refusal::Denied(d) => {
            assert_eq!(d.policies(), ["a", "b"]);
            assert_eq!((d.action(), d.resource(), d.address()), (None, None, None));
        }
        other => panic!("{other:?}"),
    }
    let not_a_list = json!({ "error": "denied", "policies": "no-secrets" });
    match Refusal::from_body(Some(403), &not_a_list, None).unwrap() {
        Refusal::Denied(d) => assert!(d.policies().is_empty()),
        other => panic!("{other:?}"),
    }
    let pending = json!({ "error": "approval_pending", "approval_id": 12, "status_url": null });
    match Refusal::from_body(Some(202), &pending, None).unwrap() {
        Refusal::ApprovalPending(p) => {
            assert_eq!(
                (p.approval_id(), p.status_url(), p.expires_at()),
                (None, None, None)
            );
        }
        other => panic!("{other:?}"),
    }
    let check = json!({ "error": "check_failed", "check": "dlp", "detail": ["x"] });
    match Refusal::from_body(Some(422), &check, None).unwrap() {
        Refusal::CheckFailed(c) => assert_eq!((c.check(), c.detail()), (Some("dlp"), None)),
        other => panic!("{other:?}"),
    }
    let vault =
        json!({ "error": "credential_unavailable", "credential": "github", "reason": "sealed" });
    match Refusal::from_body(Some(503), &vault, None).unwrap() {
        Refusal::CredentialUnavailable(c) => {
            assert_eq!(
                (c.credential(), c.reason()),
                (Some("github"), Some("sealed"))
            );
        }
        other => panic!("{other:?}"),
    }
    let paused = json!({ "error": "session_paused", "reason": "repeat of t.read" });
    let paused = Refusal::from_body(Some(423), &paused, None).unwrap();
    assert_eq!(paused.problem().reason(), Some("repeat of t.read"));
}

#[test]
fn bodies_that_are_not_ostiarys_are_not_refusals() {
    for body in [
        json!("denied"),
        json!(["denied"]),
        json!(null),
        json!({}),
        json!({ "error": "" }),
        json!({ "error": 403 }),
        json!({ "error": { "code": -32001 } }),
        json!({ "message": "no kind" }),
    ] {
        assert!(
            Refusal::from_body(Some(403), &body, None).is_none(),
            "{body}"
        );
    }
}

#[test]
fn jsonrpc_errors_carry_the_refusal_in_their_data() {
    let refused = json!({
        "jsonrpc": "2.0", "id": 1,
        "error": { "code": -32001, "message": "denied", "data": {
            "error": "denied", "message": "Denied by policy.", "policies": ["no-mcp-writes"],
        }},
    });
    match Refusal::from_jsonrpc(&refused, Some("req_9")).unwrap() {
        Refusal::Denied(d) => {
            assert_eq!(d.policies(), ["no-mcp-writes"]);
            assert_eq!(d.problem().status(), None, "no HTTP status of its own");
            assert_eq!(d.problem().request_id(), Some("req_9"));
        }
        other => panic!("{other:?}"),
    }
    for message in [
        json!({ "jsonrpc": "2.0", "id": 1, "result": { "content": [] } }),
        json!({ "jsonrpc": "2.0", "id": 1, "error": { "code": -32601, "message": "no such method" } }),
        json!({ "jsonrpc": "2.0", "id": 1, "error": { "code": -1, "data": "text" } }),
        json!({ "jsonrpc": "2.0", "id": 1, "error": "flat" }),
        json!([{ "jsonrpc": "2.0", "id": 1, "result": {} }]),
    ] {
        assert!(Refusal::from_jsonrpc(&message, None).is_none(), "{message}");
    }
}

#[test]
fn a_refusal_reads_as_kind_status_message_and_request_id() {
    let body =
        json!({ "error": "denied", "message": "Denied by policy: no.", "request_id": "req_7" });
    let refusal = Refusal::from_body(Some(403), &body, None).unwrap();
    assert_eq!(
        refusal.to_string(),
        "denied (HTTP 403): Denied by policy: no. [request req_7]"
    );
    let error = SdkError::Refused(Box::new(refusal));
    assert_eq!(error.status(), Some(403));
    assert_eq!(error.request_id(), Some("req_7"));
    let timeout = SdkError::ApprovalTimeout {
        approval_id: "apr_1".into(),
        waited: Duration::from_secs(2),
    };
    assert!(timeout.refusal().is_none() && timeout.status().is_none());
    assert!(timeout.to_string().contains("apr_1"));
    assert_eq!(
        ApprovalStatus::from("executed".to_owned()),
        ApprovalStatus::Executed
    );
    assert!(ApprovalStatus::Executed.is_final() && !ApprovalStatus::Approved.is_final());
    assert_eq!(ApprovalStatus::Other("later".into()).as_str(), "later");
}
