//! Tests of the webhook signature schemes: the published examples, round trips of every
//! scheme, and each way a delivery is refused.
use super::*;

const NOW: i64 = 1_700_000_000;
const SECRET: &[u8] = b"whsec-test-secret-Zq81";
const BODY: &[u8] = b"{\"action\":\"opened\",\"number\":7}\n";
const FIVE_MIN: Duration = Duration::from_secs(300);

// GitHub's "Validating webhook deliveries", testing the implementation.
const GITHUB_SECRET: &[u8] = b"It's a Secret to Everybody";
const GITHUB_BODY: &[u8] = b"Hello, World!";
const GITHUB_SIG: &str = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";

// Slack's "Verifying requests from Slack", the worked example.
const SLACK_SECRET: &[u8] = b"8f742231b10e8888abcd99yyyzzz85a5";
const SLACK_TS: i64 = 1_531_420_618;
const SLACK_BODY: &[u8] = b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";
const SLACK_SIG: &str = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503";

// RFC 4231 §4.3, test case 2.
const RFC4231_KEY: &[u8] = b"Jefe";
const RFC4231_DATA: &[u8] = b"what do ya want for nothing?";
const RFC4231_SHA256: &str = "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843";
const RFC4231_SHA512: &str = "164b7a7bfcf819e2e395fbe73b56e0a387bd64222e831fd610270cd7ea2505549758bf75c05a994a6d034f65f8f0e6fdcaeab1a34d4a6b4b636e070a38bce737";

fn name(text: &'static str) -> HeaderName {
    HeaderName::from_static(text)
}

fn stripe() -> Scheme {
    Scheme::Stripe {
        tolerance: FIVE_MIN,
    }
}

fn slack() -> Scheme {
    Scheme::Slack {
        tolerance: FIVE_MIN,
    }
}

fn hmac(algorithm: Algorithm, encoding: Encoding, prefix: &str, with_ts: bool) -> Scheme {
    Scheme::Hmac(HmacSpec {
        header: name("x-signature"),
        algorithm,
        encoding,
        prefix: prefix.to_owned(),
        timestamp_header: with_ts.then(|| name("x-timestamp")),
        tolerance: FIVE_MIN,
    })
}

fn hmac_ts() -> Scheme {
    hmac(Algorithm::Sha256, Encoding::Hex, "sha256=", true)
}

/// Every scheme, and the generic one in each of its shapes.
fn all_schemes() -> Vec<Scheme> {
    let mut schemes = vec![Scheme::Github, stripe(), slack()];
    for algorithm in [Algorithm::Sha256, Algorithm::Sha512] {
        for encoding in [Encoding::Hex, Encoding::Base64] {
            for prefix in ["", "sha256="] {
                for with_ts in [false, true] {
                    schemes.push(hmac(algorithm, encoding, prefix, with_ts));
                }
            }
        }
    }
    schemes
}

/// Schemes that sign a timestamp.
fn timed_schemes() -> Vec<Scheme> {
    vec![stripe(), slack(), hmac_ts()]
}

fn map(pairs: Vec<(HeaderName, HeaderValue)>) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, value) in pairs {
        headers.append(name, value);
    }
    headers
}

fn signed(scheme: &Scheme, secret: &[u8], body: &[u8], at: i64) -> HeaderMap {
    map(scheme.sign(secret, body, at))
}

/// The header that carries the signature.
fn signature_header(scheme: &Scheme) -> HeaderName {
    match scheme {
        Scheme::Github => github_header(),
        Scheme::Stripe { .. } => stripe_header(),
        Scheme::Slack { .. } => slack_signature_header(),
        Scheme::Hmac(spec) => spec.header.clone(),
    }
}

/// The header whose timestamp `Stale` names.
fn timestamp_header(scheme: &Scheme) -> HeaderName {
    match scheme {
        Scheme::Slack { .. } => slack_timestamp_header(),
        Scheme::Hmac(HmacSpec {
            timestamp_header: Some(header),
            ..
        }) => header.clone(),
        _ => signature_header(scheme),
    }
}

/// `headers` with `header`'s value replaced.
fn with(mut headers: HeaderMap, header: &HeaderName, value: &str) -> HeaderMap {
    headers.insert(header.clone(), HeaderValue::from_str(value).unwrap());
    headers
}

fn why(result: Result<(), SignatureError>) -> &'static str {
    match result {
        Err(SignatureError::Malformed { why, .. }) => why,
        other => panic!("expected Malformed, got {other:?}"),
    }
}

