//! Evidence for auditors who hold none of Ostiary's keys: `audit pubkey` (the key that signs
//! the chain's checkpoints), `audit export` (records with the checkpoints covering them)
//! and `audit verify --offline` (an export checked with the public key alone).

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use ostiary::audit::attest::PublicKey;
use ostiary::audit::export::{self, OfflineError};
use ostiary::config::Config;
use ostiary::state::files;
use ostiary_store::audit::AuditStore;

use serde_json::json;

use super::CliError;
use crate::output::{paint, print_json, Output, BAD, GOOD};

/// `audit pubkey`: the public half of the checkpoint signing key, as PEM (its id on stderr,
/// so stdout is the key file as it is); with `--json`, `{"pem", "key_id"}`.
pub fn pubkey(config: &Config, out: Output) -> Result<ExitCode, CliError> {
    let dir = config.state.keys_dir.as_ref().unwrap_or(&config.state.dir);
    let path = dir.join(files::AUDIT_VERIFY_KEY);
    let key = PublicKey::read(&path).map_err(|e| CliError::Usage(e.to_string()))?;
    if out.json {
        print_json(&json!({ "pem": key.to_pem(), "key_id": key.id().to_string() }));
    } else {
        print!("{}", key.to_pem());
        eprintln!("key id {}", key.id());
    }
    Ok(ExitCode::SUCCESS)
}

/// `audit export`: to standard output; what was left out is said on standard error.
pub fn export(trail: &dyn AuditStore, since_ms: Option<i64>) -> Result<ExitCode, CliError> {
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let exported = export::export(trail, since_ms, &mut out).map_err(|e| match e {
        export::ExportError::Store(e) => CliError::Store(e),
        other => CliError::Usage(other.to_string()),
    })?;
    out.flush().map_err(|source| CliError::Io {
        what: "writing the export".into(),
        source,
    })?;
    let h = &exported.header;
    eprintln!(
        "exported records {}–{} with {} signed checkpoints (key {})",
        h.first, h.last, h.checkpoints, h.key
    );
    if exported.unsigned > 0 {
        eprintln!(
            "note: the {} newest records are not signed yet; they will be in an export after \
             the next checkpoint",
            exported.unsigned
        );
    }
    if exported.unsigned_before > 0 && since_ms.is_none() {
        eprintln!(
            "note: records 1–{} were written before checkpoints were signed; only `audit \
             verify` (with the audit key) checks them",
            exported.unsigned_before
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `audit verify --offline FILE --pubkey KEY`: exit 0 if the export is intact, 1 if not.
pub fn verify_offline(file: &Path, key: &Path, out: Output) -> Result<ExitCode, CliError> {
    let key = PublicKey::read(key).map_err(|e| CliError::Usage(e.to_string()))?;
    let reader = std::fs::File::open(file).map_err(|source| CliError::Io {
        what: format!("opening {}", file.display()),
        source,
    })?;
    // A malformed export is one problem said on the verdict's line, as before; broken
    // records are listed under it.
    let (problems, one_line) = match export::verify_offline(std::io::BufReader::new(reader), &key) {
        Ok(v) => {
            if out.json {
                print_json(&json!({
                    "ok": true,
                    "file": file,
                    "first": v.first,
                    "last": v.last,
                    "checkpoints": v.checkpoints,
                    "key_id": v.key,
                    "signed_ms": v.signed_ms,
                }));
            } else {
                anstream::println!(
                    "{}: records {}–{} intact, {} signed checkpoints verified with key {}; the \
                     newest signed at {} ms",
                    paint(GOOD, "ok"),
                    v.first,
                    v.last,
                    v.checkpoints,
                    v.key,
                    v.signed_ms
                );
            }
            return Ok(ExitCode::SUCCESS);
        }
        Err(OfflineError::Failed(problems)) => (problems, false),
        Err(e @ OfflineError::Format { .. }) => (vec![e.to_string()], true),
        Err(OfflineError::Read(source)) => {
            return Err(CliError::Io {
                what: format!("reading {}", file.display()),
                source,
            })
        }
    };
    if out.json {
        print_json(&json!({ "ok": false, "file": file, "problems": problems }));
    } else if one_line {
        anstream::println!(
            "{}: {}: {}",
            paint(BAD, "FAILED"),
            file.display(),
            problems.join("; ")
        );
    } else {
        anstream::println!("{}: {}", paint(BAD, "FAILED"), file.display());
        for p in &problems {
            println!("  {p}");
        }
    }
    Ok(ExitCode::FAILURE)
}
