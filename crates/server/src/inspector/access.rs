//! Who is looking: the inspector's callers are authenticated by the token
//! file, as gRPC callers are, and see what their tenant may see.
//!
//! A script sends `authorization: Bearer <token>`. A browser cannot send
//! that header with a link or an `EventSource`, so the login form posts
//! the token once and the answer sets it as a cookie that only these
//! pages receive (`HttpOnly`, `SameSite=Strict`, `Path=/inspect`, and
//! `Secure` over TLS). Every role may read: the inspector changes nothing.

use std::sync::Arc;

use axum::http::{HeaderMap, HeaderValue, header};

use crate::auth::{self, Tokens};
use crate::tenant::Caller;

/// The cookie that carries the token.
pub(crate) const COOKIE: &str = "ctxbroker_token";
/// The longest token the login form takes, in bytes.
pub(crate) const MAX_TOKEN_BYTES: usize = 512;

/// How the inspector's callers are known.
#[derive(Debug, Clone)]
pub(crate) enum Access {
    /// No token file: every caller is an operator, as on gRPC.
    Open,
    /// The token file decides.
    Tokens(Arc<Tokens>),
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refused(pub String);

impl Access {
    /// Whether callers must log in.
    pub(crate) fn required(&self) -> bool {
        matches!(self, Access::Tokens(_))
    }

    /// The caller of a request with `headers`: from its bearer token, or
    /// else from the login cookie.
    pub(crate) fn caller(&self, headers: &HeaderMap) -> Result<Caller, Refused> {
        let Access::Tokens(tokens) = self else {
            return Ok(Caller::open());
        };
        let token = match headers.contains_key(header::AUTHORIZATION) {
            true => auth::bearer_token(headers).map_err(|err| Refused(err.to_string()))?,
            false => cookie(headers).ok_or_else(|| {
                Refused(
                    "no credentials: log in, or send `authorization: Bearer <token>`".to_owned(),
                )
            })?,
        };
        known(tokens, token)
    }

    /// The caller a token stands for.
    pub(crate) fn login(&self, token: &str) -> Result<Caller, Refused> {
        match self {
            Access::Open => Ok(Caller::open()),
            Access::Tokens(tokens) => known(tokens, token),
        }
    }
}

/// The caller the token file has for `token`.
fn known(tokens: &Tokens, token: &str) -> Result<Caller, Refused> {
    tokens
        .table()
        .caller(token)
        .ok_or_else(|| Refused("unknown token: it is not in the daemon's token file".to_owned()))
}

/// The login cookie's value, when the request carries one.
fn cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|line| line.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.trim())
        .filter(|value| !value.is_empty())
}

/// The `Set-Cookie` value that logs a browser in with `token` (already
/// checked: visible ASCII without `;`), or out with `None`.
pub(crate) fn set_cookie(token: Option<&str>, secure: bool) -> Option<HeaderValue> {
    let secure = if secure { "; Secure" } else { "" };
    let value = match token {
        Some(token) => {
            format!("{COOKIE}={token}; Path=/inspect; HttpOnly; SameSite=Strict{secure}")
        }
        None => format!("{COOKIE}=; Path=/inspect; HttpOnly; SameSite=Strict; Max-Age=0{secure}"),
    };
    HeaderValue::from_str(&value).ok()
}

/// Whether a token can travel in a cookie: visible ASCII, no separator,
/// within [`MAX_TOKEN_BYTES`].
pub(crate) fn cookie_safe(token: &str) -> bool {
    !token.is_empty()
        && token.len() <= MAX_TOKEN_BYTES
        && token
            .bytes()
            .all(|b| b.is_ascii_graphic() && !matches!(b, b';' | b',' | b'"' | b'\\'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    #[test]
    fn the_cookie_is_found_among_others() {
        let h = headers(&[("cookie", "a=1; ctxbroker_token=abc ; b=2")]);
        assert_eq!(cookie(&h), Some("abc"));
        assert_eq!(cookie(&headers(&[("cookie", "ctxbroker_token=")])), None);
        assert_eq!(cookie(&headers(&[("cookie", "other=1")])), None);
    }

    #[test]
    fn only_plain_tokens_travel_in_cookies() {
        assert!(cookie_safe("ctxb_0123-abc"));
        assert!(!cookie_safe(""));
        assert!(!cookie_safe("a;b"));
        assert!(!cookie_safe("a b"));
        assert!(!cookie_safe(&"x".repeat(MAX_TOKEN_BYTES + 1)));
    }

    #[test]
    fn cookies_are_scoped_and_hidden_from_scripts() {
        let set = set_cookie(Some("t0k"), true).unwrap();
        let set = set.to_str().unwrap();
        for part in [
            "ctxbroker_token=t0k",
            "Path=/inspect",
            "HttpOnly",
            "SameSite=Strict",
            "Secure",
        ] {
            assert!(set.contains(part), "{set}");
        }
        let out = set_cookie(None, false).unwrap();
        assert!(out.to_str().unwrap().contains("Max-Age=0"));
        assert!(!out.to_str().unwrap().contains("Secure"));
    }
}