#[test]
fn github_published_example_reproduces() {
    let headers = map(vec![(
        github_header(),
        HeaderValue::from_static(GITHUB_SIG),
    )]);
    assert_eq!(
        Scheme::Github.verify(GITHUB_SECRET, &headers, GITHUB_BODY, NOW),
        Ok(())
    );
    assert_eq!(
        Scheme::Github.sign(GITHUB_SECRET, GITHUB_BODY, NOW),
        vec![(github_header(), HeaderValue::from_static(GITHUB_SIG))]
    );
}

#[test]
fn slack_published_example_reproduces() {
    let headers = map(vec![
        (slack_timestamp_header(), HeaderValue::from(SLACK_TS)),
        (
            slack_signature_header(),
            HeaderValue::from_static(SLACK_SIG),
        ),
    ]);
    assert_eq!(
        slack().verify(SLACK_SECRET, &headers, SLACK_BODY, SLACK_TS),
        Ok(())
    );
    assert_eq!(
        slack().sign(SLACK_SECRET, SLACK_BODY, SLACK_TS),
        vec![
            (slack_timestamp_header(), HeaderValue::from(SLACK_TS)),
            (
                slack_signature_header(),
                HeaderValue::from_static(SLACK_SIG)
            ),
        ]
    );
}

#[test]
fn rfc4231_vectors_reproduce_in_hex_and_base64() {
    for (algorithm, hex_mac) in [
        (Algorithm::Sha256, RFC4231_SHA256),
        (Algorithm::Sha512, RFC4231_SHA512),
    ] {
        let b64_mac = BASE64.encode(hex::decode(hex_mac).unwrap());
        for (encoding, text) in [(Encoding::Hex, hex_mac), (Encoding::Base64, &*b64_mac)] {
            let scheme = hmac(algorithm, encoding, "", false);
            let headers = map(vec![(
                name("x-signature"),
                HeaderValue::from_str(text).unwrap(),
            )]);
            assert_eq!(
                scheme.verify(RFC4231_KEY, &headers, RFC4231_DATA, NOW),
                Ok(()),
                "{algorithm:?} {encoding:?}"
            );
            assert_eq!(map(scheme.sign(RFC4231_KEY, RFC4231_DATA, NOW)), headers);
        }
    }
}

#[test]
fn every_scheme_verifies_what_it_signs() {
    for scheme in all_schemes() {
        let headers = signed(&scheme, SECRET, BODY, NOW);
        assert_eq!(
            scheme.verify(SECRET, &headers, BODY, NOW),
            Ok(()),
            "{scheme:?}"
        );
        // An empty body is still a body, and still signed.
        let headers = signed(&scheme, SECRET, b"", NOW);
        assert_eq!(
            scheme.verify(SECRET, &headers, b"", NOW),
            Ok(()),
            "{scheme:?}"
        );
    }
}

#[test]
fn missing_signature_header_is_missing() {
    for scheme in all_schemes() {
        let mut headers = signed(&scheme, SECRET, BODY, NOW);
        let header = signature_header(&scheme);
        headers.remove(&header);
        assert_eq!(
            scheme.verify(SECRET, &headers, BODY, NOW),
            Err(SignatureError::Missing(header)),
            "{scheme:?}"
        );
    }
}

#[test]
fn missing_timestamp_header_is_missing() {
    for scheme in [slack(), hmac_ts()] {
        let mut headers = signed(&scheme, SECRET, BODY, NOW);
        let header = timestamp_header(&scheme);
        headers.remove(&header);
        assert_eq!(
            scheme.verify(SECRET, &headers, BODY, NOW),
            Err(SignatureError::Missing(header)),
            "{scheme:?}"
        );
    }
}

#[test]
fn wrong_secret_is_mismatch() {
    for scheme in all_schemes() {
        let headers = signed(&scheme, b"some other secret", BODY, NOW);
        assert_eq!(
            scheme.verify(SECRET, &headers, BODY, NOW),
            Err(SignatureError::Mismatch {
                header: signature_header(&scheme)
            }),
            "{scheme:?}"
        );
    }
}

