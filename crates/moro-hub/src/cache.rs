//! Repository ids and the Hugging Face cache layout
//! (<https://huggingface.co/docs/huggingface_hub/guides/manage-cache>):
//!
//! ```text
//! $HF_HUB_CACHE/models--{org}--{name}/
//!     refs/{revision}            (the commit sha the revision pointed to)
//!     blobs/{etag}               (file contents, named by their ETag)
//!     snapshots/{sha}/{file}     (symlink to ../../blobs/{etag}; a copy where symlinks fail)
//! ```

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::HubError;

/// A model repository and revision, as typed: `org/name` or `org/name@revision`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoRef {
    /// `org/name` (or a bare legacy `name`).
    pub id: String,
    /// Branch, tag or commit sha (default `main`).
    pub revision: String,
}

impl RepoRef {
    /// Parses `org/name[@revision]`. Repo ids follow `huggingface_hub.utils.validate_repo_id`:
    /// at most 96 characters of `[A-Za-z0-9._-]` with at most one `/`, no `--` or `..`, not
    /// starting or ending with `-` or `.`. Revisions may contain `/` (`refs/pr/1`) but no
    /// `..` or empty component.
    ///
    /// # Errors
    /// [`HubError::InvalidRepo`].
    pub fn parse(s: &str) -> Result<Self, HubError> {
        let (id, rev) = match s.split_once('@') {
            Some((id, rev)) => (id, rev),
            None => (s, "main"),
        };
        let bad = |why: &str| HubError::InvalidRepo {
            repo: s.to_owned(),
            why: why.to_owned(),
        };
        if id.is_empty() || id.len() > 96 {
            return Err(bad("a repo id has 1 to 96 characters"));
        }
        let parts: Vec<&str> = id.split('/').collect();
        if parts.len() > 2 {
            return Err(bad("expected `org/name`"));
        }
        for p in &parts {
            if p.is_empty()
                || !p
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
                || p.starts_with(['-', '.'])
                || p.ends_with(['-', '.'])
            {
                return Err(bad("use letters, digits, `.`, `_` and `-`"));
            }
        }
        if id.contains("--") || id.contains("..") {
            return Err(bad("`--` and `..` are not allowed"));
        }
        if rev.is_empty()
            || rev.len() > 255
            || rev
                .split('/')
                .any(|c| c.is_empty() || c == "." || c == "..")
            || rev.chars().any(|c| c.is_control() || c == '\\')
        {
            return Err(bad("invalid revision"));
        }
        Ok(Self {
            id: id.to_owned(),
            revision: rev.to_owned(),
        })
    }

    /// The cache folder name, `models--{org}--{name}`.
    #[must_use]
    pub fn cache_folder(&self) -> String {
        format!("models--{}", self.id.replace('/', "--"))
    }
}

impl std::fmt::Display for RepoRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.revision == "main" {
            f.write_str(&self.id)
        } else {
            write!(f, "{}@{}", self.id, self.revision)
        }
    }
}

/// Whether `s` is a full commit sha (40 hex digits).
#[must_use]
pub fn is_commit_sha(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Checks a repo file name before it becomes a path or URL.
pub(crate) fn check_file_name(file: &str) -> Result<(), HubError> {
    if moro_core::formats::safetensors::is_safe_relative_name(file) {
        Ok(())
    } else {
        Err(HubError::InvalidFile(file.to_owned()))
    }
}

/// The commit a revision points to in the cache (`refs/{rev}`, or the revision itself when
/// it is a sha).
fn cached_commit(cache: &Path, repo: &RepoRef) -> Option<String> {
    commit_in(&cache.join(repo.cache_folder()), &repo.revision)
}

/// The commit `revision` names in the repository folder `root`.
fn commit_in(root: &Path, revision: &str) -> Option<String> {
    if is_commit_sha(revision) {
        return Some(revision.to_owned());
    }
    let sha = fs::read_to_string(root.join("refs").join(revision))
        .ok()?
        .trim()
        .to_owned();
    is_commit_sha(&sha).then_some(sha)
}

/// The snapshot folder of the dataset repository `id` (`org/name[@revision]`) in the cache
/// (`datasets--{org}--{name}/snapshots/{commit}`, as `hf download --repo-type dataset`
/// writes it), with [`find_cached_lenient`]'s tolerance: a revision naming a snapshot folder,
/// and, for `main` without `refs/main`, the most recently modified snapshot.
#[must_use]
pub fn find_cached_dataset(hub_cache: &Path, id: &str) -> Option<PathBuf> {
    let repo = RepoRef::parse(id).ok()?;
    let root = hub_cache.join(format!("datasets--{}", repo.id.replace('/', "--")));
    let snapshots = root.join("snapshots");
    let named = |name: &str| Some(snapshots.join(name)).filter(|p| p.is_dir());
    if let Some(p) = commit_in(&root, &repo.revision).and_then(|sha| named(&sha)) {
        return Some(p);
    }
    if let Some(p) = named(&repo.revision) {
        return Some(p);
    }
    if repo.revision != "main" {
        return None;
    }
    fs::read_dir(&snapshots)
        .ok()?
        .flatten()
        .filter(|e| e.path().is_dir())
        .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok())
        .map(|e| e.path())
}

