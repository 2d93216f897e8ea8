//! Method overrides: a `_method` parameter that frameworks run as the request's method
//! (Rails' `Rack::MethodOverride`, Laravel, Symfony, Express's method-override), so that a
//! POST decided as plain `http` would reach the handler of a catalogued `DELETE` tool.
//!
//! One rule says which names are `_method` to some framework ([`names_override`]: PHP's
//! name mangling included), and one function says which bodies are read for it and how
//! ([`refuse_in_body`]): form and JSON bodies are read whole (bounded), as before; bodies
//! that Rack reads as a form without saying so (no content type) and multipart bodies keep
//! streaming, watched on their way ([`watch`]) with their end held back until the watch
//! has read everything, so an upstream never receives a whole body that names one.

mod form;
mod parts;
mod watch;

use std::sync::{Arc, OnceLock};

use http::header::CONTENT_TYPE;
use http::Request;
use serde_json::{Map, Value};

use crate::body::{self, ProxyBody};
use crate::classify::Target;
use crate::error::ProxyError;
use crate::recognise::{declared_length, read_body, serves_tools};
use ostiary_policies::Catalog;

pub use form::FormKeys;
pub use parts::PartNames;

/// A reader of a body as it streams, asked whether anything in it names an override: the
/// same answer however the body is cut into chunks.
pub trait Reader {
    /// Read `bytes`; whether anything read so far names an override.
    fn push(&mut self, bytes: &[u8]) -> bool;

    /// The body ended: whether anything in it names an override.
    fn finish(&mut self) -> bool;
}

/// Where a refused override was found, as the refusal names it.
pub(crate) type Place = &'static str;

/// What a watched body found, read once the upstream send is over: the send itself fails
/// opaquely when the watch ends the body.
pub(crate) type Finding = Arc<OnceLock<Place>>;

/// Whether a parameter, member or part named `key` (decoded bytes) is `_method` to some
/// framework, in any case:
/// - PHP (Laravel, Symfony) ends a name at NUL, drops leading blanks, and turns a leading
///   `.` or ` ` and an unclosed `[` into `_`: `.method`, `[method`, `_method%00x`;
/// - PHP and Rack read `_method[]` and `_method[x]` as an array under `_method`;
/// - surrounding blanks are ignored (a form's `+_method`), any Unicode blank.
pub(crate) fn names_override(key: &[u8]) -> bool {
    let key = key.split(|&b| b == 0).next().unwrap_or_default();
    let key = match std::str::from_utf8(key) {
        Ok(text) => text.trim().as_bytes(),
        Err(_) => key.trim_ascii(),
    };
    let Some((&first, rest)) = key.split_first() else {
        return false;
    };
    if !matches!(first, b'_' | b'.' | b' ' | b'[') {
        return false;
    }
    let name = rest.split(|&b| b == b'[').next().unwrap_or_default();
    name.eq_ignore_ascii_case(b"method")
}

/// [`names_override`] of a decoded key.
pub(crate) fn is_method_override(key: &str) -> bool {
    names_override(key.as_bytes())
}

/// The refusal of a request carrying a method override in `place` (the query, the body).
pub(crate) fn refused(place: &str) -> ProxyError {
    ProxyError::bad_request(format!(
        "{place} names `_method`, which frameworks run as the request's method; send the \
         request with that method instead"
    ))
}

/// How frameworks may read a body with this `Content-Type` (lowercased), each reading
/// taken if any framework takes it: Laravel reads JSON from any type that contains
/// `/json` or `+json`, PHP cuts the media type at `;`, `,` or a blank and Rack at `;` or
/// `,`, Rack reads a POST with no media type as a form and any `multipart/*` as parts.
#[derive(Debug, Default, PartialEq, Eq)]
struct Readings {
    json: bool,
    form: bool,
    /// A form streamed, not read whole: no media type was given.
    untyped_form: bool,
    multipart: bool,
}

impl Readings {
    fn of(content_type: Option<&[u8]>) -> Self {
        let Some(value) = content_type else {
            return Self {
                untyped_form: true,
                ..Self::default()
            };
        };
        let value = value.to_ascii_lowercase();
        let has = |needle: &[u8]| value.windows(needle.len()).any(|w| w == needle);
        let media = value
            .split(|&b| b == b';' || b == b',')
            .next()
            .unwrap_or_default()
            .trim_ascii();
        Self {
            json: has(b"/json") || has(b"+json"),
            form: has(b"application/x-www-form-urlencoded"),
            untyped_form: media.is_empty(),
            multipart: has(b"multipart/"),
        }
    }
}

