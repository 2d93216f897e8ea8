//! `[sandbox]` and `[sandbox.profiles.<name>]`: how `ostiary run --sandbox[=PROFILE]` isolates
//! a command (docs/sandbox.md).
//!
//! A profile names an isolation level (`namespaces`: Linux namespaces through bubblewrap;
//! `gvisor`: the same arrangement under gVisor's user-space kernel), the resource limits, the
//! read-only view of the host, what becomes of the working directory, and the environment
//! variables the command may inherit. Two profiles are built in — `default` (namespaces) and
//! `gvisor` — and a configured profile of the same name replaces one. Cedar sees the profile a
//! session runs under as `context.session.profile`, so policies can ask riskier tools for a
//! stricter one.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

use super::duration;

/// Environment variables a sandboxed command may inherit from the operator's, unless the
/// configuration says otherwise: what programs need to run, nothing that holds a secret.
pub const DEFAULT_ENV: &[&str] = &["PATH", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "TZ"];

/// Host paths a sandbox sees read-only by default: the system, not the users.
pub const DEFAULT_READ_ONLY: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt",
];

/// Variables never passed into a sandbox, whatever an allowlist says: the proxy's own and
/// Vault's (prefixes).
pub const NEVER_ENV_PREFIXES: &[&str] = &["OSTIARY_", "VAULT_", "BAO_"];

/// `[sandbox]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Sandbox {
    /// Variables of the operator's environment every profile may pass in (never one of
    /// [`NEVER_ENV_PREFIXES`], nor a variable some config field names as holding a secret).
    pub env: Vec<String>,
    /// The profile `--sandbox` without a name uses.
    pub default_profile: String,
    /// The bubblewrap binary (`namespaces`).
    pub bwrap: PathBuf,
    /// gVisor's `runsc` (`gvisor`).
    pub runsc: PathBuf,
    /// Resource control: `auto` (cgroup v2 where delegated, else v1 when writable, else
    /// rlimits), `v2`, `v1`, or `rlimits`. A named mechanism that is not available is an
    /// error, never a silent fallback.
    pub cgroups: CgroupMode,
    /// When `ostiary run` runs as root, each sandbox gets a host uid of its own from this
    /// range (inclusive), so that nothing the host's users own is the agent's, and per-uid
    /// limits count only the run's own processes.
    pub uid_range: [u32; 2],
    /// Profiles by name, beside (or replacing) the built-in `default` and `gvisor`.
    #[serde(deserialize_with = "profiles")]
    pub profiles: BTreeMap<String, Profile>,
}

impl Default for Sandbox {
    fn default() -> Self {
        Self {
            env: DEFAULT_ENV.iter().map(|s| (*s).to_owned()).collect(),
            default_profile: "default".into(),
            bwrap: PathBuf::from("bwrap"),
            runsc: PathBuf::from("runsc"),
            cgroups: CgroupMode::Auto,
            uid_range: [1_000_000_000, 1_999_999_999],
            profiles: BTreeMap::new(),
        }
    }
}

/// How resource limits are enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupMode {
    Auto,
    V2,
    V1,
    Rlimits,
}

/// The isolation level of a profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Isolation {
    /// Linux namespaces (mount, pid, network, ipc, uts), a separate uid, a seccomp filter.
    Namespaces,
    /// The same, run under gVisor's `runsc`: a user-space kernel between the command and
    /// the host.
    Gvisor,
}

impl Isolation {
    pub fn as_str(self) -> &'static str {
        match self {
            Isolation::Namespaces => "namespaces",
            Isolation::Gvisor => "gvisor",
        }
    }
}

/// What the sandbox's working directory is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Workdir {
    /// A private tmpfs holding a copy of the host directory (bounded by `workdir_copy_max`):
    /// the command sees its files, and nothing it writes survives.
    Copy,
    /// An empty private tmpfs.
    Empty,
}

/// `[sandbox.profiles.<name>]`. Every field has the built-in default profile's value when
/// absent.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Profile {
    pub isolation: Isolation,
    /// Memory of the whole sandbox, e.g. `"2GiB"`.
    #[serde(deserialize_with = "bytes")]
    pub memory: u64,
    /// Processes (and threads) at once.
    pub processes: u32,
    /// Open files per process.
    pub open_files: u32,
    /// CPU time of the whole run.
    #[serde(deserialize_with = "duration")]
    pub cpu_time: Duration,
    /// Wall-clock limit; absent: the session's TTL.
    #[serde(deserialize_with = "optional_duration")]
    pub wall_clock: Option<Duration>,
    /// Host paths seen read-only (those that do not exist are skipped).
    pub read_only: Vec<PathBuf>,
    /// Host paths hidden (an empty tmpfs over them), besides the state directory and the
    /// config's secret files, which are never visible.
    pub hide: Vec<PathBuf>,
    pub workdir: Workdir,
    /// The largest working directory `workdir = "copy"` copies.
    #[serde(deserialize_with = "bytes")]
    pub workdir_copy_max: u64,
    /// Variables this profile passes in besides `[sandbox] env`.
    pub env: Vec<String>,
}

