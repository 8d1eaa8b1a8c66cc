//! Where a `--model` comes from, in this order:
//!
//! 1. a local path: a `config.json` (or any `.json` config), a directory, a `.safetensors`
//!    file (single or sharded, headers read for the exact stored bytes) or a `.gguf` file;
//! 2. the local Hugging Face cache (`HF_HUB_CACHE`); the safetensors headers come from the
//!    cached weights when present, else from the Hub (`Range` requests) unless offline;
//! 3. the embedded catalog;
//! 4. the Hugging Face Hub (`HF_ENDPOINT`): `config.json` and the safetensors headers, unless
//!    offline (`--offline`, `HF_HUB_OFFLINE=1`).
//!
//! A pinned revision (`org/name@rev`, `--revision`) or `--exact-weights` goes to the Hub
//! before the catalog; when the Hub fails and the catalog has the model, the catalog is used
//! and a note says so. Every file read and request happens here (through `moro-hub`); parsing
//! is `moro-core`'s.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use anyhow::Result;
use moro_core::catalog;
use moro_core::estimate::{DeviceProfile, Estimate};
use moro_core::formats::gguf::GgufHeader;
use moro_core::formats::safetensors::{
    ParamCheck, SafetensorsHeader, StoredWeights, check_params, stored_weights,
};
use moro_core::job::Job;
use moro_core::model::ModelSpec;
use moro_hub::{HubClient, HubError, HubSettings, LocalModel, ProgressEvent, RepoRef};

use crate::error::{user, user_hint};
use crate::output::size;

/// A resolved model.
#[derive(Debug, Clone)]
pub(crate) struct Resolved {
    /// What to call it in output (the HF id or the path given).
    pub(crate) id: String,
    /// Where it came from, for display.
    pub(crate) source: String,
    /// The architecture.
    pub(crate) spec: ModelSpec,
    /// What the checkpoint stores, from its safetensors headers (local files, the cache or
    /// the Hub); `None` when no header was read.
    pub(crate) stored: Option<StoredWeights>,
}

/// Hub options shared by the commands that take `--model`.
#[derive(Debug, Clone, Default, clap::Args)]
pub(crate) struct HubArgs {
    /// Never use the network: only local files, the Hugging Face cache and the catalog (as
    /// HF_HUB_OFFLINE=1).
    #[arg(long)]
    pub(crate) offline: bool,
    /// Hub revision of --model (branch, tag or commit), as `org/name@REV`.
    #[arg(long, value_name = "REV")]
    pub(crate) revision: Option<String>,
    /// Read the exact stored weight bytes from the Hub's safetensors headers, even for a
    /// model in the catalog.
    #[arg(long)]
    pub(crate) exact_weights: bool,
}

/// `config.json` of `org/name[@rev]` in the local cache (`models--org--name/refs/<rev>` →
/// `snapshots/<sha>`, with moro-hub's lenient fallbacks for hand-made caches).
pub(crate) fn find_in_cache(cache: &Path, id: &str) -> Option<PathBuf> {
    let repo = RepoRef::parse(id).ok()?;
    moro_hub::find_cached_lenient(cache, &repo, "config.json")
}

fn parse_config_bytes(bytes: &[u8], what: &str) -> Result<ModelSpec> {
    moro_core::arch::parse_config(bytes).map_err(|e| user(format!("{what}: {e}")))
}

fn parse_file(path: &Path, id: &str, source: &str) -> Result<Resolved> {
    let bytes = moro_hub::local::read_limited(path, 16 << 20)
        .map_err(|e| user(format!("cannot read `{}`: {e}", path.display())))?;
    Ok(Resolved {
        id: id.to_owned(),
        source: source.to_owned(),
        spec: parse_config_bytes(&bytes, &path.display().to_string())?,
        stored: None,
    })
}

/// `quantization_config.bits` of a config (GPTQ/AWQ packing), when present.
fn quant_bits(config: &[u8]) -> Option<u64> {
    let v: serde_json::Value = serde_json::from_slice(config).ok()?;
    v.get("quantization_config")?.get("bits")?.as_u64()
}

