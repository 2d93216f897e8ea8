//! Host normalisation: `normalize_host` and `split_authority`.

use super::*;

// ---------------------------------------------------------------------------------------
// Hosts and authorities (egress/address.rs)
// ---------------------------------------------------------------------------------------

/// What `Host` promises: a name is lowercase ASCII (punycode) without trailing dot, at most
/// 253 characters in labels of 1..=63; an IP is never an IPv4-mapped IPv6 address; and the
/// canonical text normalises to itself.
pub(crate) fn assert_canonical(host: &Host, from: &str) {
    match host {
        Host::Name(name) => {
            assert!(name.len() <= 253, "{from:?} -> {name:?}");
            assert!(
                name.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b)),
                "{from:?} -> {name:?}"
            );
            assert!(
                name.split('.').all(|l| (1..=63).contains(&l.len())),
                "{from:?} -> {name:?}"
            );
        }
        Host::Ip(IpAddr::V6(v6)) => {
            assert!(v6.to_ipv4_mapped().is_none(), "{from:?} -> {v6}");
        }
        Host::Ip(IpAddr::V4(_)) => {}
    }
    let text = host.to_string();
    assert_eq!(
        normalize_host(&text).as_ref(),
        Ok(host),
        "{from:?} -> {text:?} does not normalise to itself"
    );
}

/// Host spellings: the odd forms THREATS.md lists (octal, hex, dotless, mapped IPv6,
/// trailing dots, IDN, full-width and ideographic dots) are reached far more often when
/// inputs are built from their pieces than from arbitrary strings.
const HOST_PIECES: &[&str] = &[
    "0",
    "1",
    "7",
    "9",
    "127",
    "255",
    "256",
    "0x",
    "0X7f",
    "0177",
    "4294967295",
    "4294967296",
    "2130706433",
    ".",
    "..",
    ":",
    "::",
    "[",
    "]",
    "ffff",
    "::ffff:",
    "64:ff9b::",
    "2002:",
    "a",
    "Z",
    "-",
    "_",
    "xn--",
    "xn--nxasmq6b",
    "example",
    "com",
    "é",
    "ß",
    "Ａ",
    "。",
    "．",
    "%2e",
    "%41",
    "%",
    "\u{0}",
    " ",
    "@",
    "*",
    "/",
    "\\",
    "\u{200b}",
    "ǅ",
    "ﬀ",
    "K",
];

pub(crate) fn host_from(pieces: &[u8]) -> String {
    pieces
        .iter()
        .map(|&i| HOST_PIECES[usize::from(i) % HOST_PIECES.len()])
        .collect()
}

fn check_host(raw: &str) {
    if let Ok(host) = normalize_host(raw) {
        assert_canonical(&host, raw);
    }
    if let Ok((host, port)) = split_authority(raw) {
        assert_canonical(&host, raw);
        assert_ne!(port, Some(0), "{raw:?}: port 0 is not a destination");
    }
}

#[test]
fn normalize_host_arbitrary_text() {
    check!()
        .with_type::<String>()
        .with_iterations(ITERATIONS)
        .for_each(|raw| check_host(raw));
}

#[test]
fn normalize_host_spellings() {
    check!()
        .with_type::<Vec<u8>>()
        .with_iterations(ITERATIONS)
        .for_each(|pieces| check_host(&host_from(pieces)));
}
