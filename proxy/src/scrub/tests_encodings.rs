//! Tests of scrubbing through encodings, and of a hold-back that tells nothing: a canary
//! holding `+ / = < & '` and a space, echoed the way real encoders write it (each encoder
//! written out here by its documented escaping rules), escaped in random per-character
//! mixtures, nested, and streamed in every chunking.

use std::collections::VecDeque;

use base64::Engine;
use bytes::Bytes;
use rand::{Rng, SeedableRng};

use super::*;

const CANARY: &str = "osc+K3y/v4l=ue<a&b'c d-9f2e";

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

/// JSON string content: `"` and `\` escaped, and every character of `set` as `\uXXXX`.
fn json(s: &str, set: &str, upper: bool) -> String {
    s.chars()
        .map(|c| match c {
            '"' => "\\\"".to_owned(),
            '\\' => "\\\\".to_owned(),
            c if set.contains(c) && upper => format!("\\u{:04X}", u32::from(c)),
            c if set.contains(c) => format!("\\u{:04x}", u32::from(c)),
            c => c.to_string(),
        })
        .collect()
}

/// Python's `html.escape(s, quote=True)`.
fn html(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#x27;")
}

/// Percent-encoding of everything but `keep` and RFC 3986's unreserved characters.
fn percent(s: &str, keep: &str, upper: bool, plus: bool) -> String {
    s.bytes()
        .map(|b| {
            let c = char::from(b);
            if b.is_ascii_alphanumeric() || "-_.~".contains(c) || keep.contains(c) {
                c.to_string()
            } else if plus && b == b' ' {
                "+".to_owned()
            } else if upper {
                format!("%{b:02X}")
            } else {
                format!("%{b:02x}")
            }
        })
        .collect()
}

const SPECIALS: &str = "+/=<&' ";

/// The canary as common encoders write it.
fn encoder_outputs() -> Vec<(&'static str, String)> {
    let c = CANARY;
    let std_b64 = base64::engine::general_purpose::STANDARD.encode(c);
    vec![
        ("raw", c.to_owned()),
        // System.Text.Json's default encoder: uppercase hex.
        ("dotnet", json(c, "+<>&'\"`", true)),
        ("go", json(c, "<>&", false)),
        ("gson", json(c, "<>&='", false)),
        ("php", json(c, "", false).replace('/', "\\/")),
        ("every special", json(c, SPECIALS, false)),
        ("python html.escape", html(c)),
        ("php htmlspecialchars", html(c).replace("&#x27;", "&#039;")),
        (
            "decimal references",
            c.chars()
                .map(|ch| {
                    if SPECIALS.contains(ch) {
                        format!("&#{};", u32::from(ch))
                    } else {
                        ch.to_string()
                    }
                })
                .collect(),
        ),
        (
            "hex references, upper",
            c.chars()
                .map(|ch| {
                    if SPECIALS.contains(ch) {
                        format!("&#X{:X};", u32::from(ch))
                    } else {
                        ch.to_string()
                    }
                })
                .collect(),
        ),
        ("quote(safe='')", percent(c, "", true, false)),
        ("lowercase percent", percent(c, "", false, false)),
        ("quote_plus", percent(c, "", true, true)),
        ("encodeURI", percent(c, ";,/?:@&=+$#!'()*", true, false)),
        ("encodeURIComponent", percent(c, "!'()*", true, false)),
        ("hex", hex::encode(c)),
        ("HEX", hex::encode_upper(c)),
        ("base64 in gson", json(&std_b64, "=", false)),
        ("base64 in php", std_b64.replace('/', "\\/")),
        ("base64 in a query", percent(&std_b64, "", true, false)),
        // Nested once.
        ("json in json", json(&json(c, "+<>&'", true), "", false)),
        (
            "url twice",
            percent(&percent(c, "", true, false), "", true, false),
        ),
        ("html twice", html(&html(c))),
        ("html in go json", json(&html(c), "<>&", false)),
        ("go json in html", html(&json(c, "<>&", false))),
        (
            "url in php json",
            percent(c, "", true, true).replace('/', "\\/"),
        ),
        (
            "url in dotnet json",
            json(&percent(c, "/", false, true), "+<>&'", true),
        ),
        (
            "encodeURI then html",
            html(&percent(c, "/&=+'", true, false)),
        ),
    ]
}

