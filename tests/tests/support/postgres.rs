//! A PostgreSQL schema of a test's own on the machine's server (`OSTIARY_TEST_POSTGRES`,
//! default `postgres://postgres@127.0.0.1:5432/test`), dropped with it, and `psql` to look
//! inside. A server that cannot be reached fails the test, naming it.
#![allow(dead_code)]

pub(crate) fn base_url() -> String {
    std::env::var("OSTIARY_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// A schema of the test's own, dropped with it.
pub(crate) struct Schema(pub(crate) String);

impl Schema {
    pub(crate) fn create() -> Self {
        let name = format!(
            "e2e_{}_{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .subsec_nanos()
        );
        psql(&format!("CREATE SCHEMA {name}"));
        Self(name)
    }

    /// The store URL whose connections start in this schema.
    pub(crate) fn url(&self) -> String {
        format!("{}?options=-csearch_path%3D{}", base_url(), self.0)
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        let _ = std::process::Command::new("psql")
            .args([
                &base_url(),
                "-qc",
                &format!("DROP SCHEMA IF EXISTS {} CASCADE", self.0),
            ])
            .status();
    }
}

pub(crate) fn psql(sql: &str) -> String {
    let out = std::process::Command::new("psql")
        .args([&base_url(), "-tAqc", sql])
        .output()
        .expect("psql runs");
    assert!(
        out.status.success(),
        "PostgreSQL at {} is required: {}",
        base_url(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}
