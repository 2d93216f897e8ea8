//! `/reflect`, the hostile upstream: it echoes whatever credential it received back in
//! headers, bodies, cookies, redirects, trailers and error pages, in every mode the parent
//! module's doc lists, so that the proxy's scrubbing is tested against each.

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use hyper::{Response, StatusCode};
use serde_json::json;
use std::convert::Infallible;
use std::time::Duration;

use super::routes::{chunked, plain_reflect_body, query_param, text};
use super::*;

/// Percent-encode everything but RFC 3986 unreserved characters.
fn percent_encode(raw: &str) -> String {
    raw.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

async fn compress(coding: &str, data: &[u8]) -> Vec<u8> {
    use async_compression::tokio::bufread::{BrotliEncoder, GzipEncoder, ZlibEncoder, ZstdEncoder};
    use tokio::io::AsyncReadExt;
    let mut out = Vec::new();
    let read = match coding {
        "gzip" => GzipEncoder::new(data).read_to_end(&mut out).await,
        "br" => BrotliEncoder::new(data).read_to_end(&mut out).await,
        "zstd" => ZstdEncoder::new(data).read_to_end(&mut out).await,
        // HTTP's `deflate` is the zlib format (RFC 9110 §8.4.1.2).
        "deflate" => ZlibEncoder::new(data).read_to_end(&mut out).await,
        other => unreachable!("no encoder for {other}"),
    };
    read.expect("compressing in memory");
    out
}

/// The hostile, reflecting upstream (see the module docs of the parent for the modes).
pub(super) async fn reflect(parts: &hyper::http::request::Parts, body: Bytes) -> Response<Body> {
    let query = parts.uri.query();
    let mode = query_param(query, "mode").unwrap_or("json");
    let authorization = parts
        .headers
        .get(hyper::header::AUTHORIZATION)
        .map(text)
        .unwrap_or_default();
    if mode == "plain" {
        let mut resp = Response::new(chunked(plain_reflect_body(), 7, Duration::ZERO));
        resp.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain"),
        );
        resp.headers_mut().insert(
            "x-plain",
            HeaderValue::from_static("ghp_CANARY_ not a secret"),
        );
        return resp;
    }

    // Every header the upstream received, in order, as (name, value) text pairs.
    let pairs: Vec<(String, String)> = parts
        .headers
        .iter()
        .map(|(n, v)| (n.as_str().to_owned(), text(v)))
        .collect();
    let echo = json!({
        "method": parts.method.as_str(),
        "uri": parts.uri.to_string(),
        "query": query,
        "headers": pairs.iter().map(|(n, v)| json!([n, v])).collect::<Vec<_>>(),
        "body": String::from_utf8_lossy(&body),
    })
    .to_string()
    .into_bytes();

    let mut headers = reflected_headers(&pairs, query, mode, &authorization);

    let delay = Duration::from_millis(
        query_param(query, "delay_ms")
            .and_then(|d| d.parse().ok())
            .unwrap_or(0),
    );
    let (status, content_type, encoding, payload, size) =
        reflected_payload(mode, parts, &pairs, echo, &authorization, &mut headers).await;
    let mut body = chunked(payload, size, delay);
    if mode == "trailers" {
        body = with_reflected_trailers(body, &pairs);
    }
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    if mode == "reason" {
        // HTTP/1.1 only: the reason phrase quotes the credential.
        if let Ok(reason) =
            hyper::ext::ReasonPhrase::try_from(format!("Echo {authorization}").into_bytes())
        {
            resp.extensions_mut().insert(reason);
        }
    }
    *resp.headers_mut() = headers;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static(content_type),
    );
    if mode == "encoding_upper" {
        let key = parts
            .headers
            .get("x-api-key")
            .map(text)
            .unwrap_or_default()
            .to_ascii_uppercase();
        if let Ok(value) = HeaderValue::from_str(&key) {
            resp.headers_mut()
                .insert(hyper::header::CONTENT_ENCODING, value);
        }
    }
    if let Some(encoding) = encoding {
        resp.headers_mut().insert(
            hyper::header::CONTENT_ENCODING,
            HeaderValue::from_str(encoding).expect("coding names are header-safe"),
        );
    }
    resp
}

/// The response headers `/reflect` echoes the request in: `authorization`, `cookie` and
/// `x-*` as `x-reflect-*`, the query, values as names (`mode=names`), a cookie carrying the
/// credential, and forged proxy headers (`mode=forge`).
fn reflected_headers(
    pairs: &[(String, String)],
    query: Option<&str>,
    mode: &str,
    authorization: &str,
) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, value) in pairs {
        if name == "authorization" || name == "cookie" || name.starts_with("x-") {
            add_header(&mut headers, format!("x-reflect-{name}"), value);
        }
    }
    if let Some(q) = query {
        add_header(&mut headers, "x-reflect-query".into(), q);
    }
    if mode == "names" {
        // Values turned into header *names*: a reflection a scrubber of values misses.
        for (name, value) in pairs {
            if name == "authorization" || name.starts_with("x-") {
                let token: String = value
                    .chars()
                    .filter(|c| c.is_ascii_alphanumeric() || "-_.".contains(*c))
                    .collect();
                add_header(&mut headers, format!("x-n-{token}"), "1");
            }
        }
    }
    add_header(
        &mut headers,
        "set-cookie".into(),
        &format!("s={authorization}; Path=/"),
    );
    if mode == "forge" {
        // An upstream dressing its answer as the proxy's own: a refusal's headers, which a
        // client (the SDKs) takes as the proxy speaking.
        for name in [
            "ostiary-request-id",
            "Ostiary-Approval",
            "OSTIARY-DUPLICATE",
        ] {
            add_header(&mut headers, name.into(), "forged-by-upstream");
        }
    }
    headers
}

