//! The shared counters' operations: session accounts (open, sync, charge, carve, close,
//! grant), GCRA rate keys and spawn fan-out — each one script call ([`super::scripts`]).
//! The answers come back as the meter's own types, so the guardrails decide and word a
//! refusal the same way whichever side counted.

use std::time::Duration;

use serde_json::json;

use super::{Counters, CountersError};
use crate::config::Rate;
use crate::guardrails::meter::{Account, LimitHit, Limits, Usage};

/// `-1` for no limit, as the scripts store it.
fn limit<T: Into<i128>>(value: Option<T>) -> String {
    value.map_or_else(|| "-1".to_owned(), |v| v.into().to_string())
}

fn opt_u64(v: i64) -> Option<u64> {
    u64::try_from(v).ok()
}

fn opt_i64(v: i64) -> Option<i64> {
    (v >= 0).then_some(v)
}

fn cost_value(micros: i64) -> serde_json::Value {
    json!(micros as f64 / 1_000_000.0)
}

/// A session's chain of accounts as Redis has them (nearest first), and its pause.
#[derive(Debug, Clone)]
pub struct Synced {
    pub accounts: Vec<(String, Account)>,
    pub pause: Option<crate::guardrails::store::Paused>,
}

/// What a charge did: charged (with the usage after it), or the limit that refused it.
pub type Charged = Result<Usage, Box<LimitHit>>;

impl Counters {
    fn account_key(&self, session: &str) -> String {
        self.key("acct", session)
    }

    fn children_key(&self, session: &str) -> String {
        self.key("kids", session)
    }

    /// Open a session's account, to live `ttl` (past which Redis forgets it).
    pub async fn open(
        &self,
        session: &str,
        limits: &Limits,
        parent: Option<&str>,
        ttl: Duration,
    ) -> Result<(), CountersError> {
        let key = self.account_key(session);
        let args = [
            limit(limits.max_calls),
            limit(limits.max_cost_micros),
            limit(limits.max_bytes_sent),
            limit(limits.max_bytes_received),
            parent.unwrap_or_default().to_owned(),
            ttl.as_millis().max(1).to_string(),
        ];
        self.run::<i64>(&self.scripts.open, &[&key], &args).await?;
        Ok(())
    }

    /// Add `sent`/`received` bytes to `session` and its ancestors; their accounts as they
    /// are now, nearest first. A session without an account is [`CountersError::AccountLost`].
    pub async fn sync(
        &self,
        session: &str,
        sent: u64,
        received: u64,
    ) -> Result<Synced, CountersError> {
        let key = self.account_key(session);
        let args = [
            self.key("acct", ""),
            session.to_owned(),
            sent.to_string(),
            received.to_string(),
        ];
        let rows: Vec<Vec<String>> = self.run(&self.scripts.sync, &[&key], &args).await?;
        let Some(pause) = rows.first().and_then(|r| r.get(11)).cloned() else {
            return Err(CountersError::AccountLost(session.to_owned()));
        };
        let pause = match pause.as_str() {
            "" => None,
            json => Some(
                serde_json::from_str(json)
                    .map_err(|e| CountersError::Protocol(format!("a stored pause: {e}")))?,
            ),
        };
        let ids: Vec<String> = rows.iter().filter_map(|r| r.first().cloned()).collect();
        let int = |row: &[String], i: usize| -> Result<i64, CountersError> {
            row.get(i).and_then(|v| v.parse().ok()).ok_or_else(|| {
                CountersError::Protocol(format!("account field {i} is not a number"))
            })
        };
        let mut accounts = Vec::with_capacity(rows.len());
        for (i, row) in rows.iter().enumerate() {
            let n = |j| int(row, j);
            let (mc, mk, ms, mr) = (n(1)?, n(2)?, n(3)?, n(4)?);
            let (c, k, s, r, cc, ck) = (n(5)?, n(6)?, n(7)?, n(8)?, n(9)?, n(10)?);
            let u = |v: i64| u64::try_from(v).unwrap_or(0);
            let id = ids[i].clone();
            accounts.push({
                let account = Account {
                    limits: Limits {
                        max_calls: opt_u64(mc),
                        max_cost_micros: opt_i64(mk),
                        max_bytes_sent: opt_u64(ms),
                        max_bytes_received: opt_u64(mr),
                    },
                    usage: Usage {
                        calls: u(c),
                        cost_micros: k,
                        bytes_sent: u(s),
                        bytes_received: u(r),
                    },
                    carved_calls: u(cc),
                    carved_cost_micros: ck,
                    parent: ids.get(i + 1).cloned(),
                    ..Default::default()
                };
                (id, account)
            });
        }
        Ok(Synced { accounts, pause })
    }

