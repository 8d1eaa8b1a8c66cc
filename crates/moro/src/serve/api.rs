//! The routes: the page, and the JSON API (docs/serve.md). Every API answer is what the
//! command prints with `--json` (or the picture `--svg` writes).

use std::sync::{Arc, OnceLock};

use axum::Router;
use axum::body::Bytes;
use axum::extract::DefaultBodyLimit;
use axum::extract::rejection::BytesRejection;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use super::error::ApiError;
use super::page;
use super::recent::{Recent, key_of};
use super::request::parse;
use crate::commands;
use crate::output::captured;

/// The largest request body, in bytes (a recipe is a few kilobytes).
pub(crate) const MAX_BODY: usize = 256 * 1024;

/// What every request shares.
#[derive(Debug)]
pub(crate) struct State {
    /// `moro hardware --json` of this machine, probed once.
    detected: OnceLock<Value>,
    /// The server listens on loopback only: requests must name this machine.
    loopback: bool,
    /// The last fit searches, with the notes they printed.
    fits: Recent<Arc<(commands::fit::Found, Vec<String>)>>,
}

impl State {
    pub(crate) fn new(loopback: bool) -> Arc<Self> {
        Arc::new(Self {
            detected: OnceLock::new(),
            loopback,
            fits: Recent::new(32),
        })
    }
}

type Shared = axum::extract::State<Arc<State>>;

/// The page and the API.
pub(crate) fn router(state: Arc<State>) -> Router {
    Router::new()
        .route("/", get(page::index))
        .route("/app.js", get(page::script))
        .route("/style.css", get(page::style))
        .route("/api/models", get(models))
        .route("/api/hardware", get(hardware))
        .route("/api/estimate", post(estimate))
        .route("/api/estimate.svg", post(estimate_svg))
        .route("/api/fit", post(fit))
        .route("/api/fit.svg", post(fit_svg))
        .route("/api/recipe", post(recipe))
        .route("/api/recipe.yaml", post(recipe_yaml))
        .route("/api/export", post(export))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            same_machine,
        ))
        .with_state(state)
}

/// Refuses what a web page elsewhere could make the user's browser send: a `Host` that is not
/// this machine's, on a loopback server (DNS rebinding), and a `POST` that is not JSON (a
/// cross-site form or `text/plain` fetch needs no CORS preflight; JSON does, and none is
/// granted).
async fn same_machine(
    state: Shared,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if state.loopback && !loopback_host(request.headers().get(header::HOST)) {
        return ApiError::bad(
            "the Host header does not name this machine (127.0.0.1, localhost or [::1])",
            None,
        )
        .with_status(StatusCode::FORBIDDEN)
        .into_response();
    }
    let json = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.trim_start()
                .to_ascii_lowercase()
                .starts_with("application/json")
        });
    if request.method() == axum::http::Method::POST && !json {
        return ApiError::bad("send the body as `Content-Type: application/json`", None)
            .with_status(StatusCode::UNSUPPORTED_MEDIA_TYPE)
            .into_response();
    }
    next.run(request).await
}

/// Whether a `Host` header names this machine: `127.0.0.1`, `[::1]` or `localhost`, with
/// any port.
fn loopback_host(host: Option<&header::HeaderValue>) -> bool {
    let Some(h) = host.and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let name = match h.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or_default(),
        None => h.rsplit_once(':').map_or(h, |(n, _)| n),
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

async fn not_found() -> Response {
    ApiError::bad("no such page or API route; the API is under /api/", None)
        .with_status(StatusCode::NOT_FOUND)
        .into_response()
}

/// Runs `f` on the blocking pool; a panic is a 500, not a dead server.
async fn blocking(f: impl FnOnce() -> Result<Response, ApiError> + Send + 'static) -> Response {
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => e.into_response(),
        Err(_) => ApiError::bad(
            "the request failed inside moro (a bug: please report it)",
            None,
        )
        .with_status(StatusCode::INTERNAL_SERVER_ERROR)
        .into_response(),
    }
}

