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

use super::CliError;

/// `audit pubkey`: the public half of the checkpoint signing key, as PEM.
pub fn pubkey(config: &Config) -> Result<ExitCode, CliError> {
    let dir = config.state.keys_dir.as_ref().unwrap_or(&config.state.dir);
    let path = dir.join(files::AUDIT_VERIFY_KEY);
    let key = PublicKey::read(&path).map_err(|e| CliError::Usage(e.to_string()))?;
    print!("{}", key.to_pem());
    eprintln!("key id {}", key.id());
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
pub fn verify_offline(file: &Path, key: &Path) -> Result<ExitCode, CliError> {
    let key = PublicKey::read(key).map_err(|e| CliError::Usage(e.to_string()))?;
    let reader = std::fs::File::open(file).map_err(|source| CliError::Io {
        what: format!("opening {}", file.display()),
        source,
    })?;
    match export::verify_offline(std::io::BufReader::new(reader), &key) {
        Ok(v) => {
            println!(
                "ok: records {}–{} intact, {} signed checkpoints verified with key {}; the \
                 newest signed at {} ms",
                v.first, v.last, v.checkpoints, v.key, v.signed_ms
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(OfflineError::Failed(problems)) => {
            println!("FAILED: {}", file.display());
            for p in problems {
                println!("  {p}");
            }
            Ok(ExitCode::FAILURE)
        }
        Err(e @ OfflineError::Format { .. }) => {
            println!("FAILED: {}: {e}", file.display());
            Ok(ExitCode::FAILURE)
        }
        Err(OfflineError::Read(source)) => Err(CliError::Io {
            what: format!("reading {}", file.display()),
            source,
        }),
    }
}