#[test]
fn body_changed_by_one_byte_is_mismatch() {
    let mut flipped = BODY.to_vec();
    flipped[10] ^= 0x01;
    let trimmed = &BODY[..BODY.len() - 1];
    let extended = [BODY, b" "].concat();
    for scheme in all_schemes() {
        let headers = signed(&scheme, SECRET, BODY, NOW);
        for body in [&flipped[..], trimmed, &extended[..]] {
            assert_eq!(
                scheme.verify(SECRET, &headers, body, NOW),
                Err(SignatureError::Mismatch {
                    header: signature_header(&scheme)
                }),
                "{scheme:?} {body:?}"
            );
        }
    }
}

#[test]
fn timestamp_at_the_tolerance_either_way_is_fresh() {
    for scheme in timed_schemes() {
        for sent in [NOW - 300, NOW + 300] {
            let headers = signed(&scheme, SECRET, BODY, sent);
            assert_eq!(
                scheme.verify(SECRET, &headers, BODY, NOW),
                Ok(()),
                "{scheme:?}"
            );
        }
    }
}

#[test]
fn stale_and_future_timestamps_are_stale() {
    for scheme in timed_schemes() {
        for (sent, age_secs) in [(NOW - 301, 301), (NOW + 301, -301), (0, NOW)] {
            let headers = signed(&scheme, SECRET, BODY, sent);
            assert_eq!(
                scheme.verify(SECRET, &headers, BODY, NOW),
                Err(SignatureError::Stale {
                    header: timestamp_header(&scheme),
                    age_secs,
                    tolerance_secs: 300,
                }),
                "{scheme:?} sent at {sent}"
            );
        }
    }
}

#[test]
fn a_forgery_is_a_mismatch_however_old() {
    for scheme in timed_schemes() {
        let headers = signed(&scheme, b"forger", BODY, NOW - 3600);
        assert_eq!(
            scheme.verify(SECRET, &headers, BODY, NOW),
            Err(SignatureError::Mismatch {
                header: signature_header(&scheme)
            }),
            "{scheme:?}"
        );
    }
}

#[test]
fn timestamp_is_signed() {
    // The signature from one time presented with another: a replay with its time moved.
    let stripe_value = signed(&stripe(), SECRET, BODY, NOW)
        .get(stripe_header())
        .unwrap()
        .to_str()
        .unwrap()
        .replace(&format!("t={NOW}"), &format!("t={}", NOW + 1));
    let headers = with(HeaderMap::new(), &stripe_header(), &stripe_value);
    assert_eq!(
        stripe().verify(SECRET, &headers, BODY, NOW),
        Err(SignatureError::Mismatch {
            header: stripe_header()
        })
    );
    for scheme in [slack(), hmac_ts()] {
        let headers = signed(&scheme, SECRET, BODY, NOW);
        let headers = with(headers, &timestamp_header(&scheme), &(NOW + 1).to_string());
        assert_eq!(
            scheme.verify(SECRET, &headers, BODY, NOW),
            Err(SignatureError::Mismatch {
                header: signature_header(&scheme)
            }),
            "{scheme:?}"
        );
    }
}

#[test]
fn malformed_timestamps_are_malformed() {
    let bad = [
        ("abc", TS_NOT_DIGITS),
        ("+1700000000", TS_NOT_DIGITS),
        ("-1", TS_NOT_DIGITS),
        ("1700000000.5", TS_NOT_DIGITS),
        ("0x6553f100", TS_NOT_DIGITS),
        ("253402300800", TS_IMPLAUSIBLE),
        ("99999999999999999999999", TS_IMPLAUSIBLE),
    ];
    for (ts, expected) in bad {
        for scheme in [slack(), hmac_ts()] {
            let headers = signed(&scheme, SECRET, BODY, NOW);
            let headers = with(headers, &timestamp_header(&scheme), ts);
            assert_eq!(
                why(scheme.verify(SECRET, &headers, BODY, NOW)),
                expected,
                "{scheme:?} {ts}"
            );
        }
        let sig = hex::encode([0u8; 32]);
        let headers = with(
            HeaderMap::new(),
            &stripe_header(),
            &format!("t={ts},v1={sig}"),
        );
        assert_eq!(
            why(stripe().verify(SECRET, &headers, BODY, NOW)),
            expected,
            "{ts}"
        );
    }
    let headers = with(
        HeaderMap::new(),
        &stripe_header(),
        &format!("t=,v1={}", hex::encode([0u8; 32])),
    );
    assert_eq!(
        why(stripe().verify(SECRET, &headers, BODY, NOW)),
        TS_NOT_DIGITS
    );
}

