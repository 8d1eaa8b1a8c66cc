//! `moro serve --port 0 --offline` in a scratch directory, and an HTTP client for it.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// A running `moro serve`; killed when dropped.
pub struct Server {
    child: Child,
    /// `http://127.0.0.1:PORT` (no trailing slash).
    pub url: String,
    /// The first line it printed on stderr.
    pub banner: String,
    agent: ureq::Agent,
}

impl Server {
    /// Starts it with `extra` arguments, as the CLI tests run `moro` (offline, empty cache).
    pub fn start(dir: &Path, extra: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_moro"))
            .args(["serve", "--port", "0", "--offline"])
            .args(extra)
            .current_dir(dir)
            .env("HF_HUB_CACHE", "/nonexistent-moro-test-cache")
            .env("MORO_CONFIG_DIR", dir.join(".moro-config"))
            .env_remove("HF_TOKEN")
            .env_remove("HF_HOME")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("moro serve starts");
        let mut lines = BufReader::new(child.stderr.take().expect("stderr"));
        let mut banner = String::new();
        lines.read_line(&mut banner).expect("a first line");
        let url = banner
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .unwrap_or_else(|| panic!("no URL in {banner:?}"))
            .trim_end_matches('/')
            .to_owned();
        // Keep draining stderr so the server never blocks on a full pipe.
        std::thread::spawn(move || {
            let mut sink = String::new();
            while lines.read_line(&mut sink).is_ok_and(|n| n > 0) {
                sink.clear();
            }
        });
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        Self {
            child,
            url,
            banner,
            agent,
        }
    }

    /// `POST path` with `body`: (status, content type, body text).
    pub fn post(&self, path: &str, body: &str) -> (u16, String, String) {
        let (status, kind, text, _) = self.post_with_notes(path, body);
        (status, kind, text)
    }

    /// `POST path` with `body`: (status, content type, body text, the `moro-notes` header
    /// percent-decoded).
    pub fn post_with_notes(&self, path: &str, body: &str) -> (u16, String, String, String) {
        let mut r = self
            .agent
            .post(format!("{}{path}", self.url))
            .header("content-type", "application/json")
            .send(body)
            .expect("the server answers");
        let notes = r
            .headers()
            .get("moro-notes")
            .and_then(|v| v.to_str().ok())
            .map(percent_decode)
            .unwrap_or_default();
        let (status, kind, text) = Self::parts(&mut r);
        (status, kind, text, notes)
    }

    /// `GET path`: (status, content type, body text).
    pub fn get(&self, path: &str) -> (u16, String, String) {
        let mut r = self
            .agent
            .get(format!("{}{path}", self.url))
            .call()
            .expect("the server answers");
        Self::parts(&mut r)
    }

    fn parts(r: &mut ureq::http::Response<ureq::Body>) -> (u16, String, String) {
        let kind = r
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let body = r
            .body_mut()
            .with_config()
            .limit(64 << 20)
            .read_to_string()
            .expect("a text body");
        (r.status().as_u16(), kind, body)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `%XX` escapes decoded (as the page's `decodeURIComponent`).
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && let Some(v) = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(v);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).expect("UTF-8 notes")
}
