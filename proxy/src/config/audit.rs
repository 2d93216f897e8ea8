//! `[audit]`: how often the chain is signed for auditors who hold no key of ours
//! (docs/audit.md, docs/audit-export.md), and `[audit.siem]`, the trail streamed to a SIEM
//! (`crate::audit::stream`).

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

/// The audit trail's signed checkpoints.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Audit {
    /// At most this long after the previous signed checkpoint while records come (and at
    /// shutdown) the writer signs the records since: the longest an export can lag the chain.
    #[serde(deserialize_with = "super::duration")]
    pub signed_checkpoint_interval: Duration,
    /// Group commit: how long the writer gathers records after the first of a batch before
    /// committing them in one transaction (a flush — a hold, a pause, a query — or shutdown
    /// commits at once). Records are queued after the answer, so this is how much later a
    /// record may become durable, never a delay to any response; `0s` commits every batch
    /// as soon as the writer takes it. At most 100 ms.
    #[serde(deserialize_with = "super::duration")]
    pub group_commit: Duration,
    /// Stream every record to a SIEM as it is written; unset: no stream.
    pub siem: Option<Siem>,
}

impl Default for Audit {
    fn default() -> Self {
        Self {
            signed_checkpoint_interval: Duration::from_secs(60),
            group_commit: crate::audit::Limits::default().linger,
            siem: None,
        }
    }
}

/// `[audit.siem]`: where the trail is streamed, and how.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Siem {
    /// The receiver: every batch is `POST`ed here as JSON lines.
    pub url: String,
    /// `ocsf` (OCSF 1.3 events, as `audit query --format ocsf` prints them) or `records`
    /// (each record as stored, with its sequence number and chain hashes).
    pub format: SiemFormat,
    /// The environment variable holding a token sent as `Authorization: Bearer`; unset:
    /// no `Authorization` header. The token itself never appears in the config.
    pub token_env: Option<String>,
    /// Extra roots (PEM) trusted for an `https` receiver, besides the public ones.
    pub ca_file: Option<PathBuf>,
    /// The most records in one `POST`.
    pub batch: usize,
    /// How often the trail is looked at for new records while the stream is caught up.
    #[serde(deserialize_with = "super::duration")]
    pub interval: Duration,
    /// The longest wait between retries of a failed delivery (the wait doubles from
    /// `interval` up to this); a failed batch is retried for as long as it takes.
    #[serde(deserialize_with = "super::duration")]
    pub retry_max: Duration,
    /// The longest one delivery may take.
    #[serde(deserialize_with = "super::duration")]
    pub timeout: Duration,
    /// The cursor's name in the store: replicas sharing a store share it (one of them sends
    /// at a time); two streams of one trail need two names.
    pub cursor: String,
}

/// What a SIEM receives per record.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SiemFormat {
    #[default]
    Ocsf,
    Records,
}

impl Default for Siem {
    fn default() -> Self {
        Self {
            url: String::new(),
            format: SiemFormat::Ocsf,
            token_env: None,
            ca_file: None,
            batch: 500,
            interval: Duration::from_secs(1),
            retry_max: Duration::from_secs(60),
            timeout: Duration::from_secs(10),
            cursor: "siem".into(),
        }
    }
}

/// Most records in one delivery: a receiver's request-size limits are usually a few MiB.
const MOST_PER_BATCH: usize = 10_000;

impl Siem {
    fn validate(&self) -> Result<(), String> {
        let url = url::Url::parse(&self.url)
            .map_err(|e| format!("audit.siem.url {:?}: {e}", self.url))?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
            return Err(format!(
                "audit.siem.url {:?} must be an http(s) URL with a host",
                self.url
            ));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(
                "audit.siem.url must not carry credentials: name an environment variable in \
                 audit.siem.token_env"
                    .into(),
            );
        }
        if !(1..=MOST_PER_BATCH).contains(&self.batch) {
            return Err(format!(
                "audit.siem.batch is {}; it must be 1 to {MOST_PER_BATCH}",
                self.batch
            ));
        }
        for (name, value) in [
            ("interval", self.interval),
            ("retry_max", self.retry_max),
            ("timeout", self.timeout),
        ] {
            if value.is_zero() {
                return Err(format!("audit.siem.{name} must be more than 0"));
            }
        }
        if self.retry_max < self.interval {
            return Err("audit.siem.retry_max must be at least audit.siem.interval".into());
        }
        if self.token_env.as_deref().is_some_and(str::is_empty) || self.cursor.is_empty() {
            return Err("audit.siem.token_env and audit.siem.cursor may not be empty".into());
        }
        Ok(())
    }
}

/// Below this, a checkpoint record would follow nearly every batch: more chain than records.
const SHORTEST: Duration = Duration::from_millis(100);

/// The longest group commit: records of answered requests are not left undurable longer.
const LONGEST_GROUP_COMMIT: Duration = Duration::from_millis(100);

