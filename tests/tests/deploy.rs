//! The example deployment files in `deploy/` (docs/deploy.md) hold what the docs promise.
//!
//! `tests/scripts/check_deploy.py` validates the Kubernetes manifests offline and strictly
//! (kubernetes-validate, unknown fields refused), checks the properties across files
//! (replicas, probes, grace period, security context, references, selectors, the PDB), runs
//! `systemd-analyze` on the unit, and extracts the ConfigMaps. This test runs it, then loads
//! what it extracted with Ostiary's own code: the config as `ostiary serve` parses it, the
//! policies as `ostiary policy validate` loads them, and the keys the Deployment mounts as a
//! replica opens them. Copies of the manifests with one defect each must make the script fail,
//! so a check that stopped checking is noticed. A missing Python package fails the test with
//! the script's message; nothing is skipped.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use ostiary::config::Config;
use ostiary::state::StateDir;
use ostiary_e2e::clients::{self, CmdOutput};
use serde_json::Value;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ lives in the workspace")
        .to_owned()
}

/// `check_deploy.py OUT [ARGS]` with the venv's Python (`OSTIARY_TEST_PYTHON`).
async fn check_deploy(out: &Path, args: &[&str]) -> CmdOutput {
    let script = root().join("tests/scripts/check_deploy.py");
    let out = out.to_str().expect("utf-8 temp path");
    let mut all = vec![out];
    all.extend_from_slice(args);
    let result = clients::python(&script, &all, &[]).await;
    assert!(
        !result.stderr.contains("cannot import"),
        "check_deploy.py lacks its packages (run scripts/test.sh --setup-only, and set \
         OSTIARY_TEST_PYTHON={}):\n{result}",
        root().join(".venv/bin/python").display()
    );
    result
}

fn load_config(path: &Path) -> Config {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    Config::from_toml(&text, path)
        .unwrap_or_else(|e| panic!("{} does not load as ostiary.toml: {e}", path.display()))
}

/// The policies of `dir`, loaded as `ostiary policy validate` does ([`ostiary::server::load_policies`]).
fn load_policies(config: &Config, dir: &Path) -> ostiary_policies::PolicyEngine {
    let mut config = config.clone();
    config.policy.dir = dir.to_owned();
    let engine = ostiary::server::load_policies(&config)
        .unwrap_or_else(|e| panic!("policies in {} do not validate: {e}", dir.display()));
    assert!(!engine.is_empty(), "no policy in {}", dir.display());
    // A tool naming a credential no binding defines would run without it: `serve` warns,
    // as long as the config binds any (the shipped library names credentials for
    // illustration, and a config without bindings has nothing to misspell).
    let bound: BTreeSet<&str> = config.credential.iter().map(|b| b.name.as_str()).collect();
    for tool in engine
        .catalog()
        .tools()
        .iter()
        .filter(|_| !bound.is_empty())
    {
        if let Some(credential) = tool.credential() {
            assert!(
                bound.contains(credential),
                "tool {} in {} uses credential {credential:?}, which the config does not bind ({bound:?})",
                tool.name(),
                dir.display()
            );
        }
    }
    engine
}

