//! [`Secret`]: a token the SDK holds (the admin token, a session token), kept out of every
//! `Debug` and every message.
//!
//! A client is the kind of value that ends up in a log line or a panic message
//! (`{client:?}`); the token inside it must not. [`redact`] does the same for text the SDK
//! quotes but did not write itself (an answer that is not JSON, a transport error), because
//! a misconfigured server or an error that names a URL could echo the very token sent.

use std::fmt;

/// A token: `Debug` prints `***`, only [`Secret::expose`] gives the text.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Secret(String);

impl Secret {
    /// `None` for an empty (or all-blank) token: "no token" has one spelling.
    pub(crate) fn new(text: impl Into<String>) -> Option<Self> {
        let text = text.into().trim().to_owned();
        (!text.is_empty()).then_some(Self(text))
    }

    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// `text` with every secret in it replaced by `***`. Secrets shorter than four characters
/// are left alone: replacing them would garble the text without protecting anything.
pub(crate) fn redact<'a>(text: &str, secrets: impl IntoIterator<Item = &'a str>) -> String {
    let mut out = text.to_owned();
    for secret in secrets {
        if secret.len() >= 4 {
            out = out.replace(secret, "***");
        }
    }
    out
}
