//! `moro serve`'s page in a real browser: headless Chromium driven over WebDriver
//! (chromedriver), changing inputs as a user does and reading the numbers the page shows,
//! which must be the API's and the CLI's. Screenshots at desktop and phone widths go to
//! `target/`, and to `docs/img/` with `MORO_BLESS=1` (the README shows them).
//!
//! Needs Debian's `chromium` and `chromium-driver` (`.ci/run` installs them); skipped
//! without them, except under CI, where that is a failure.

mod common;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::server::Server;
use common::{json_of, moro, stdout_of};
use serde_json::{Value, json};

/// Chromium's flags for a closed, headless machine (no sandbox as root, no background
/// connections).
const CHROMIUM_ARGS: [&str; 9] = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
];

fn tool(env: &str, default: &str) -> Option<PathBuf> {
    let p = std::env::var_os(env).map_or_else(|| PathBuf::from(default), PathBuf::from);
    p.exists().then_some(p)
}

/// A chromedriver on a free loopback port and one browser session; both end on drop.
struct Browser {
    driver: Child,
    base: String,
    session: String,
    agent: ureq::Agent,
    _profile: tempfile::TempDir,
}

impl Browser {
    fn start(driver: &Path, chromium: &Path) -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let child = Command::new(driver)
            .args([format!("--port={port}"), "--allowed-ips=127.0.0.1".into()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(120)))
            .build()
            .into();
        let base = format!("http://127.0.0.1:{port}");
        let start = Instant::now();
        while agent.get(format!("{base}/status")).call().is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "chromedriver never answered"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let profile = tempfile::tempdir().unwrap();
        let mut args: Vec<String> = CHROMIUM_ARGS.iter().map(|s| (*s).to_owned()).collect();
        args.push(format!("--user-data-dir={}", profile.path().display()));
        args.push("--window-size=1280,1900".into());
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": chromium, "args": args},
        }}});
        let mut b = Self {
            driver: child,
            base,
            session: String::new(),
            agent,
            _profile: profile,
        };
        let v = b.call("POST", "/session", &caps);
        b.session = v["sessionId"].as_str().expect("a session id").to_owned();
        b
    }

    fn call(&self, method: &str, path: &str, body: &Value) -> Value {
        let url = if path == "/session" {
            format!("{}{path}", self.base)
        } else {
            format!("{}/session/{}{path}", self.base, self.session)
        };
        let mut r = match method {
            "GET" => self.agent.get(&url).call(),
            _ => self
                .agent
                .post(&url)
                .header("content-type", "application/json")
                .send(body.to_string()),
        }
        .expect("chromedriver answers");
        let text = r
            .body_mut()
            .with_config()
            .limit(64 << 20)
            .read_to_string()
            .unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        assert!(
            r.status().is_success(),
            "{method} {path}: {}",
            &text[..text.len().min(600)]
        );
        v["value"].clone()
    }

    fn open(&self, url: &str) {
        self.call("POST", "/url", &json!({"url": url}));
    }

    fn script(&self, js: &str) -> Value {
        self.call("POST", "/execute/sync", &json!({"script": js, "args": []}))
    }

    fn element(&self, css: &str) -> String {
        let v = self.call(
            "POST",
            "/element",
            &json!({"using": "css selector", "value": css}),
        );
        v.as_object()
            .and_then(|o| o.values().next())
            .and_then(Value::as_str)
            .expect("an element")
            .to_owned()
    }

    /// Types `text` into the input `css` after clearing it, as a user would.
    fn type_into(&self, css: &str, text: &str) {
        let e = self.element(css);
        self.call("POST", &format!("/element/{e}/clear"), &json!({}));
        self.call(
            "POST",
            &format!("/element/{e}/value"),
            &json!({"text": text}),
        );
    }

    fn click(&self, css: &str) {
        let e = self.element(css);
        self.call("POST", &format!("/element/{e}/click"), &json!({}));
    }

    /// Waits until the page has finished `n` refreshes (`body[data-ready]`).
    fn settled(&self, n: u64) {
        let start = Instant::now();
        loop {
            let ready = self.script("return Number(document.body.dataset.ready || 0)");
            if ready.as_u64().unwrap_or(0) >= n {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "the page never settled"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until the numbers on the page are for settings that include each of `pairs`
    /// (`seq_len=8192`): the page records them in `body[data-shown]` after each refresh.
    fn showing(&self, pairs: &[&str]) {
        let start = Instant::now();
        loop {
            let shown = self.script("return document.body.dataset.shown || ''");
            let shown = shown.as_str().unwrap_or_default();
            if pairs.iter().all(|p| shown.split('&').any(|kv| kv == *p)) {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "the page never showed {pairs:?}: {shown}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// What the page shows: the three levels, their bounds, the verdict line, the fit rows.
    fn shown(&self) -> Value {
        self.script(
            "const t = (id) => document.getElementById(id).textContent;
             return {
               levels: [t('out-allocated'), t('out-reserved'), t('out-device')],
               upper: [t('out-allocated-max'), t('out-reserved-max'), t('out-device-max')],
               verdict: t('verdict'),
               fit: [...document.querySelectorAll('#fit-table tbody tr')].map(
                 (r) => [...r.cells].slice(0, 5).map((c) => c.textContent)),
               url: location.search,
               charts: document.querySelectorAll('#estimate-chart svg').length,
             };",
        )
    }

    fn screenshot(&self, width: u32, height: u32, name: &str) {
        self.call(
            "POST",
            "/window/rect",
            &json!({"width": width, "height": height}),
        );
        std::thread::sleep(Duration::from_millis(300));
        let png = decode_base64(
            self.call("GET", "/screenshot", &json!({}))
                .as_str()
                .unwrap(),
        );
        assert!(png.starts_with(b"\x89PNG"), "a PNG");
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("screenshots");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), &png).unwrap();
        if std::env::var_os("MORO_BLESS").is_some() {
            let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/img");
            std::fs::create_dir_all(&docs).unwrap();
            std::fs::write(docs.join(name), &png).unwrap();
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let url = format!("{}/session/{}", self.base, self.session);
            let _ = self.agent.delete(&url).call();
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

fn decode_base64(s: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0);
    for v in s.bytes().filter_map(value) {
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

fn gib(v: &Value) -> String {
    format!("{:.2}", v.as_u64().unwrap() as f64 / f64::from(1u32 << 30))
}

/// `moro estimate`'s device level, as the page prints it, for the page's Qwen2.5-7B QLoRA
/// job at 8192 tokens on an A100 with `extra` flags.
fn cli_device_gib(dir: &Path, extra: &[&str]) -> String {
    let mut args = vec![
        "estimate",
        "--model",
        "Qwen/Qwen2.5-7B",
        "--method",
        "qlora",
        "--seq-len",
        "8192",
        "--hardware",
        "a100-sxm4-80gb",
        "--json",
    ];
    args.extend_from_slice(extra);
    let out = moro(dir).args(&args).assert().get_output().stdout.clone();
    gib(&json_of(&out)["peak_device_bytes"])
}

/// The levels and bounds of the API's estimate, as the page prints them.
fn expected(server: &Server, job: &Value) -> (Vec<String>, Vec<String>, Value) {
    let (status, _, body) = server.post("/api/estimate", &job.to_string());
    assert_eq!(status, 200, "{body}");
    let d = json_of(body.as_bytes());
    let levels = [
        "peak_allocated_bytes",
        "peak_reserved_bytes",
        "peak_device_bytes",
    ]
    .iter()
    .map(|k| gib(&d[*k]))
    .collect();
    let upper = ["allocated", "reserved", "device"]
        .iter()
        .map(|k| gib(&d["upper"][*k]))
        .collect();
    (levels, upper, d)
}

#[test]
fn the_page_shows_the_engines_numbers() {
    let (Some(driver), Some(chromium)) = (
        tool("MORO_CHROMEDRIVER", "/usr/bin/chromedriver"),
        tool("MORO_CHROMIUM", "/usr/bin/chromium"),
    ) else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must install chromium and chromium-driver (.ci/run does)"
        );
        eprintln!("skipped: no chromium/chromedriver (apt install chromium chromium-driver)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    let browser = Browser::start(&driver, &chromium);

    // A link with the job in it: the README's QLoRA job on an RTX 4090.
    browser.open(&format!(
        "{}/?model=Qwen/Qwen2.5-7B&method=qlora&seq_len=2048&hardware=rtx-4090",
        server.url
    ));
    browser.settled(1);
    let shown = browser.shown();
    let job = json!({"model": "Qwen/Qwen2.5-7B", "method": "qlora", "seq_len": 2048,
                     "hardware": "rtx-4090"});
    let (levels, upper, doc) = expected(&server, &job);
    assert_eq!(shown["levels"], json!(levels), "{shown}");
    assert_eq!(shown["upper"], json!(upper), "{shown}");
    // The README's figures, independently of the API.
    assert_eq!(levels, ["12.95", "14.25", "15.15"]);
    assert_eq!(doc["verdict"], "fits");
    assert!(
        shown["verdict"].as_str().unwrap().starts_with("fits: "),
        "{shown}"
    );
    assert_eq!(shown["charts"], 1, "the estimate's picture is on the page");

    // The fit table is `moro fit --json`'s rows, cheapest first.
    let fit = stdout_of(
        dir.path(),
        &[
            "fit",
            "--model",
            "Qwen/Qwen2.5-7B",
            "--method",
            "qlora",
            "--seq-len",
            "2048",
            "--json",
        ],
        0,
    );
    let fit = json_of(&fit);
    let first = &fit["fits"][0];
    assert_eq!(
        shown["fit"][0],
        json!([
            first["name"],
            first["gpus"].to_string(),
            first["strategy"],
            gib(&first["peak_device_bytes"]),
            gib(&first["peak_upper_bytes"])
        ]),
        "{shown}"
    );
    browser.screenshot(1280, 1900, "serve-desktop.png");

    // A user makes the context longer and picks another GPU: the numbers follow.
    browser.type_into("#seq_len", "8192");
    browser.click("#hardware option[value='a100-sxm4-80gb']");
    browser.showing(&["seq_len=8192", "hardware=a100-sxm4-80gb"]);
    let shown = browser.shown();
    let job = json!({"model": "Qwen/Qwen2.5-7B", "method": "qlora", "seq_len": 8192,
                     "hardware": "a100-sxm4-80gb"});
    let (levels, upper, _) = expected(&server, &job);
    assert_eq!(shown["levels"], json!(levels), "{shown}");
    assert_eq!(shown["upper"], json!(upper), "{shown}");
    assert_eq!(cli_device_gib(dir.path(), &[]), levels[2]);

    // The URL alone reproduces the page.
    let url = format!("{}/{}", server.url, shown["url"].as_str().unwrap());
    browser.open(&url);
    browser.settled(1);
    assert_eq!(browser.shown()["levels"], json!(levels));

    // Bad input shows the API's message, naming the field.
    browser.type_into("#lora_rank", "0");
    browser.showing(&["lora_rank=0"]);
    let verdict = browser.shown()["verdict"].as_str().unwrap().to_owned();
    assert!(verdict.contains("lora_rank"), "{verdict}");

    browser.type_into("#lora_rank", "16");

    // Liger's kernels turned on in the form: the CLI's `--liger` numbers.
    browser.click("#liger option[value='true']");
    browser.showing(&["liger=true"]);
    let shown = browser.shown();
    let job = json!({"model": "Qwen/Qwen2.5-7B", "method": "qlora", "seq_len": 8192,
                     "hardware": "a100-sxm4-80gb", "lora_rank": 16, "liger": true});
    let (with_liger, _, _) = expected(&server, &job);
    assert_eq!(shown["levels"], json!(with_liger), "{shown}");
    assert_ne!(with_liger, levels, "Liger changes the estimate");
    assert_eq!(cli_device_gib(dir.path(), &["--liger"]), with_liger[2]);
    browser.screenshot(390, 1500, "serve-phone.png");
}