#[tokio::test]
async fn the_kubernetes_manifests_validate_and_what_they_mount_loads() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let run = check_deploy(&out, &[]).await;
    assert!(run.success(), "check_deploy.py refused deploy/:\n{run}");
    assert!(run.stdout.contains("strict"), "{run}");

    let facts: Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("deployment.json")).expect("deployment.json"),
    )
    .expect("deployment.json is JSON");
    let mount_of = |volume: &str| -> PathBuf {
        let mounts = facts["mounts"].as_object().expect("mounts");
        let (path, _) = mounts
            .iter()
            .find(|(_, m)| m["volume"] == volume)
            .unwrap_or_else(|| panic!("no mount of volume {volume}: {facts}"));
        PathBuf::from(path)
    };

    // The config map's ostiary.toml, as `ostiary serve` parses and validates it.
    // `state.keys_dir` is required: a replica that generated keys of its own would sign
    // tokens, links and audit records no other replica accepts.
    let config = load_config(&out.join("ostiary.toml"));
    assert_eq!(
        config.state.keys_dir.as_deref(),
        Some(mount_of("keys").as_path()),
        "state.keys_dir is where the ostiary-keys Secret is mounted"
    );
    assert_eq!(config.policy.dir, mount_of("policies"));
    assert!(
        config.state.dir.starts_with(mount_of("state")) && config.state.dir != mount_of("state"),
        "state.dir {} is a directory Ostiary makes inside the emptyDir",
        config.state.dir.display()
    );
    let port = |name: &str| facts["ports"][name].as_u64().expect("container port") as u16;
    assert_eq!(
        config.listen.proxy,
        SocketAddr::from(([0, 0, 0, 0], port("proxy")))
    );
    assert_eq!(
        config.listen.control,
        SocketAddr::from(([0, 0, 0, 0], port("control")))
    );
    assert_eq!(config.broker.backend, "vault");
    assert!(config.broker.vault.is_some());

    // The policy ConfigMap in the kubelet's layout (symlinks through `..data`).
    load_policies(&config, &out.join("policies"));

    // The keys `ostiary state init` makes are exactly the files the Deployment mounts, and a
    // replica opens its state with only those.
    let made = tmp.path().join("keys-made");
    let names: BTreeSet<String> = StateDir::init_keys(&made)
        .expect("state init")
        .into_iter()
        .map(str::to_owned)
        .collect();
    let mounted: BTreeSet<String> = facts["key_files"]
        .as_array()
        .expect("key_files")
        .iter()
        .map(|v| v.as_str().expect("file name").to_owned())
        .collect();
    assert_eq!(
        names, mounted,
        "ostiary state init vs the keys volume's items"
    );
    let keys = tmp.path().join("keys-mounted");
    std::fs::create_dir(&keys).unwrap();
    for name in &mounted {
        std::fs::copy(made.join(name), keys.join(name)).unwrap();
    }
    StateDir::open_shared(&tmp.path().join("state"), &keys)
        .unwrap_or_else(|e| panic!("a replica cannot open its state with the mounted keys: {e}"));
}

#[test]
fn the_systemd_config_loads_with_the_library_it_installs() {
    let config = load_config(&root().join("deploy/systemd/ostiary.toml"));
    assert_eq!(config.state.dir, Path::new("/var/lib/ostiary"));
    assert_eq!(
        config.state.keys_dir, None,
        "one replica makes its own keys"
    );
    assert_eq!(config.state.store, "sqlite");
    assert_eq!(config.policy.dir, Path::new("/etc/ostiary/policies"));
    // The unit's install steps copy policies/library/ to policy.dir.
    load_policies(&config, &root().join("policies/library"));
}

/// The Dockerfile's instructions, `\`-continued lines joined, comments dropped.
fn dockerfile() -> Vec<String> {
    let text = std::fs::read_to_string(root().join("Dockerfile")).expect("Dockerfile");
    let mut out: Vec<String> = Vec::new();
    let mut open = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (body, more) = match line.strip_suffix('\\') {
            Some(body) => (body.trim(), true),
            None => (line, false),
        };
        match out.last_mut() {
            Some(last) if open => {
                last.push(' ');
                last.push_str(body);
            }
            _ => out.push(body.to_owned()),
        }
        open = more;
    }
    out
}

