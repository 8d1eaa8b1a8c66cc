//! Hub settings resolved from the environment the way `huggingface_hub` does it
//! (`huggingface_hub/constants.py`, documented at
//! <https://huggingface.co/docs/huggingface_hub/package_reference/environment_variables>), so
//! moro shares its cache and login with the Python tools.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// `HF_ENDPOINT` default (`constants.ENDPOINT`).
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// `HF_HUB_DOWNLOAD_TIMEOUT` default, seconds (`constants.DEFAULT_DOWNLOAD_TIMEOUT = 10`).
pub const DEFAULT_TIMEOUT_SECS: u64 = 10;

/// A Hub access token. Its `Debug` and `Display` never show it.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl Token {
    /// Wraps a token, cleaned as `huggingface_hub._clean_token` does (surrounding whitespace
    /// and line breaks removed); `None` when empty.
    #[must_use]
    pub fn new(raw: &str) -> Option<Self> {
        let t: String = raw
            .trim()
            .chars()
            .filter(|c| *c != '\r' && *c != '\n')
            .collect();
        (!t.is_empty()).then_some(Self(t))
    }

    /// The secret, only for building the `Authorization` header.
    pub(crate) fn secret(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Where the Hub is and how to talk to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubSettings {
    /// `HF_ENDPOINT`, without a trailing slash.
    pub endpoint: String,
    /// `HF_HOME`.
    pub hf_home: PathBuf,
    /// `HF_HUB_CACHE` (or legacy `HUGGINGFACE_HUB_CACHE`), default `$HF_HOME/hub`.
    pub hub_cache: PathBuf,
    /// `HF_TOKEN`, else the content of `HF_TOKEN_PATH`, else of `$HF_HOME/token`.
    pub token: Option<Token>,
    /// `HF_HUB_OFFLINE` (or legacy `TRANSFORMERS_OFFLINE`) is true: only the cache is used.
    pub offline: bool,
    /// Per-request timeout (`HF_HUB_DOWNLOAD_TIMEOUT` seconds, default 10).
    pub timeout: Duration,
    /// Whether to honour `HTTPS_PROXY`/`ALL_PROXY`/`NO_PROXY` (true by default; tests turn it
    /// off).
    pub use_env_proxy: bool,
}

/// huggingface_hub's `_is_true`: `1`, `ON`, `YES`, `TRUE`, case-insensitive.
fn is_true(v: Option<String>) -> bool {
    v.is_some_and(|v| {
        matches!(
            v.trim().to_ascii_uppercase().as_str(),
            "1" | "ON" | "YES" | "TRUE"
        )
    })
}

/// `os.path.expanduser` for a leading `~`.
fn expand_home(p: &str, home: Option<&str>) -> PathBuf {
    match (p.strip_prefix('~'), home) {
        (Some(rest), Some(home)) if rest.is_empty() || rest.starts_with('/') => {
            PathBuf::from(format!("{home}{rest}"))
        }
        _ => PathBuf::from(p),
    }
}

impl HubSettings {
    /// Resolves the settings from an environment lookup (pass `|k| std::env::var(k).ok()`, or a
    /// map in tests). Reads the token file when `HF_TOKEN` is unset; an unreadable token
    /// file means no token.
    ///
    /// Precedence follows `huggingface_hub.constants`:
    /// - `HF_HOME` = `$HF_HOME`, else `$XDG_CACHE_HOME/huggingface`, else
    ///   `~/.cache/huggingface` (`~` expanded from `HOME`);
    /// - `HF_HUB_CACHE` = `$HF_HUB_CACHE`, else `$HUGGINGFACE_HUB_CACHE`, else `$HF_HOME/hub`;
    /// - token = `$HF_TOKEN`, else the file `$HF_TOKEN_PATH`, else `$HF_HOME/token`
    ///   (`huggingface_hub.utils._auth.get_token`).
    pub fn from_env(lookup: impl Fn(&str) -> Option<String>) -> Self {
        let get = |k: &str| lookup(k).filter(|v| !v.is_empty());
        let home = get("HOME");
        let hf_home = match get("HF_HOME") {
            Some(h) => expand_home(&h, home.as_deref()),
            None => {
                let xdg = get("XDG_CACHE_HOME").unwrap_or_else(|| "~/.cache".to_owned());
                expand_home(&xdg, home.as_deref()).join("huggingface")
            }
        };
        let hub_cache = get("HF_HUB_CACHE")
            .or_else(|| get("HUGGINGFACE_HUB_CACHE"))
            .map_or_else(|| hf_home.join("hub"), |p| expand_home(&p, home.as_deref()));
        let token = get("HF_TOKEN").and_then(|t| Token::new(&t)).or_else(|| {
            let path = get("HF_TOKEN_PATH").map_or_else(
                || hf_home.join("token"),
                |p| expand_home(&p, home.as_deref()),
            );
            read_token_file(&path)
        });
        let endpoint = get("HF_ENDPOINT")
            .unwrap_or_else(|| DEFAULT_ENDPOINT.to_owned())
            .trim_end_matches('/')
            .to_owned();
        let offline = is_true(get("HF_HUB_OFFLINE")) || is_true(get("TRANSFORMERS_OFFLINE"));
        let timeout = get("HF_HUB_DOWNLOAD_TIMEOUT")
            .and_then(|s| s.trim().parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s > 0.0 && *s < 86_400.0)
            .map_or(
                Duration::from_secs(DEFAULT_TIMEOUT_SECS),
                Duration::from_secs_f64,
            );
        Self {
            endpoint,
            hf_home,
            hub_cache,
            token,
            offline,
            timeout,
            use_env_proxy: true,
        }
    }

    /// [`Self::from_env`] over the process environment.
    #[must_use]
    pub fn from_process_env() -> Self {
        Self::from_env(|k| std::env::var(k).ok())
    }
}

/// Reads a token file, at most 4 KiB; `None` if missing, unreadable or empty.
fn read_token_file(path: &Path) -> Option<Token> {
    use std::io::Read;
    let mut buf = String::new();
    std::fs::File::open(path)
        .ok()?
        .take(4096)
        .read_to_string(&mut buf)
        .ok()?;
    Token::new(&buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn defaults_follow_huggingface_hub() {
        let s = HubSettings::from_env(env(&[("HOME", "/home/u")]));
        assert_eq!(s.endpoint, "https://huggingface.co");
        assert_eq!(s.hf_home, PathBuf::from("/home/u/.cache/huggingface"));
        assert_eq!(s.hub_cache, PathBuf::from("/home/u/.cache/huggingface/hub"));
        assert!(!s.offline && s.token.is_none());
        assert_eq!(s.timeout, Duration::from_secs(10));
        let s = HubSettings::from_env(env(&[("HOME", "/h"), ("XDG_CACHE_HOME", "/x")]));
        assert_eq!(s.hub_cache, PathBuf::from("/x/huggingface/hub"));
    }

    #[test]
    fn overrides_and_precedence() {
        let s = HubSettings::from_env(env(&[
            ("HF_HOME", "~/hf"),
            ("HOME", "/h"),
            ("HUGGINGFACE_HUB_CACHE", "/legacy"),
            ("HF_ENDPOINT", "http://127.0.0.1:9/"),
            ("HF_HUB_OFFLINE", "yes"),
            ("HF_TOKEN", " hf_abc\n"),
            ("HF_HUB_DOWNLOAD_TIMEOUT", "0.5"),
        ]));
        assert_eq!(s.hf_home, PathBuf::from("/h/hf"));
        assert_eq!(s.hub_cache, PathBuf::from("/legacy"));
        assert_eq!(s.endpoint, "http://127.0.0.1:9");
        assert!(s.offline);
        assert_eq!(s.token.as_ref().map(Token::secret), Some("hf_abc"));
        assert_eq!(s.timeout, Duration::from_millis(500));
        let s = HubSettings::from_env(env(&[
            ("HF_HUB_CACHE", "/new"),
            ("HUGGINGFACE_HUB_CACHE", "/old"),
        ]));
        assert_eq!(s.hub_cache, PathBuf::from("/new"));
        assert!(!HubSettings::from_env(env(&[("HF_HUB_OFFLINE", "0")])).offline);
        assert!(HubSettings::from_env(env(&[("TRANSFORMERS_OFFLINE", "1")])).offline);
    }

    #[test]
    fn token_files_and_redaction() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().to_str().unwrap();
        std::fs::write(dir.path().join("token"), "hf_home_token\n").unwrap();
        std::fs::write(dir.path().join("other"), "hf_path_token").unwrap();
        let s = HubSettings::from_env(env(&[("HF_HOME", home)]));
        assert_eq!(s.token.as_ref().map(Token::secret), Some("hf_home_token"));
        let other = dir.path().join("other");
        let s = HubSettings::from_env(env(&[
            ("HF_HOME", home),
            ("HF_TOKEN_PATH", other.to_str().unwrap()),
        ]));
        assert_eq!(s.token.as_ref().map(Token::secret), Some("hf_path_token"));
        let s = HubSettings::from_env(env(&[("HF_HOME", home), ("HF_TOKEN", "hf_env")]));
        assert_eq!(s.token.as_ref().map(Token::secret), Some("hf_env"));
        let shown = format!("{s:?} {}", s.token.as_ref().unwrap());
        assert!(!shown.contains("hf_env"), "{shown}");
    }
}