#[test]
fn duplicate_headers_are_malformed() {
    for scheme in all_schemes() {
        let headers = signed(&scheme, SECRET, BODY, NOW);
        let mut repeated = vec![signature_header(&scheme)];
        if timestamp_header(&scheme) != signature_header(&scheme) {
            repeated.push(timestamp_header(&scheme));
        }
        for header in repeated {
            // The same valid value twice is still refused: the rule is about counting.
            let mut twice = headers.clone();
            let value = twice.get(&header).unwrap().clone();
            twice.append(header.clone(), value);
            assert_eq!(
                scheme.verify(SECRET, &twice, BODY, NOW),
                Err(malformed(&header, REPEATED)),
                "{scheme:?} {header}"
            );
        }
    }
}

#[test]
fn malformed_hex_is_malformed() {
    let not_hex = "zz".repeat(32);
    let cases = [
        (Scheme::Github, format!("sha256={not_hex}")),
        (slack(), format!("v0={not_hex}")),
        (stripe(), format!("t={NOW},v1={not_hex}")),
        (hmac_ts(), format!("sha256={not_hex}")),
        (
            Scheme::Github,
            format!("sha256={}", &hex::encode([7u8; 32])[1..]),
        ),
    ];
    for (scheme, value) in cases {
        let headers = signed(&scheme, SECRET, BODY, NOW);
        let headers = with(headers, &signature_header(&scheme), &value);
        assert_eq!(
            why(scheme.verify(SECRET, &headers, BODY, NOW)),
            NOT_HEX,
            "{value}"
        );
    }
}

#[test]
fn wrong_length_is_malformed() {
    let short = hex::encode([7u8; 31]);
    let long = hex::encode([7u8; 33]);
    let sha512_sized = hex::encode([7u8; 64]);
    for given in [&short, &long, &sha512_sized] {
        let cases = [
            (Scheme::Github, format!("sha256={given}")),
            (slack(), format!("v0={given}")),
            (stripe(), format!("t={NOW},v1={given}")),
        ];
        for (scheme, value) in cases {
            let headers = signed(&scheme, SECRET, BODY, NOW);
            let headers = with(headers, &signature_header(&scheme), &value);
            assert_eq!(
                why(scheme.verify(SECRET, &headers, BODY, NOW)),
                LEN_SHA256_HEX,
                "{value}"
            );
        }
    }
    let sha512 = hmac(Algorithm::Sha512, Encoding::Hex, "", false);
    let headers = with(
        HeaderMap::new(),
        &name("x-signature"),
        &hex::encode([7u8; 32]),
    );
    assert_eq!(
        why(sha512.verify(SECRET, &headers, BODY, NOW)),
        LEN_SHA512_HEX
    );
    let b64 = hmac(Algorithm::Sha256, Encoding::Base64, "", false);
    let headers = with(
        HeaderMap::new(),
        &name("x-signature"),
        &BASE64.encode([7u8; 64]),
    );
    assert_eq!(
        why(b64.verify(SECRET, &headers, BODY, NOW)),
        LEN_SHA256_BASE64
    );
    let b64 = hmac(Algorithm::Sha512, Encoding::Base64, "", false);
    let headers = with(
        HeaderMap::new(),
        &name("x-signature"),
        &BASE64.encode([7u8; 32]),
    );
    assert_eq!(
        why(b64.verify(SECRET, &headers, BODY, NOW)),
        LEN_SHA512_BASE64
    );
}

#[test]
fn wrong_prefix_is_malformed() {
    let sig = hex::encode([7u8; 32]);
    let cases = [
        (Scheme::Github, sig.clone(), GITHUB_PREFIX),
        (Scheme::Github, format!("sha1={sig}"), GITHUB_PREFIX),
        (Scheme::Github, format!("SHA256={sig}"), GITHUB_PREFIX),
        (slack(), sig.clone(), SLACK_PREFIX),
        (slack(), format!("v1={sig}"), SLACK_PREFIX),
        (hmac_ts(), sig.clone(), HMAC_PREFIX),
        (hmac_ts(), format!("sha512={sig}"), HMAC_PREFIX),
    ];
    for (scheme, value, expected) in cases {
        let headers = signed(&scheme, SECRET, BODY, NOW);
        let headers = with(headers, &signature_header(&scheme), &value);
        assert_eq!(
            why(scheme.verify(SECRET, &headers, BODY, NOW)),
            expected,
            "{scheme:?} {value}"
        );
    }
}