#[test]
fn the_container_image_builds_the_dist_profile_and_runs_unprivileged_on_its_config() {
    let steps = dockerfile();
    let stages: Vec<&String> = steps.iter().filter(|s| s.starts_with("FROM ")).collect();
    assert_eq!(
        stages.len(),
        2,
        "a build stage and a runtime stage: {stages:?}"
    );
    assert!(
        stages[1].contains("distroless/cc") && stages[1].contains(":nonroot"),
        "the runtime is distroless, glibc and nothing else: {}",
        stages[1]
    );
    let run = steps
        .iter()
        .find(|s| s.starts_with("RUN ") && s.contains("scripts/build-dist.sh"))
        .expect("a build step through scripts/build-dist.sh");
    assert!(run.contains("target/dist/ostiary"), "{run}");
    // The script builds locked, with the committed execution profile, the build profile the
    // execution profile is taken on (its symbols are what it matches), stripped afterwards.
    let script = std::fs::read_to_string(root().join("scripts/build-dist.sh")).unwrap();
    for wanted in [
        "cargo build --locked --profile profiling -p ostiary-cli --bin ostiary",
        "strip --strip-all -o \"$TARGET/dist/ostiary\" \"$TARGET/profiling/ostiary\"",
        "-Cprofile-use=$PROFDATA",
        "deploy/pgo/ostiary.profdata.gz",
    ] {
        assert!(script.contains(wanted), "{wanted} in scripts/build-dist.sh");
    }
    // The profile the build names exists, and ships one stripped binary.
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let manifest: toml::Value = toml::from_str(&manifest).unwrap();
    let dist = &manifest["profile"]["dist"];
    assert_eq!(dist["inherits"].as_str(), Some("release"), "{dist}");
    assert_eq!(dist["strip"].as_str(), Some("symbols"), "{dist}");
    // Whatever comes after the runtime stage's FROM runs as the unprivileged user.
    let runtime = steps
        .iter()
        .skip_while(|s| *s != stages[1])
        .collect::<Vec<_>>();
    let user = runtime
        .iter()
        .rev()
        .find(|s| s.starts_with("USER "))
        .expect("a USER in the runtime stage");
    assert!(
        !["USER root", "USER 0", "USER 0:0"].contains(&user.as_str()),
        "{user}"
    );
    assert!(
        runtime.iter().any(|s| s.starts_with("COPY ")
            && s.contains("--chown=65532:65532")
            && s.contains("/var/lib/ostiary")),
        "the state volume belongs to the user: {runtime:?}"
    );
    let entry = runtime
        .iter()
        .find(|s| s.starts_with("ENTRYPOINT "))
        .expect("an ENTRYPOINT");
    assert!(entry.contains("/etc/ostiary/ostiary.toml"), "{entry}");
    // The config the image carries loads as `serve` reads it, listening beyond the
    // container's loopback and keeping its state in the volume.
    let config = load_config(&root().join("deploy/docker/ostiary.toml"));
    assert!(
        config.listen.proxy.ip().is_unspecified(),
        "{:?}",
        config.listen.proxy
    );
    assert!(
        config.listen.control.ip().is_unspecified(),
        "{:?}",
        config.listen.control
    );
    assert!(
        config.state.dir.starts_with("/var/lib/ostiary"),
        "{}",
        config.state.dir.display()
    );
    assert!(
        steps
            .iter()
            .any(|s| s.contains("deploy/docker/ostiary.toml")
                && s.contains("/etc/ostiary/ostiary.toml")),
        "the image carries deploy/docker/ostiary.toml"
    );
}

/// Copies `deploy/<what>` to a temp dir with `from` replaced by `to` in `file`, runs the
/// script on the copy, and checks it fails naming `expect`.
async fn defect_is_refused(what: &str, file: &str, from: &str, to: &str, expect: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let copy = tmp.path().join(what);
    std::fs::create_dir(&copy).unwrap();
    let source = root().join("deploy").join(what);
    for entry in std::fs::read_dir(&source).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), copy.join(entry.file_name())).unwrap();
    }
    let text = std::fs::read_to_string(copy.join(file)).unwrap();
    assert_eq!(
        text.matches(from).count(),
        1,
        "the defect's anchor {from:?} must occur once in deploy/{what}/{file}"
    );
    std::fs::write(copy.join(file), text.replace(from, to)).unwrap();

    let flag = format!("--{what}-dir");
    let copy = copy.to_str().unwrap();
    let run = check_deploy(&tmp.path().join("out"), &[&flag, copy]).await;
    assert!(
        !run.success(),
        "check_deploy.py accepted {file} with {to:?}:\n{run}"
    );
    assert!(
        run.stderr.contains("FAIL") && run.stderr.contains(expect),
        "check_deploy.py failed without naming {expect:?}:\n{run}"
    );
}

#[tokio::test]
async fn one_replica_is_refused() {
    defect_is_refused(
        "k8s",
        "30-deployment.yaml",
        "replicas: 3",
        "replicas: 1",
        "spec.replicas is 1, not 3",
    )
    .await;
}

#[tokio::test]
async fn a_missing_readiness_probe_is_refused() {
    defect_is_refused(
        "k8s",
        "30-deployment.yaml",
        "readinessProbe:",
        "startupProbe:",
        "no readinessProbe",
    )
    .await;
}

#[tokio::test]
async fn an_unknown_field_is_refused_by_the_schema() {
    defect_is_refused(
        "k8s",
        "30-deployment.yaml",
        "terminationGracePeriodSeconds: 45",
        "terminationGracePeriodSeconds: 45\n      terminationGraceSeconds: 45",
        "'terminationGraceSeconds' was unexpected",
    )
    .await;
}

#[tokio::test]
async fn an_env_reference_to_a_missing_secret_key_is_refused() {
    defect_is_refused(
        "k8s",
        "20-secrets.yaml",
        "OSTIARY_STATE_REDIS:",
        "OSTIARY_REDIS:",
        "has no key 'OSTIARY_STATE_REDIS'",
    )
    .await;
}