/// The cached path of `file` at the repo's revision, if present.
#[must_use]
pub fn find_cached(hub_cache: &Path, repo: &RepoRef, file: &str) -> Option<PathBuf> {
    check_file_name(file).ok()?;
    let sha = cached_commit(hub_cache, repo)?;
    let path = hub_cache
        .join(repo.cache_folder())
        .join("snapshots")
        .join(sha)
        .join(file);
    // `exists` follows the symlink: a dangling link (blob removed) is not a hit.
    path.exists().then_some(path)
}

/// Like [`find_cached`], but also tolerant of caches written by hand or by other tools: a
/// revision that names a snapshot folder directly, and, for the default revision with no
/// `refs/main`, the most recently modified snapshot holding `file`.
#[must_use]
pub fn find_cached_lenient(hub_cache: &Path, repo: &RepoRef, file: &str) -> Option<PathBuf> {
    if let Some(p) = find_cached(hub_cache, repo, file) {
        return Some(p);
    }
    check_file_name(file).ok()?;
    let snapshots = hub_cache.join(repo.cache_folder()).join("snapshots");
    let direct = snapshots.join(&repo.revision).join(file);
    if direct.is_file() {
        return Some(direct);
    }
    if repo.revision != "main" {
        return None;
    }
    let mut best: Option<(std::time::SystemTime, PathBuf)> = None;
    for entry in fs::read_dir(&snapshots).ok()?.flatten() {
        let p = entry.path().join(file);
        if let Ok(meta) = fs::metadata(&p) {
            let t = meta.modified().unwrap_or(std::time::UNIX_EPOCH);
            if best.as_ref().is_none_or(|b| t > b.0) {
                best = Some((t, p));
            }
        }
    }
    best.map(|b| b.1)
}

/// Whether an ETag is usable as a blob file name.
fn safe_etag(etag: &str) -> bool {
    !etag.is_empty()
        && etag.len() <= 128
        && etag.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// Writes `bytes` to `path` atomically: a temp file in the same folder, then rename.
fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or_else(|| Path::new("."));
    fs::create_dir_all(dir)?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = dir.join(format!(".{name}.{}.incomplete", std::process::id()));
    let mut f = fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    fs::rename(&tmp, path).inspect_err(|_| {
        let _ = fs::remove_file(&tmp);
    })
}

/// Stores a fetched file in the cache the way `huggingface_hub.hf_hub_download` does: the
/// contents in `blobs/{etag}`, a relative symlink `snapshots/{commit}/{file}` to it (a plain
/// copy where symlinks are unavailable), and `refs/{revision}` → commit when the revision is a
/// name. Every write is a temp file + rename, so readers never see partial files. Returns the
/// snapshot path.
///
/// # Errors
/// [`HubError::Io`], or [`HubError::InvalidFile`] for an unsafe file name, commit or ETag.
pub fn store_in_cache(
    hub_cache: &Path,
    repo: &RepoRef,
    commit: &str,
    etag: &str,
    file: &str,
    bytes: &[u8],
) -> Result<PathBuf, HubError> {
    check_file_name(file)?;
    if !is_commit_sha(commit) || !safe_etag(etag) {
        return Err(HubError::InvalidFile(format!(
            "{file} (commit `{commit}`, etag `{etag}`)"
        )));
    }
    let root = hub_cache.join(repo.cache_folder());
    let io = |path: &Path| {
        let p = path.to_path_buf();
        move |e: std::io::Error| HubError::Io {
            path: p,
            detail: e.to_string(),
        }
    };
    let blob = root.join("blobs").join(etag);
    if !blob.exists() {
        write_atomic(&blob, bytes).map_err(io(&blob))?;
    }
    let snap = root.join("snapshots").join(commit).join(file);
    let parent = snap.parent().unwrap_or(&root).to_path_buf();
    fs::create_dir_all(&parent).map_err(io(&parent))?;
    link_or_copy(&blob, &snap, file, bytes).map_err(io(&snap))?;
    if repo.revision != commit {
        let refs = root.join("refs").join(&repo.revision);
        write_atomic(&refs, commit.as_bytes()).map_err(io(&refs))?;
    }
    Ok(snap)
}

