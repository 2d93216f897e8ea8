//! The database's schema version, end to end: a restart keeps the sessions and the version;
//! a database a newer Ostiary migrated is refused at start-up with the versions named, and
//! left exactly as it was (nothing migrated down, nothing written).

use ostiary::config::Config;
use ostiary::server::{Options, Ostiary};
use ostiary::store::sqlite::migrations::LATEST;
use ostiary_e2e::proxy::{ProxySpec, TestProxy};

fn schema_version(db: &std::path::Path) -> i64 {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.query_row("SELECT MAX(version) FROM schema_version", [], |r| r.get(0))
        .unwrap()
}

fn sessions(db: &std::path::Path) -> i64 {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.query_row("SELECT COUNT(*) FROM sessions", [], |r| r.get(0))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restart_keeps_the_version_and_a_newer_database_is_refused_untouched() {
    let keep = tempfile::tempdir().unwrap();
    let state = keep.path().join("state");
    let spec = ProxySpec {
        state_dir: Some(state.clone()),
        ..Default::default()
    };
    let mut proxy = TestProxy::start(spec).await;
    proxy.session("planner").await;
    let db = state.join("ostiary.db");
    assert_eq!(schema_version(&db), LATEST);
    proxy.restart().await;
    assert_eq!(
        schema_version(&db),
        LATEST,
        "a restart applies nothing twice"
    );
    let config_path = proxy.config_path.clone();
    // The config and the policies, copied out of the proxy's own temporary directory,
    // which `stop` removes.
    let policies = proxy.dir.path().join("policies");
    let kept = keep.path().join("policies");
    std::fs::create_dir_all(&kept).unwrap();
    for entry in std::fs::read_dir(&policies).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), kept.join(entry.file_name())).unwrap();
    }
    let config_text = std::fs::read_to_string(&config_path)
        .unwrap()
        .replace(&policies.display().to_string(), &kept.display().to_string());
    proxy.stop().await;
    assert_eq!(sessions(&db), 1);

    // What a newer binary would leave: one more migration recorded.
    {
        let conn = rusqlite::Connection::open(&db).unwrap();
        conn.execute(
            "INSERT INTO schema_version (version, name, applied_ms) VALUES (?1, 'from the future', 0)",
            [LATEST + 1],
        )
        .unwrap();
    }
    let before = std::fs::read(&db).unwrap();
    let config_file = keep.path().join("ostiary.toml");
    std::fs::write(&config_file, config_text).unwrap();
    let config = Config::load(&config_file).unwrap();
    let refused = Ostiary::build(config, Options::default()).await;
    let message = match refused {
        Ok(_) => panic!("a database newer than the binary was opened"),
        Err(e) => e.to_string(),
    };
    assert!(
        message.contains(&format!("schema version {}", LATEST + 1))
            && message.contains(&format!("({LATEST})"))
            && message.contains("newer than this binary"),
        "{message}"
    );
    assert_eq!(schema_version(&db), LATEST + 1);
    assert_eq!(sessions(&db), 1);
    assert_eq!(std::fs::read(&db).unwrap(), before, "nothing was written");
}