impl Default for Profile {
    fn default() -> Self {
        Self {
            isolation: Isolation::Namespaces,
            memory: 2 << 30,
            processes: 512,
            open_files: 1024,
            cpu_time: Duration::from_secs(3600),
            wall_clock: None,
            read_only: DEFAULT_READ_ONLY.iter().map(PathBuf::from).collect(),
            hide: Vec::new(),
            workdir: Workdir::Copy,
            workdir_copy_max: 256 << 20,
            env: Vec::new(),
        }
    }
}

impl Sandbox {
    /// The profile `name`: a configured one, else a built-in one.
    pub fn profile(&self, name: &str) -> Option<Profile> {
        if let Some(profile) = self.profiles.get(name) {
            return Some(profile.clone());
        }
        match name {
            "default" => Some(Profile::default()),
            "gvisor" => Some(Profile {
                isolation: Isolation::Gvisor,
                ..Profile::default()
            }),
            _ => None,
        }
    }

    /// Every profile name a session may name: the built-in ones and the configured ones.
    pub fn profile_names(&self) -> Vec<String> {
        let mut names: Vec<String> = ["default", "gvisor"]
            .iter()
            .map(|s| (*s).to_owned())
            .chain(self.profiles.keys().cloned())
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// Checks the config cannot express in types.
    pub(super) fn validate(&self) -> Result<(), String> {
        if self.profile(&self.default_profile).is_none() {
            return Err(format!(
                "sandbox.default_profile {:?} names no profile",
                self.default_profile
            ));
        }
        let [low, high] = self.uid_range;
        if low == 0 || low > high {
            return Err("sandbox.uid_range must be [low, high] with 0 < low <= high".into());
        }
        for name in &self.env {
            if NEVER_ENV_PREFIXES.iter().any(|p| name.starts_with(p)) {
                return Err(format!(
                    "sandbox.env names {name}: OSTIARY_*, VAULT_* and BAO_* variables never enter a sandbox"
                ));
            }
        }
        for (name, profile) in &self.profiles {
            let bad = |what: &str| Err(format!("sandbox.profiles.{name}: {what}"));
            if !crate::session::registry::valid_profile_name(name) {
                return bad("a profile name is 1-64 characters of a-z 0-9 _ -");
            }
            if profile.memory < 16 << 20 {
                return bad("memory must be at least 16MiB");
            }
            if profile.processes == 0 || profile.open_files < 16 {
                return bad("processes must be at least 1 and open_files at least 16");
            }
            if profile.cpu_time.is_zero() || profile.wall_clock.is_some_and(|w| w.is_zero()) {
                return bad("cpu_time and wall_clock must not be zero");
            }
            for path in profile.read_only.iter().chain(&profile.hide) {
                if !path.is_absolute() {
                    return bad(&format!("{} is not an absolute path", path.display()));
                }
            }
            for var in &profile.env {
                if NEVER_ENV_PREFIXES.iter().any(|p| var.starts_with(p)) {
                    return bad(&format!("env names {var}, which never enters a sandbox"));
                }
            }
        }
        Ok(())
    }
}

/// `[sandbox.profiles.*]`. A configured `gvisor` profile that does not name its isolation
/// level keeps the built-in one's: `[sandbox.profiles.gvisor] memory = "4GiB"` must not
/// quietly make the `gvisor` profile a `namespaces` one.
fn profiles<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, Profile>, D::Error> {
    let tables = BTreeMap::<String, toml::Table>::deserialize(d)?;
    tables
        .into_iter()
        .map(|(name, table)| {
            let named = table.contains_key("isolation");
            let mut profile: Profile = toml::Value::Table(table)
                .try_into()
                .map_err(|e| serde::de::Error::custom(format!("sandbox.profiles.{name}: {e}")))?;
            if !named && name == "gvisor" {
                profile.isolation = Isolation::Gvisor;
            }
            Ok((name, profile))
        })
        .collect()
}

/// `"2GiB"`, `"512MiB"`, `"1048576"`: a byte count (`KiB`, `MiB`, `GiB`, `TiB`; also `K`,
/// `M`, `G`, `T` and `KB`… as the same binary units), or a plain integer.
fn bytes<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Size {
        Number(u64),
        Text(String),
    }
    match Size::deserialize(d)? {
        Size::Number(n) => Ok(n),
        Size::Text(text) => parse_bytes(&text).map_err(serde::de::Error::custom),
    }
}