#[cfg(unix)]
fn link_or_copy(_blob: &Path, snap: &Path, file: &str, bytes: &[u8]) -> std::io::Result<()> {
    // snapshots/{commit}/{dirs…}/{name} → ../../{"../" per dir}blobs/{etag}
    let depth = 2 + file.matches('/').count();
    let mut target = PathBuf::new();
    for _ in 0..depth {
        target.push("..");
    }
    target.push("blobs");
    target.push(_blob.file_name().unwrap_or_default());
    let dir = snap.parent().unwrap_or_else(|| Path::new("."));
    let tmp = dir.join(format!(".link.{}.incomplete", std::process::id()));
    let _ = fs::remove_file(&tmp);
    match std::os::unix::fs::symlink(&target, &tmp) {
        Ok(()) => fs::rename(&tmp, snap),
        Err(_) => write_atomic(snap, bytes),
    }
}

#[cfg(not(unix))]
fn link_or_copy(_blob: &Path, snap: &Path, _file: &str, bytes: &[u8]) -> std::io::Result<()> {
    write_atomic(snap, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_ids() {
        let r = RepoRef::parse("Qwen/Qwen2.5-0.5B@refs/pr/1").unwrap();
        assert_eq!(
            (r.id.as_str(), r.revision.as_str()),
            ("Qwen/Qwen2.5-0.5B", "refs/pr/1")
        );
        assert_eq!(r.cache_folder(), "models--Qwen--Qwen2.5-0.5B");
        assert_eq!(RepoRef::parse("gpt2").unwrap().revision, "main");
        for bad in [
            "", "a/b/c", "a--b/c", "../x", "a/..", "a/b@", "a/b@../x", "a b/c", "-a/b", "a/b@x//y",
        ] {
            assert!(RepoRef::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn dataset_snapshots_by_ref_name_or_newest() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("datasets--org--data");
        let sha = "0123456789abcdef0123456789abcdef01234567";
        assert_eq!(find_cached_dataset(dir.path(), "org/data"), None);
        fs::create_dir_all(root.join("snapshots").join(sha)).unwrap();
        fs::create_dir_all(root.join("snapshots/handmade")).unwrap();
        // No refs/main: the newest snapshot; a revision naming a folder: that folder.
        assert!(find_cached_dataset(dir.path(), "org/data").is_some());
        assert_eq!(
            find_cached_dataset(dir.path(), "org/data@handmade"),
            Some(root.join("snapshots/handmade"))
        );
        fs::create_dir_all(root.join("refs")).unwrap();
        fs::write(root.join("refs/main"), format!("{sha}\n")).unwrap();
        assert_eq!(
            find_cached_dataset(dir.path(), "org/data"),
            Some(root.join("snapshots").join(sha))
        );
        assert_eq!(find_cached_dataset(dir.path(), "org/data@v2"), None);
        assert_eq!(
            find_cached_dataset(dir.path(), "../x"),
            None,
            "ids are checked"
        );
    }

    #[test]
    fn store_then_find() {
        let dir = tempfile::tempdir().unwrap();
        let repo = RepoRef::parse("org/name").unwrap();
        let sha = "0123456789abcdef0123456789abcdef01234567";
        assert_eq!(find_cached(dir.path(), &repo, "config.json"), None);
        let p = store_in_cache(dir.path(), &repo, sha, "abc123", "config.json", b"{}").unwrap();
        assert_eq!(
            find_cached(dir.path(), &repo, "config.json"),
            Some(p.clone())
        );
        assert_eq!(fs::read(&p).unwrap(), b"{}");
        let root = dir.path().join("models--org--name");
        assert_eq!(fs::read_to_string(root.join("refs/main")).unwrap(), sha);
        assert!(root.join("blobs/abc123").is_file());
        #[cfg(unix)]
        assert_eq!(
            fs::read_link(&p).unwrap(),
            PathBuf::from("../../blobs/abc123")
        );
        let nested = store_in_cache(dir.path(), &repo, sha, "def", "sub/x.json", b"1").unwrap();
        assert_eq!(fs::read(nested).unwrap(), b"1");
        let by_sha = RepoRef {
            id: "org/name".into(),
            revision: sha.into(),
        };
        assert!(find_cached(dir.path(), &by_sha, "config.json").is_some());
        assert!(store_in_cache(dir.path(), &repo, "nothex", "abc", "config.json", b"").is_err());
        assert!(store_in_cache(dir.path(), &repo, sha, "../x", "config.json", b"").is_err());
        assert!(store_in_cache(dir.path(), &repo, sha, "abc", "../config.json", b"").is_err());
    }
}
