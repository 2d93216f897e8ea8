//! Phase `authenticate`: the session token in `Proxy-Authorization` → the [`Principal`].
//!
//! Both forms of docs/design.md §5 are accepted: `Basic base64("<anything>:<token>")`, so that
//! `HTTPS_PROXY=http://agent:<token>@host:port` works in every client, and `Bearer <token>`.

use std::sync::Arc;

use base64::Engine;
use http::header::PROXY_AUTHORIZATION;
use http::HeaderMap;

use crate::error::ProxyError;
use crate::session::{Principal, SessionError, SessionRegistry};

/// Authenticate the caller of a request that carries `Proxy-Authorization`.
pub async fn principal(
    sessions: &SessionRegistry,
    headers: &HeaderMap,
) -> Result<Arc<Principal>, ProxyError> {
    let mut values = headers.get_all(PROXY_AUTHORIZATION).iter();
    let value = values
        .next()
        .ok_or_else(|| ProxyError::unauthenticated("missing Proxy-Authorization"))?;
    if values.next().is_some() {
        return Err(ProxyError::unauthenticated(
            "more than one Proxy-Authorization header",
        ));
    }
    let value = value
        .to_str()
        .map_err(|e| ProxyError::unauthenticated(format!("Proxy-Authorization: {e}")))?;
    let token = token_of(value)?;
    sessions.authenticate(&token).await.map_err(|e| match e {
        SessionError::Token(t) => ProxyError::unauthenticated(t.to_string()),
        SessionError::NotActive(_) => {
            ProxyError::unauthenticated("the session is not active (revoked or expired)")
        }
        // The store could not say whether a session another replica made is live: that is
        // not the agent's fault, and not a yes either.
        SessionError::Store(e) => ProxyError::StateUnavailable {
            component: "store",
            reason: e.to_string(),
        },
        other => ProxyError::unauthenticated(other.to_string()),
    })
}

fn token_of(value: &str) -> Result<String, ProxyError> {
    let (scheme, rest) = value
        .split_once(' ')
        .ok_or_else(|| ProxyError::unauthenticated("Proxy-Authorization has no scheme"))?;
    let rest = rest.trim();
    if scheme.eq_ignore_ascii_case("bearer") {
        return Ok(rest.to_owned());
    }
    if scheme.eq_ignore_ascii_case("basic") {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(rest)
            .map_err(|e| ProxyError::unauthenticated(format!("Basic credentials: {e}")))?;
        let decoded = String::from_utf8(decoded)
            .map_err(|e| ProxyError::unauthenticated(format!("Basic credentials: {e}")))?;
        let (_user, password) = decoded
            .split_once(':')
            .ok_or_else(|| ProxyError::unauthenticated("Basic credentials need user:token"))?;
        return Ok(password.to_owned());
    }
    Err(ProxyError::unauthenticated(
        "Proxy-Authorization must be Basic or Bearer",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_and_bearer() {
        let basic = base64::engine::general_purpose::STANDARD.encode("agent:tok.en");
        assert_eq!(token_of(&format!("Basic {basic}")).unwrap(), "tok.en");
        assert_eq!(token_of("Bearer abc").unwrap(), "abc");
        assert!(token_of("Digest abc").is_err());
        assert!(token_of("Basic !!!").is_err());
        let no_colon = base64::engine::general_purpose::STANDARD.encode("token");
        assert!(token_of(&format!("Basic {no_colon}")).is_err());
    }
}