#[test]
fn every_encoder_s_output_is_redacted() {
    let s = Scrubber::new([CANARY]);
    for (name, form) in encoder_outputs() {
        for (before, after) in [("", ""), ("{\"echo\":\"", "\"}"), ("x=", "&y=1")] {
            let body = format!("{before}{form}{after}");
            let out = s.scrub_bytes(body.as_bytes());
            assert_eq!(
                out.as_ref(),
                format!("{before}{REDACTED}{after}").as_bytes(),
                "{name}: {form}"
            );
        }
    }
}

#[test]
fn any_subset_of_characters_escaped_any_way_is_redacted() {
    let s = Scrubber::new([CANARY]);
    let spellings = |ch: char| -> Vec<String> {
        let cp = u32::from(ch);
        let mut v = vec![
            ch.to_string(),
            format!("\\u{cp:04x}"),
            format!("\\u{cp:04X}"),
            format!("&#{cp};"),
            format!("&#0{cp};"),
            format!("&#x{cp:x};"),
            format!("&#X{cp:X};"),
            format!("%{cp:02X}"),
            format!("%{cp:02x}"),
            format!("\\u0026#{cp};"),
            format!("%25{cp:02X}"),
            format!("\\\\u{cp:04X}"),
        ];
        match ch {
            '&' => v.extend(["&amp;".into(), "&AMP;".into(), "&amp;amp;".into()]),
            '<' => v.extend(["&lt;".into(), "\\u0026lt;".into()]),
            '\'' => v.extend(["&apos;".into(), "\\'".into()]),
            '/' => v.extend(["\\/".into(), "&sol;".into()]),
            ' ' => v.push("+".into()),
            '+' => v.push("&plus;".into()),
            '=' => v.push("&equals;".into()),
            _ => {}
        }
        v
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5c2b);
    for round in 0..300 {
        let form: String = CANARY
            .chars()
            .map(|ch| {
                if SPECIALS.contains(ch) {
                    let v = spellings(ch);
                    v[rng.random_range(0..v.len())].clone()
                } else {
                    ch.to_string()
                }
            })
            .collect();
        let body = format!("<p>{form}</p>");
        assert_eq!(
            s.scrub_bytes(body.as_bytes()).as_ref(),
            format!("<p>{REDACTED}</p>").as_bytes(),
            "round {round}: {form}"
        );
    }
}

#[test]
fn near_misses_of_the_canary_stay() {
    let s = Scrubber::new([CANARY]);
    for text in [
        CANARY.replace('+', "-"),
        CANARY.replace('+', "%2C"),
        CANARY.replace('&', "&amp"),
        CANARY.replace('<', "&lt"),
        CANARY.replace('+', "\\u002"),
        CANARY.replace('=', "&#0000061;"),
        CANARY[..CANARY.len() - 1].to_owned(),
    ] {
        assert_eq!(s.scrub_bytes(text.as_bytes()).as_ref(), text.as_bytes());
    }
}

/// Streamed through [`StreamScrubber`] in these chunks; also what was released after each.
fn streamed(s: &Scrubber, chunks: &[&[u8]]) -> (Vec<u8>, Vec<usize>) {
    let mut stream = StreamScrubber::new(s.clone());
    let mut out = VecDeque::new();
    let mut released = Vec::new();
    for c in chunks {
        stream.feed(Bytes::copy_from_slice(c), &mut out);
        released.push(out.iter().map(Bytes::len).sum());
    }
    stream.finish(&mut out);
    (
        out.iter().flat_map(|b| b.iter().copied()).collect(),
        released,
    )
}

