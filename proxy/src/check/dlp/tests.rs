//! The detectors one by one (found, and the near misses that must not be), and the
//! streaming property: for any chunking, nothing of a finding is released before it, and
//! the finding is the whole-buffer scan's.
//!
//! Sample secrets are assembled at run time, so the source holds no token a secret scanner
//! of the repository would (rightly) complain about.

use std::sync::Arc;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use bytes::Bytes;
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use rand::{Rng, SeedableRng};

use super::*;
use crate::body::{self, BoxError};

fn set() -> Detectors {
    Detectors::default_set()
}

fn kind(text: impl AsRef<[u8]>) -> Option<String> {
    set().scan(text.as_ref()).map(|f| f.kind)
}

fn rep(s: &str, n: usize) -> String {
    s.repeat(n)
}

fn jwt_with(header: &str) -> String {
    format!(
        "{}.{}.{}",
        URL_SAFE_NO_PAD.encode(header),
        URL_SAFE_NO_PAD.encode(r#"{"sub":"1234567890","name":"A","iat":1516239022}"#),
        "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
    )
}

fn pem(label: &str) -> String {
    format!(
        "-----BEGIN {label}-----\nMIIEowIBAAKCAQEA{}\n-----END {label}-----\n",
        rep("q7Zx", 20)
    )
}

/// One sample of each kind, as it would appear in a body.
fn samples() -> Vec<(&'static str, String)> {
    vec![
        ("private_key", pem("RSA PRIVATE KEY")),
        ("private_key", pem("PRIVATE KEY")),
        ("private_key", pem("EC PRIVATE KEY")),
        ("private_key", pem("OPENSSH PRIVATE KEY")),
        ("private_key", pem("ENCRYPTED PRIVATE KEY")),
        (
            "private_key",
            // As JSON: escaped newlines.
            pem("PRIVATE KEY").replace('\n', "\\n"),
        ),
        ("aws_access_key", format!("AKIA{}", rep("Q7ZX", 4))),
        ("aws_access_key", format!("id=ASIA{} ", rep("3KD9", 4))),
        (
            "aws_secret_key",
            format!("aws_secret_access_key = {}", rep("wJalrXUtnF/K7MDENG+b", 2)),
        ),
        (
            "aws_secret_key",
            format!(
                "{{\"SecretAccessKey\": \"{}\"}}",
                rep("wJalrXUtnF/K7MDENG+b", 2)
            ),
        ),
        (
            "aws_secret_key",
            format!("AWS_SECRET_ACCESS_KEY={}\n", rep("wJalrXUtnF/K7MDENG+b", 2)),
        ),
        (
            "gcp_service_account",
            format!(
                "{{\"type\": \"service_account\", \"project_id\": \"p\", \"private_key_id\": \"{}\", \"private_key\": \"{}\"}}",
                rep("ab12", 10),
                pem("PRIVATE KEY").replace('\n', "\\n")
            ),
        ),
        ("gcp_api_key", format!("key=AIza{}&q=1", rep("Sy-9_bQ", 5))),
        ("github_token", format!("token ghp_{}", rep("R2d2C3po", 4) + "Bb8L")),
        ("github_token", format!("\"gho_{}\"", rep("a1B2", 9))),
        ("github_token", format!("ghs_{}", rep("a1B2", 9))),
        ("github_token", format!("github_pat_{}", rep("11ABCDE_x", 9) + "z")),
        (
            "slack_token",
            format!("xoxb-1234567890-1234567890123-{}", rep("aB3d", 6)),
        ),
        ("slack_token", format!("xoxp-1234-5678-9012-{}", rep("ab12", 8))),
        (
            "slack_webhook",
            format!(
                "https://hooks.slack.com/services/T0123ABCD/B0456EFGH/{}",
                rep("xY9z", 6)
            ),
        ),
        ("stripe_key", format!("Bearer sk_live_{}", rep("4eC39HqL", 3))),
        ("stripe_key", format!("rk_live_{}", rep("51Hx", 7))),
        (
            "jwt",
            format!(
                "Authorization: Bearer {}",
                jwt_with(r#"{"alg":"HS256","typ":"JWT"}"#)
            ),
        ),
        ("card_number", "{\"pan\": \"4111 1111 1111 1111\"}".to_owned()),
        ("card_number", "cc=5555555555554444&exp=1227".to_owned()),
    ]
}

#[test]
fn every_sample_is_found_with_its_kind() {
    for (k, text) in samples() {
        assert_eq!(kind(&text).as_deref(), Some(k), "{text}");
    }
}

#[test]
fn near_misses_are_not_findings() {
    let misses = [
        // AWS ids one short, or inside a longer word.
        format!("AKIA{}", rep("Q7ZX", 4)[..15].to_owned()),
        format!("AKIA{}X", rep("Q7ZX", 4)),
        format!("xAKIA{}", rep("Q7ZX", 4)),
        format!("AKIA{}", rep("q7zx", 4)),
        // A 40-character base64 run with no label.
        format!("data: {}", rep("wJalrXUtnF/K7MDENG+b", 2)),
        format!("aws_secret_access_key = {}", rep("wJalrXUtnF/K7MDENG+b", 3)),
        // PEM headers without a key, and public material.
        "if line == \"-----BEGIN RSA PRIVATE KEY-----\": return".to_owned(),
        pem("PUBLIC KEY"),
        pem("CERTIFICATE"),
        // A service account without a key.
        "{\"type\": \"service_account\", \"client_email\": \"x@y\"}".to_owned(),
        "AIzaShort".to_owned(),
        format!("ghp_{}", rep("a1B2", 8)),
        format!("ghp_{}x", rep("a1B2", 9)),
        "xoxb-your-token-here-for-the-bot".to_owned(),
        "sk_test_4eC39HqLyjWDarjtT1zdp7dc".to_owned(),
        "sk_live_short".to_owned(),
        // Base64 JSON that is not a JWT, and a JWT-shaped string whose header has no alg.
        format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(r#"{"alg":"HS256"}"#),
            "eyJzdWIiOiIxIn0"
        ),
        URL_SAFE_NO_PAD.encode(r#"{"hello":"world","n":1234567890}"#),
        jwt_with(r#"{"typ":"JWT"}"#),
        // Numbers that are not cards.
        "4111111111111112".to_owned(),
        "123456789012345".to_owned(),
        "{\"ts\": 1732950000000, \"us\": 1732950000000000}".to_owned(),
        "550e8400-e29b-41d4-a716-446655440000".to_owned(),
        "commit da39a3ee5e6b4b0d3255bfef95601890afd80709".to_owned(),
        "\"id\": 41111111111111111111".to_owned(),
        "pi = 3.4111111111111111".to_owned(),
        "hooks.slack.com/services/ is where webhooks live".to_owned(),
    ];
    for text in misses {
        assert_eq!(kind(&text), None, "{text}");
    }
    // Random base64 and random digits, a megabyte of each.
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let blob: Vec<u8> = (0..1 << 20)
        .map(|_| alphabet[rng.random_range(0..64)])
        .collect();
    assert_eq!(set().scan(&blob), None);
}

#[test]
fn findings_name_the_kind_and_offset_not_the_secret() {
    let token = format!("ghp_{}", rep("a1B2", 9));
    let text = format!("{{\"x\": \"{token}\"}}");
    let f = set().scan(text.as_bytes()).unwrap();
    assert_eq!(f.kind, "github_token");
    assert_eq!(f.offset, 7);
    assert!(!format!("{f:?}").contains(&token));
    let blocked = Blocked(f);
    assert!(!blocked.to_string().contains(&token));
}

#[test]
fn the_leftmost_finding_wins() {
    let text = format!(
        "card 4111111111111111 then AKIA{} then {}",
        rep("Q7ZX", 4),
        pem("PRIVATE KEY")
    );
    assert_eq!(
        set().scan(text.as_bytes()),
        Some(Finding {
            kind: "card_number".into(),
            offset: 5
        })
    );
}

#[test]
fn literal_values_are_matched_exactly_and_never_printed() {
    let secret = b"s3cr3t-broker-v4lue".to_vec();
    let d = Detectors::with_literals(
        &set(),
        vec![
            ("billing".into(), secret.clone()),
            ("tiny".into(), b"abc".to_vec()),
        ],
    );
    let f = d.scan(b"x=s3cr3t-broker-v4lue&y=1").unwrap();
    assert_eq!(f.kind, "credential:billing");
    assert_eq!(f.offset, 2);
    assert_eq!(d.scan(b"x=s3cr3t-broker-v4lu&y=1"), None);
    assert_eq!(d.scan(b"S3CR3T-BROKER-V4LUE"), None);
    assert_eq!(d.skipped_literals(), ["tiny".to_owned()]);
    let shown = format!("{d:?}");
    assert!(shown.contains("billing"));
    assert!(!shown.contains("s3cr3t"));
    // A literal that is also a default token is reported as the credential.
    let token = format!("ghp_{}", rep("a1B2", 9));
    let d = Detectors::with_literals(&set(), vec![("gh".into(), token.clone().into_bytes())]);
    assert_eq!(d.scan(token.as_bytes()).unwrap().kind, "credential:gh");
}

/// Stream `input` cut at `cuts` through a scanner: what was released, and the result.
fn stream(d: &Arc<Detectors>, input: &[u8], cuts: &[usize]) -> (Vec<u8>, Option<Finding>) {
    let mut s = StreamScanner::new(d.clone());
    let mut released = Vec::new();
    let mut at = 0;
    for &cut in cuts.iter().chain(std::iter::once(&input.len())) {
        let chunk = Bytes::copy_from_slice(&input[at..cut]);
        at = cut;
        match s.push(chunk) {
            Ok(out) => released.extend_from_slice(&out),
            Err(f) => return (released, Some(f)),
        }
        assert!(s.held() <= MAX_HELD, "held {}", s.held());
    }
    match s.finish() {
        Ok(out) => {
            released.extend_from_slice(&out);
            (released, None)
        }
        Err(f) => (released, Some(f)),
    }
}

fn assert_stream_matches(d: &Arc<Detectors>, input: &[u8], cuts: &[usize]) {
    let whole = d.scan(input);
    let (released, found) = stream(d, input, cuts);
    assert_eq!(found, whole, "cuts {cuts:?}");
    match found {
        Some(f) => assert!(
            (released.len() as u64) <= f.offset,
            "released {} bytes past the finding at {}",
            released.len(),
            f.offset
        ),
        None => assert_eq!(released, input),
    }
    assert_eq!(&input[..released.len()], &released[..]);
}

#[test]
fn a_secret_split_at_every_position_is_found_before_any_of_it_goes() {
    let d = Arc::new(set());
    for (_, sample) in samples() {
        let text = format!("{{\"note\": \"hello\", \"v\": \"{sample}\", \"n\": 12}}");
        let input = text.as_bytes();
        for cut in 0..=input.len() {
            assert_stream_matches(&d, input, &[cut]);
        }
        for (a, b) in [(1, 2), (3, 17), (10, 11)] {
            for start in 0..input.len().saturating_sub(b) {
                assert_stream_matches(&d, input, &[start + a, start + b]);
            }
        }
    }
}

#[test]
fn random_chunkings_agree_with_the_whole_scan() {
    let d = Arc::new(Detectors::with_literals(
        &set(),
        vec![("lit".into(), b"literal-secret-value".to_vec())],
    ));
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let mut pool: Vec<String> = samples().into_iter().map(|(_, s)| s).collect();
    pool.push("literal-secret-value".into());
    let fillers = [
        "{\"id\": 17, \"name\": \"item\", \"ts\": 1732950000000}\n",
        "eyJ not a jwt eyJhbGciOi ",
        "AKIA ghp_ xoxb- sk_live_ -----BEGIN ",
        "4111 1111 ",
        "lorem ipsum dolor sit amet ",
        "literal-secret-valu",
    ];
    for round in 0..400 {
        let mut text = String::new();
        for _ in 0..rng.random_range(1..12) {
            text.push_str(fillers[rng.random_range(0..fillers.len())]);
        }
        if round % 4 != 0 {
            text.push_str(&pool[rng.random_range(0..pool.len())]);
            text.push_str(fillers[rng.random_range(0..fillers.len())]);
        }
        let input = text.as_bytes();
        // 1-byte chunks, then random ones.
        let ones: Vec<usize> = (1..input.len()).collect();
        assert_stream_matches(&d, input, &ones);
        for _ in 0..8 {
            let mut cuts: Vec<usize> = (0..rng.random_range(0..8))
                .map(|_| rng.random_range(0..=input.len()))
                .collect();
            cuts.sort();
            assert_stream_matches(&d, input, &cuts);
        }
    }
}

#[test]
fn a_long_jwt_candidate_is_held_at_most_the_cap() {
    let d = Arc::new(set());
    // A header, a dot, and a payload that never ends: held until the cap, then released.
    let mut input = URL_SAFE_NO_PAD.encode(r#"{"alg":"HS256"}"#).into_bytes();
    input.push(b'.');
    input.extend(std::iter::repeat_n(b'A', 64 * 1024));
    let cuts: Vec<usize> = (1..input.len()).step_by(100).collect();
    assert_stream_matches(&d, &input, &cuts);
    let ones: Vec<usize> = (1..input.len()).collect();
    assert_stream_matches(&d, &input, &ones);
}

fn big_body(len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 64);
    let mut i = 0u64;
    while out.len() < len {
        out.extend_from_slice(
            format!(
                "{{\"id\":{i},\"name\":\"item-{i}\",\"state\":\"open\",\"n\":{}}}\n",
                i * 7919
            )
            .as_bytes(),
        );
        i += 1;
    }
    out.truncate(len);
    out
}

#[test]
fn a_multi_megabyte_body_with_a_key_at_3_mib_and_at_the_end() {
    let d = Arc::new(set());
    let key = format!("AKIA{}", rep("Q7ZX", 4));
    let clean = big_body(5 << 20);
    assert_eq!(d.scan(&clean), None);
    let cuts: Vec<usize> = (16 * 1024..clean.len()).step_by(16 * 1024).collect();
    assert_stream_matches(&d, &clean, &cuts);

    let mut at3 = clean.clone();
    let pos = 3 << 20;
    at3.splice(pos..pos, format!(" {key} ").into_bytes());
    let (released, found) = stream(&d, &at3, &cuts);
    let found = found.unwrap();
    assert_eq!(found.offset, pos as u64 + 1);
    assert!(released.len() <= pos + 1);

    let mut end = clean.clone();
    end.extend_from_slice(format!(" {key}").as_bytes());
    let (released, found) = stream(&d, &end, &cuts);
    assert_eq!(found.unwrap().kind, "aws_access_key");
    assert!(released.len() <= clean.len() + 1);
}

fn chunked(parts: Vec<Vec<u8>>, trailers: Option<http::HeaderMap>) -> crate::body::ProxyBody {
    let mut frames: Vec<Result<Frame<Bytes>, BoxError>> = parts
        .into_iter()
        .map(|p| Ok(Frame::data(Bytes::from(p))))
        .collect();
    if let Some(t) = trailers {
        frames.push(Ok(Frame::trailers(t)));
    }
    body::stream(StreamBody::new(futures_util::stream::iter(frames)))
}

#[tokio::test]
async fn dlp_body_stops_at_the_finding_and_fills_the_slot() {
    let key = format!("ghp_{}", rep("a1B2", 9));
    let text = format!(
        "{{\"a\": \"{}\", \"token\": \"{key}\", \"z\": 1}}",
        rep("x", 100)
    );
    let cut = text.find("ghp_").unwrap() + 10;
    let parts = vec![
        text.as_bytes()[..cut].to_vec(),
        text.as_bytes()[cut..].to_vec(),
    ];
    let (mut body, slot) = DlpBody::new(chunked(parts, None), Arc::new(set()));
    let mut passed = Vec::new();
    let mut error = None;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(f) => passed.extend_from_slice(f.data_ref().unwrap()),
            Err(e) => {
                error = Some(e);
                break;
            }
        }
    }
    let error = error.expect("the body ends with an error");
    let blocked = error.downcast_ref::<Blocked>().expect("a Blocked error");
    assert_eq!(blocked.0.kind, "github_token");
    assert!(!error.to_string().contains(&key));
    let finding = slot.get().expect("the slot is set");
    assert_eq!(finding.offset as usize, text.find("ghp_").unwrap());
    assert!(!String::from_utf8_lossy(&passed).contains("ghp_"));
    assert!(body.frame().await.is_none());
}

#[tokio::test]
async fn dlp_body_passes_a_clean_body_and_its_trailers() {
    let text = big_body(200_000);
    let parts: Vec<Vec<u8>> = text.chunks(7001).map(<[u8]>::to_vec).collect();
    let mut trailers = http::HeaderMap::new();
    trailers.insert("x-checksum", "abc".parse().unwrap());
    let source = chunked(parts, Some(trailers.clone()));
    let (body, slot) = DlpBody::new(source, Arc::new(set()));
    let collected = body.collect().await.unwrap();
    assert_eq!(collected.trailers(), Some(&trailers));
    assert_eq!(collected.to_bytes(), text);
    assert!(slot.get().is_none());
}

#[tokio::test]
async fn dlp_body_forwards_an_upstream_error_without_the_held_tail() {
    let text = format!("{} AKIA", rep("hello ", 10));
    let frames: Vec<Result<Frame<Bytes>, BoxError>> = vec![
        Ok(Frame::data(Bytes::from(text.clone()))),
        Err("agent hung up".into()),
    ];
    let source = body::stream(StreamBody::new(futures_util::stream::iter(frames)));
    let (mut body, slot) = DlpBody::new(source, Arc::new(set()));
    let first = body.frame().await.unwrap().unwrap();
    let first = first.data_ref().unwrap();
    // What went is a prefix short of the held tail (and of the pending anchor).
    assert!(!first.is_empty() && first.len() < text.find("AKIA").unwrap());
    assert!(text.as_bytes().starts_with(first));
    assert!(body.frame().await.unwrap().is_err());
    assert!(body.frame().await.is_none());
    assert!(slot.get().is_none());
}

/// Item 6 of issue 13: how much of a chunk is held back must not tell an upstream whether
/// the chunk began one of the session's credentials (it would learn it byte by byte).
#[test]
fn the_hold_back_does_not_depend_on_whether_a_chunk_begins_a_credential() {
    let secret = b"session-credential-0f3a9c7e";
    let d = Arc::new(Detectors::with_literals(
        &set(),
        vec![("cred".into(), secret.to_vec())],
    ));
    let released = |chunks: &[&[u8]]| -> Vec<usize> {
        let mut s = StreamScanner::new(d.clone());
        let mut out: Vec<usize> = chunks
            .iter()
            .map(|c| s.push(Bytes::copy_from_slice(c)).unwrap().len())
            .collect();
        out.push(s.finish().unwrap().len());
        out
    };
    let head = rep("{\"note\":\"some words before the probe\",\"v\":\"", 3);
    for k in 1..secret.len() {
        let matching = &secret[..k];
        let other = vec![b'q'; k];
        for tail in [
            &b""[..],
            b"\"}\n",
            b"\", \"more\": \"text after the probe\"}",
        ] {
            let a = released(&[head.as_bytes(), matching, tail]);
            let b = released(&[head.as_bytes(), &other, tail]);
            assert_eq!(a, b, "probe of {k} bytes, tail {tail:?}");
        }
    }
    // A fixed window: a long line keeps exactly its last bytes back, a newline none.
    let line = vec![b'x'; 4096];
    let kept = released(&[&line]);
    assert!(kept[0] < line.len() && kept[0] + kept[1] == line.len());
    let with_newline = [&line[..], b"\n"].concat();
    assert_eq!(released(&[&with_newline]), vec![with_newline.len(), 0]);
}