/// Appends `name: value` when both are valid in a header (a reflection of what cannot be
/// one is left out).
fn add_header(headers: &mut HeaderMap, name: String, value: &str) {
    if let (Ok(name), Ok(value)) = (
        HeaderName::from_bytes(name.as_bytes()),
        HeaderValue::from_str(value),
    ) {
        headers.append(name, value);
    }
}

/// A `/reflect` answer's status, content type, coding, body and chunk count, by `mode`:
/// the echo as JSON, an event stream, compressed, base64, a redirect (its `location` added
/// to `headers`), an HTML error page, JSON with escaped slashes.
async fn reflected_payload<'m>(
    mode: &'m str,
    parts: &hyper::http::request::Parts,
    pairs: &[(String, String)],
    echo: Vec<u8>,
    authorization: &str,
    headers: &mut HeaderMap,
) -> (StatusCode, &'static str, Option<&'m str>, Vec<u8>, usize) {
    match mode {
        "sse" => {
            let mut events = Vec::new();
            for (name, value) in pairs {
                events.extend_from_slice(
                    format!("event: header\ndata: {name}: {value}\n\n").as_bytes(),
                );
            }
            events.extend_from_slice(b"event: end\ndata: done\n\n");
            (StatusCode::OK, "text/event-stream", None, events, 3)
        }
        "gzip" | "br" | "zstd" | "deflate" => {
            let compressed = compress(mode, &echo).await;
            (
                StatusCode::OK,
                "application/json",
                Some(mode),
                compressed,
                3,
            )
        }
        // `compress` (LZW) is a registered coding nobody implements any more: the proxy
        // cannot decode it, so it must refuse the body rather than pass it on.
        "compress" => (
            StatusCode::OK,
            "application/json",
            Some("compress"),
            echo,
            3,
        ),
        "b64" => {
            use base64::Engine;
            let encoded = base64::engine::general_purpose::STANDARD.encode(&echo);
            (StatusCode::OK, "text/plain", None, encoded.into_bytes(), 3)
        }
        "redirect" => {
            let authority = parts
                .uri
                .authority()
                .map(|a| a.to_string())
                .or_else(|| parts.headers.get(hyper::header::HOST).map(text))
                .unwrap_or_default();
            let port = authority
                .rsplit_once(':')
                .map(|(_, p)| p.to_owned())
                .unwrap_or_else(|| "443".into());
            let location = format!(
                "https://other.example.test:{port}/reflect?auth={}",
                percent_encode(authorization)
            );
            add_header(headers, "location".into(), &location);
            (StatusCode::FOUND, "application/json", None, echo, 3)
        }
        "error" => {
            let mut page = String::from(
                "<html><head><title>500 Internal Server Error</title></head><body>\n\
                 <h1>Internal Server Error</h1><p>While handling:</p><pre>\n",
            );
            page.push_str(&format!("{} {}\n", parts.method, parts.uri));
            for (name, value) in pairs {
                page.push_str(&format!("{name}: {value}\n"));
            }
            page.push_str("</pre></body></html>\n");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "text/html",
                None,
                page.into_bytes(),
                3,
            )
        }
        // JSON as PHP's json_encode writes it: `/` escaped as `\/`.
        "json_slashes" => {
            let text = String::from_utf8_lossy(&echo).replace('/', "\\/");
            (
                StatusCode::OK,
                "application/json",
                None,
                text.into_bytes(),
                3,
            )
        }
        // A coding named after the (uppercased) `x-api-key` the upstream received: a
        // value that differs from the secret only in case.
        "encoding_upper" => (StatusCode::OK, "application/json", None, echo, 3),
        _ => (StatusCode::OK, "application/json", None, echo, 3),
    }
}

/// `body` followed by trailers carrying the reflection again (h2 carries them; so does
/// chunked h1).
fn with_reflected_trailers(body: Body, pairs: &[(String, String)]) -> Body {
    let mut trailers = HeaderMap::new();
    for (name, value) in pairs {
        if name == "authorization" || name.starts_with("x-") {
            if let (Ok(n), Ok(v)) = (
                HeaderName::from_bytes(format!("x-trailer-{name}").as_bytes()),
                HeaderValue::from_str(value),
            ) {
                trailers.append(n, v);
            }
        }
    }
    let tail = futures_util::stream::iter([Ok::<_, Infallible>(Frame::trailers(trailers))]);
    let data = body.into_data_stream().map(|d| d.map(Frame::data));
    BodyExt::boxed_unsync(StreamBody::new(data.chain(tail)))
}