#[test]
fn streaming_equals_whole_body_scrubbing_through_encodings() {
    let s = Scrubber::new([CANARY, "second secret+"]);
    let mut body = Vec::new();
    for (i, (_, form)) in encoder_outputs().into_iter().enumerate() {
        body.extend_from_slice(format!("{{\"n\":{i},\"v\":\"{form}\"}}").as_bytes());
        if i % 3 == 0 {
            body.push(b'\n');
        }
    }
    let want = s.scrub_bytes(&body).into_owned();
    assert!(!contains(&want, CANARY.as_bytes()));
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x0e5c);
    for _ in 0..200 {
        let mut chunks: Vec<&[u8]> = Vec::new();
        let mut rest = &body[..];
        while !rest.is_empty() {
            let n = rng.random_range(0..=rest.len().min(90));
            let (a, b) = rest.split_at(n);
            chunks.push(a);
            rest = b;
        }
        assert_eq!(streamed(&s, &chunks).0, want);
    }
}

/// Item 6 of issue 13: what is released after each chunk is the same whether the probe
/// begins the secret or not, so an echoing upstream teaches the agent nothing.
#[test]
fn the_hold_back_does_not_depend_on_whether_a_probe_begins_the_secret() {
    let s = Scrubber::new([CANARY]);
    let head = b"{\"echo\":\"".as_slice();
    for k in 1..CANARY.len() {
        let matching = CANARY[..k].to_owned();
        let other: String = "Z".repeat(k);
        let escaped = json(&CANARY[..k], SPECIALS, true);
        let other_escaped: String = "Q".repeat(escaped.len());
        for (a, b) in [(&matching, &other), (&escaped, &other_escaped)] {
            for tail in [
                &b""[..],
                b"\"}",
                b"\"}\n",
                b" and more text that follows it",
            ] {
                let ra = streamed(&s, &[head, a.as_bytes(), tail]).1;
                let rb = streamed(&s, &[head, b.as_bytes(), tail]).1;
                assert_eq!(ra, rb, "probe of {k} bytes, tail {tail:?}");
            }
        }
    }
    // And it is the fixed window: everything but the last `hold_back` bytes goes.
    let long = vec![b'x'; 10 * s.hold_back()];
    let (_, released) = streamed(&s, &[&long]);
    assert_eq!(released, vec![long.len() - s.hold_back()]);
}

#[test]
fn the_hold_back_is_sized_from_lengths_alone() {
    // Same lengths, different characters: the same window.
    let a = Scrubber::new(["aaaaaaaaaaaaaaaa"]);
    let b = Scrubber::new(["+/=<&' +/=<&' +/"]);
    let c = Scrubber::new(["é"]);
    assert_eq!(a.hold_back(), b.hold_back());
    assert!(c.hold_back() > 0);
    assert!(b.max_pattern_len() <= b.hold_back() + 1);
}

#[test]
fn a_multi_line_secret_is_redacted_line_by_line_and_lines_stream() {
    let key =
        "-----BEGIN TEST KEY-----\nMIIBVgIBADANBgkqhkiG9w0BAQEFAASCAUAw+/=\n-----END TEST KEY-----";
    let s = Scrubber::new([key]);
    let body = format!("{{\"k\":\"{}\"}}\n", key.replace('\n', "\\n"));
    let out = s.scrub_bytes(body.as_bytes()).into_owned();
    assert!(
        !contains(&out, b"MIIBVgIBADANBgkqhkiG9w0BAQEFAASCAUAw"),
        "{out:?}"
    );
    // A raw echo: released at the first newline no wrapped encoding may go on from (the
    // blank line; a line ending in `-` or `=` may be a wrap, and waits like any bytes).
    let raw = format!("{key}\n\n");
    let (whole, released) = streamed(&s, &[raw.as_bytes()]);
    assert_eq!(released, vec![whole.len()], "nothing waited for the end");
    assert_eq!(whole, s.scrub_bytes(raw.as_bytes()).as_ref());
    assert!(!contains(&whole, b"MIIBVgIBADANBgkqhkiG9w0BAQEFAASCAUAw"));
}