/// Sums the headers and notes a parameter count that disagrees with the config's.
fn summarize<'a>(
    headers: impl IntoIterator<Item = &'a SafetensorsHeader>,
    bits: Option<u64>,
    spec: &ModelSpec,
) -> StoredWeights {
    let w = stored_weights(headers.into_iter().flat_map(|h| &h.tensors), bits);
    let expected = spec.total_params();
    if let ParamCheck::Mismatch { relative } = check_params(w.params_estimate, expected) {
        say(&format!(
            "note: the safetensors headers hold {} parameters, config.json implies {} \
             ({:+.1}%): the weights follow the headers",
            count(w.params_estimate),
            count(expected),
            relative * 100.0
        ));
    }
    w
}

/// A parameter count for display: `7.62B`, `494.03M`, `6400`.
#[allow(clippy::cast_precision_loss)]
fn count(n: u64) -> String {
    if n >= 1_000_000_000 {
        format!("{:.2}B", n as f64 / 1e9)
    } else if n >= 1_000_000 {
        format!("{:.2}M", n as f64 / 1e6)
    } else {
        n.to_string()
    }
}

/// Whether `arg` names something on disk rather than a Hub id.
fn looks_like_path(arg: &str) -> bool {
    arg.starts_with('.')
        || arg.starts_with('/')
        || arg.starts_with('~')
        || arg.ends_with(".json")
        || arg.ends_with(".gguf")
        || arg.ends_with(".safetensors")
        || Path::new(arg).exists()
}

/// Whether `arg` is a local `.gguf` file (or a directory holding one and no safetensors).
pub(crate) fn is_gguf(arg: &str) -> bool {
    let path = Path::new(arg.trim());
    if arg.trim().to_ascii_lowercase().ends_with(".gguf") {
        return true;
    }
    path.is_dir() && matches!(moro_hub::model_dir_files(path), Ok(LocalModel::Gguf { .. }))
}

/// Resolves `--model` with the default Hub options (network allowed unless
/// `HF_HUB_OFFLINE`).
pub(crate) fn model(arg: &str) -> Result<Resolved> {
    model_with(arg, &HubArgs::default())
}

/// Resolves `--model`.
pub(crate) fn model_with(arg: &str, opts: &HubArgs) -> Result<Resolved> {
    let r = resolve(arg, opts);
    clear_progress();
    r
}

/// A note on stderr (after clearing the progress line).
fn say(s: &str) {
    clear_progress();
    crate::output::note(s);
}

