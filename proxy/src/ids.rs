//! Identifiers Ostiary hands out: request ids (echoed in `Ostiary-Request-Id` and audit
//! records, so an agent's error can be matched to its record) and session ids.

/// A new request id: 16 random bytes, hex.
pub fn request_id() -> String {
    crate::state::random_hex(8)
}

/// A new session id, prefixed so that it is recognisable in logs and URLs.
pub fn session_id() -> String {
    format!("ses_{}", crate::state::random_hex(12))
}