impl Audit {
    pub(super) fn validate(&self) -> Result<(), String> {
        if self.signed_checkpoint_interval < SHORTEST {
            return Err(format!(
                "audit.signed_checkpoint_interval is {:?}; it must be at least {SHORTEST:?}",
                self.signed_checkpoint_interval
            ));
        }
        if self.group_commit > LONGEST_GROUP_COMMIT {
            return Err(format!(
                "audit.group_commit is {:?}; it may be at most {LONGEST_GROUP_COMMIT:?}",
                self.group_commit
            ));
        }
        if let Some(siem) = &self.siem {
            siem.validate()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::Config;
    use super::*;

    #[test]
    fn the_interval_defaults_to_a_minute_and_is_bounded_below() {
        let c = Config::from_toml("", Path::new("t")).unwrap();
        assert_eq!(c.audit.signed_checkpoint_interval, Duration::from_secs(60));
        let c = Config::from_toml(
            "[audit]\nsigned_checkpoint_interval = \"5s\"\n",
            Path::new("t"),
        )
        .unwrap();
        assert_eq!(c.audit.signed_checkpoint_interval, Duration::from_secs(5));
        for short in ["0s", "10ms"] {
            let toml = format!("[audit]\nsigned_checkpoint_interval = \"{short}\"\n");
            let e = Config::from_toml(&toml, Path::new("t")).unwrap_err();
            assert!(e.to_string().contains("at least 100ms"), "{short}: {e}");
        }
        for bad in ["\"soon\"", "5"] {
            let toml = format!("[audit]\nsigned_checkpoint_interval = {bad}\n");
            assert!(Config::from_toml(&toml, Path::new("t")).is_err(), "{bad}");
        }
    }

    #[test]
    fn group_commit_defaults_to_the_writers_linger_and_is_bounded_above() {
        let c = Config::from_toml("", Path::new("t")).unwrap();
        assert_eq!(c.audit.group_commit, Duration::from_millis(20));
        for (text, want) in [("0s", 0), ("10ms", 10), ("100ms", 100)] {
            let toml = format!("[audit]\ngroup_commit = \"{text}\"\n");
            let c = Config::from_toml(&toml, Path::new("t")).unwrap();
            assert_eq!(c.audit.group_commit, Duration::from_millis(want), "{text}");
        }
        for long in ["101ms", "1s"] {
            let toml = format!("[audit]\ngroup_commit = \"{long}\"\n");
            let e = Config::from_toml(&toml, Path::new("t")).unwrap_err();
            assert!(e.to_string().contains("at most 100ms"), "{long}: {e}");
        }
        for bad in ["\"now\"", "2", "-1"] {
            let toml = format!("[audit]\ngroup_commit = {bad}\n");
            assert!(Config::from_toml(&toml, Path::new("t")).is_err(), "{bad}");
        }
        assert!(Config::from_toml("[audit]\nsigned_every = \"5s\"\n", Path::new("t")).is_err());
    }

    fn siem(body: &str) -> Result<Config, String> {
        Config::from_toml(&format!("[audit.siem]\n{body}\n"), Path::new("t"))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn a_siem_stream_needs_an_http_url_and_sane_bounds() {
        assert!(Config::from_toml("", Path::new("t"))
            .unwrap()
            .audit
            .siem
            .is_none());
        let c = siem("url = \"https://siem.example.com/in\"").unwrap();
        let s = c.audit.siem.unwrap();
        assert_eq!(
            (s.format, s.batch, s.cursor.as_str()),
            (SiemFormat::Ocsf, 500, "siem")
        );
        let c = siem("url = \"http://127.0.0.1:9/x\"\nformat = \"records\"\nbatch = 10\ntoken_env = \"T\"\ninterval = \"100ms\"").unwrap();
        let s = c.audit.siem.unwrap();
        assert_eq!((s.format, s.batch), (SiemFormat::Records, 10));
        assert_eq!(s.token_env.as_deref(), Some("T"));
        for (bad, says) in [
            ("", "audit.siem.url"),
            ("url = \"siem.example.com\"", "audit.siem.url"),
            ("url = \"ftp://siem.example.com/\"", "http(s)"),
            ("url = \"https://user:pw@siem.example.com/\"", "token_env"),
            ("url = \"https://s.example.com/\"\nbatch = 0", "batch"),
            ("url = \"https://s.example.com/\"\nbatch = 10001", "batch"),
            (
                "url = \"https://s.example.com/\"\ninterval = \"0s\"",
                "interval",
            ),
            (
                "url = \"https://s.example.com/\"\ninterval = \"2m\"",
                "retry_max",
            ),
            (
                "url = \"https://s.example.com/\"\ntoken_env = \"\"",
                "token_env",
            ),
            (
                "url = \"https://s.example.com/\"\nformat = \"cef\"",
                "format",
            ),
            (
                "url = \"https://s.example.com/\"\ntoken = \"s3cret\"",
                "token",
            ),
        ] {
            let e = siem(bad).unwrap_err();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
    }
}
