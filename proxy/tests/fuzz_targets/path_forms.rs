//! The path normaliser and route matching (`path_forms`, `recognise::route`): a path that a
//! lenient upstream would route to a catalogued tool is decided as that tool or refused,
//! never decided as plain `http`; and normalising never changes what a path means.
//!
//! The reference router below is written independently of the proxy: it routes a raw path
//! the way the most lenient upstream this project knows of does (unreserved escapes
//! decoded, `%2F`/`%5C`/`\` taken as separators, and `%252F`/`%255C` too (it decodes
//! twice), `;parameters` cut, empty segments and a trailing slash dropped, letters in any
//! case, the method in any case, HEAD for GET).

use ostiary::recognise;
use ostiary_policies::Catalog;

use super::*;

/// RFC 3986 §6.2.2 by hand: decode escapes of unreserved characters, uppercase the hex of
/// the others; anything else as it is.
pub(crate) fn reference_normalize(path: &str) -> String {
    let b = path.as_bytes();
    let mut out = String::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let h = char::from(b[i + 1]).to_digit(16);
            let l = char::from(b[i + 2]).to_digit(16);
            if let (Some(h), Some(l)) = (h, l) {
                let c = char::from((h * 16 + l) as u8);
                if c.is_ascii_alphanumeric() || "-._~".contains(c) {
                    out.push(c);
                } else {
                    out.push('%');
                    out.push(char::from(b[i + 1]).to_ascii_uppercase());
                    out.push(char::from(b[i + 2]).to_ascii_uppercase());
                }
                i += 3;
                continue;
            }
        }
        let c = path[i..].chars().next().unwrap();
        out.push(c);
        i += c.len_utf8();
    }
    out
}

