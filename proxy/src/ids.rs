//! Identifiers Ostiary hands out: request ids (echoed in `Ostiary-Request-Id` and audit
//! records, so an agent's error can be matched to its record) and session ids; and the hasher
//! of the maps they key.

/// The hasher of maps keyed by ids the proxy mints itself (session ids): foldhash, seeded
/// per process. Every request looks its session up in several such maps (the meter, the
/// in-flight counts, the watchdog, the session memory, the live registry), and SipHash —
/// std's default, built to resist keys chosen to collide — cost ~150 instructions a lookup
/// there, ~4,000 of a tool call's 8,900 spent hashing (docs/benchmarks.md, "A kept decision
/// written by the writer, and maps keyed by the proxy's own ids"). A session id is 12
/// random bytes drawn by the proxy, so no agent chooses the keys these maps hold; a map
/// keyed by anything an agent writes (a host, a path, a call's arguments) keeps std's.
pub type IdHasher = foldhash::fast::RandomState;

/// A map keyed by ids the proxy mints ([`IdHasher`]).
pub type IdMap<K, V> = std::collections::HashMap<K, V, IdHasher>;

/// A new request id: 16 random bytes, hex.
pub fn request_id() -> String {
    crate::state::random_hex(8)
}

/// A new session id, prefixed so that it is recognisable in logs and URLs.
pub fn session_id() -> String {
    format!("ses_{}", crate::state::random_hex(12))
}
