//! What a webhook delivery is made of, read the way its trigger says: the signature scheme
//! from the config, the payload as JSON (a JSON body read strictly — a duplicate key is
//! refused, as the proxy refuses it everywhere — or a form, as Slack sends), and the
//! deduplication key from a header or a JSON pointer.

use std::time::Duration;

use http::HeaderMap;
use serde_json::{Map, Value};

use super::signature::{Algorithm, Encoding, HmacSpec, Scheme};
use crate::config::triggers::{Dedup, SchemeName, Signature};

/// The scheme a trigger's `signature` table describes.
pub fn scheme(config: &Signature) -> Result<Scheme, String> {
    let tolerance = config.tolerance;
    if tolerance.is_zero() || tolerance > Duration::from_secs(24 * 3600) {
        return Err("signature.tolerance must be more than 0 and at most 24h".into());
    }
    if config.secret.is_empty() {
        return Err("signature.secret names no credential".into());
    }
    let not_hmac = config.header.is_some()
        || config.algorithm.is_some()
        || config.encoding.is_some()
        || !config.prefix.is_empty()
        || config.timestamp_header.is_some();
    let scheme = match config.scheme {
        SchemeName::Github => Scheme::Github,
        SchemeName::Stripe => Scheme::Stripe { tolerance },
        SchemeName::Slack => Scheme::Slack { tolerance },
        SchemeName::Hmac => return hmac(config),
    };
    if not_hmac {
        return Err(
            "signature.header, algorithm, encoding, prefix and timestamp_header are for scheme = \"hmac\""
                .into(),
        );
    }
    Ok(scheme)
}

fn hmac(config: &Signature) -> Result<Scheme, String> {
    let header = config
        .header
        .as_deref()
        .ok_or("scheme = \"hmac\" needs signature.header")?;
    let header = http::HeaderName::try_from(header)
        .map_err(|e| format!("signature.header {header:?}: {e}"))?;
    let algorithm = match config.algorithm.as_deref().unwrap_or("sha256") {
        "sha256" => Algorithm::Sha256,
        "sha512" => Algorithm::Sha512,
        other => return Err(format!("signature.algorithm {other:?}: sha256 or sha512")),
    };
    let encoding = match config.encoding.as_deref().unwrap_or("hex") {
        "hex" => Encoding::Hex,
        "base64" => Encoding::Base64,
        other => return Err(format!("signature.encoding {other:?}: hex or base64")),
    };
    // `sign` writes the prefix into a header value and `verify` compares it as one.
    if !config.prefix.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("signature.prefix must be visible ASCII characters".into());
    }
    let timestamp_header = config
        .timestamp_header
        .as_deref()
        .map(|h| {
            http::HeaderName::try_from(h)
                .map_err(|e| format!("signature.timestamp_header {h:?}: {e}"))
        })
        .transpose()?;
    if timestamp_header.as_ref() == Some(&header) {
        return Err("signature.timestamp_header must differ from signature.header".into());
    }
    Ok(Scheme::Hmac(HmacSpec {
        header,
        algorithm,
        encoding,
        prefix: config.prefix.clone(),
        timestamp_header,
        tolerance: config.tolerance,
    }))
}

/// The payload of a delivery: a JSON body (strictly: duplicate or case-folded keys are
/// refused), or a form (`application/x-www-form-urlencoded`) as an object of strings.
pub fn payload(headers: &HeaderMap, body: &[u8]) -> Result<Value, String> {
    let kind = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json");
    let essence = kind
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    if essence == "application/x-www-form-urlencoded" {
        let mut object = Map::new();
        for (key, value) in url::form_urlencoded::parse(body) {
            if object
                .insert(key.clone().into_owned(), Value::String(value.into_owned()))
                .is_some()
            {
                return Err(format!("the form names {key:?} twice"));
            }
        }
        return Ok(Value::Object(object));
    }
    if essence != "application/json" && !essence.ends_with("+json") {
        return Err(format!("a payload is JSON or a form, not {essence:?}"));
    }
    crate::strict_json::parse(body).map_err(|e| format!("the payload is not JSON: {e}"))
}

