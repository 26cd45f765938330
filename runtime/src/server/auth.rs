//! API keys: with a key configured, every `/v1/*` request must carry
//! `Authorization: Bearer <key>`; anything else is a 401 in OpenAI's error
//! format. The comparison takes the same time wherever the first wrong byte
//! is (`subtle`), so the key cannot be guessed byte by byte from response
//! times. `/health` and `/metrics` need no key (load balancers and
//! scrapers).

use super::AppState;
use super::error::ApiError;
use crate::error::{Error, Result};
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;
use subtle::ConstantTimeEq;

/// The key to require: `--api-key` if given, else the environment's
/// `TESSERA_API_KEY`; an empty key is a usage error (it would let every
/// request with an empty bearer token in while looking protected).
pub(super) fn key_from(flag: Option<String>, env: Option<String>) -> Result<Option<String>> {
    match flag.or(env) {
        Some(k) if k.is_empty() => {
            Err(Error::Usage("the API key (--api-key or TESSERA_API_KEY) is empty".into()))
        }
        Some(k) if k.chars().any(|c| c.is_whitespace() || c.is_control()) => {
            Err(Error::Usage("the API key (--api-key or TESSERA_API_KEY) contains white space".into()))
        }
        k => Ok(k),
    }
}

/// Whether `host` (the `--host` value) only accepts local connections.
pub(super) fn is_loopback(host: &str) -> bool {
    host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Whether a request to `path` needs the key.
fn guarded(path: &str) -> bool {
    path == "/v1" || path.starts_with("/v1/")
}

/// Whether the request's `Authorization` header carries `key`.
fn authorized(req: &Request, key: &str) -> bool {
    let Some(given) = req.headers().get(AUTHORIZATION).and_then(|v| v.to_str().ok()) else { return false };
    let Some(token) = given.strip_prefix("Bearer ") else { return false };
    token.trim().as_bytes().ct_eq(key.as_bytes()).into()
}

/// The middleware: a 401 for a guarded request without the key.
pub(super) async fn require_key(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if let Some(key) = &st.api_key
        && guarded(req.uri().path())
        && !authorized(&req, key)
    {
        let missing = !req.headers().contains_key(AUTHORIZATION);
        let message = if missing {
            "This server needs an API key: send it as `Authorization: Bearer <key>`."
        } else {
            "Incorrect API key provided."
        };
        return ApiError {
            status: StatusCode::UNAUTHORIZED,
            kind: "invalid_request_error",
            message: message.into(),
            param: None,
            code: Some("invalid_api_key"),
        }
        .into_response();
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_come_from_the_flag_then_the_environment() {
        assert_eq!(key_from(Some("a".into()), Some("b".into())).unwrap(), Some("a".into()));
        assert_eq!(key_from(None, Some("b".into())).unwrap(), Some("b".into()));
        assert_eq!(key_from(None, None).unwrap(), None);
        assert!(matches!(key_from(Some(String::new()), None), Err(Error::Usage(_))));
        assert!(matches!(key_from(None, Some("a b".into())), Err(Error::Usage(_))));
    }

    #[test]
    fn loopback_hosts() {
        for h in ["127.0.0.1", "::1", "localhost", "127.0.0.2"] {
            assert!(is_loopback(h), "{h}");
        }
        for h in ["0.0.0.0", "::", "10.0.0.1", "example.org"] {
            assert!(!is_loopback(h), "{h}");
        }
        assert!(guarded("/v1/models") && guarded("/v1") && !guarded("/v10") && !guarded("/health"));
    }
}