/// Every escape decoded: what a path means, byte for byte.
fn decoded(path: &str) -> Vec<u8> {
    let b = path.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (
                char::from(b[i + 1]).to_digit(16),
                char::from(b[i + 2]).to_digit(16),
            ) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

/// The segments a lenient upstream routes `path` by.
fn reference_segments(path: &str) -> Vec<String> {
    let normal = reference_normalize(path);
    let separated = normal
        .replace("%252F", "/")
        .replace("%255C", "/")
        .replace("%2F", "/")
        .replace("%5C", "/")
        .replace('\\', "/");
    separated
        .split('/')
        .map(|s| s.split(';').next().unwrap_or("").to_owned())
        .filter(|s| !s.is_empty())
        .collect()
}

/// One template segment: a literal from a small alphabet, or a parameter.
#[derive(Debug, TypeGenerator)]
enum Seg {
    Literal(u8),
    Param,
}

const LITERALS: &[&str] = &["v1", "refunds", "bulk", "a", "items", "x-y", "~u"];

/// How one segment of the sent path is spelled.
#[derive(Debug, TypeGenerator)]
struct Spelling {
    /// Doubled slash before it, `;param` after it, an escaped first character, `%2F` into
    /// the next segment instead of `/`, `%252F` instead of `/`, the segment in upper case:
    /// each when its bit is set.
    flags: u8,
}

#[derive(Debug, TypeGenerator)]
struct RouteCase {
    template: Vec<Seg>,
    spellings: Vec<Spelling>,
    trailing: bool,
    method: u8,
}

fn template_text(segments: &[Seg]) -> String {
    let mut text = String::new();
    for (i, seg) in segments.iter().take(5).enumerate() {
        text.push('/');
        match seg {
            Seg::Literal(n) => text.push_str(LITERALS[usize::from(*n) % LITERALS.len()]),
            Seg::Param => text.push_str(&format!("{{p{i}}}")),
        }
    }
    if text.is_empty() {
        text.push('/');
    }
    text
}

/// The path sent for `case`: the template's segments (a parameter filled with `val`),
/// each spelled as its flags say.
fn sent_path(case: &RouteCase) -> String {
    let mut path = String::new();
    for (i, seg) in case.template.iter().take(5).enumerate() {
        let flags = case.spellings.get(i).map_or(0, |s| s.flags);
        let text = match seg {
            Seg::Literal(n) => LITERALS[usize::from(*n) % LITERALS.len()].to_owned(),
            Seg::Param => "val".to_owned(),
        };
        let text = if flags & 32 != 0 {
            text.to_ascii_uppercase()
        } else {
            text
        };
        let mut text = if flags & 4 != 0 {
            let mut chars = text.chars();
            let first = chars.next().unwrap_or('v');
            format!("%{:02x}{}", first as u32, chars.as_str())
        } else {
            text
        };
        if flags & 2 != 0 {
            text.push_str(";jsessionid=1");
        }
        let sep = match (flags & 8 != 0, flags & 16 != 0) {
            _ if i == 0 => "/",
            (true, _) => "%2F",
            (false, true) => "%252F",
            (false, false) => "/",
        };
        if flags & 1 != 0 {
            path.push('/');
        }
        path.push_str(sep);
        path.push_str(&text);
    }
    if path.is_empty() || case.trailing {
        path.push('/');
    }
    path
}

fn check_route(case: &RouteCase) {
    let template = template_text(&case.template);
    let tools = format!(
        "[[tool]]\nname = \"t.tool\"\ntier = \"read\"\nmatch = {{ host = \"api.t\", method = \"GET\", path = \"{template}\" }}\n"
    );
    let catalog = Catalog::parse("tools.toml", &tools, None).expect("a generated catalog loads");
    let path = sent_path(case);
    let method = ["GET", "get", "Get", "HEAD", "POST"][usize::from(case.method) % 5];
    let req = Request::builder()
        .method(Method::from_bytes(method.as_bytes()).unwrap())
        .uri(format!("http://api.t{path}"))
        .body(())
        .unwrap();
    let Ok(target) = classify::target(&Origin::Plain, &req) else {
        return;
    };
    // The normalised path means what the sent one meant, and is what the reference says.
    assert_eq!(target.path, reference_normalize(req.uri().path()), "{path}");
    assert_eq!(decoded(&target.path), decoded(req.uri().path()), "{path}");
    let template_segments: Vec<&str> = template.split('/').filter(|s| !s.is_empty()).collect();
    let routed = reference_segments(req.uri().path());
    let reference_match = routed.len() == template_segments.len()
        && routed
            .iter()
            .zip(&template_segments)
            .all(|(got, want)| want.starts_with('{') || got.eq_ignore_ascii_case(want));
    let method_matches = method.eq_ignore_ascii_case("GET") || method == "HEAD";
    match recognise::route(&catalog, &target) {
        Ok(Some(route)) => {
            assert_eq!(route.tool.name(), "t.tool");
            assert!(
                method_matches && reference_match,
                "{method} {path} matched {template}"
            );
        }
        Ok(None) => assert!(
            !(method_matches && reference_match),
            "{method} {path} routes to {template} upstream but was not decided as the tool"
        ),
        Err(ProxyError::BadRequest { reason }) => {
            assert!(reason.contains("t.tool"), "{method} {path}: {reason}");
            assert!(
                method_matches && reference_match,
                "{method} {path} refused for {template}"
            );
        }
        Err(e) => panic!("{method} {path}: {e}"),
    }
}

#[test]
fn route_agrees_with_a_lenient_reference_router() {
    check!()
        .with_type::<RouteCase>()
        .with_iterations(ITERATIONS)
        .with_max_len(STRUCTURED_MAX_LEN)
        .with_max_depth(STRUCTURED_MAX_DEPTH)
        .for_each(check_route);
}

#[test]
fn normalize_keeps_meaning_and_is_idempotent() {
    check!()
        .with_type::<String>()
        .with_iterations(ITERATIONS)
        .for_each(|text| {
            let path = format!("/{text}");
            let once = ostiary::path_forms::normalize(&path).into_owned();
            assert_eq!(once, reference_normalize(&path), "{path:?}");
            assert_eq!(decoded(&once), decoded(&path), "{path:?}");
            assert_eq!(ostiary::path_forms::normalize(&once), once, "{path:?}");
        });
}
