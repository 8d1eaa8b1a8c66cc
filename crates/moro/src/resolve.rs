//! Where a `--model` comes from: a local path, the local Hugging Face cache, or the embedded
//! catalog (in that order). Every file read happens here; parsing is `moro-core`'s.

use std::path::{Path, PathBuf};

use anyhow::Result;
use moro_core::catalog;
use moro_core::model::ModelSpec;

use crate::error::{user, user_hint};

/// A resolved model.
#[derive(Debug, Clone)]
pub(crate) struct Resolved {
    /// What to call it in output (the HF id or the path given).
    pub(crate) id: String,
    /// Where it came from, for display.
    pub(crate) source: String,
    /// The architecture.
    pub(crate) spec: ModelSpec,
}

/// Environment variables moro reads (documented in README "Environment").
pub(crate) mod env {
    /// Root of the Hugging Face cache and token (default `$XDG_CACHE_HOME/huggingface` or
    /// `~/.cache/huggingface`).
    pub(crate) const HF_HOME: &str = "HF_HOME";
    /// The hub cache directory (default `$HF_HOME/hub`).
    pub(crate) const HF_HUB_CACHE: &str = "HF_HUB_CACHE";
    /// Legacy name of `HF_HUB_CACHE`.
    pub(crate) const HUGGINGFACE_HUB_CACHE: &str = "HUGGINGFACE_HUB_CACHE";
    /// XDG cache root.
    pub(crate) const XDG_CACHE_HOME: &str = "XDG_CACHE_HOME";
}

/// The hub cache directory as `huggingface_hub` resolves it.
pub(crate) fn hub_cache_dir() -> Option<PathBuf> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(p) = var(env::HF_HUB_CACHE).or_else(|| var(env::HUGGINGFACE_HUB_CACHE)) {
        return Some(p);
    }
    let home = var(env::HF_HOME).or_else(|| {
        var(env::XDG_CACHE_HOME)
            .or_else(|| var("HOME").map(|h| h.join(".cache")))
            .map(|c| c.join("huggingface"))
    })?;
    Some(home.join("hub"))
}

/// `config.json` of `org/name[@rev]` in the local cache: `models--org--name/refs/<rev>` names
/// a snapshot; without a ref file, the newest snapshot holding a config.json.
pub(crate) fn find_in_cache(cache: &Path, id: &str) -> Option<PathBuf> {
    let (repo, rev) = match id.split_once('@') {
        Some((r, v)) => (r, v),
        None => (id, "main"),
    };
    if !repo.contains('/') {
        return None;
    }
    let dir = cache.join(format!("models--{}", repo.replace('/', "--")));
    let snapshots = dir.join("snapshots");
    if let Ok(sha) = std::fs::read_to_string(dir.join("refs").join(rev)) {
        let p = snapshots.join(sha.trim()).join("config.json");
        if p.is_file() {
            return Some(p);
        }
    }
    // A revision given as a commit hash, or no refs file.
    let direct = snapshots.join(rev).join("config.json");
    if direct.is_file() {
        return Some(direct);
    }
    let mut best: Option<(std::time::SystemTime, PathBuf)> = None;
    for entry in std::fs::read_dir(&snapshots).ok()?.flatten() {
        let p = entry.path().join("config.json");
        if let Ok(meta) = std::fs::metadata(&p) {
            let t = meta.modified().unwrap_or(std::time::UNIX_EPOCH);
            if best.as_ref().is_none_or(|b| t > b.0) {
                best = Some((t, p));
            }
        }
    }
    best.map(|b| b.1)
}

fn parse_file(path: &Path, id: &str, source: &str) -> Result<Resolved> {
    let bytes =
        std::fs::read(path).map_err(|e| user(format!("cannot read `{}`: {e}", path.display())))?;
    let spec = moro_core::arch::parse_config(&bytes)
        .map_err(|e| user(format!("{}: {e}", path.display())))?;
    Ok(Resolved {
        id: id.to_owned(),
        source: source.to_owned(),
        spec,
    })
}

/// Resolves `--model`.
pub(crate) fn model(arg: &str) -> Result<Resolved> {
    let arg = arg.trim();
    if arg.is_empty() {
        return Err(user("`--model` is empty"));
    }
    let path = Path::new(arg);
    let looks_like_path = arg.starts_with('.')
        || arg.starts_with('/')
        || arg.starts_with('~')
        || arg.ends_with(".json")
        || path.exists();
    if looks_like_path {
        if path.is_dir() {
            let cfg = path.join("config.json");
            if cfg.is_file() {
                return parse_file(&cfg, arg, "local directory");
            }
            return Err(user_hint(
                format!("`{arg}` is a directory without a config.json"),
                "point --model at a model directory, a config.json, or a Hugging Face id",
            ));
        }
        if path.is_file() {
            return parse_file(path, arg, "local file");
        }
        return Err(user(format!("`{arg}` does not exist")));
    }
    if let Some(cache) = hub_cache_dir()
        && let Some(cfg) = find_in_cache(&cache, arg)
    {
        return parse_file(
            &cfg,
            arg.split('@').next().unwrap_or(arg),
            "Hugging Face cache",
        );
    }
    let bare = arg.split('@').next().unwrap_or(arg);
    if let Some(entry) = catalog::find(bare) {
        let spec =
            catalog::load(entry).map_err(|e| user(format!("catalog entry `{}`: {e}", entry.id)))?;
        return Ok(Resolved {
            id: entry.id.to_owned(),
            source: "embedded catalog".into(),
            spec,
        });
    }
    let suggestions = catalog::suggest(bare, 3);
    let hint = if suggestions.is_empty() {
        "run `moro models` for the embedded catalog, or pass a path to a config.json".to_owned()
    } else {
        format!(
            "did you mean {}? (`moro models` lists the catalog; a path to a config.json works too)",
            suggestions
                .iter()
                .map(|s| format!("`{s}`"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    Err(user_hint(
        format!("model `{arg}` is not in the local cache or the embedded catalog"),
        hint,
    ))
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
}
