//! The loop watchdog's trail, shared by replicas: a Redis stream per session
//! (`<prefix>:trail:<session>`, the newest [`KEEP`] events) that every replica appends its
//! observations to and reads the others' from. Each replica keeps its own watchdog
//! ([`crate::session::watchdog`]) and feeds it the whole sequence in stream order, so a loop
//! spread over replicas by a load balancer is judged as the one loop it is, by whichever
//! replica observes the call that completes it. A trip, and a human's resume, put a reset
//! marker in the stream, so every replica starts counting afresh from the same point.

use redis::Value;
use serde::{Deserialize, Serialize};

use super::{Counters, CountersError};

/// Events a session's stream keeps (about: Redis trims whole nodes). Above the watchdog's
/// own ring, so no rule sees fewer calls than it would in one process.
pub const KEEP: usize = 512;

/// One observation, as replicas exchange it. `reset` marks a point where every watchdog
/// forgets the session's trail (a trip, a resume); its other fields are then unused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrailEvent {
    pub key: String,
    pub args_hash: u64,
    pub tier_rank: u8,
    pub denied: bool,
    pub held: bool,
    pub repeat_max: u32,
    pub repeat_window_ms: u64,
    pub at_ms: i64,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reset: bool,
}

impl TrailEvent {
    /// A reset marker at `at_ms`.
    pub fn reset(at_ms: i64) -> Self {
        Self {
            key: String::new(),
            args_hash: 0,
            tier_rank: 0,
            denied: false,
            held: false,
            repeat_max: 0,
            repeat_window_ms: 0,
            at_ms,
            reset: true,
        }
    }
}

/// What an exchange returned: every event after the cursor in stream order (this replica's
/// own included), which of them are this call's own, and the new cursor.
#[derive(Debug, Clone, Default)]
pub struct Exchanged {
    pub events: Vec<(TrailEvent, bool)>,
    pub cursor: String,
}

/// Append `own` events and read everything after `cursor` (empty: read nothing). KEYS: the
/// stream. ARGV: cursor, ttl ms, then one JSON event each.
pub(super) const EXCHANGE: &str = r"
local ids = {}
for i = 3, #ARGV do
  ids[#ids + 1] = redis.call('XADD', KEYS[1], 'MAXLEN', '~', 512, '*', 'e', ARGV[i])
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if ARGV[1] == '' then return {ids, {}} end
return {ids, redis.call('XRANGE', KEYS[1], '(' .. ARGV[1], '+')}
";

impl Counters {
    /// Add `own` to `session`'s shared trail and take what was appended after `cursor`
    /// (`"0-0"` for a session this replica has not followed yet: all that is kept; `""`:
    /// nothing, only append).
    pub async fn exchange_trail(
        &self,
        session: &str,
        cursor: &str,
        own: &[TrailEvent],
        ttl: std::time::Duration,
    ) -> Result<Exchanged, CountersError> {
        let key = self.key("trail", session);
        let mut args = vec![cursor.to_owned(), ttl.as_millis().max(1).to_string()];
        for event in own {
            args.push(
                serde_json::to_string(event).map_err(|e| CountersError::Protocol(e.to_string()))?,
            );
        }
        let value: Value = self.run(&self.scripts.trail, &[&key], &args).await?;
        parse(value, cursor)
    }
}

fn protocol(what: &str) -> CountersError {
    CountersError::Protocol(format!("trail exchange: {what}"))
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

fn parse(value: Value, cursor: &str) -> Result<Exchanged, CountersError> {
    let Value::Array(parts) = value else {
        return Err(protocol("not a list"));
    };
    let [Value::Array(ids), Value::Array(rows)] = parts.as_slice() else {
        return Err(protocol("not two lists"));
    };
    let own: Vec<String> = ids.iter().filter_map(text).collect();
    let mut out = Exchanged {
        events: Vec::with_capacity(rows.len()),
        cursor: cursor.to_owned(),
    };
    for row in rows {
        let Value::Array(entry) = row else {
            return Err(protocol("an entry is not a list"));
        };
        let [id, Value::Array(fields)] = entry.as_slice() else {
            return Err(protocol("an entry is not id and fields"));
        };
        let id = text(id).ok_or_else(|| protocol("an entry id"))?;
        let json = fields
            .get(1)
            .and_then(text)
            .ok_or_else(|| protocol("an entry without its event"))?;
        // An event this version cannot read is skipped, not fatal: the rest still counts.
        if let Ok(event) = serde_json::from_str::<TrailEvent>(&json) {
            out.events.push((event, own.contains(&id)));
        }
        out.cursor = id;
    }
    Ok(out)
}
