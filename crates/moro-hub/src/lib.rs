//! moro-hub: models from the Hugging Face Hub and from local files, header bytes only.
//!
//! This is moro's I/O edge for model files; the parsing itself is pure
//! ([`moro_core::formats`]). It follows the Hub client conventions so moro shares state with
//! the Python tools:
//!
//! - [`HubSettings`]: `HF_ENDPOINT`, `HF_HOME`, `HF_HUB_CACHE`, `HF_TOKEN` / token file,
//!   `HF_HUB_OFFLINE`, resolved from an injectable environment lookup.
//! - [`cache`]: the standard cache layout (`models--org--name/{refs,blobs,snapshots}`), read
//!   before any network access and written after each full-file fetch.
//! - [`HubClient`]: `config.json`, `model.safetensors.index.json`, and the safetensors / GGUF
//!   headers through HTTP `Range` requests, never the weights. Redirects are followed by hand
//!   so the token goes only to the endpoint's own origin.
//! - [`local`]: a directory or file on disk (safetensors, single or sharded, or GGUF).
//!
//! Nothing here prints; progress goes through a [`Progress`] callback and the token is never
//! part of an error, a `Debug` output or a log line.

pub mod cache;
mod client;
pub mod local;
mod settings;

use std::path::PathBuf;

pub use cache::{RepoRef, find_cached, find_cached_dataset, find_cached_lenient, store_in_cache};
pub use client::{HubClient, RemoteSafetensors};
pub use local::{LocalModel, model_dir_files};
pub use settings::{DEFAULT_ENDPOINT, DEFAULT_TIMEOUT_SECS, HubSettings, Token};

/// Progress events for a spinner or progress line (the caller decides how to draw them).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProgressEvent<'a> {
    /// A request is starting.
    Fetching {
        /// Repo id.
        repo: &'a str,
        /// File name.
        file: &'a str,
        /// Requested byte range, when partial.
        range: Option<(u64, u64)>,
    },
    /// A file was found in the local cache.
    Cached {
        /// Repo id.
        repo: &'a str,
        /// File name.
        file: &'a str,
    },
    /// A request finished.
    Done {
        /// File name.
        file: &'a str,
        /// Bytes received.
        bytes: u64,
    },
}

/// A progress callback.
pub type Progress = std::sync::Arc<dyn Fn(&ProgressEvent<'_>) + Send + Sync>;

/// Why a model could not be fetched or read. Messages are one line and never contain the
/// token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HubError {
    /// Not an `org/name[@revision]`.
    #[error("invalid model id `{repo}`: {why}")]
    InvalidRepo {
        /// What was given.
        repo: String,
        /// What is wrong.
        why: String,
    },
    /// A file name that cannot be used as a path (from an index, or given).
    #[error("refusing unsafe file name `{0}`")]
    InvalidFile(String),
    /// 401/403.
    #[error(
        "`{repo}` is gated or private; {}",
        if *token_sent {
            "your token has no access to it: request access on its Hub page, or check HF_TOKEN"
        } else {
            "set HF_TOKEN or run `huggingface-cli login`"
        }
    )]
    Gated {
        /// Repo id.
        repo: String,
        /// Whether a token was sent.
        token_sent: bool,
    },
    /// The repo does not exist, or is private and no token was sent (HF
    /// `X-Error-Code: RepoNotFound`, with status 404 or 401).
    #[error(
        "model `{repo}` not found on {endpoint} (a private repo answers the same without a token)"
    )]
    RepoNotFound {
        /// Repo id.
        repo: String,
        /// The Hub endpoint.
        endpoint: String,
    },
    /// The revision does not exist.
    #[error("revision `{revision}` not found in `{repo}`")]
    RevisionNotFound {
        /// Repo id.
        repo: String,
        /// Revision.
        revision: String,
    },
    /// The file does not exist at that revision.
    #[error("`{file}` not found in `{repo}` at revision `{revision}`")]
    FileNotFound {
        /// Repo id.
        repo: String,
        /// Revision.
        revision: String,
        /// File.
        file: String,
    },
    /// Offline mode and the file is not cached.
    #[error(
        "`{file}` of `{repo}` is not in the Hugging Face cache and offline mode is on (HF_HUB_OFFLINE or --offline)"
    )]
    Offline {
        /// Repo id.
        repo: String,
        /// File.
        file: String,
    },
    /// No response within the timeout.
    #[error(
        "timed out after {millis} ms fetching `{file}` from {host}; raise HF_HUB_DOWNLOAD_TIMEOUT"
    )]
    Timeout {
        /// File.
        file: String,
        /// Host.
        host: String,
        /// Timeout, milliseconds.
        millis: u128,
    },
    /// No connection (DNS, refused, TLS, proxy).
    #[error("cannot reach {host}: {detail}; use --offline to work from the cache")]
    Network {
        /// Host.
        host: String,
        /// What failed.
        detail: String,
    },
    /// Another HTTP status.
    #[error("HTTP {status} fetching `{file}` from {host}")]
    Http {
        /// Status code.
        status: u16,
        /// File.
        file: String,
        /// Host.
        host: String,
    },
    /// The server's answer does not make sense (bad redirect, missing range, too large).
    #[error("unexpected response fetching `{file}`: {detail}")]
    Protocol {
        /// File.
        file: String,
        /// What was wrong.
        detail: String,
    },
    /// A local file problem.
    #[error("{}: {detail}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// What failed.
        detail: String,
    },
    /// A header or config that does not parse.
    #[error("`{file}`: {detail}")]
    Format {
        /// File.
        file: String,
        /// Parser message.
        detail: String,
    },
}