/// Refuse a POST decided as plain `http` to a host that serves catalogued tools when its
/// body names `_method` (see the module docs for why). Form and JSON bodies are read
/// (bounded by `limit`, like a tool call's) and put back for forwarding; untyped and
/// multipart bodies are watched as they stream, and what the watch finds is returned for
/// `forward` to report. Bodies of other types and methods, and to hosts without tools,
/// pass as they are: no framework reads `_method` from them, or no tool is there to reach.
pub(crate) async fn refuse_in_body(
    req: &mut Request<ProxyBody>,
    catalog: &Catalog,
    target: &Target,
    limit: usize,
) -> Result<Option<Finding>, ProxyError> {
    if !target.method.as_str().eq_ignore_ascii_case("POST") {
        return Ok(None);
    }
    let readings = Readings::of(req.headers().get(CONTENT_TYPE).map(|v| v.as_bytes()));
    if readings == Readings::default() || !serves_tools(catalog, &target.host.to_string()) {
        return Ok(None);
    }
    if readings.json || readings.form {
        let bytes = read_body(req, limit).await?;
        *req.body_mut() = body::full(bytes.clone());
        let in_json = readings.json
            && serde_json::from_slice::<Map<String, Value>>(&bytes)
                .is_ok_and(|members| members.keys().any(|key| is_method_override(key)));
        if in_json || (readings.form && FormKeys::name_override(&bytes)) {
            return Err(refused("the body"));
        }
    }
    if !(readings.untyped_form || readings.multipart) {
        return Ok(None);
    }
    let declared = declared_length(req.headers());
    let body = std::mem::replace(req.body_mut(), body::empty());
    let (body, finding) = watch::watched(body, declared, readings.untyped_form, readings.multipart);
    *req.body_mut() = body;
    Ok(Some(finding))
}

/// `%XX` decoding of bytes; a malformed escape is kept as it is (as form parsers do).
fn percent_decoded(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = (bytes[i] == b'%')
            .then(|| Some((hex(*bytes.get(i + 1)?)?, hex(*bytes.get(i + 2)?)?)))
            .flatten();
        match escaped {
            Some((hi, lo)) => {
                out.push(hi << 4 | lo);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    out
}

/// The value of one hex digit.
fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// What a `R` finds in `text` read whole, checked to be what it finds read in every
    /// split into two pieces and byte by byte.
    pub(crate) fn read_every_way<R: Reader + Default>(text: &str) -> bool {
        let bytes = text.as_bytes();
        let mut reader = R::default();
        let whole = reader.push(bytes) | reader.finish();
        for cut in 0..=bytes.len() {
            let mut reader = R::default();
            let split = reader.push(&bytes[..cut]) | reader.push(&bytes[cut..]) | reader.finish();
            assert_eq!(split, whole, "{text:?} cut at {cut}");
        }
        let mut reader = R::default();
        let bytewise = bytes.iter().any(|b| reader.push(&[*b])) | reader.finish();
        assert_eq!(bytewise, whole, "{text:?} byte by byte");
        whole
    }

    #[test]
    fn every_name_a_framework_reads_as_method_is_an_override() {
        for key in [
            "_method",
            "_METHOD",
            " _method ",
            "\u{a0}_method",
            ".method",
            "[method",
            "_method[]",
            "_method[x]",
            "_method\0junk",
            ".Method\0",
        ] {
            assert!(is_method_override(key), "{key:?}");
        }
        for key in [
            "method",
            "payment_method",
            "_methods",
            "x_method",
            "[method]",
            "-method",
            "_meth od",
            "",
            "\0_method",
        ] {
            assert!(!is_method_override(key), "{key:?}");
        }
        // Bytes that are not UTF-8 are trimmed of ASCII blanks only.
        assert!(names_override(b" _method[\xff]"));
        assert!(!names_override(b"\xff_method"));
    }

    #[test]
    fn content_types_are_read_every_way_a_framework_reads_them() {
        let of = |ct: Option<&str>| Readings::of(ct.map(str::as_bytes));
        assert_eq!(
            of(None),
            Readings {
                untyped_form: true,
                ..Readings::default()
            }
        );
        assert!(of(Some("")).untyped_form);
        assert!(of(Some(" ; charset=utf-8")).untyped_form);
        assert!(of(Some("Application/X-WWW-Form-Urlencoded")).form);
        assert!(of(Some("application/x-www-form-urlencoded, text/plain")).form);
        assert!(of(Some("application/x-www-form-urlencoded foo")).form);
        assert!(of(Some("text/plain; x=/json")).json);
        assert!(of(Some("application/vnd.api+json")).json);
        assert!(of(Some("multipart/form-data; boundary=x")).multipart);
        assert!(of(Some("multipart/mixed")).multipart);
        assert_eq!(of(Some("application/x-ndjson")), Readings::default());
        assert_eq!(of(Some("application/octet-stream")), Readings::default());
        assert_eq!(of(Some("text/plain")), Readings::default());
    }

    #[test]
    fn percent_decoding_keeps_what_is_not_an_escape() {
        assert_eq!(percent_decoded(b"%5Fmethod"), b"_method");
        assert_eq!(percent_decoded(b"%5fmethod%"), b"_method%");
        assert_eq!(percent_decoded(b"%zz%4"), b"%zz%4");
    }
}
