//! Verifying and reading Slack's interactive callbacks (`POST /v1/slack/interactions`), the
//! route by which an Approve or Deny button in Slack decides an approval.
//!
//! Anyone who can reach the control listener can post a form that looks like Slack's, the
//! agent included, so nothing in a callback is read before its signature is checked:
//! Slack's v0 scheme, HMAC-SHA256 with the app's signing secret over
//! `v0:{X-Slack-Request-Timestamp}:{raw body}`, sent as `X-Slack-Signature: v0=<hex>`. The
//! signature covers the timestamp, and a timestamp more than five minutes from now is
//! refused, so a captured callback is only good for five minutes; within them the store
//! refuses a signature it has seen before. The comparison is constant-time so that timing
//! does not reveal how much of a forged signature was right.

use hmac::{Hmac, Mac};
use serde::Deserialize;
use sha2::Sha256;
use subtle::ConstantTimeEq;

use crate::approvals::model::Verdict;

/// The header names, lowercase as hyper gives them.
pub const TIMESTAMP_HEADER: &str = "x-slack-request-timestamp";
pub const SIGNATURE_HEADER: &str = "x-slack-signature";

/// How far the request's timestamp may be from our clock, either way (Slack's advice).
pub const MAX_SKEW_SECS: i64 = 300;

/// Why a callback was refused. None carries the secret or the expected signature.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CallbackError {
    #[error("missing or empty {0} header")]
    MissingHeader(&'static str),
    #[error("X-Slack-Request-Timestamp is not a whole number of seconds")]
    BadTimestamp,
    #[error("X-Slack-Request-Timestamp is {skew_secs} s from now, more than {MAX_SKEW_SECS} s")]
    StaleTimestamp { skew_secs: i64 },
    #[error("X-Slack-Signature is not of the form v0=<64 hex digits>")]
    MalformedSignature,
    #[error("X-Slack-Signature does not match the body")]
    BadSignature,
    #[error("malformed interaction payload: {0}")]
    MalformedPayload(String),
    #[error("unknown action {0:?}")]
    UnknownAction(String),
}

/// A verified button click.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlackAction {
    pub verdict: Verdict,
    /// The button's `value`: the approval it was attached to.
    pub approval_id: String,
    /// Slack's user id (`U…`), mapped to an approver by `approvals.slack_users`.
    pub user_id: String,
    /// The Slack handle, for the audit record only: it is not an identity.
    pub user_name: Option<String>,
}

/// Checks a callback's signature and freshness. `timestamp` and `signature` are the header
/// values (empty when absent); `now_secs` is the current Unix time.
pub fn verify(
    signing_secret: &[u8],
    timestamp: &str,
    signature: &str,
    raw_body: &[u8],
    now_secs: i64,
) -> Result<(), CallbackError> {
    if timestamp.is_empty() {
        return Err(CallbackError::MissingHeader("X-Slack-Request-Timestamp"));
    }
    if signature.is_empty() {
        return Err(CallbackError::MissingHeader("X-Slack-Signature"));
    }
    // Digits only: `i64::from_str` would also take `+123`, a second spelling of one time.
    if !timestamp.bytes().all(|b| b.is_ascii_digit()) {
        return Err(CallbackError::BadTimestamp);
    }
    let sent: i64 = timestamp
        .parse()
        .map_err(|_overflow: std::num::ParseIntError| CallbackError::BadTimestamp)?;
    let skew = now_secs.saturating_sub(sent).saturating_abs();
    if skew > MAX_SKEW_SECS {
        return Err(CallbackError::StaleTimestamp { skew_secs: skew });
    }
    let given = signature
        .strip_prefix("v0=")
        .and_then(|hex_text| hex::decode(hex_text).ok())
        .filter(|bytes| bytes.len() == 32)
        .ok_or(CallbackError::MalformedSignature)?;
    let expected = mac(signing_secret, timestamp, raw_body);
    if bool::from(expected.as_slice().ct_eq(&given)) {
        Ok(())
    } else {
        Err(CallbackError::BadSignature)
    }
}

/// HMAC-SHA256 over Slack's v0 base string.
fn mac(secret: &[u8], timestamp: &str, body: &[u8]) -> Vec<u8> {
    // HMAC takes a key of any length; this cannot fail.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret)
        .unwrap_or_else(|_| unreachable!("HMAC accepts keys of any length"));
    mac.update(b"v0:");
    mac.update(timestamp.as_bytes());
    mac.update(b":");
    mac.update(body);
    mac.finalize().into_bytes().to_vec()
}