fn resolve(arg: &str, opts: &HubArgs) -> Result<Resolved> {
    let arg = arg.trim();
    if arg.is_empty() {
        return Err(user("`--model` is empty"));
    }
    if looks_like_path(arg) {
        if opts.revision.is_some() {
            return Err(user_hint(
                format!("--revision applies to Hub ids, and `{arg}` is a local path"),
                "drop --revision, or pass the Hub id (`org/name`)",
            ));
        }
        return local(arg);
    }
    let full = with_revision(arg, opts.revision.as_deref())?;
    let bare = full.split('@').next().unwrap_or(&full).to_owned();
    let pinned = full.contains('@');
    let want_hub = pinned || opts.exact_weights;
    let settings = settings(opts);

    // 1. The local cache.
    let cached = if pinned {
        // A pinned revision must be that revision, not the newest snapshot.
        RepoRef::parse(&full)
            .ok()
            .and_then(|r| moro_hub::find_cached(&settings.hub_cache, &r, "config.json"))
    } else {
        find_in_cache(&settings.hub_cache, &full)
    };
    if let Some(cfg) = cached {
        let mut r = parse_file(&cfg, &bare, "Hugging Face cache")?;
        if let Ok(repo) = RepoRef::parse(&full) {
            let bits = std::fs::read(&cfg).ok().and_then(|b| quant_bits(&b));
            // From the cache when the weights are there, else their headers from the Hub
            // (as a run that fetched the config would), unless offline.
            let client = client(settings.clone());
            match client.fetch_safetensors_headers(&repo) {
                Ok(remote) => {
                    r.stored = Some(summarize(
                        remote.shards.iter().map(|(_, h)| h),
                        bits,
                        &r.spec,
                    ));
                }
                Err(e) if want_hub => say(&format!(
                    "note: no exact weights for `{bare}` ({e}); counting them from config.json"
                )),
                Err(_) => {}
            }
        }
        return Ok(r);
    }

    // 2. The catalog.
    let entry = catalog::find(&bare);
    if let Some(entry) = entry
        && !want_hub
    {
        return from_catalog(entry, &bare);
    }

    // 3. The Hub.
    let repo = match RepoRef::parse(&full) {
        Ok(r) => r,
        Err(e) => {
            if let Some(entry) = entry {
                return from_catalog(entry, &bare);
            }
            if !bare.contains('/') {
                return Err(not_found(&full, false));
            }
            return Err(user(e.to_string()));
        }
    };
    if settings.offline {
        if let Some(entry) = entry {
            say(&format!(
                "note: offline mode: `{full}` is not in the Hugging Face cache; using the \
                 embedded catalog entry `{}`",
                entry.id
            ));
            return from_catalog(entry, &bare);
        }
        return Err(not_found(&full, true));
    }
    let endpoint = settings.endpoint.clone();
    let client = client(settings);
    let outcome = match client.fetch_config(&repo) {
        Ok(bytes) => match parse_config_bytes(&bytes, &format!("config.json of `{repo}`")) {
            Ok(spec) => Ok((spec, quant_bits(&bytes))),
            Err(e) => Err((e.to_string(), e)),
        },
        Err(e) => Err((e.to_string(), hub_error(&e, &repo, &endpoint))),
    };
    let (spec, bits) = match outcome {
        Ok(x) => x,
        Err((why, err)) => {
            if let Some(entry) = entry {
                say(&format!(
                    "note: cannot fetch `{repo}` from the Hub ({why}); using the embedded \
                     catalog entry `{}`",
                    entry.id
                ));
                return from_catalog(entry, &bare);
            }
            return Err(err);
        }
    };
    let mut r = Resolved {
        id: bare,
        source: if endpoint == moro_hub::DEFAULT_ENDPOINT {
            "Hugging Face Hub".to_owned()
        } else {
            format!("Hub at {endpoint}")
        },
        spec,
        stored: None,
    };
    match client.fetch_safetensors_headers(&repo) {
        Ok(remote) => {
            r.stored = Some(summarize(
                remote.shards.iter().map(|(_, h)| h),
                bits,
                &r.spec,
            ));
        }
        Err(HubError::FileNotFound { .. }) => say(&format!(
            "note: `{repo}` has no safetensors weights; counting them from config.json"
        )),
        Err(e) => say(&format!(
            "note: cannot read the safetensors headers of `{repo}` ({e}); counting the weights \
             from config.json"
        )),
    }
    Ok(r)
}

/// `arg` with `--revision` applied.
fn with_revision(arg: &str, revision: Option<&str>) -> Result<String> {
    match (arg.split_once('@'), revision) {
        (_, None) => Ok(arg.to_owned()),
        (None, Some(rev)) => Ok(format!("{arg}@{rev}")),
        (Some((_, r)), Some(rev)) if r == rev => Ok(arg.to_owned()),
        (Some((_, r)), Some(rev)) => Err(user_hint(
            format!("two revisions: `@{r}` in --model and --revision {rev}"),
            "give the revision once",
        )),
    }
}

/// The catalog entry `asked` resolved to; an alias keeps its own name and says whose config
/// stands in for it; a renamed repository takes today's name and says so.
fn from_catalog(entry: &catalog::CatalogEntry, asked: &str) -> Result<Resolved> {
    if let Some(new) = catalog::renamed(asked) {
        let mut r = from_catalog(entry, new)?;
        r.source = format!(
            "{}; `{asked}` is `{new}` since the Hub renamed it",
            r.source
        );
        r.id = new.to_owned();
        return Ok(r);
    }
    let spec =
        catalog::load(entry).map_err(|e| user(format!("catalog entry `{}`: {e}", entry.id)))?;
    let (id, source) = match catalog::alias(asked) {
        Some(alias) => (
            alias.to_owned(),
            format!(
                "embedded catalog: `{}`'s config, same architecture",
                entry.id
            ),
        ),
        None => (entry.id.to_owned(), "embedded catalog".to_owned()),
    };
    Ok(Resolved {
        id,
        source,
        spec,
        stored: None,
    })
}

