//! Signed checkpoints: evidence of the chain that an auditor can check without the audit
//! key.
//!
//! The HMAC chain ([`super::chain`]) proves integrity only to whoever holds the audit key,
//! and that is whoever could also rewrite it. A signed checkpoint is a record of the chain
//! itself (kind `audit`, decision `checkpoint`) carrying an Ed25519 signature, made with a
//! key of its own (`audit-signing.key.pem`), over a keyless SHA-256 digest of every row in
//! a range `(from, to]` — sequence number, links, seal and the record text — and the hashes
//! of the rows at both ends. With the public key alone (`ostiary audit pubkey`) anyone can
//! check an export ([`super::export`]): each row's content is in a signed digest, and no
//! row can be added, removed or changed without breaking one.
//!
//! Ranges follow one another: a checkpoint's range starts where the previous one's ended,
//! so the previous checkpoint record (the row after that end) is covered by the next. The
//! writer makes one at most every `signed_checkpoint_interval` while records come, and at
//! shutdown.

use std::path::Path;

use ring::signature::{Ed25519KeyPair, KeyPair, UnparsedPublicKey, ED25519};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::store::audit::{AuditRow, Tip};

/// The `decision` of a checkpoint record (its `kind` is `audit`).
pub const CHECKPOINT: &str = "checkpoint";

/// What a signature covers first: a domain of its own, and the version of the payload.
const DOMAIN: &str = "ostiary audit checkpoint v1";

/// The DER prefix of an Ed25519 `SubjectPublicKeyInfo` (RFC 8410): the 32 key bytes follow.
const SPKI_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];

/// Why a key could not be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("{path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("the audit signing key is not an Ed25519 PKCS#8 key: {0}")]
    Private(String),
    #[error("{0}: not an Ed25519 public key in PEM (`-----BEGIN PUBLIC KEY-----`, as `ostiary audit pubkey` prints it)")]
    Public(String),
}

/// One signed checkpoint, as its record holds it. Field order is the serialisation order
/// (the chain's seals depend on it): append fields, never reorder.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Checkpoint {
    /// The row before the range (0: the chain's start) and its hash.
    pub from: i64,
    pub from_hash: String,
    /// The range's last row and its hash.
    pub to: i64,
    pub to_hash: String,
    /// SHA-256 (hex) over the rows `(from, to]`, as [`RangeDigest`] computes it.
    pub digest: String,
    /// When it was signed (milliseconds since the epoch).
    pub signed_ms: i64,
    /// The signing key's id ([`key_id`]).
    pub key: String,
    /// Ed25519 over [`Checkpoint::payload`], hex.
    pub signature: String,
}

impl Checkpoint {
    /// The bytes the signature covers: every field but the signature, one per line.
    pub fn payload(&self) -> String {
        format!(
            "{DOMAIN}\nkey {}\nfrom {} {}\nto {} {}\ndigest {}\nsigned_ms {}\n",
            self.key, self.from, self.from_hash, self.to, self.to_hash, self.digest, self.signed_ms
        )
    }

    /// Whether the signature is `key`'s over this checkpoint.
    pub fn verify(&self, key: &PublicKey) -> bool {
        let Ok(signature) = hex::decode(&self.signature) else {
            return false;
        };
        self.key == key.id
            && UnparsedPublicKey::new(&ED25519, &key.raw)
                .verify(self.payload().as_bytes(), &signature)
                .is_ok()
    }
}

/// The short id of a public key: the first 16 hex digits of SHA-256 over its 32 bytes.
pub fn key_id(raw: &[u8]) -> String {
    hex::encode(Sha256::digest(raw))[..16].to_owned()
}

/// The private half: signs checkpoints. `Debug` names the key id only.
pub struct Signer {
    pair: Ed25519KeyPair,
    id: String,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer").field("key", &self.id).finish()
    }
}

impl Signer {
    /// From the PKCS#8 PEM the state directory keeps.
    pub fn from_pem(pem: &str) -> Result<Self, KeyError> {
        let pair = rcgen::KeyPair::from_pem(pem).map_err(|e| KeyError::Private(e.to_string()))?;
        if !pair.is_compatible(&rcgen::PKCS_ED25519) {
            return Err(KeyError::Private("it is not an Ed25519 key".into()));
        }
        let pair = Ed25519KeyPair::from_pkcs8_maybe_unchecked(&pair.serialize_der())
            .map_err(|e| KeyError::Private(e.to_string()))?;
        let id = key_id(pair.public_key().as_ref());
        Ok(Self { pair, id })
    }

    /// The key id checkpoints name.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The public half.
    pub fn public(&self) -> PublicKey {
        let raw: [u8; 32] = self
            .pair
            .public_key()
            .as_ref()
            .try_into()
            .expect("an Ed25519 public key is 32 bytes");
        PublicKey {
            raw,
            id: self.id.clone(),
        }
    }

