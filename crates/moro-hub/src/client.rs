//! The HTTP side: `{endpoint}/{repo}/resolve/{revision}/{file}` as `huggingface_hub`'s
//! `hf_hub_url` builds it, full fetches of small JSON files (stored in the cache) and `Range`
//! fetches of weight-file headers (never stored: they are partial).

use std::io::Read;

use moro_core::formats::gguf::GgufHeader;
use moro_core::formats::safetensors::{self, SafetensorsHeader, ShardIndex};
use ureq::http::Uri;

use crate::cache::{self, RepoRef, check_file_name};
use crate::local::{self, GGUF_FIRST_READ, GGUF_MAX_HEADER, INDEX_FILE, SINGLE_FILE};
use crate::{HubError, HubSettings, Progress, ProgressEvent};

/// Most redirects followed (`requests`' default is 30; the Hub uses one or two).
const MAX_REDIRECTS: u32 = 10;

/// Largest JSON file fetched whole (configs and indexes are far smaller).
const MAX_JSON: u64 = safetensors::MAX_INDEX_LEN as u64;

/// Most shards accepted from an index (the largest public checkpoints have a few hundred).
const MAX_SHARDS: usize = 4096;

/// safetensors headers of a remote (or cached) model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteSafetensors {
    /// The index, when sharded.
    pub index: Option<ShardIndex>,
    /// Each shard's file name and header, in index order.
    pub shards: Vec<(String, SafetensorsHeader)>,
}

/// A response, read (or partly read).
struct Fetched {
    bytes: Vec<u8>,
    /// `X-Repo-Commit`.
    commit: Option<String>,
    /// `X-Linked-Etag` or `ETag`, unquoted.
    etag: Option<String>,
    /// File size from `Content-Range` / `Content-Length`.
    total: Option<u64>,
}

/// A Hub client. Cheap to clone; holds a connection pool.
#[derive(Clone)]
pub struct HubClient {
    settings: HubSettings,
    agent: ureq::Agent,
    progress: Option<Progress>,
}

