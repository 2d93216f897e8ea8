//! The spellings of one path: what the proxy forwards, and what an upstream may route it as.
//!
//! Policy must see the path the upstream acts on. Two steps get there:
//! - [`normalize`] — the equivalences RFC 3986 §6.2.2 defines are applied before anything
//!   reads the path, and the normalised path is what is forwarded: a percent-encoded
//!   unreserved character (`%61` for `a`, `%7E` for `~`) is decoded, and the hex digits of
//!   every other escape are uppercased (`%2f` → `%2F`). The two spellings mean the same URI,
//!   so no compliant upstream sees a difference, and a rule on `/admin` cannot be walked
//!   around with `/%61dmin`. (Dot-segments are refused earlier, in `classify`.)
//! - [`routed`] — what a lenient upstream routes the path as: slashes merged (nginx's
//!   `merge_slashes`, on by default), `;parameters` cut from each segment (Java servlet
//!   containers), `%2F` and `%5C` decoded to a separator (servers that decode before
//!   routing, and `%252F` for those that decode twice), and a trailing slash dropped (most
//!   frameworks route `/a/` as `/a`). A request whose lenient form reaches a catalogued tool that its own form does not is refused by
//!   `recognise` rather than decided as plain `http`.
//!
//! Neither step allocates for a path that needs no change.

use std::borrow::Cow;

/// Whether `b` is an unreserved character (RFC 3986 §2.3).
fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

/// `path` with percent-encoded unreserved characters decoded and the hex digits of other
/// escapes uppercased. A `%` not followed by two hex digits is left as it is (the upstream
/// answers such a path; it matches no catalogued route).
pub fn normalize(path: &str) -> Cow<'_, str> {
    let bytes = path.as_bytes();
    let needs = bytes.windows(3).any(|w| {
        w[0] == b'%'
            && matches!((hex(w[1]), hex(w[2])), (Some(h), Some(l))
                if unreserved(h * 16 + l) || w[1].is_ascii_lowercase() || w[2].is_ascii_lowercase())
    });
    if !needs {
        return Cow::Borrowed(path);
    }
    let mut out = String::with_capacity(path.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                let decoded = h * 16 + l;
                if unreserved(decoded) {
                    out.push(decoded as char);
                } else {
                    out.push('%');
                    out.push(bytes[i + 1].to_ascii_uppercase() as char);
                    out.push(bytes[i + 2].to_ascii_uppercase() as char);
                }
                i += 3;
                continue;
            }
        }
        // Paths are ASCII by the time they get here (the URI parser refuses the rest), so
        // byte-wise copying keeps them intact; a non-ASCII byte is copied as its character.
        let ch = path[i..].chars().next().unwrap_or('\u{fffd}');
        out.push(ch);
        i += ch.len_utf8();
    }
    Cow::Owned(out)
}

/// `path` without one trailing slash (the root stays `/`).
pub fn trim_trailing(path: &str) -> &str {
    match path.strip_suffix('/') {
        Some("") | None => path,
        Some(trimmed) => trimmed,
    }
}

/// What a lenient upstream routes `path` as (see the module doc), or `None` when that is
/// the path itself up to a trailing slash: slashes merged, `;parameters` cut from each
/// segment, `%2F`/`%5C` taken as separators, no trailing slash.
pub fn routed(path: &str) -> Option<String> {
    let separator_escape = |w: &[u8]| {
        w[0] == b'%'
            && matches!(
                (w[1], w[2].to_ascii_uppercase()),
                (b'2', b'F') | (b'5', b'C')
            )
    };
    let interesting = path.contains("//")
        || path.contains(';')
        || path.contains('\\')
        || path.as_bytes().windows(3).any(separator_escape)
        || path.contains("%25");
    if !interesting {
        return None;
    }
    // Escaped once more (`%252F`): servers that decode twice (some in front of others) see
    // a separator there too.
    let separated = path
        .replace("%252F", "/")
        .replace("%252f", "/")
        .replace("%255C", "/")
        .replace("%255c", "/")
        .replace("%2F", "/")
        .replace("%2f", "/")
        .replace("%5C", "/")
        .replace("%5c", "/")
        .replace('\\', "/");
    let mut out = String::with_capacity(separated.len());
    for segment in separated.split('/') {
        let segment = segment.split(';').next().unwrap_or_default();
        if segment.is_empty() {
            continue;
        }
        out.push('/');
        out.push_str(segment);
    }
    if out.is_empty() {
        out.push('/');
    }
    (out != trim_trailing(path)).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreserved_escapes_are_decoded_and_others_uppercased() {
        assert_eq!(normalize("/admin"), "/admin");
        assert!(matches!(normalize("/a/b%2Fc"), Cow::Borrowed(_)));
        assert_eq!(normalize("/%61dmin"), "/admin");
        assert_eq!(normalize("/%41%7e%7E%2d%2E%5f"), "/A~~-._");
        assert_eq!(normalize("/a%2fb%3b%20"), "/a%2Fb%3B%20");
        assert_eq!(normalize("/%zz/%4"), "/%zz/%4");
        assert_eq!(normalize("/x%"), "/x%");
        assert_eq!(normalize("/%6"), "/%6");
        // Decoded once, never twice: `%25` is `%`, which is reserved.
        assert_eq!(normalize("/%25%36%31"), "/%2561");
        assert_eq!(normalize(&normalize("/%25%36%31")), "/%2561");
    }

    #[test]
    fn lenient_routing_forms() {
        assert_eq!(routed("/repos/a/b/issues"), None);
        assert_eq!(
            routed("/repos/a/b/issues/"),
            None,
            "a trailing slash is tolerated"
        );
        assert_eq!(
            routed("/repos//a/b/issues").as_deref(),
            Some("/repos/a/b/issues")
        );
        assert_eq!(
            routed("//repos/a/b/issues").as_deref(),
            Some("/repos/a/b/issues")
        );
        assert_eq!(
            routed("/repos/a/b/issues;jsessionid=1").as_deref(),
            Some("/repos/a/b/issues")
        );
        assert_eq!(
            routed("/repos/a;x/b/issues").as_deref(),
            Some("/repos/a/b/issues")
        );
        assert_eq!(
            routed("/repos/a%2Fb/issues").as_deref(),
            Some("/repos/a/b/issues")
        );
        assert_eq!(
            routed("/repos/a%5cb/issues").as_deref(),
            Some("/repos/a/b/issues")
        );
        assert_eq!(
            routed("/repos/a%252Fb/issues").as_deref(),
            Some("/repos/a/b/issues"),
            "decoded twice"
        );
        assert_eq!(
            routed("/repos/a%255cb/issues").as_deref(),
            Some("/repos/a/b/issues")
        );
        assert_eq!(routed("/;x").as_deref(), Some("/"));
        assert_eq!(routed("/"), None);
    }
}
