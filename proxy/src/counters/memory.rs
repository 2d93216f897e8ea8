//! What a session did, shared by replicas (`state.redis`): its labels and the times of its
//! recent tool calls, per tool and per tier ([`crate::session::memory`] decides what they
//! mean; here they are only kept).
//!
//! Keys, each living as long as the session: `labels:<session>` (a set), `recent:<session>:
//! tool:<name>` and `recent:<session>:tier:<tier>` (sorted sets of calls scored by their time
//! in ms, trimmed to the longest window), and `recentkeys:<session>` (the set of those keys,
//! for `ostiary sessions show`).

use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;

use super::{Counters, CountersError};

/// The longest window counted: older calls are dropped.
pub const LONGEST_MS: i64 = 3_600_000;

/// KEYS: labels, then the window keys to count. ARGV: now (ms), then the window lengths
/// (ms). Returns the labels, then per key the calls newer than each window.
const READ: &str = r"
local now = tonumber(ARGV[1])
local out = { redis.call('SMEMBERS', KEYS[1]) }
for i = 2, #KEYS do
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now - tonumber(ARGV[#ARGV]))
  local counts = {}
  for w = 2, #ARGV do
    counts[#counts + 1] = redis.call('ZCOUNT', KEYS[i], '(' .. (now - tonumber(ARGV[w])), '+inf')
  end
  out[#out + 1] = counts
end
return out
";

/// KEYS: labels, the key index, then the window keys of this call. ARGV: ttl (ms), now (ms),
/// a member unique to this call, the longest window (ms), then the labels to add.
const WRITE: &str = r"
local ttl = tonumber(ARGV[1])
local now = tonumber(ARGV[2])
if #ARGV > 4 then
  redis.call('SADD', KEYS[1], unpack(ARGV, 5))
  redis.call('PEXPIRE', KEYS[1], ttl)
end
for i = 3, #KEYS do
  redis.call('ZADD', KEYS[i], now, ARGV[3])
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now - tonumber(ARGV[4]))
  redis.call('PEXPIRE', KEYS[i], ttl)
  redis.call('SADD', KEYS[2], KEYS[i])
  redis.call('PEXPIRE', KEYS[2], ttl)
end
return 1
";

/// KEYS: the key index. ARGV: now (ms), then the window lengths (ms). Returns per key still
/// holding a call: the key, then its counts.
const SHOW: &str = r"
local now = tonumber(ARGV[1])
local out = {}
for _, key in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local counts = { key }
  for w = 2, #ARGV do
    counts[#counts + 1] = redis.call('ZCOUNT', key, '(' .. (now - tonumber(ARGV[w])), '+inf')
  end
  out[#out + 1] = counts
end
return out
";

static READ_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(READ));
static WRITE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(WRITE));
static SHOW_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(SHOW));

/// One session's figures as Redis has them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Remembered {
    pub labels: Vec<String>,
    /// Per window key asked for, the count in each window asked for.
    pub counts: Vec<Vec<i64>>,
}

impl Counters {
    fn window_key(&self, session: &str, which: &str) -> String {
        self.key("recent", &format!("{session}:{which}"))
    }

    /// `session`'s labels, and the calls counted under `windows` (`tool:<name>`,
    /// `tier:<tier>`) newer than each of `lengths` before `now_ms`.
    pub async fn remembered(
        &self,
        session: &str,
        windows: &[&str],
        lengths: &[Duration],
        now_ms: i64,
    ) -> Result<Remembered, CountersError> {
        let mut keys = vec![self.key("labels", session)];
        keys.extend(windows.iter().map(|w| self.window_key(session, w)));
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let mut args = vec![now_ms.to_string()];
        args.extend(lengths.iter().map(|l| l.as_millis().to_string()));
        let (labels, counts): (Vec<String>, Vec<Vec<i64>>) = self
            .run::<redis::Value>(&READ_SCRIPT, &keys, &args)
            .await
            .and_then(|v| split_first(v).map_err(CountersError::Protocol))?;
        Ok(Remembered { labels, counts })
    }

    /// Add `labels` to `session`'s and one call at `now_ms` to each of `windows`; every key
    /// lives `ttl` (the session's remaining life) from now.
    pub async fn remember(
        &self,
        session: &str,
        labels: &[String],
        windows: &[&str],
        now_ms: i64,
        ttl: Duration,
    ) -> Result<(), CountersError> {
        let mut keys = vec![self.key("labels", session), self.key("recentkeys", session)];
        keys.extend(windows.iter().map(|w| self.window_key(session, w)));
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let mut args = vec![
            ttl.as_millis().max(1).to_string(),
            now_ms.to_string(),
            crate::ids::request_id(),
            LONGEST_MS.to_string(),
        ];
        args.extend(labels.iter().cloned());
        self.run::<i64>(&WRITE_SCRIPT, &keys, &args).await?;
        Ok(())
    }

    /// Every window of `session` still holding a call (`tool:<name>`, `tier:<tier>`), with
    /// its counts newer than each of `lengths` before `now_ms`.
    pub async fn recent_windows(
        &self,
        session: &str,
        lengths: &[Duration],
        now_ms: i64,
    ) -> Result<Vec<(String, Vec<i64>)>, CountersError> {
        let index = self.key("recentkeys", session);
        let mut args = vec![now_ms.to_string()];
        args.extend(lengths.iter().map(|l| l.as_millis().to_string()));
        let rows: Vec<Vec<redis::Value>> = self.run(&SHOW_SCRIPT, &[&index], &args).await?;
        let prefix = self.window_key(session, "");
        rows.into_iter()
            .map(|row| {
                let mut row = row.into_iter();
                let key: String = row
                    .next()
                    .ok_or_else(|| CountersError::Protocol("an empty window row".into()))
                    .and_then(|v| redis::from_redis_value(&v).map_err(proto))?;
                let counts = row
                    .map(|v| redis::from_redis_value::<i64>(&v).map_err(proto))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok((key.strip_prefix(&prefix).unwrap_or(&key).to_owned(), counts))
            })
            .collect()
    }
}

fn proto(e: redis::RedisError) -> CountersError {
    CountersError::Protocol(e.to_string())
}

/// The READ script's answer: the labels, then one list of counts per window key.
fn split_first(value: redis::Value) -> Result<(Vec<String>, Vec<Vec<i64>>), String> {
    let redis::Value::Array(items) = value else {
        return Err(format!("expected an array, got {value:?}"));
    };
    let mut items = items.into_iter();
    let labels = items
        .next()
        .ok_or("an empty answer")
        .map_err(str::to_owned)
        .and_then(|v| redis::from_redis_value(&v).map_err(|e| e.to_string()))?;
    let counts = items
        .map(|v| redis::from_redis_value(&v).map_err(|e| e.to_string()))
        .collect::<Result<Vec<Vec<i64>>, _>>()?;
    Ok((labels, counts))
}
