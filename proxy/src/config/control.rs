//! `[control]`: settings of the control listener (docs/design.md §6) beyond where it binds
//! (`listen.control`).

use serde::Deserialize;

/// The control API.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Control {
    /// Serve `GET /metrics` without the admin token, for a Prometheus that cannot send one.
    /// Off by default: the metrics name agents, tenants, credentials and tools, which is
    /// more than an unauthenticated caller on the control network should learn.
    pub public_metrics: bool,
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::Config;

    #[test]
    fn metrics_are_private_unless_configured_and_unknown_fields_are_refused() {
        let c = Config::from_toml("", Path::new("t")).unwrap();
        assert!(!c.control.public_metrics);
        let c = Config::from_toml("[control]\npublic_metrics = true\n", Path::new("t")).unwrap();
        assert!(c.control.public_metrics);
        let e = Config::from_toml("[control]\npublic = true\n", Path::new("t")).unwrap_err();
        assert!(e.to_string().contains("unknown field"), "{e}");
        assert!(
            Config::from_toml("[control]\npublic_metrics = \"yes\"\n", Path::new("t")).is_err()
        );
    }
}