/// Reads a verified `application/x-www-form-urlencoded` body: its `payload` field is the
/// `block_actions` JSON, of which the first action is the click.
pub fn parse(raw_body: &[u8]) -> Result<SlackAction, CallbackError> {
    let mut payloads = url::form_urlencoded::parse(raw_body)
        .filter(|(key, _)| key == "payload")
        .map(|(_, value)| value);
    let payload = payloads
        .next()
        .ok_or_else(|| CallbackError::MalformedPayload("no payload field".to_owned()))?;
    if payloads.next().is_some() {
        return Err(CallbackError::MalformedPayload(
            "more than one payload field".to_owned(),
        ));
    }
    let payload: Payload = serde_json::from_str(&payload).map_err(|e| {
        CallbackError::MalformedPayload(format!("payload is not the JSON expected: {e}"))
    })?;
    if payload.kind != "block_actions" {
        return Err(CallbackError::MalformedPayload(format!(
            "type {:?}, expected \"block_actions\"",
            payload.kind
        )));
    }
    let action = payload
        .actions
        .into_iter()
        .next()
        .ok_or_else(|| CallbackError::MalformedPayload("no actions".to_owned()))?;
    let verdict = match action.action_id.as_str() {
        "approve" => Verdict::Approve,
        "deny" => Verdict::Deny,
        _ => return Err(CallbackError::UnknownAction(action.action_id)),
    };
    let approval_id = action
        .value
        .filter(|v| !v.is_empty())
        .ok_or_else(|| CallbackError::MalformedPayload("the action has no value".to_owned()))?;
    if payload.user.id.is_empty() {
        return Err(CallbackError::MalformedPayload("empty user.id".to_owned()));
    }
    Ok(SlackAction {
        verdict,
        approval_id,
        user_id: payload.user.id,
        user_name: payload.user.username.or(payload.user.name),
    })
}

/// The parts of a `block_actions` payload we read; Slack sends many more.
#[derive(Deserialize)]
struct Payload {
    #[serde(rename = "type")]
    kind: String,
    user: User,
    #[serde(default)]
    actions: Vec<Action>,
}

#[derive(Deserialize)]
struct User {
    id: String,
    username: Option<String>,
    name: Option<String>,
}

#[derive(Deserialize)]
struct Action {
    action_id: String,
    value: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    // The worked example in Slack's "Verifying requests from Slack".
    const DOC_SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";
    const DOC_TS: &str = "1531420618";
    const DOC_BODY: &str = "token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";
    const DOC_SIG: &str = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503";
    const DOC_NOW: i64 = 1_531_420_618;

    fn sign(secret: &str, ts: &str, body: &str) -> String {
        format!(
            "v0={}",
            hex::encode(mac(secret.as_bytes(), ts, body.as_bytes()))
        )
    }

    fn check(secret: &str, ts: &str, sig: &str, body: &str, now: i64) -> Result<(), CallbackError> {
        verify(secret.as_bytes(), ts, sig, body.as_bytes(), now)
    }

    #[test]
    fn slacks_documented_example_verifies() {
        assert_eq!(sign(DOC_SECRET, DOC_TS, DOC_BODY), DOC_SIG);
        check(DOC_SECRET, DOC_TS, DOC_SIG, DOC_BODY, DOC_NOW).unwrap();
        // Upper-case hex is the same signature.
        let upper = format!("v0={}", DOC_SIG[3..].to_ascii_uppercase());
        check(DOC_SECRET, DOC_TS, &upper, DOC_BODY, DOC_NOW).unwrap();
    }

    #[test]
    fn tampered_body_or_wrong_secret_is_refused() {
        let tampered = DOC_BODY.replace("roadrunner", "wilecoyote");
        assert_eq!(
            check(DOC_SECRET, DOC_TS, DOC_SIG, &tampered, DOC_NOW),
            Err(CallbackError::BadSignature)
        );
        assert_eq!(
            check("another-secret", DOC_TS, DOC_SIG, DOC_BODY, DOC_NOW),
            Err(CallbackError::BadSignature)
        );
        // The signature covers the timestamp: re-dating a captured request breaks it.
        assert_eq!(
            check(DOC_SECRET, "1531420619", DOC_SIG, DOC_BODY, DOC_NOW),
            Err(CallbackError::BadSignature)
        );
        let mut flipped = DOC_SIG.to_owned();
        flipped.replace_range(66.., "4");
        assert_eq!(
            check(DOC_SECRET, DOC_TS, &flipped, DOC_BODY, DOC_NOW),
            Err(CallbackError::BadSignature)
        );
    }