    /// Record a session's pause (`Some`) or lift it (`None`), for every replica's gate.
    pub async fn set_pause(
        &self,
        session: &str,
        pause: Option<&crate::guardrails::store::Paused>,
    ) -> Result<(), CountersError> {
        self.write_pause(session, pause, "").await.map(drop)
    }

    /// Replace a session's pause with `pause` only if it is still paused (a resume on any
    /// replica since wins); whether it was.
    pub async fn refresh_pause(
        &self,
        session: &str,
        pause: &crate::guardrails::store::Paused,
    ) -> Result<bool, CountersError> {
        self.write_pause(session, Some(pause), "refresh").await
    }

    /// The `PAUSE` script in `mode` (`""` or `refresh`); whether it wrote.
    async fn write_pause(
        &self,
        session: &str,
        pause: Option<&crate::guardrails::store::Paused>,
        mode: &str,
    ) -> Result<bool, CountersError> {
        let key = self.account_key(session);
        let json = match pause {
            Some(p) => {
                serde_json::to_string(p).map_err(|e| CountersError::Protocol(e.to_string()))?
            }
            None => String::new(),
        };
        let written: i64 = self
            .run(&self.scripts.pause, &[&key], &[json, mode.to_owned()])
            .await?;
        Ok(written == 1)
    }

    /// Charge one call costing `cost_micros`; `enforce = false` for a call a human approved.
    pub async fn charge(
        &self,
        session: &str,
        cost_micros: i64,
        enforce: bool,
    ) -> Result<Charged, CountersError> {
        let key = self.account_key(session);
        let args = [
            cost_micros.to_string(),
            if enforce { "1" } else { "0" }.into(),
        ];
        let (status, calls, cost, max_calls, max_cost): (i64, u64, i64, i64, i64) =
            self.run(&self.scripts.charge, &[&key], &args).await?;
        Ok(match status {
            0 => Ok(Usage {
                calls,
                cost_micros: cost,
                ..Default::default()
            }),
            1 => Err(Box::new(LimitHit {
                limit: "calls".into(),
                used: json!(calls),
                max: json!(max_calls.max(0)),
                retry_after: None,
            })),
            2 => Err(Box::new(LimitHit {
                limit: "cost".into(),
                used: cost_value(cost),
                max: cost_value(max_cost),
                retry_after: None,
            })),
            _ => return Err(CountersError::AccountLost(session.to_owned())),
        })
    }

    /// Carve a child's limits out of `parent`'s remainder (as [`crate::guardrails::meter::Meter::carve`]).
    pub async fn carve(&self, parent: &str, asked: Limits) -> Result<Carved, CountersError> {
        let key = self.account_key(parent);
        let args = [limit(asked.max_calls), limit(asked.max_cost_micros)];
        let row: Vec<i64> = self.run(&self.scripts.carve, &[&key], &args).await?;
        match row.as_slice() {
            [0, calls, cost, ms, mr, s, r] => {
                let mut child = asked;
                child.max_calls = opt_u64(*calls).or(asked.max_calls);
                child.max_cost_micros = opt_i64(*cost).or(asked.max_cost_micros);
                // Bytes are not carved, only bounded by what the parent has left.
                let clamp = |asked: Option<u64>, max: i64, used: i64| match opt_u64(max) {
                    Some(max) => {
                        let left = max.saturating_sub(u64::try_from(used).unwrap_or(0));
                        Some(asked.unwrap_or(max).min(left))
                    }
                    None => asked,
                };
                child.max_bytes_sent = clamp(asked.max_bytes_sent, *ms, *s);
                child.max_bytes_received = clamp(asked.max_bytes_received, *mr, *r);
                Ok(Ok(child))
            }
            [1, want, left] => Ok(Err(Box::new(LimitHit {
                limit: "calls".into(),
                used: json!(want),
                max: json!(left),
                retry_after: None,
            }))),
            [2, want, left] => Ok(Err(Box::new(LimitHit {
                limit: "cost".into(),
                used: cost_value(*want),
                max: cost_value(*left),
                retry_after: None,
            }))),
            _ => Err(CountersError::AccountLost(parent.to_owned())),
        }
    }

