//! The OpenAI-style error every failed request gets: an HTTP status and the
//! body `{"error": {"message", "type", "param", "code"}}`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

/// An error response: status, OpenAI error type, message, offending parameter.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// The OpenAI error type (`invalid_request_error`, `not_found_error`, ...).
    pub kind: &'static str,
    /// A full sentence saying what is wrong.
    pub message: String,
    /// The request field at fault, when there is one.
    pub param: Option<String>,
    /// A machine-readable code (`model_not_found`, `context_length_exceeded`, ...).
    pub code: Option<&'static str>,
}

impl ApiError {
    /// A 400 about `param`.
    pub fn invalid(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            message: message.into(),
            param: Some(param.to_string()),
            code: None,
        }
    }

    /// A 400 about the request as a whole (malformed JSON, a missing field).
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            message: message.into(),
            param: None,
            code: None,
        }
    }

    /// A 404 for a model this server does not serve.
    pub fn unknown_model(name: &str, served: &str) -> ApiError {
        ApiError {
            status: StatusCode::NOT_FOUND,
            kind: "not_found_error",
            message: format!("The model `{name}` does not exist; this server serves `{served}`."),
            param: Some("model".into()),
            code: Some("model_not_found"),
        }
    }

    /// A 429: the admission queue is full.
    pub fn overloaded(queue_limit: usize) -> ApiError {
        ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            kind: "rate_limit_error",
            message: format!(
                "The server is overloaded: {queue_limit} requests are already waiting; retry later."
            ),
            param: None,
            code: Some("queue_full"),
        }
    }

    /// A 503: the server is shutting down or its engine is gone.
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            kind: "service_unavailable",
            message: message.into(),
            param: None,
            code: None,
        }
    }

    /// A 500: the engine failed while running the request.
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            kind: "internal_error",
            message: message.into(),
            param: None,
            code: None,
        }
    }

    /// The error object (`{"message", "type", "param", "code"}`).
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "error": self.body() }).to_string();
        (self.status, [(axum::http::header::CONTENT_TYPE, "application/json")], body).into_response()
    }
}

/// Parses a request body, turning serde's message into a 400.
pub fn parse_json<'a, R: Deserialize<'a>>(body: &'a [u8]) -> Result<R, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("The request body is not a valid request: {e}.")))
}
