//! The rules a request can break and the answer written for them.
//!
//! Each rule's machine reason and client-facing sentence are declared on one line, so the
//! audit record and the `400`/`431` body can never disagree on what went wrong. The answer
//! is built here, not by hyper, because hyper never sees a refused request.

/// Declares [`Violation`]: one line per rule, with its machine reason and the sentence
/// shown to the client, so the two can never drift apart.
macro_rules! violations {
    ($($variant:ident => $reason:literal, $message:literal;)*) => {
        /// A framing rule the request broke; kept for the audit record.
        #[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
        pub enum Violation {
            $(#[error($message)] $variant,)*
        }

        impl Violation {
            #[cfg(test)]
            const ALL: &'static [Violation] = &[$(Self::$variant),*];

            /// Short machine reason, as sent in the `reason` field of the 400/431 body.
            pub fn reason(&self) -> &'static str {
                match self {
                    $(Self::$variant => $reason,)*
                }
            }
        }
    };
}

violations! {
    BareLf => "bare_lf", "The request has a line feed not preceded by a carriage return.";
    BareCr => "bare_cr", "The request has a carriage return not followed by a line feed.";
    Nul => "nul_byte", "The request head contains a NUL byte.";
    ObsFold => "obs_fold", "The request contains a folded (obs-fold) header line.";
    ClAndTe => "cl_and_te", "The request carries both Content-Length and Transfer-Encoding.";
    DuplicateContentLength => "duplicate_content_length",
        "The request carries more than one Content-Length header.";
    BadContentLength => "bad_content_length",
        "The Content-Length header is not a valid decimal length.";
    TeOnHttp10 => "te_on_http10", "Transfer-Encoding is not allowed on an HTTP/1.0 request.";
    TeNotChunked => "te_not_chunked", "The final transfer coding of the request is not chunked.";
    BadTransferEncoding => "bad_transfer_encoding",
        "The Transfer-Encoding header is empty or applies chunked more than once.";
    DuplicateHost => "duplicate_host", "The request carries more than one Host header.";
    InvalidHeaderName => "invalid_header_name", "A header name is not a valid token.";
    InvalidHeaderValue => "invalid_header_value",
        "A header value contains bytes that are not valid UTF-8 text.";
    MalformedRequestLine => "malformed_request_line", "The request line is malformed.";
    HeadTooLarge => "header_too_large", "The request head is larger than this proxy accepts.";
    TooManyHeaders => "too_many_headers",
        "The request carries more header fields than this proxy accepts.";
    BadChunkSize => "bad_chunk_size", "A chunk size is not a hexadecimal number.";
    ChunkSizeOverflow => "chunk_size_overflow", "A chunk size has more than 16 hex digits.";
    BadChunkExtension => "bad_chunk_extension", "A chunk extension is malformed or too long.";
    BadChunkTerminator => "bad_chunk_terminator", "Chunk data is not followed by CRLF.";
}

impl Violation {
    /// Status this violation earns when it is found in a request head.
    pub fn status(&self) -> u16 {
        match self {
            Self::HeadTooLarge | Self::TooManyHeaders => 431,
            _ => 400,
        }
    }
}

/// The messages are fixed sentences without `"` or `\` (a test holds them to it), so the
/// body needs no JSON escaping.
pub(super) fn rejection(v: &Violation, id: &str) -> Vec<u8> {
    let body = format!(
        r#"{{"error":"bad_request","message":"{v}","request_id":"{id}","reason":"{}"}}"#,
        v.reason()
    );
    let status = match v.status() {
        431 => "431 Request Header Fields Too Large",
        _ => "400 Bad Request",
    };
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nConnection: close\r\n\
         Ostiary-Request-Id: {id}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire_guard::testing::run;

    #[tokio::test]
    async fn rejection_is_exact_and_ends_the_stream() {
        let body = concat!(
            r#"{"error":"bad_request","message":"The request has a line feed not preceded "#,
            r#"by a carriage return.","request_id":"ID","reason":"bare_lf"}"#
        );
        let wire = format!(
            "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nConnection: close\r\n\
             Ostiary-Request-Id: ID\r\nContent-Length: {}\r\n\r\n{body}",
            body.len() - "ID".len() + 16
        );
        let out = run(b"GET / HTTP/1.1\nHost: h\r\n\r\n").await;
        assert_eq!(out, (vec![], wire, None, Some("bare_lf")));
    }

    #[test]
    fn messages_need_no_json_escaping() {
        for v in Violation::ALL {
            let message = v.to_string();
            assert!(!message.contains(['"', '\\']) && !message.chars().any(char::is_control));
        }
        assert_eq!(Violation::ALL.len(), 20);
    }
}