#[tokio::test]
async fn a_stop_timeout_within_the_drain_bound_is_refused() {
    defect_is_refused(
        "systemd",
        "ostiary.service",
        "TimeoutStopSec=45s",
        "TimeoutStopSec=20s",
        "TimeoutStopSec is '20s'",
    )
    .await;
}

/// The image, the unit and the manifests run the proxy with the same tuning environment
/// (docs/deploy.md, "Environment"): a setting that one of them drops or spells differently
/// would make that deployment measure unlike the others.
#[test]
fn every_deployment_sets_the_same_tuning_environment() {
    const TUNING: &str = "GLIBC_TUNABLES=glibc.cpu.x86_rep_movsb_threshold=1048576";
    let image: Vec<String> = dockerfile()
        .into_iter()
        .filter_map(|s| s.strip_prefix("ENV ").map(str::to_owned))
        .collect();
    assert!(image.iter().any(|e| e == TUNING), "image: {image:?}");
    let unit = std::fs::read_to_string(root().join("deploy/systemd/ostiary.service")).unwrap();
    let unit: Vec<&str> = unit
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Environment="))
        .collect();
    assert!(unit.contains(&TUNING), "unit: {unit:?}");
    let manifest = std::fs::read_to_string(root().join("deploy/k8s/30-deployment.yaml")).unwrap();
    // `- name: N` then `value: V`, as the schema check (check_deploy.py) has validated.
    let lines: Vec<&str> = manifest.lines().map(str::trim).collect();
    let (name, value) = TUNING.split_once('=').unwrap();
    let set = lines
        .windows(2)
        .any(|w| w[0] == format!("- name: {name}") && w[1] == format!("value: {value}"));
    assert!(set, "30-deployment.yaml sets {TUNING}");
    let documented = std::fs::read_to_string(root().join("docs/deploy.md")).unwrap();
    assert!(
        documented.contains(&format!("| `{TUNING}` |")),
        "docs/deploy.md"
    );
}

/// A committed `.gz` file's bytes.
fn gunzip(packed: &Path) -> Vec<u8> {
    let unpacked = std::process::Command::new("gzip")
        .arg("-dc")
        .arg(packed)
        .output()
        .expect("gzip");
    assert!(unpacked.status.success(), "{}: not gzip", packed.display());
    unpacked.stdout
}

/// The execution profile `scripts/build-dist.sh` builds with is an LLVM indexed profile that
/// this toolchain's rustc reads. rustc only warns about a profile it cannot read and builds
/// without it, so the script checks first; a damaged profile must stop it, or the check
/// proves nothing.
#[test]
fn the_committed_execution_profile_is_one_this_toolchain_reads() {
    let packed = root().join("deploy/pgo/ostiary.profdata.gz");
    let profile = gunzip(&packed);
    // `IndexedInstrProf::Magic`, little-endian: "\xfflprofi\x81".
    assert_eq!(
        profile.get(..8),
        Some(&b"\xfflprofi\x81"[..]),
        "not an LLVM indexed profile"
    );

    let dir = tempfile::tempdir().unwrap();
    let check = |packed: &Path| {
        std::process::Command::new("bash")
            .arg(root().join("scripts/build-dist.sh"))
            .arg("--check")
            .env("OSTIARY_PGO_PROFILE", packed)
            .env("CARGO_TARGET_DIR", dir.path())
            .output()
            .expect("bash")
    };
    let read = check(&packed);
    assert!(
        read.status.success(),
        "the committed profile: {}{}",
        String::from_utf8_lossy(&read.stdout),
        String::from_utf8_lossy(&read.stderr)
    );

    let mut damaged = profile.clone();
    damaged[8..16].copy_from_slice(&u64::MAX.to_le_bytes()); // the format's version
    let damaged_path = dir.path().join("damaged.profdata");
    std::fs::write(&damaged_path, &damaged).unwrap();
    let zipped = std::process::Command::new("gzip")
        .arg("-f")
        .arg(&damaged_path)
        .status()
        .expect("gzip");
    assert!(zipped.success());
    let refused = check(&dir.path().join("damaged.profdata.gz"));
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && said.contains("cannot use the profile"),
        "a damaged profile passed the check: {said}"
    );
    assert!(
        said.contains("unsupported instrumentation profile format version"),
        "rustc's own reason is passed on: {said}"
    );
}