#[test]
fn stripe_any_v1_may_match() {
    let genuine = signed(&stripe(), SECRET, BODY, NOW);
    let genuine = genuine.get(stripe_header()).unwrap().to_str().unwrap();
    let genuine_v1 = genuine.split_once(",v1=").unwrap().1;
    let other = hex::encode([7u8; 32]);
    for value in [
        format!("t={NOW},v1={other},v1={genuine_v1}"),
        format!("t={NOW},v1={genuine_v1},v1={other}"),
        format!("v1={other},v1={genuine_v1},t={NOW},v0={other}"),
    ] {
        let headers = with(HeaderMap::new(), &stripe_header(), &value);
        assert_eq!(
            stripe().verify(SECRET, &headers, BODY, NOW),
            Ok(()),
            "{value}"
        );
    }
    let headers = with(
        HeaderMap::new(),
        &stripe_header(),
        &format!("t={NOW},v1={other},v1={other}"),
    );
    assert_eq!(
        stripe().verify(SECRET, &headers, BODY, NOW),
        Err(SignatureError::Mismatch {
            header: stripe_header()
        })
    );
}

#[test]
fn stripe_v0_alone_is_refused() {
    // Even a v0 that is the correct HMAC: v0 is not a scheme we accept.
    let genuine = signed(&stripe(), SECRET, BODY, NOW);
    let genuine = genuine.get(stripe_header()).unwrap().to_str().unwrap();
    let as_v0 = genuine.replace(",v1=", ",v0=");
    let headers = with(HeaderMap::new(), &stripe_header(), &as_v0);
    assert_eq!(
        why(stripe().verify(SECRET, &headers, BODY, NOW)),
        STRIPE_NO_V1
    );
}

#[test]
fn stripe_malformed_entries_are_malformed() {
    let sig = hex::encode([7u8; 32]);
    let cases = [
        (format!("v1={sig}"), STRIPE_NO_T),
        (format!("t={NOW}"), STRIPE_NO_V1),
        (format!("t={NOW},t={NOW},v1={sig}"), STRIPE_TWO_T),
        (format!("t={NOW},v1={sig},"), STRIPE_ENTRY),
        (format!("t={NOW},,v1={sig}"), STRIPE_ENTRY),
        (format!("t={NOW};v1={sig}"), STRIPE_NO_V1),
        (format!("t={NOW},v1:{sig}"), STRIPE_ENTRY),
    ];
    for (value, expected) in cases {
        let headers = with(HeaderMap::new(), &stripe_header(), &value);
        assert_eq!(
            why(stripe().verify(SECRET, &headers, BODY, NOW)),
            expected,
            "{value}"
        );
    }
}

#[test]
fn base64_encoding_is_decoded_and_checked() {
    let scheme = hmac(Algorithm::Sha256, Encoding::Base64, "v1,", true);
    let headers = signed(&scheme, SECRET, BODY, NOW);
    let value = headers.get("x-signature").unwrap().to_str().unwrap();
    let raw = BASE64.decode(value.strip_prefix("v1,").unwrap()).unwrap();
    assert_eq!(raw.len(), 32);
    assert_eq!(scheme.verify(SECRET, &headers, BODY, NOW), Ok(()));
    let cases = [
        // Hex digits are base64 characters too: hex where base64 is configured decodes,
        // to 48 bytes.
        (format!("v1,{}", hex::encode(&raw)), LEN_SHA256_BASE64),
        (
            format!(
                "v1,{}",
                value.trim_start_matches("v1,").trim_end_matches('=')
            ),
            NOT_BASE64,
        ),
        ("v1,!!!!".to_owned(), NOT_BASE64),
    ];
    for (bad, expected) in cases {
        let headers = with(headers.clone(), &name("x-signature"), &bad);
        assert_eq!(
            why(scheme.verify(SECRET, &headers, BODY, NOW)),
            expected,
            "{bad}"
        );
    }
}

#[test]
fn sha512_is_sha512() {
    let scheme = hmac(Algorithm::Sha512, Encoding::Hex, "sha512=", false);
    let headers = signed(&scheme, SECRET, BODY, NOW);
    let value = headers.get("x-signature").unwrap().to_str().unwrap();
    assert_eq!(value.len(), "sha512=".len() + 128);
    assert_eq!(scheme.verify(SECRET, &headers, BODY, NOW), Ok(()));
    // The SHA-256 MAC of the same message, correctly sized for SHA-256, is no SHA-512 MAC.
    let sha256 = hmac(Algorithm::Sha256, Encoding::Hex, "sha512=", false);
    let headers = signed(&sha256, SECRET, BODY, NOW);
    assert_eq!(
        why(scheme.verify(SECRET, &headers, BODY, NOW)),
        LEN_SHA512_HEX
    );
}