/// The body as JSON (an empty body is `{}`).
fn body_of(body: Result<Bytes, BytesRejection>) -> Result<Value, ApiError> {
    let bytes = body.map_err(|r| {
        let message = if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            format!("the body is larger than {MAX_BODY} bytes")
        } else {
            format!("cannot read the body: {}", r.body_text())
        };
        ApiError::bad(message, None).with_status(r.status())
    })?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(json!({}));
    }
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad(format!("the body is not JSON: {e}"), None))
}

fn with_type(content_type: &'static str, body: String) -> Response {
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

/// The header that carries what the command printed on stderr (its notes and warnings),
/// one per line, percent-encoded as `encodeURIComponent` does.
pub(crate) const NOTES_HEADER: &str = "moro-notes";

/// `body` as `content_type`, with the command's notes in [`NOTES_HEADER`].
fn respond(content_type: &'static str, body: String, notes: &[String]) -> Response {
    let mut r = with_type(content_type, body);
    if !notes.is_empty()
        && let Ok(v) = header::HeaderValue::from_str(&percent_encode(&notes.join("\n")))
    {
        r.headers_mut().insert(NOTES_HEADER, v);
    }
    r
}

/// Percent-encoding of everything but `encodeURIComponent`'s unreserved characters.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.!~*'()".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Runs a command with its output collected: its stdout as `content_type` with its notes,
/// or its error as an answer.
fn command(
    content_type: &'static str,
    run: impl FnOnce() -> anyhow::Result<std::process::ExitCode>,
) -> Result<Response, ApiError> {
    let (result, out) = captured(run);
    result.map_err(|e| ApiError::from_command(&e))?;
    Ok(respond(content_type, out.stdout, &out.notes))
}

async fn models() -> Response {
    blocking(|| {
        let args = parse::<commands::models::ModelsArgs>("models", &json!({}), &["--json"])?;
        command("application/json", || commands::models::run(&args))
    })
    .await
}

async fn hardware(state: Shared) -> Response {
    let state = state.0.clone();
    blocking(move || {
        let detected = state
            .detected
            .get_or_init(|| {
                let detection = moro_gpu::detect(&moro_gpu::DetectOptions::default());
                commands::hardware::render(&detection, true)
                    .ok()
                    .and_then(|(out, _)| serde_json::from_str(&out).ok())
                    .unwrap_or_else(|| json!([]))
            })
            .clone();
        let presets: Vec<Value> = moro_core::hardware::presets()
            .iter()
            .filter_map(|p| {
                let d = p.to_device(None)?;
                Some(json!({
                    "preset": p.id,
                    "name": d.name,
                    "vendor": p.vendor.as_str(),
                    "memory_bytes": d.total_bytes,
                }))
            })
            .collect();
        Ok(axum::Json(json!({"detected": detected, "presets": presets})).into_response())
    })
    .await
}

async fn estimate(body: Result<Bytes, BytesRejection>) -> Response {
    blocking(move || {
        let args =
            parse::<commands::estimate::EstimateArgs>("estimate", &body_of(body)?, &["--json"])?;
        command("application/json", || commands::estimate::run(&args))
    })
    .await
}

async fn estimate_svg(body: Result<Bytes, BytesRejection>) -> Response {
    blocking(move || {
        let args = parse::<commands::estimate::EstimateArgs>("estimate", &body_of(body)?, &[])?;
        let (svg, out) = captured(|| -> anyhow::Result<String> {
            let (setup, _) = commands::estimate::setup_of(&args, None)?;
            let est = setup.estimate()?;
            Ok(crate::charts::estimate_svg(&setup, &est))
        });
        svg.map(|s| respond("image/svg+xml", s, &out.notes))
            .map_err(|e| ApiError::from_command(&e))
    })
    .await
}

/// The fit search of `body`, from the last few when it was made already.
fn found(
    state: &State,
    body: &Value,
    args: &commands::fit::FitArgs,
) -> Result<Arc<(commands::fit::Found, Vec<String>)>, ApiError> {
    state.fits.get_or(key_of(body), || {
        let (found, out) = captured(|| commands::fit::find(args));
        let f = found.map_err(|e| ApiError::from_command(&e))?;
        Ok(Arc::new((f, out.notes)))
    })
}

async fn fit(state: Shared, body: Result<Bytes, BytesRejection>) -> Response {
    let state = state.0.clone();
    blocking(move || {
        let v = body_of(body)?;
        let args = parse::<commands::fit::FitArgs>("fit", &v, &["--json"])?;
        let kept = found(&state, &v, &args)?;
        let (result, out) = captured(|| commands::fit::print(&args, &kept.0));
        result.map_err(|e| ApiError::from_command(&e))?;
        Ok(respond("application/json", out.stdout, &kept.1))
    })
    .await
}

async fn fit_svg(state: Shared, body: Result<Bytes, BytesRejection>) -> Response {
    let state = state.0.clone();
    blocking(move || {
        let v = body_of(body)?;
        let args = parse::<commands::fit::FitArgs>("fit", &v, &[])?;
        let kept = found(&state, &v, &args)?;
        let f = &kept.0;
        let svg = crate::charts::fit_svg(f.title(args.seq_len), &f.fits, &f.not);
        Ok(respond("image/svg+xml", svg, &kept.1))
    })
    .await
}

async fn recipe(body: Result<Bytes, BytesRejection>) -> Response {
    blocking(move || {
        let args = parse::<commands::recipe::GenerateArgs>("recipe", &body_of(body)?, &["--json"])?;
        command("application/json", || commands::recipe::run_generate(&args))
    })
    .await
}

async fn recipe_yaml(body: Result<Bytes, BytesRejection>) -> Response {
    blocking(move || {
        let args = parse::<commands::recipe::GenerateArgs>("recipe", &body_of(body)?, &[])?;
        command("application/yaml", || commands::recipe::run_generate(&args))
    })
    .await
}

/// `{"recipe": "<moro.yaml text>", "to": "axolotl"}` → the files `moro recipe export` writes,
/// with their text.
async fn export(body: Result<Bytes, BytesRejection>) -> Response {
    blocking(move || {
        let v = body_of(body)?;
        let text = v.get("recipe").and_then(Value::as_str).ok_or_else(|| {
            ApiError::bad(
                "field `recipe`: the moro.yaml text is required",
                Some("recipe"),
            )
        })?;
        let to = v.get("to").and_then(Value::as_str).ok_or_else(|| {
            ApiError::bad("field `to`: the trainer format is required", Some("to"))
        })?;
        if let Some(k) = v
            .as_object()
            .and_then(|m| m.keys().find(|k| !["recipe", "to"].contains(&k.as_str())))
        {
            return Err(ApiError::bad(
                format!("unknown field `{k}`; the fields are: recipe, to"),
                Some(k),
            ));
        }
        let format = commands::export::parse_format(to)
            .map_err(|m| ApiError::bad(format!("field `to`: {m}"), Some("to")))?;
        let loaded =
            commands::recipe::LoadedRecipe::from_bytes("moro.yaml".into(), text.as_bytes())
                .map_err(|e| {
                    let mut a = ApiError::from_command(&e);
                    a.detail.field = Some("recipe".into());
                    a
                })?;
        let export = commands::export::export_as(&loaded, format, None)
            .map_err(|e| ApiError::from_command(&e))?;
        let files: Vec<Value> = export
            .files
            .iter()
            .map(|f| json!({"name": f.name, "content": f.content}))
            .collect();
        Ok(axum::Json(json!({
            "format": export.format,
            "files": files,
            "warnings": export.warnings,
            "launch": export.launch,
        }))
        .into_response())
    })
    .await
}
