//! API errors: the status, and the body `--json` prints for the same error
//! (`{"error": {"message", "field", "causes", "hint", "exit_code"}}`, `closest` for a model
//! that does not exist).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::error::UserError;

/// An error answered to a request.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) detail: Box<Detail>,
}

/// What an [`ApiError`] says.
#[derive(Debug)]
pub(crate) struct Detail {
    pub(crate) message: String,
    pub(crate) field: Option<String>,
    pub(crate) hint: Option<String>,
    /// The whole body, when it came from a command's error.
    body: Option<Value>,
}

impl ApiError {
    /// Bad input (400) about `field`.
    pub(crate) fn bad(message: impl Into<String>, field: Option<&str>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            detail: Box::new(Detail {
                message: message.into(),
                field: field.map(str::to_owned),
                hint: None,
                body: None,
            }),
        }
    }

    /// The same error answered with `status`.
    pub(crate) fn with_status(mut self, status: StatusCode) -> Self {
        self.status = status;
        self
    }

    /// A command's error: 404 for something named that does not exist, 400 for other input
    /// the user can fix, 500 for the rest.
    pub(crate) fn from_command(e: &anyhow::Error) -> Self {
        let user = e.downcast_ref::<UserError>();
        let status = match user {
            Some(u) if u.missing.is_some() => StatusCode::NOT_FOUND,
            Some(_) => StatusCode::BAD_REQUEST,
            None => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Self {
            status,
            detail: Box::new(Detail {
                message: e.to_string(),
                field: user.and_then(|u| u.field.clone()),
                hint: user.and_then(|u| u.hint.clone()),
                body: Some(crate::error::to_json(e)),
            }),
        }
    }

    fn body(&self) -> Value {
        let d = &self.detail;
        d.body.clone().unwrap_or_else(|| {
            json!({"error": {
                "message": d.message,
                "field": d.field,
                "causes": [],
                "hint": d.hint,
                "exit_code": 2,
            }})
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}