/// "did you mean" hint from the catalog.
fn catalog_hint(bare: &str) -> Option<String> {
    let suggestions = catalog::suggest(bare, 3);
    (!suggestions.is_empty()).then(|| {
        format!(
            "did you mean {}?",
            suggestions
                .iter()
                .map(|s| format!("`{s}`"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    })
}

fn not_found(full: &str, offline: bool) -> anyhow::Error {
    let bare = full.split('@').next().unwrap_or(full);
    let base = "`moro models` lists the catalog; a path to a config.json or a model directory \
                works too";
    let hint = match catalog_hint(bare) {
        Some(s) => format!("{s} ({base})"),
        None => format!("run {base}"),
    };
    let offline = if offline {
        " (offline: the Hub was not asked)"
    } else {
        ""
    };
    let mut e = crate::error::UserError::new(format!(
        "model `{full}` is not in the local cache or the embedded catalog{offline}"
    ))
    .hint(hint);
    e.missing = Some(
        catalog::suggest(bare, 5)
            .into_iter()
            .map(str::to_owned)
            .collect(),
    );
    anyhow::Error::new(e)
}

/// A Hub failure as a one-line error with a hint (never the token).
fn hub_error(e: &HubError, repo: &RepoRef, endpoint: &str) -> anyhow::Error {
    let page = format!("{endpoint}/{}", repo.id);
    let hint = match e {
        HubError::Gated {
            token_sent: false, ..
        } => format!(
            "accept the model's terms on {page}, then set HF_TOKEN or run `huggingface-cli login` \
             (a misspelled id answers the same way)"
        ),
        HubError::Gated {
            token_sent: true, ..
        } => format!("request access on {page}, or check that HF_TOKEN is the right account's"),
        HubError::RepoNotFound { .. } | HubError::FileNotFound { .. } => {
            let base = "check the id's spelling; `moro models` lists the embedded catalog";
            match catalog_hint(&repo.id) {
                Some(s) => format!("{s} ({base})"),
                None => base.to_owned(),
            }
        }
        HubError::RevisionNotFound { .. } => {
            format!("see the branches, tags and commits on {page}")
        }
        HubError::Timeout { .. } => {
            "retry, raise HF_HUB_DOWNLOAD_TIMEOUT (seconds), or use --offline".to_owned()
        }
        HubError::Network { .. } => {
            let base = "check the connection, a proxy or HF_ENDPOINT; --offline uses the cache \
                        and the catalog";
            match catalog_hint(&repo.id) {
                Some(s) => format!("{base}; in the catalog: {s}"),
                None => base.to_owned(),
            }
        }
        _ => "pass a local model directory or a config.json instead".to_owned(),
    };
    user_hint(e.to_string(), hint)
}

/// Set once by `moro serve --offline`: no request reaches the Hub, whatever its flags say.
static PROCESS_OFFLINE: AtomicBool = AtomicBool::new(false);

/// Keeps every later model lookup of this process off the network.
pub(crate) fn stay_offline() {
    PROCESS_OFFLINE.store(true, Ordering::Relaxed);
}

/// The Hub settings from the environment and the flags.
pub(crate) fn settings(opts: &HubArgs) -> HubSettings {
    let mut s = HubSettings::from_process_env();
    s.offline |= opts.offline || PROCESS_OFFLINE.load(Ordering::Relaxed);
    s
}

pub(crate) fn client(s: HubSettings) -> HubClient {
    let c = HubClient::new(s);
    match progress_line() {
        Some(p) => c.with_progress(p),
        None => c,
    }
}

/// Whether a progress line is on screen (cleared before anything else is printed).
static PROGRESS_SHOWN: AtomicBool = AtomicBool::new(false);

/// A one-line spinner on stderr, only when stderr is a terminal.
fn progress_line() -> Option<moro_hub::Progress> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let frame = Arc::new(AtomicUsize::new(0));
    Some(Arc::new(move |ev: &ProgressEvent<'_>| {
        let text = match ev {
            ProgressEvent::Fetching { repo, file, range } => match range {
                Some((a, b)) => format!("fetching {repo} {file} (bytes {a}-{b})"),
                None => format!("fetching {repo} {file}"),
            },
            ProgressEvent::Cached { repo, file } => format!("cached {repo} {file}"),
            ProgressEvent::Done { file, bytes } => format!("got {file} ({})", size(*bytes)),
            _ => return,
        };
        let spin = ['|', '/', '-', '\\'][frame.fetch_add(1, Ordering::Relaxed) % 4];
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r{spin} {text:<76.76}");
        let _ = err.flush();
        PROGRESS_SHOWN.store(true, Ordering::Relaxed);
    }))
}

/// Clears the progress line, if one was drawn.
pub(crate) fn clear_progress() {
    if PROGRESS_SHOWN.swap(false, Ordering::Relaxed) {
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r{:78}\r", "");
        let _ = err.flush();
    }
}

fn local_error(arg: &str, e: &HubError) -> anyhow::Error {
    user_hint(
        format!("`{arg}`: {e}"),
        "point --model at a model directory (config.json + safetensors), a config.json, a \
         .gguf file, or a Hugging Face id",
    )
}

/// A local path.
fn local(arg: &str) -> Result<Resolved> {
    let path = Path::new(arg);
    if !path.exists() {
        return Err(user(format!("`{arg}` does not exist")));
    }
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if path.is_file()
        && name.to_ascii_lowercase().ends_with(".json")
        && name != "config.json"
        && name != moro_hub::local::INDEX_FILE
    {
        return parse_file(path, arg, "local file");
    }
    let source = if path.is_dir() {
        "local directory"
    } else {
        "local file"
    };
    let files = match moro_hub::model_dir_files(path) {
        Ok(f) => f,
        Err(e) => {
            let cfg = if path.is_dir() {
                path.join("config.json")
            } else {
                path.to_path_buf()
            };
            if cfg.is_file() && cfg.file_name().is_some_and(|n| n == "config.json") {
                let dir = cfg.parent().unwrap_or(path);
                if dir.join(moro_hub::local::INDEX_FILE).exists() {
                    say(&format!(
                        "note: ignoring the weights ({e}); counting them from config.json"
                    ));
                }
                return parse_file(&cfg, arg, source);
            }
            if path.is_dir() && !cfg.exists() {
                return Err(user_hint(
                    format!("`{arg}` is a directory without a config.json"),
                    "point --model at a model directory, a config.json, a .gguf file, or a \
                     Hugging Face id",
                ));
            }
            return Err(local_error(arg, &e));
        }
    };
    match files {
        LocalModel::Safetensors { config, shards, .. } => {
            let Some(cfg) = config else {
                return Err(user_hint(
                    format!("`{arg}` has safetensors weights but no config.json next to them"),
                    "moro reads the architecture from config.json: put the model's config.json \
                     beside the weights, or pass its Hub id",
                ));
            };
            let mut r = parse_file(&cfg, arg, source)?;
            let bits = std::fs::read(&cfg).ok().and_then(|b| quant_bits(&b));
            match moro_hub::local::read_safetensors_headers(&shards) {
                Ok(headers) => r.stored = Some(summarize(&headers, bits, &r.spec)),
                Err(e) => say(&format!(
                    "note: ignoring the safetensors headers ({e}); counting the weights from \
                     config.json"
                )),
            }
            Ok(r)
        }
        LocalModel::Gguf {
            config: Some(cfg),
            file,
        } => {
            say(&format!(
                "note: `{}` is a GGUF file: this estimate uses config.json beside it; `moro gguf \
                 {}` gives llama.cpp's allocation",
                file.display(),
                file.display()
            ));
            parse_file(&cfg, arg, source)
        }
        LocalModel::Gguf { file, config: None } => Err(user_hint(
            format!(
                "`{}` is a GGUF file (llama.cpp), without a config.json beside it",
                file.display()
            ),
            format!(
                "`moro gguf {}` estimates llama.cpp inference from its header",
                file.display()
            ),
        )),
        _ => Err(user(format!("`{arg}`: unsupported model files"))),
    }
}

/// The header of a GGUF file: a local path, or `file` in the Hub repo `arg`.
pub(crate) fn gguf_header(
    arg: &str,
    file: Option<&str>,
    opts: &HubArgs,
) -> Result<(String, GgufHeader)> {
    let arg = arg.trim();
    let path = Path::new(arg);
    if path.exists() {
        if file.is_some() {
            return Err(user_hint(
                "--file names a file in a Hub repo, and this is a local path",
                "pass the .gguf file itself",
            ));
        }
        let gguf = match moro_hub::model_dir_files(path).map_err(|e| local_error(arg, &e))? {
            LocalModel::Gguf { file, .. } => file,
            _ => {
                return Err(user_hint(
                    format!("`{arg}` holds no .gguf file"),
                    "for safetensors models use `moro estimate --model PATH`",
                ));
            }
        };
        let header = moro_hub::local::read_gguf_header(&gguf).map_err(|e| user(e.to_string()))?;
        return Ok((gguf.display().to_string(), header));
    }
    let Some(file) = file else {
        return Err(user_hint(
            format!("`{arg}` does not exist"),
            "pass a .gguf file, or a Hub repo with --file NAME.gguf",
        ));
    };
    let full = with_revision(arg, opts.revision.as_deref())?;
    let repo = RepoRef::parse(&full).map_err(|e| user(e.to_string()))?;
    let settings = settings(opts);
    let endpoint = settings.endpoint.clone();
    let header = client(settings).fetch_gguf_header(&repo, file);
    clear_progress();
    let header = header.map_err(|e| match e {
        HubError::Format { .. } | HubError::InvalidFile(_) => user(e.to_string()),
        e => hub_error(&e, &repo, &endpoint),
    })?;
    Ok((format!("{repo} {file}"), header))
}

/// One line on the stored weights, for display.
pub(crate) fn describe_stored(w: &StoredWeights) -> String {
    let mut by: Vec<(&String, &u64)> = w.by_dtype.iter().collect();
    by.sort_by(|a, b| b.1.cmp(a.1));
    let parts: Vec<String> = by
        .iter()
        .map(|(d, b)| format!("{} {}", d.to_ascii_lowercase(), size(**b)))
        .collect();
    let mut s = format!(
        "{} in the safetensors headers ({})",
        size(w.total_bytes),
        parts.join(", ")
    );
    if let Some(q) = w.quantization {
        s.push_str(&format!(", pre-quantized: {q}"));
    }
    s
}

/// Applies the exact stored weights of `model` (when its headers were read) to `est`, with a
/// note when the job holds them differently.
pub(crate) fn apply_stored(
    model: &Resolved,
    job: &Job,
    profile: &DeviceProfile,
    est: Estimate,
) -> Estimate {
    use moro_core::estimate::stored::{loaded_weight_bytes, with_stored_weights};
    let Some(w) = &model.stored else {
        return est;
    };
    match loaded_weight_bytes(w, job, &est.regime) {
        Some(bytes) => with_stored_weights(est, &model.spec, job, profile, bytes),
        None => {
            say(&format!(
                "note: the checkpoint stores {}; the job quantizes it on load ({}), so the \
                 weights follow that layout",
                size(w.total_bytes),
                job.quantization.as_str()
            ));
            est
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_layout() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("models--org--tiny");
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::create_dir_all(repo.join("snapshots/abc123")).unwrap();
        std::fs::write(repo.join("refs/main"), "abc123\n").unwrap();
        std::fs::write(repo.join("snapshots/abc123/config.json"), "{}").unwrap();
        let found = find_in_cache(dir.path(), "org/tiny").unwrap();
        assert!(found.ends_with("snapshots/abc123/config.json"));
        assert!(find_in_cache(dir.path(), "org/tiny@abc123").is_some());
        assert!(find_in_cache(dir.path(), "org/other").is_none());
        assert!(find_in_cache(dir.path(), "nodash").is_none());
    }

    #[test]
    fn revisions() {
        assert_eq!(with_revision("a/b", None).unwrap(), "a/b");
        assert_eq!(with_revision("a/b", Some("v1")).unwrap(), "a/b@v1");
        assert_eq!(with_revision("a/b@v1", Some("v1")).unwrap(), "a/b@v1");
        assert!(with_revision("a/b@v1", Some("v2")).is_err());
        assert!(looks_like_path("x.gguf") && looks_like_path("./m") && !looks_like_path("a/b"));
    }
}