#[test]
fn scrub_text_catches_what_a_serialiser_wrote_back() {
    let s = Scrubber::new([CANARY]);
    let stored = format!("{{\"text\":\"{}\"}}", json(CANARY, "+<>&'", true));
    let value: serde_json::Value = serde_json::from_str(&stored).unwrap();
    let written = value.to_string();
    assert!(written.contains(CANARY), "serde_json decodes the escapes");
    let scrubbed = s.scrub_text(written);
    assert_eq!(scrubbed, format!("{{\"text\":\"{REDACTED}\"}}"));
    assert_eq!(s.scrub_text("clean".into()), "clean");
}

/// `text` wrapped every `width` bytes with `brk`.
fn wrap(text: &str, width: usize, brk: &str) -> String {
    let lines: Vec<&str> = text
        .as_bytes()
        .chunks(width)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect();
    lines.join(brk)
}

/// Quoted-printable of printable ASCII without `=`: soft breaks (`=` CRLF) keep each
/// line at most 76 bytes.
fn quoted_printable(text: &str) -> String {
    assert!(!text.contains('=') && text.bytes().all(|b| (b' '..=b'~').contains(&b)));
    wrap(text, 75, "=\r\n")
}

/// Everything `out` says once its breaks are taken out: a wrapped form left whole would
/// be found there.
fn without_breaks(out: &[u8]) -> Vec<u8> {
    String::from_utf8_lossy(out)
        .replace("=\r\n", "")
        .replace("\\r\\n", "")
        .replace("\\n", "")
        .replace(['\r', '\n'], "")
        .into_bytes()
}

/// Found by attacking this proxy: an upstream that wraps what it echoes — MIME base64 at
/// 76 columns, PEM at 64, the same inside a JSON string, quoted-printable's soft breaks —
/// cut the secret's form across a line, and 44 to 76 of 160 offsets leaked. At every
/// offset, whole and streamed in random frames, nothing of a form is left.
#[test]
fn a_secret_wrapped_across_lines_is_redacted_at_every_offset() {
    let token = "ghp_W7xQ2mL9vK4tR8nB3cF6hJ1dZ5sY0aP";
    let s = Scrubber::new([CANARY, token]);
    let oracle = Scrubber::new([CANARY, token]);
    let b64 = |t: &str| base64::engine::general_purpose::STANDARD.encode(t);
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x3A9);
    for pad in 0..160 {
        let before = "x".repeat(pad);
        let blob = format!("{before}Authorization: Bearer {CANARY} and {token};");
        let plain = format!("{before}token: {token} done");
        let pem = format!(
            "-----BEGIN DATA-----\n{}\n-----END DATA-----\n",
            wrap(&b64(&blob), 64, "\n")
        );
        let cases = [
            (
                "mime",
                format!(
                    "Content-Transfer-Encoding: base64\r\n\r\n{}\r\n",
                    wrap(&b64(&blob), 76, "\r\n")
                ),
            ),
            ("pem", pem.clone()),
            ("pem in json", serde_json::json!({ "pem": pem }).to_string()),
            (
                "json crlf",
                format!("{{\"b\":\"{}\"}}", wrap(&b64(&blob), 76, "\\r\\n")),
            ),
            (
                "quoted-printable",
                format!("{}\r\n", quoted_printable(&plain)),
            ),
            ("hex", format!("{}\n", wrap(&hex::encode(&blob), 64, "\n"))),
        ];
        for (what, text) in cases {
            let out = s.scrub_bytes(text.as_bytes()).into_owned();
            let flat = without_breaks(&out);
            assert_eq!(
                oracle.scrub_bytes(&flat).as_ref(),
                &flat[..],
                "{what} at {pad}: {}",
                String::from_utf8_lossy(&out)
            );
            let cuts: Vec<usize> = {
                let mut c: Vec<usize> = (0..3).map(|_| rng.random_range(0..=text.len())).collect();
                c.sort_unstable();
                c
            };
            let chunks = [
                &text.as_bytes()[..cuts[0]],
                &text.as_bytes()[cuts[0]..cuts[1]],
                &text.as_bytes()[cuts[1]..cuts[2]],
                &text.as_bytes()[cuts[2]..],
            ];
            let (streamed_out, _) = streamed(&s, &chunks);
            assert_eq!(streamed_out, out, "{what} at {pad}, streamed in {cuts:?}");
        }
    }
}