/// The shipped build lays out first every function the proxy was seen to run
/// (`deploy/pgo/ostiary.order.gz`, benches/order.py) and packs its relocations: the code and
/// tables start-up maps in are half what they were (docs/benchmarks.md, "Code laid out by
/// what runs"). The order is the linker's symbols, the profile's hottest among the first;
/// without it the build stops rather than ship the old layout unsaid.
#[test]
fn the_shipped_build_lays_out_what_runs_together() {
    let script = std::fs::read_to_string(root().join("scripts/build-dist.sh")).unwrap();
    for wanted in [
        "deploy/pgo/ostiary.order.gz",
        "-Wl,--symbol-ordering-file=$ORDER",
        "-Wl,-z,pack-relative-relocs",
    ] {
        assert!(script.contains(wanted), "{wanted} in scripts/build-dist.sh");
    }

    let order = String::from_utf8(gunzip(&root().join("deploy/pgo/ostiary.order.gz")))
        .expect("an order is text");
    let names: Vec<&str> = order.lines().collect();
    assert!(names.len() > 5_000, "{} functions", names.len());
    let unique: BTreeSet<&str> = names.iter().copied().collect();
    assert_eq!(unique.len(), names.len(), "a function named twice");
    // One symbol per line, as the linker spells it: mangled Rust, or a C identifier
    // (SQLite's, with the compiler's `.constprop.0` suffixes).
    for name in &names {
        assert!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_$.".contains(c)),
            "not a symbol: {name:?}"
        );
    }
    // The profile's most-run functions first; the start-up code callgrind saw (SQLite's,
    // which the profile cannot count) is in too.
    let first = &names[..200];
    assert!(
        first
            .iter()
            .any(|n| n.contains("pipeline") || n.contains("hyper")),
        "the hot path leads: {:?}",
        &first[..10]
    );
    assert!(names.contains(&"sqlite3_open_v2"), "SQLite's start-up");

    let dir = tempfile::tempdir().unwrap();
    let missing = std::process::Command::new("bash")
        .arg(root().join("scripts/build-dist.sh"))
        .arg("--check")
        .env("OSTIARY_PGO_ORDER", dir.path().join("absent.order.gz"))
        .env("CARGO_TARGET_DIR", dir.path())
        .output()
        .expect("bash");
    let said = String::from_utf8_lossy(&missing.stderr);
    assert!(
        !missing.status.success() && said.contains("absent.order.gz is missing"),
        "a build without its order went on: {said}"
    );
}

/// benches/order.py: what callgrind saw the proxy run, the profile's most-run first and
/// what the profile lacks after them; then the profile's functions the proxy was not seen
/// to run (the training's other code), each once; a function that never ran is left where
/// the compiler put it, and an empty input or a missing argument is an error, not an empty
/// order.
#[test]
fn the_order_puts_what_runs_first_the_most_run_first() {
    let dir = tempfile::tempdir().unwrap();
    let listing = "Counters:\n  \
        crate.abc-cgu.0;_ZN4warm17hE:\n    Hash: 0x1\n    Counters: 2\n    Block counts: [5, 40]\n  \
        _ZN3hot17hE:\n    Hash: 0x2\n    Counters: 1\n    Block counts: [900]\n  \
        _ZN5never17hE:\n    Hash: 0x3\n    Counters: 1\n    Block counts: [0]\n\
        Instrumentation level: IR\n";
    let ran = dir.path().join("ran.txt");
    // callgrind's own spellings: a recursive activation, a glibc symbol, `(below main)`.
    std::fs::write(
        &ran,
        "sqlite3_open_v2\n_ZN3hot17hE\nyy_reduce.constprop.0\nsqlite3_open_v2'2\n\
         _IO_file_close_it@@GLIBC_2.2.5\n(below main)\n",
    )
    .unwrap();
    let order = |args: &[&Path], input: &str| {
        use std::io::Write;
        let mut child = std::process::Command::new("python3")
            .arg(root().join("benches/order.py"))
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("python3");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    };
    let out = order(&[&ran], listing);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "_ZN3hot17hE\nsqlite3_open_v2\nyy_reduce.constprop.0\n_ZN4warm17hE\n"
    );

    let empty = dir.path().join("empty.txt");
    std::fs::write(&empty, "").unwrap();
    let nothing = order(&[&empty], "");
    assert_eq!(nothing.status.code(), Some(1), "an empty order");
    assert!(String::from_utf8_lossy(&nothing.stderr).contains("no function"));
    let usage = order(&[], listing);
    assert_eq!(usage.status.code(), Some(2), "no list of what ran");
}