    /// Give back a carve whose child was never created.
    pub async fn uncarve(&self, parent: &str, child: &Limits) -> Result<(), CountersError> {
        let key = self.account_key(parent);
        let args = [limit(child.max_calls), limit(child.max_cost_micros)];
        self.run::<i64>(&self.scripts.uncarve, &[&key], &args)
            .await?;
        Ok(())
    }

    /// Close a session's account (once: `None` when it is already closed).
    pub async fn close(&self, session: &str) -> Result<Option<Account>, CountersError> {
        let key = self.account_key(session);
        let args = [self.key("acct", ""), self.key("kids", "")];
        let row: Vec<Option<String>> = self.run(&self.scripts.close, &[&key], &args).await?;
        if row.is_empty() {
            return Ok(None);
        }
        let n = |i: usize| -> i64 {
            row.get(i)
                .and_then(|v| v.as_deref())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        Ok(Some(Account {
            limits: Limits {
                max_calls: opt_u64(n(0)),
                max_cost_micros: opt_i64(n(1)),
                max_bytes_sent: opt_u64(n(2)),
                max_bytes_received: opt_u64(n(3)),
            },
            usage: Usage {
                calls: opt_u64(n(4)).unwrap_or(0),
                cost_micros: n(5),
                bytes_sent: opt_u64(n(6)).unwrap_or(0),
                bytes_received: opt_u64(n(7)).unwrap_or(0),
            },
            carved_calls: opt_u64(n(8)).unwrap_or(0),
            carved_cost_micros: n(9),
            parent: row.get(10).cloned().flatten().filter(|p| !p.is_empty()),
            ..Default::default()
        }))
    }

    /// An approver granted more of `limit` (`calls`, `cost`): as much again.
    pub async fn grant(&self, session: &str, limit: &str) -> Result<bool, CountersError> {
        let field = match limit {
            "calls" => "mc",
            "cost" => "mk",
            _ => return Ok(false),
        };
        let key = self.account_key(session);
        let raised: i64 = self
            .run(&self.scripts.grant, &[&key], &[field.to_owned()])
            .await?;
        Ok(raised == 1)
    }

    /// Admit one request of rate key `name` under `rate`, or say how long until one would be.
    pub async fn admit_rate(
        &self,
        name: &str,
        rate: &Rate,
    ) -> Result<Result<(), Duration>, CountersError> {
        let interval = rate.interval();
        let tolerance = interval * rate.burst.saturating_sub(1);
        let key = self.key("rate", name);
        let args = [
            interval.as_micros().to_string(),
            tolerance.as_micros().to_string(),
        ];
        let wait: i64 = self.run(&self.scripts.gcra, &[&key], &args).await?;
        Ok(match u64::try_from(wait) {
            Ok(0) | Err(_) => Ok(()),
            Ok(us) => Err(Duration::from_micros(us)),
        })
    }

    /// Count one more child of `parent` unless it has `max` (the count that refused it).
    pub async fn spawn(
        &self,
        parent: &str,
        max: u32,
        ttl: Duration,
    ) -> Result<Result<(), u64>, CountersError> {
        let key = self.children_key(parent);
        let args = [max.to_string(), ttl.as_millis().max(1).to_string()];
        let n: i64 = self.run(&self.scripts.spawn, &[&key], &args).await?;
        Ok(match u64::try_from(n) {
            Ok(n) => Err(n),
            Err(_) => Ok(()),
        })
    }

    /// Give back a child count whose child was never created.
    pub async fn unspawn(&self, parent: &str) -> Result<(), CountersError> {
        let key = self.children_key(parent);
        self.run::<i64>(&self.scripts.unspawn, &[&key], &[]).await?;
        Ok(())
    }
}

/// What a carve did: the child's limits, or the limit of the parent's that refused it.
pub type Carved = Result<Limits, Box<LimitHit>>;
