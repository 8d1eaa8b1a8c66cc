//! The page: one HTML file, its script and its style sheet, embedded in the binary.

use axum::http::header;
use axum::response::IntoResponse;

const INDEX: &str = include_str!("page/index.html");
const SCRIPT: &str = include_str!("page/app.js");
const STYLE: &str = include_str!("page/style.css");

/// Nothing the page loads comes from elsewhere, and it is never framed.
const POLICY: &str = "default-src 'self'; img-src 'self' data: blob:; style-src 'self'; \
                      script-src 'self'; frame-ancestors 'none'";

pub(crate) async fn index() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CONTENT_SECURITY_POLICY, POLICY),
        ],
        INDEX,
    )
}

pub(crate) async fn script() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        SCRIPT,
    )
}

pub(crate) async fn style() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE)
}