#[test]
fn values_that_are_not_visible_ascii_are_malformed() {
    let sig = hex::encode(mac(Algorithm::Sha256, SECRET, &[BODY]));
    for raw in [
        format!("sha256={sig}\u{e9}").into_bytes(),
        format!("sha256= {sig}").into_bytes(),
        format!("sha256=\t{sig}").into_bytes(),
        [b"sha256=".as_slice(), sig.as_bytes(), &[0xff]].concat(),
    ] {
        let mut headers = HeaderMap::new();
        headers.insert(github_header(), HeaderValue::from_bytes(&raw).unwrap());
        assert_eq!(
            why(Scheme::Github.verify(SECRET, &headers, BODY, NOW)),
            NOT_VISIBLE_ASCII,
            "{raw:?}"
        );
    }
    let headers = with(HeaderMap::new(), &github_header(), "");
    assert_eq!(
        why(Scheme::Github.verify(SECRET, &headers, BODY, NOW)),
        EMPTY
    );
}

/// Every kind of refusal, for the message checks.
fn refusals() -> Vec<SignatureError> {
    let mut errors = Vec::new();
    for scheme in all_schemes() {
        let good = signed(&scheme, SECRET, BODY, NOW);
        errors.push(scheme.verify(SECRET, &HeaderMap::new(), BODY, NOW));
        errors.push(scheme.verify(b"wrong", &good, BODY, NOW));
        errors.push(scheme.verify(SECRET, &good, b"changed", NOW));
        errors.push(scheme.verify(SECRET, &good, BODY, NOW + 86_400));
        let header = signature_header(&scheme);
        for value in ["sha256=", "v0=abc", "t=x", "=", "\"\""] {
            errors.push(scheme.verify(SECRET, &with(good.clone(), &header, value), BODY, NOW));
        }
        let mut twice = good.clone();
        twice.append(header.clone(), HeaderValue::from_static("x"));
        errors.push(scheme.verify(SECRET, &twice, BODY, NOW));
    }
    errors.into_iter().filter_map(Result::err).collect()
}

#[test]
fn messages_never_hold_the_secret_the_signature_or_the_body() {
    let secret = String::from_utf8(SECRET.to_vec()).unwrap();
    let body = String::from_utf8(BODY.to_vec()).unwrap();
    let errors = refusals();
    assert!(errors.len() > 100);
    let mut seen = std::collections::HashSet::new();
    for error in &errors {
        seen.insert(std::mem::discriminant(error));
        for algorithm in [Algorithm::Sha256, Algorithm::Sha512] {
            let ts = NOW.to_string();
            let plain = mac(algorithm, SECRET, &[BODY]);
            let timed = mac(algorithm, SECRET, &[ts.as_bytes(), b".", BODY]);
            let slack = mac(algorithm, SECRET, &[b"v0:", ts.as_bytes(), b":", BODY]);
            for expected in [plain, timed, slack] {
                for text in [hex::encode(&expected), BASE64.encode(&expected)] {
                    let message = error.to_string();
                    assert!(!message.contains(&text), "{message}");
                    assert!(!format!("{error:?}").contains(&text), "{error:?}");
                }
            }
        }
        for message in [error.to_string(), format!("{error:?}")] {
            assert!(!message.contains(&secret), "{message}");
            assert!(!message.contains(body.trim_end()), "{message}");
        }
    }
    assert_eq!(seen.len(), 4, "every variant is exercised");
}

#[test]
fn messages_name_the_header() {
    for error in refusals() {
        let header = match &error {
            SignatureError::Missing(header)
            | SignatureError::Malformed { header, .. }
            | SignatureError::Stale { header, .. }
            | SignatureError::Mismatch { header } => header,
        };
        assert!(error.to_string().contains(header.as_str()), "{error}");
    }
    let stale = SignatureError::Stale {
        header: slack_timestamp_header(),
        age_secs: -301,
        tolerance_secs: 300,
    };
    assert_eq!(
        stale.to_string(),
        "the x-slack-request-timestamp timestamp is -301 s from this proxy's clock \
         (negative: ahead of it), beyond the 300 s tolerated: the delivery is a replay, or \
         the sender's clock or ours is wrong"
    );
}