    /// Sign the range `digest` covers.
    pub fn sign(&self, digest: &RangeDigest, signed_ms: i64) -> Checkpoint {
        let mut checkpoint = Checkpoint {
            from: digest.from.seq,
            from_hash: digest.from.hash.clone(),
            to: digest.upto.seq,
            to_hash: digest.upto.hash.clone(),
            digest: digest.hex(),
            signed_ms,
            key: self.id.clone(),
            signature: String::new(),
        };
        checkpoint.signature = hex::encode(self.pair.sign(checkpoint.payload().as_bytes()));
        checkpoint
    }
}

/// The public half: what an auditor is given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicKey {
    raw: [u8; 32],
    id: String,
}

impl PublicKey {
    /// From `-----BEGIN PUBLIC KEY-----` PEM (an Ed25519 `SubjectPublicKeyInfo`).
    pub fn from_pem(pem: &str) -> Result<Self, KeyError> {
        use base64::Engine as _;
        let bad = || KeyError::Public("the key".into());
        let body: String = pem
            .trim()
            .strip_prefix("-----BEGIN PUBLIC KEY-----")
            .and_then(|rest| rest.trim_end().strip_suffix("-----END PUBLIC KEY-----"))
            .ok_or_else(bad)?
            .split_whitespace()
            .collect();
        let der = base64::engine::general_purpose::STANDARD
            .decode(body)
            .map_err(|_| bad())?;
        let raw: [u8; 32] = der
            .strip_prefix(&SPKI_PREFIX[..])
            .and_then(|key| key.try_into().ok())
            .ok_or_else(bad)?;
        Ok(Self {
            id: key_id(&raw),
            raw,
        })
    }

    /// Read a PEM file.
    pub fn read(path: &Path) -> Result<Self, KeyError> {
        let text = std::fs::read_to_string(path).map_err(|source| KeyError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_pem(&text).map_err(|_| KeyError::Public(path.display().to_string()))
    }

    /// As PEM.
    pub fn to_pem(&self) -> String {
        use base64::Engine as _;
        let mut der = SPKI_PREFIX.to_vec();
        der.extend_from_slice(&self.raw);
        let b64 = base64::engine::general_purpose::STANDARD.encode(der);
        format!("-----BEGIN PUBLIC KEY-----\n{b64}\n-----END PUBLIC KEY-----\n")
    }

    /// The key id checkpoints name.
    pub fn id(&self) -> &str {
        &self.id
    }
}

/// The keyless digest of a range of rows `(from, upto]`, fed in order.
#[derive(Debug, Clone)]
pub struct RangeDigest {
    hasher: Sha256,
    /// The row before the range.
    pub from: Tip,
    /// The last row fed (`from` while none was).
    pub upto: Tip,
}

impl RangeDigest {
    /// An empty range after `from`.
    pub fn after(from: Tip) -> Self {
        Self {
            hasher: Sha256::new(),
            upto: from.clone(),
            from,
        }
    }

    /// Take in the next row; `false` (and nothing taken) when it does not follow the last one
    /// (another writer's rows came between).
    pub fn feed(&mut self, row: &AuditRow) -> bool {
        if row.seq != self.upto.seq + 1 || row.prev != self.upto.hash {
            return false;
        }
        // Each field on a line of its own, the record length-prefixed: no two different
        // rows hash alike, whatever their texts hold.
        // Fed piece by piece (every row of the trail passes here, on the writer's thread):
        // the same bytes as one formatted line, without a string made for each row.
        let mut seq = itoa::Buffer::new();
        let mut len = itoa::Buffer::new();
        for piece in [
            seq.format(row.seq).as_bytes(),
            b"\n",
            row.prev.as_bytes(),
            b"\n",
            row.hash.as_bytes(),
            b"\n",
            len.format(row.record.len()).as_bytes(),
            b"\n",
            row.record.as_bytes(),
            b"\n",
        ] {
            self.hasher.update(piece);
        }
        self.upto.seq = row.seq;
        self.upto.hash.clone_from(&row.hash);
        true
    }

    /// How many rows were taken in.
    pub fn len(&self) -> i64 {
        self.upto.seq - self.from.seq
    }

