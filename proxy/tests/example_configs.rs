//! Every example config in `docs/examples/` loads, and the complete one equals the
//! built-in defaults (so the documentation cannot drift from the code).

use std::path::Path;

use ostiary::Config;

#[test]
fn every_example_config_loads() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/examples");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            Config::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            n += 1;
        }
    }
    assert!(n >= 2, "expected the example configs in {}", dir.display());
}

#[test]
fn the_complete_example_is_the_default() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/examples/ostiary.toml");
    let mut example = Config::load(&path).unwrap();
    // Where it was read from is the one thing a file has that the defaults do not.
    assert_eq!(example.source.as_deref(), Some(path.as_path()));
    example.source = None;
    let default = Config::default();
    assert_eq!(format!("{example:?}"), format!("{default:?}"));
}
