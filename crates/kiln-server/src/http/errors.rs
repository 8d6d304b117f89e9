//! Error responses: the OpenAI error object and its status, for refusals, engine errors and
//! bodies axum could not read.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use kiln_engine::SubmitError;

use super::ServerState;
use crate::api::ApiError;
use crate::engine::EngineCallError;
use crate::responses::ErrorBody;

/// An error response: the OpenAI error object, with `Retry-After` on a 429.
pub struct Failure {
    pub(super) error: ApiError,
    retry_after: Option<u64>,
}

impl From<ApiError> for Failure {
    fn from(error: ApiError) -> Self {
        Failure {
            error,
            retry_after: None,
        }
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.error.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut resp = (status, Json(ErrorBody::from(&self.error))).into_response();
        if let Some(secs) = self.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}

pub(super) fn server_error(message: impl Into<String>) -> Failure {
    ApiError {
        status: 500,
        message: message.into(),
        kind: "server_error",
        param: None,
        code: None,
    }
    .into()
}

pub(super) fn engine_failure(
    e: EngineCallError,
    state: &ServerState,
    prompt_param: &str,
) -> Failure {
    match e {
        EngineCallError::Refused(SubmitError::QueueFull(n)) => Failure {
            error: ApiError {
                status: 429,
                message: format!(
                    "the server is busy ({n} requests waiting); retry after {} s",
                    state.retry_after_secs
                ),
                kind: "rate_limit_error",
                param: None,
                code: Some("queue_full"),
            },
            retry_after: Some(state.retry_after_secs),
        },
        EngineCallError::Refused(SubmitError::PromptTooLong { prompt, context }) => {
            context_exceeded(prompt_param, prompt, context)
        }
        EngineCallError::Refused(
            e @ (SubmitError::PromptTooLarge { .. }
            | SubmitError::EmptyPrompt
            | SubmitError::BadToken { .. }),
        ) => ApiError::invalid(prompt_param, e.to_string()).into(),
        EngineCallError::Refused(e @ (SubmitError::NoTokens | SubmitError::Sampling(_))) => {
            ApiError::bad_body(e.to_string()).into()
        }
        EngineCallError::Input(m) => ApiError::invalid(prompt_param, m).into(),
        EngineCallError::Stopped | EngineCallError::Failed(_) => server_error(e.to_string()),
    }
}

pub(super) fn context_exceeded(param: &str, prompt: usize, context: usize) -> Failure {
    let mut e = ApiError::invalid(
        param,
        format!(
            "the prompt has {prompt} tokens; this model's context holds {context} tokens, \
             including at least one generated token"
        ),
    );
    e.code = Some("context_length_exceeded");
    e.into()
}

/// The body bytes, or the OpenAI error for a body axum could not read (too large, broken).
pub(super) fn body_bytes(body: Result<Bytes, BytesRejection>) -> Result<Bytes, Failure> {
    body.map_err(|e| {
        let mut err = ApiError::bad_body(e.body_text());
        err.status = e.status().as_u16();
        err.into()
    })
}