/// The byte count of `text` (see [`bytes`]).
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a size such as \"2GiB\""))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(format!("{text:?}: unknown unit (KiB, MiB, GiB, TiB)")),
    };
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("{text:?} is too large"))
}

fn optional_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    let text = String::deserialize(d)?;
    if text.is_empty() {
        return Ok(None);
    }
    humantime::parse_duration(&text)
        .map(Some)
        .map_err(|e| serde::de::Error::custom(format!("{text:?}: {e}")))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::Config;

    #[test]
    fn built_in_profiles_and_configured_ones() {
        let c = Config::from_toml("", Path::new("t")).unwrap();
        let d = c.sandbox.profile("default").unwrap();
        assert_eq!(d.isolation, Isolation::Namespaces);
        assert_eq!((d.memory, d.processes, d.open_files), (2 << 30, 512, 1024));
        assert_eq!(d.cpu_time, Duration::from_secs(3600));
        assert_eq!(d.wall_clock, None, "the session's TTL");
        assert_eq!(
            c.sandbox.profile("gvisor").unwrap().isolation,
            Isolation::Gvisor
        );
        assert!(c.sandbox.profile("nope").is_none());
        let c = Config::from_toml(
            r#"
            [sandbox]
            env = ["PATH", "HOME"]
            [sandbox.profiles.tight]
            memory = "256MiB"
            processes = 32
            wall_clock = "10m"
            read_only = ["/usr"]
            workdir = "empty"
            "#,
            Path::new("t"),
        )
        .unwrap();
        let t = c.sandbox.profile("tight").unwrap();
        assert_eq!((t.memory, t.processes), (256 << 20, 32));
        assert_eq!(t.wall_clock, Some(Duration::from_secs(600)));
        assert_eq!(t.workdir, Workdir::Empty);
        assert_eq!(
            t.open_files, 1024,
            "unnamed fields keep the default profile's"
        );
        assert_eq!(c.sandbox.profile_names(), ["default", "gvisor", "tight"]);
        // A configured `gvisor` profile keeps its level unless it names another.
        let c = Config::from_toml(
            "[sandbox.profiles.gvisor]\nmemory = \"1GiB\"\n[sandbox.profiles.default]\nmemory = \"1GiB\"",
            Path::new("t"),
        )
        .unwrap();
        assert_eq!(
            c.sandbox.profile("gvisor").unwrap().isolation,
            Isolation::Gvisor
        );
        assert_eq!(
            c.sandbox.profile("default").unwrap().isolation,
            Isolation::Namespaces
        );
        let c = Config::from_toml(
            "[sandbox.profiles.gvisor]\nisolation = \"namespaces\"",
            Path::new("t"),
        )
        .unwrap();
        assert_eq!(
            c.sandbox.profile("gvisor").unwrap().isolation,
            Isolation::Namespaces
        );
    }

    #[test]
    fn bad_sandbox_configs_are_refused() {
        for (text, needle) in [
            ("[sandbox]\nenv = [\"OSTIARY_ADMIN_TOKEN\"]", "never enter"),
            ("[sandbox]\ndefault_profile = \"x\"", "names no profile"),
            ("[sandbox]\nuid_range = [0, 5]", "uid_range"),
            ("[sandbox.profiles.a]\nmemory = \"1KiB\"", "16MiB"),
            (
                "[sandbox.profiles.a]\nmemory = \"2 parsecs\"",
                "unknown unit",
            ),
            ("[sandbox.profiles.a]\nprocesses = 0", "processes"),
            ("[sandbox.profiles.a]\nread_only = [\"usr\"]", "absolute"),
            (
                "[sandbox.profiles.a]\nenv = [\"VAULT_TOKEN\"]",
                "never enters",
            ),
            ("[sandbox.profiles.\"A B\"]\n", "profile name"),
            (
                "[sandbox.profiles.a]\nisolation = \"vm\"",
                "unknown variant",
            ),
            ("[sandbox.profiles.a]\nfoo = 1", "unknown field"),
        ] {
            let e = Config::from_toml(text, Path::new("t"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(needle), "{text}: {e}");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("2GiB").unwrap(), 2 << 30);
        assert_eq!(parse_bytes("512 MiB").unwrap(), 512 << 20);
        assert_eq!(parse_bytes("1048576").unwrap(), 1 << 20);
        assert_eq!(parse_bytes("1k").unwrap(), 1024);
        assert!(parse_bytes("-1G").is_err());
        assert!(parse_bytes("99999999999T").is_err());
    }
}