/// The deduplication key: the header's value, or what the pointer finds (a string, or a
/// number as written).
pub fn dedup_key(dedup: &Dedup, headers: &HeaderMap, payload: &Value) -> Result<String, String> {
    let key = match (&dedup.header, &dedup.pointer) {
        (Some(name), _) => {
            let mut values = headers.get_all(name.as_str()).iter();
            match (values.next(), values.next()) {
                (Some(v), None) => v
                    .to_str()
                    .map(str::to_owned)
                    .map_err(|_| format!("the {name} header is not text"))?,
                (None, _) => return Err(format!("no {name} header to deduplicate by")),
                (Some(_), Some(_)) => return Err(format!("two {name} headers")),
            }
        }
        (None, Some(pointer)) => match payload.pointer(pointer) {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Number(n)) => n.to_string(),
            Some(_) => return Err(format!("{pointer} is not a string or a number")),
            None => return Err(format!("the payload has nothing at {pointer}")),
        },
        (None, None) => return Err("dedup names no header or pointer".into()),
    };
    if key.is_empty() || key.len() > 512 {
        return Err("the deduplication key is empty or longer than 512 bytes".into());
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn signature(scheme: SchemeName) -> Signature {
        Signature {
            scheme,
            secret: "s".into(),
            tolerance: Duration::from_secs(300),
            header: None,
            algorithm: None,
            encoding: None,
            prefix: String::new(),
            timestamp_header: None,
        }
    }

    #[test]
    fn schemes_come_from_the_config_and_hmac_fields_only_for_hmac() {
        assert!(matches!(
            scheme(&signature(SchemeName::Github)),
            Ok(Scheme::Github)
        ));
        assert!(matches!(
            scheme(&signature(SchemeName::Stripe)),
            Ok(Scheme::Stripe { .. })
        ));
        let mut wrong = signature(SchemeName::Github);
        wrong.header = Some("x-sig".into());
        assert!(scheme(&wrong)
            .unwrap_err()
            .contains("for scheme = \"hmac\""));
        let mut hmac = signature(SchemeName::Hmac);
        assert!(scheme(&hmac)
            .unwrap_err()
            .contains("needs signature.header"));
        hmac.header = Some("x-sig".into());
        hmac.algorithm = Some("md5".into());
        assert!(scheme(&hmac).unwrap_err().contains("sha256 or sha512"));
        hmac.algorithm = Some("sha512".into());
        hmac.encoding = Some("base64".into());
        assert!(matches!(scheme(&hmac), Ok(Scheme::Hmac(_))));
        let mut zero = signature(SchemeName::Slack);
        zero.tolerance = Duration::ZERO;
        assert!(scheme(&zero).is_err());
    }

    #[test]
    fn payloads_are_strict_json_or_forms() {
        let mut headers = HeaderMap::new();
        assert_eq!(
            payload(&headers, br#"{"ref":"main"}"#).unwrap()["ref"],
            "main"
        );
        assert!(payload(&headers, br#"{"ref":"a","ref":"b"}"#).is_err());
        assert!(payload(&headers, b"not json").is_err());
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/x-www-form-urlencoded"),
        );
        assert_eq!(payload(&headers, b"a=1&b=x%20y").unwrap()["b"], "x y");
        assert!(payload(&headers, b"a=1&a=2").unwrap_err().contains("twice"));
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain"),
        );
        assert!(payload(&headers, b"{}")
            .unwrap_err()
            .contains("JSON or a form"));
    }

    #[test]
    fn dedup_keys_come_from_one_header_or_a_pointer() {
        let by_header = Dedup {
            header: Some("x-github-delivery".into()),
            pointer: None,
            window: Duration::from_secs(60),
        };
        let mut headers = HeaderMap::new();
        let body = serde_json::json!({"id": 42, "deep": {"key": "k"}, "list": []});
        assert!(dedup_key(&by_header, &headers, &body)
            .unwrap_err()
            .contains("no x-github-delivery"));
        headers.append("x-github-delivery", HeaderValue::from_static("d-1"));
        assert_eq!(dedup_key(&by_header, &headers, &body).unwrap(), "d-1");
        headers.append("x-github-delivery", HeaderValue::from_static("d-2"));
        assert!(dedup_key(&by_header, &headers, &body)
            .unwrap_err()
            .contains("two"));
        let pointer = |p: &str| Dedup {
            header: None,
            pointer: Some(p.into()),
            window: Duration::from_secs(60),
        };
        assert_eq!(dedup_key(&pointer("/id"), &headers, &body).unwrap(), "42");
        assert_eq!(
            dedup_key(&pointer("/deep/key"), &headers, &body).unwrap(),
            "k"
        );
        assert!(dedup_key(&pointer("/list"), &headers, &body).is_err());
        assert!(dedup_key(&pointer("/nope"), &headers, &body).is_err());
    }
}