    #[test]
    fn timestamps_outside_five_minutes_are_refused_both_ways() {
        for now in [DOC_NOW + 300, DOC_NOW - 300] {
            check(DOC_SECRET, DOC_TS, DOC_SIG, DOC_BODY, now).unwrap();
        }
        assert_eq!(
            check(DOC_SECRET, DOC_TS, DOC_SIG, DOC_BODY, DOC_NOW + 301),
            Err(CallbackError::StaleTimestamp { skew_secs: 301 })
        );
        assert_eq!(
            check(DOC_SECRET, DOC_TS, DOC_SIG, DOC_BODY, DOC_NOW - 301),
            Err(CallbackError::StaleTimestamp { skew_secs: 301 })
        );
        // Far extremes do not overflow.
        assert!(matches!(
            check(DOC_SECRET, DOC_TS, DOC_SIG, DOC_BODY, i64::MIN),
            Err(CallbackError::StaleTimestamp { .. })
        ));
    }

    #[test]
    fn malformed_headers_are_refused() {
        for ts in [
            "abc",
            "+1531420618",
            "-1",
            " 1531420618",
            "1531420618.5",
            "99999999999999999999",
        ] {
            assert_eq!(
                check(DOC_SECRET, ts, DOC_SIG, DOC_BODY, DOC_NOW),
                Err(CallbackError::BadTimestamp),
                "{ts:?}"
            );
        }
        assert_eq!(
            check(DOC_SECRET, "", DOC_SIG, DOC_BODY, DOC_NOW),
            Err(CallbackError::MissingHeader("X-Slack-Request-Timestamp"))
        );
        assert_eq!(
            check(DOC_SECRET, DOC_TS, "", DOC_BODY, DOC_NOW),
            Err(CallbackError::MissingHeader("X-Slack-Signature"))
        );
        for sig in [
            &DOC_SIG[3..],
            "v1=00",
            "v0=zz",
            "v0=abcd",
            &format!("v0={}00", &DOC_SIG[3..]),
        ] {
            assert_eq!(
                check(DOC_SECRET, DOC_TS, sig, DOC_BODY, DOC_NOW),
                Err(CallbackError::MalformedSignature),
                "{sig:?}"
            );
        }
    }

    fn form(payload: &serde_json::Value) -> String {
        url::form_urlencoded::Serializer::new(String::new())
            .append_pair("payload", &payload.to_string())
            .finish()
    }

    fn click(action_id: &str) -> serde_json::Value {
        serde_json::json!({
            "type": "block_actions",
            "user": {"id": "U123", "username": "alice", "name": "alice", "team_id": "T1"},
            "team": {"id": "T1", "domain": "acme"},
            "actions": [{
                "action_id": action_id, "block_id": "b", "type": "button",
                "value": "apr_1", "action_ts": "1700000000.1",
                "text": {"type": "plain_text", "text": "Approve"}
            }]
        })
    }

    #[test]
    fn parses_approve_and_deny() {
        let action = parse(form(&click("approve")).as_bytes()).unwrap();
        assert_eq!(
            action,
            SlackAction {
                verdict: Verdict::Approve,
                approval_id: "apr_1".to_owned(),
                user_id: "U123".to_owned(),
                user_name: Some("alice".to_owned()),
            }
        );
        let mut deny = click("deny");
        deny["user"].as_object_mut().unwrap().remove("username");
        deny["user"]["name"] = "Alice A".into();
        let action = parse(form(&deny).as_bytes()).unwrap();
        assert_eq!(action.verdict, Verdict::Deny);
        assert_eq!(action.user_name.as_deref(), Some("Alice A"));
    }

    #[test]
    fn refuses_anything_else() {
        assert_eq!(
            parse(form(&click("review-0")).as_bytes()),
            Err(CallbackError::UnknownAction("review-0".to_owned()))
        );
        let malformed = |body: &str| {
            assert!(
                matches!(
                    parse(body.as_bytes()),
                    Err(CallbackError::MalformedPayload(_))
                ),
                "{body}"
            )
        };
        malformed("");
        malformed("payload=not-json");
        malformed(&format!(
            "{}&{}",
            form(&click("approve")),
            form(&click("deny"))
        ));
        let mut other = click("approve");
        other["type"] = "view_submission".into();
        malformed(&form(&other));
        let mut no_value = click("approve");
        no_value["actions"][0]
            .as_object_mut()
            .unwrap()
            .remove("value");
        malformed(&form(&no_value));
        let mut no_actions = click("approve");
        no_actions["actions"] = serde_json::json!([]);
        malformed(&form(&no_actions));
        let mut no_user = click("approve");
        no_user["user"]["id"] = "".into();
        malformed(&form(&no_user));
    }
}