    /// Whether no row was.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The digest so far, hex.
    pub fn hex(&self) -> String {
        hex::encode(self.hasher.clone().finalize())
    }
}

/// The checkpoint a record's JSON text carries, if it is a checkpoint record.
pub fn checkpoint_of(record_json: &str) -> Option<Checkpoint> {
    #[derive(Deserialize)]
    struct Shape {
        kind: String,
        decision: String,
        checkpoint: Option<Checkpoint>,
    }
    let shape: Shape = serde_json::from_str(record_json).ok()?;
    (shape.kind == "audit" && shape.decision == CHECKPOINT)
        .then_some(shape.checkpoint)
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn signer() -> Signer {
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        Signer::from_pem(&pair.serialize_pem()).unwrap()
    }

    fn row(seq: i64, prev: &str, record: &str) -> AuditRow {
        AuditRow {
            seq,
            ts_ms: 0,
            session: None,
            decision: "allow".into(),
            record: record.into(),
            prev: prev.into(),
            hash: format!("{seq:064x}"),
        }
    }

    #[test]
    fn a_checkpoint_verifies_with_its_key_only_and_not_once_changed() {
        let signer = signer();
        let mut digest = RangeDigest::after(Tip::genesis());
        assert!(digest.feed(&row(1, crate::store::audit::GENESIS, "{}")));
        assert!(digest.feed(&row(2, &format!("{:064x}", 1), "{\"a\":1}")));
        let checkpoint = signer.sign(&digest, 42);
        assert_eq!((checkpoint.from, checkpoint.to), (0, 2));
        let public = PublicKey::from_pem(&signer.public().to_pem()).unwrap();
        assert_eq!(public, signer.public());
        assert!(checkpoint.verify(&public));
        assert!(!checkpoint.verify(&self::tests::signer().public()));
        let changed = [
            Checkpoint {
                to: 3,
                ..checkpoint.clone()
            },
            Checkpoint {
                digest: "00".repeat(32),
                ..checkpoint.clone()
            },
            Checkpoint {
                signed_ms: 43,
                ..checkpoint.clone()
            },
            Checkpoint {
                signature: "zz".into(),
                ..checkpoint.clone()
            },
        ];
        for c in changed {
            assert!(!c.verify(&public), "{c:?}");
        }
    }

    #[test]
    fn a_digest_is_of_each_rows_lines_as_checkpoints_already_signed_were() {
        // The bytes a signed checkpoint covers: trails written before stay verifiable.
        let rows = [
            row(1, crate::store::audit::GENESIS, "{}"),
            row(2, &format!("{:064x}", 1), "{\"a\":\"é\\n\"}"),
            row(3, &format!("{:064x}", 2), &"x".repeat(10_000)),
        ];
        let mut digest = RangeDigest::after(Tip::genesis());
        let mut expected = Sha256::new();
        for r in &rows {
            assert!(digest.feed(r));
            expected.update(
                format!("{}\n{}\n{}\n{}\n", r.seq, r.prev, r.hash, r.record.len()).as_bytes(),
            );
            expected.update(r.record.as_bytes());
            expected.update(b"\n");
        }
        assert_eq!(digest.hex(), hex::encode(expected.finalize()));
        assert_eq!((digest.upto.seq, &digest.upto.hash), (3, &rows[2].hash));
    }

    #[test]
    fn a_digest_takes_rows_in_order_only_and_covers_every_byte() {
        let mut a = RangeDigest::after(Tip::genesis());
        assert!(
            !a.feed(&row(2, crate::store::audit::GENESIS, "{}")),
            "a gap"
        );
        assert!(!a.feed(&row(1, "other", "{}")), "a broken link");
        assert!(a.is_empty());
        assert!(a.feed(&row(1, crate::store::audit::GENESIS, "{\"x\":1}")));
        let mut b = RangeDigest::after(Tip::genesis());
        assert!(b.feed(&row(1, crate::store::audit::GENESIS, "{\"x\":2}")));
        assert_ne!(a.hex(), b.hex());
    }

    #[test]
    fn bad_keys_are_refused_with_a_reason() {
        assert!(PublicKey::from_pem("not pem").is_err());
        // An RSA-sized body, or a P-256 key: not Ed25519.
        let p256 = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        assert!(PublicKey::from_pem(&p256.public_key_pem()).is_err());
        let err = Signer::from_pem(&p256.serialize_pem()).unwrap_err();
        assert!(err.to_string().contains("Ed25519"), "{err}");
        let ed = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        let from_rcgen = PublicKey::from_pem(&ed.public_key_pem()).unwrap();
        let signer = Signer::from_pem(&ed.serialize_pem()).unwrap();
        assert_eq!(from_rcgen, signer.public());
        assert_eq!(
            format!("{signer:?}"),
            format!("Signer {{ key: {:?} }}", signer.id())
        );
    }

    #[test]
    fn only_checkpoint_records_carry_a_checkpoint() {
        let c = Checkpoint::default();
        let json = serde_json::json!({"kind": "audit", "decision": "checkpoint", "checkpoint": c});
        assert_eq!(checkpoint_of(&json.to_string()), Some(c.clone()));
        let json = serde_json::json!({"kind": "http", "decision": "checkpoint", "checkpoint": c});
        assert_eq!(checkpoint_of(&json.to_string()), None);
        assert_eq!(checkpoint_of("not json"), None);
    }
}