impl std::fmt::Debug for HubClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HubClient")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// `urllib.parse.quote`: unreserved characters as they are, the rest percent-encoded;
/// `/` kept when `keep_slash` (file paths) and encoded otherwise (revisions, as
/// `huggingface_hub.hf_hub_url` does with `quote(revision, safe="")`).
fn quote(s: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric()
            || matches!(b, b'-' | b'.' | b'_' | b'~')
            || (keep_slash && b == b'/')
        {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// (scheme, host, port) of a URL, lowercase, with the default port filled in.
fn origin(uri: &Uri) -> Option<(String, String, u16)> {
    let scheme = uri.scheme_str()?.to_ascii_lowercase();
    let host = uri.host()?.to_ascii_lowercase();
    let port = uri
        .port_u16()
        .unwrap_or(if scheme == "https" { 443 } else { 80 });
    Some((scheme, host, port))
}

fn host_of(url: &str) -> String {
    url.parse::<Uri>()
        .ok()
        .and_then(|u| u.host().map(str::to_owned))
        .unwrap_or_else(|| url.to_owned())
}

/// Resolves a `Location` header against the URL it answered.
fn resolve_location(base: &Uri, location: &str) -> Option<String> {
    if location.starts_with("http://") || location.starts_with("https://") {
        return Some(location.to_owned());
    }
    let scheme = base.scheme_str()?;
    let authority = base.authority()?.as_str();
    if let Some(rest) = location.strip_prefix("//") {
        return Some(format!("{scheme}://{rest}"));
    }
    if location.starts_with('/') {
        return Some(format!("{scheme}://{authority}{location}"));
    }
    let path = base.path();
    let dir = &path[..path.rfind('/').map_or(0, |i| i + 1)];
    Some(format!("{scheme}://{authority}{dir}{location}"))
}

fn header(resp: &ureq::http::Response<ureq::Body>, name: &str) -> Option<String> {
    resp.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// `bytes a-b/total` → total.
fn content_range_total(v: &str) -> Option<u64> {
    v.trim()
        .strip_prefix("bytes")?
        .trim()
        .split('/')
        .nth(1)?
        .trim()
        .parse()
        .ok()
}

impl HubClient {
    /// A client for these settings: timeouts from `settings.timeout`, no automatic redirects
    /// (followed by hand, see [`Self::fetch_file`]), identity encoding (byte ranges must be
    /// of the stored bytes), proxies from the environment unless `use_env_proxy` is off.
    #[must_use]
    pub fn new(settings: HubSettings) -> Self {
        let mut config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .max_redirects_will_error(false)
            .timeout_global(Some(settings.timeout))
            .user_agent(format!("moro/{}", env!("CARGO_PKG_VERSION")))
            .accept_encoding("identity");
        if !settings.use_env_proxy {
            config = config.proxy(None);
        }
        let agent: ureq::Agent = config.build().into();
        Self {
            settings,
            agent,
            progress: None,
        }
    }

    /// Adds a progress callback.
    #[must_use]
    pub fn with_progress(mut self, progress: Progress) -> Self {
        self.progress = Some(progress);
        self
    }

    /// The settings in use.
    #[must_use]
    pub fn settings(&self) -> &HubSettings {
        &self.settings
    }

    fn report(&self, ev: &ProgressEvent<'_>) {
        if let Some(p) = &self.progress {
            p(ev);
        }
    }

    /// `{endpoint}/{repo}/resolve/{revision}/{file}`.
    #[must_use]
    pub fn file_url(&self, repo: &RepoRef, file: &str) -> String {
        format!(
            "{}/{}/resolve/{}/{}",
            self.settings.endpoint,
            repo.id,
            quote(&repo.revision, false),
            quote(file, true)
        )
    }

    fn map_transport(&self, e: ureq::Error, file: &str, url: &str) -> HubError {
        let host = host_of(url);
        let timeout = || HubError::Timeout {
            file: file.to_owned(),
            host: host.clone(),
            millis: self.settings.timeout.as_millis(),
        };
        match e {
            ureq::Error::Timeout(_) => timeout(),
            ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::TimedOut => timeout(),
            ureq::Error::Io(io) => HubError::Network {
                host: host.clone(),
                detail: io.to_string().to_lowercase(),
            },
            ureq::Error::HostNotFound => HubError::Network {
                host: host.clone(),
                detail: "host not found".into(),
            },
            ureq::Error::ConnectionFailed => HubError::Network {
                host: host.clone(),
                detail: "connection failed".into(),
            },
            other => HubError::Network {
                host: host.clone(),
                detail: other.to_string().to_lowercase().replace('\n', " "),
            },
        }
    }

    /// GET with the token on the endpoint's origin only, following redirects by hand. Reads
    /// at most `limit` bytes of the body (a server that ignores `Range` and sends the whole
    /// file is cut off there).
    fn get(
        &self,
        repo: &RepoRef,
        file: &str,
        range: Option<(u64, u64)>,
        limit: u64,
    ) -> Result<Fetched, HubError> {
        check_file_name(file)?;
        let endpoint_origin = self
            .settings
            .endpoint
            .parse::<Uri>()
            .ok()
            .as_ref()
            .and_then(origin);
        let mut url = self.file_url(repo, file);
        let (mut commit, mut etag) = (None, None);
        self.report(&ProgressEvent::Fetching {
            repo: &repo.id,
            file,
            range,
        });
        for _ in 0..=MAX_REDIRECTS {
            let uri: Uri = url.parse().map_err(|_| HubError::Protocol {
                file: file.to_owned(),
                detail: "invalid URL".into(),
            })?;
            let mut req = self.agent.get(&url);
            if let Some((a, b)) = range {
                req = req.header("Range", &format!("bytes={a}-{b}"));
            }
            let same_origin = endpoint_origin.is_some() && origin(&uri) == endpoint_origin;
            if let (true, Some(token)) = (same_origin, &self.settings.token) {
                req = req.header("Authorization", &format!("Bearer {}", token.secret()));
            }
            let resp = req.call().map_err(|e| self.map_transport(e, file, &url))?;
            let status = resp.status().as_u16();
            commit = commit.or_else(|| header(&resp, "x-repo-commit"));
            etag = etag.or_else(|| {
                header(&resp, "x-linked-etag")
                    .or_else(|| header(&resp, "etag"))
                    .map(|e| e.trim_start_matches("W/").trim_matches('"').to_owned())
            });
            if matches!(status, 301 | 302 | 303 | 307 | 308) {
                let loc = header(&resp, "location").ok_or_else(|| HubError::Protocol {
                    file: file.to_owned(),
                    detail: format!("redirect {status} without a location"),
                })?;
                url = resolve_location(&uri, &loc).ok_or_else(|| HubError::Protocol {
                    file: file.to_owned(),
                    detail: "unusable redirect location".into(),
                })?;
                continue;
            }
            let host = host_of(&url);
            let code = header(&resp, "x-error-code").unwrap_or_default();
            match status {
                200 | 206 => {}
                // The Hub answers a missing repo — and, without a token, a private one — with
                // 401 and `X-Error-Code: RepoNotFound`; gated repos say `GatedRepo`
                // (huggingface_hub `hf_raise_for_status` reads the code before the status).
                401 | 403 | 404 if code == "RepoNotFound" => {
                    return Err(HubError::RepoNotFound {
                        repo: repo.id.clone(),
                        endpoint: self.settings.endpoint.clone(),
                    });
                }
                401 | 403 => {
                    return Err(HubError::Gated {
                        repo: repo.id.clone(),
                        token_sent: self.settings.token.is_some(),
                    });
                }
                404 if code == "RevisionNotFound" => {
                    return Err(HubError::RevisionNotFound {
                        repo: repo.id.clone(),
                        revision: repo.revision.clone(),
                    });
                }
                404 => {
                    return Err(HubError::FileNotFound {
                        repo: repo.id.clone(),
                        revision: repo.revision.clone(),
                        file: file.to_owned(),
                    });
                }
                _ => {
                    return Err(HubError::Http {
                        status,
                        file: file.to_owned(),
                        host,
                    });
                }
            }
            let total = if status == 206 {
                header(&resp, "content-range")
                    .as_deref()
                    .and_then(content_range_total)
            } else {
                header(&resp, "content-length").and_then(|v| v.trim().parse().ok())
            };
            // A server that ignores Range answers 200 with the whole file: only `limit`
            // bytes are read below, then the connection is dropped.
            let mut bytes = Vec::new();
            resp.into_body()
                .into_reader()
                .take(limit.saturating_add(1))
                .read_to_end(&mut bytes)
                .map_err(|e| {
                    if e.kind() == std::io::ErrorKind::TimedOut {
                        HubError::Timeout {
                            file: file.to_owned(),
                            host: host.clone(),
                            millis: self.settings.timeout.as_millis(),
                        }
                    } else {
                        HubError::Network {
                            host: host.clone(),
                            detail: e.to_string().to_lowercase(),
                        }
                    }
                })?;
            if bytes.len() as u64 > limit {
                if range.is_some() {
                    bytes.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
                } else {
                    return Err(HubError::Protocol {
                        file: file.to_owned(),
                        detail: format!("larger than {limit} bytes"),
                    });
                }
            }
            self.report(&ProgressEvent::Done {
                file,
                bytes: bytes.len() as u64,
            });
            return Ok(Fetched {
                bytes,
                commit,
                etag,
                total,
            });
        }
        Err(HubError::Protocol {
            file: file.to_owned(),
            detail: "too many redirects".into(),
        })
    }

    /// A whole small file (JSON): from the cache when there, else from the Hub (then stored
    /// in the cache when the response names its commit and ETag, as the Hub's do).
    ///
    /// # Errors
    /// [`HubError`]: offline and not cached, gated, missing, timeout, network.
    pub fn fetch_file(&self, repo: &RepoRef, file: &str) -> Result<Vec<u8>, HubError> {
        check_file_name(file)?;
        if let Some(path) = cache::find_cached(&self.settings.hub_cache, repo, file) {
            self.report(&ProgressEvent::Cached {
                repo: &repo.id,
                file,
            });
            return local::read_limited(&path, MAX_JSON);
        }
        if self.settings.offline {
            return Err(HubError::Offline {
                repo: repo.id.clone(),
                file: file.to_owned(),
            });
        }
        let f = self.get(repo, file, None, MAX_JSON)?;
        if let (Some(commit), Some(etag)) = (&f.commit, &f.etag) {
            // A cache that cannot be written (read-only home) must not fail the fetch.
            let _ =
                cache::store_in_cache(&self.settings.hub_cache, repo, commit, etag, file, &f.bytes);
        }
        Ok(f.bytes)
    }

    /// `config.json`.
    ///
    /// # Errors
    /// See [`Self::fetch_file`].
    pub fn fetch_config(&self, repo: &RepoRef) -> Result<Vec<u8>, HubError> {
        self.fetch_file(repo, "config.json")
    }

    /// Bytes `start..start+len` of a file (fewer at its end) and the file size when the
    /// server says it.
    ///
    /// # Errors
    /// See [`Self::fetch_file`]; [`HubError::Offline`] in offline mode.
    pub fn fetch_range(
        &self,
        repo: &RepoRef,
        file: &str,
        start: u64,
        len: u64,
    ) -> Result<(Vec<u8>, Option<u64>), HubError> {
        if self.settings.offline {
            return Err(HubError::Offline {
                repo: repo.id.clone(),
                file: file.to_owned(),
            });
        }
        if len == 0 {
            return Ok((Vec::new(), None));
        }
        let f = self.get(
            repo,
            file,
            Some((start, start.saturating_add(len - 1))),
            len,
        )?;
        Ok((f.bytes, f.total))
    }

    /// The header of one safetensors file: read from the cached file when present, else two
    /// `Range` requests (`bytes=0-7`, then the JSON).
    fn safetensors_header(
        &self,
        repo: &RepoRef,
        file: &str,
    ) -> Result<SafetensorsHeader, HubError> {
        if let Some(path) = cache::find_cached(&self.settings.hub_cache, repo, file) {
            self.report(&ProgressEvent::Cached {
                repo: &repo.id,
                file,
            });
            return local::read_safetensors_header(&path);
        }
        let fmt = |e: safetensors::SafetensorsError| HubError::Format {
            file: file.to_owned(),
            detail: e.to_string(),
        };
        let (first, total) = self.fetch_range(repo, file, 0, 8)?;
        let n = safetensors::header_len(&first).map_err(fmt)?;
        if let Some(t) = total
            && 8 + n > t
        {
            return Err(fmt(safetensors::SafetensorsError::Truncated {
                needed: 8 + n,
                have: t,
            }));
        }
        let (json, _) = self.fetch_range(repo, file, 8, n)?;
        if (json.len() as u64) < n {
            return Err(fmt(safetensors::SafetensorsError::Truncated {
                needed: 8 + n,
                have: 8 + json.len() as u64,
            }));
        }
        safetensors::parse_header_json(&json).map_err(fmt)
    }

    /// The safetensors headers of a model: `model.safetensors.index.json` and each shard's
    /// header, or `model.safetensors` when there is no index. Never downloads weights.
    ///
    /// # Errors
    /// [`HubError`]; [`HubError::FileNotFound`] for `model.safetensors` when the repo has
    /// neither file (e.g. a GGUF-only or `.bin` repo).
    pub fn fetch_safetensors_headers(&self, repo: &RepoRef) -> Result<RemoteSafetensors, HubError> {
        let index = match self.fetch_file(repo, INDEX_FILE) {
            Ok(bytes) => Some(
                safetensors::parse_index(&bytes).map_err(|e| HubError::Format {
                    file: INDEX_FILE.into(),
                    detail: e.to_string(),
                })?,
            ),
            Err(HubError::FileNotFound { .. }) => None,
            Err(e @ HubError::Offline { .. }) => {
                if cache::find_cached(&self.settings.hub_cache, repo, SINGLE_FILE).is_none() {
                    return Err(e);
                }
                None
            }
            Err(e) => return Err(e),
        };
        let files = index
            .as_ref()
            .map_or_else(|| vec![SINGLE_FILE.to_owned()], ShardIndex::shard_files);
        if files.len() > MAX_SHARDS {
            return Err(HubError::Format {
                file: INDEX_FILE.into(),
                detail: format!("{} shards; at most {MAX_SHARDS} are read", files.len()),
            });
        }
        let mut shards = Vec::with_capacity(files.len());
        for f in files {
            let h = self.safetensors_header(repo, &f)?;
            shards.push((f, h));
        }
        Ok(RemoteSafetensors { index, shards })
    }

    /// The header of a GGUF file in a repo: from the cache, else `Range` requests of a
    /// growing prefix (1 MiB, ×4, at most 512 MiB).
    ///
    /// # Errors
    /// [`HubError`].
    pub fn fetch_gguf_header(&self, repo: &RepoRef, file: &str) -> Result<GgufHeader, HubError> {
        check_file_name(file)?;
        if let Some(path) = cache::find_cached(&self.settings.hub_cache, repo, file) {
            self.report(&ProgressEvent::Cached {
                repo: &repo.id,
                file,
            });
            return local::read_gguf_header(&path);
        }
        local::grow_gguf(file, GGUF_FIRST_READ, GGUF_MAX_HEADER, &[], |len| {
            self.fetch_range(repo, file, 0, len)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_locations() {
        assert_eq!(quote("refs/pr/1", false), "refs%2Fpr%2F1");
        assert_eq!(quote("sub dir/a.json", true), "sub%20dir/a.json");
        let base: Uri = "http://127.0.0.1:8080/org/m/resolve/main/x"
            .parse()
            .unwrap();
        assert_eq!(
            resolve_location(&base, "/a/b").unwrap(),
            "http://127.0.0.1:8080/a/b"
        );
        assert_eq!(
            resolve_location(&base, "y").unwrap(),
            "http://127.0.0.1:8080/org/m/resolve/main/y"
        );
        assert_eq!(
            resolve_location(&base, "https://cdn/x").unwrap(),
            "https://cdn/x"
        );
        assert_eq!(resolve_location(&base, "//cdn/x").unwrap(), "http://cdn/x");
        let a = origin(&"https://huggingface.co/x".parse().unwrap());
        let b = origin(&"https://HuggingFace.co:443/y".parse().unwrap());
        assert_eq!(a, b);
        assert_ne!(
            a,
            origin(&"https://cdn-lfs.huggingface.co/x".parse().unwrap())
        );
        assert_eq!(content_range_total("bytes 0-7/1234"), Some(1234));
        assert_eq!(content_range_total("bytes 0-7/*"), None);
    }
}
