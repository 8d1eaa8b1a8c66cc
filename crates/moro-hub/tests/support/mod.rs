//! A tiny HTTP/1.1 server on 127.0.0.1:0 (std::net only) serving a Hub layout,
//! `/{org}/{name}/resolve/{rev}/{file}`, with `Range`, tokens, redirects and delays.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

/// A commit sha the fake Hub reports.
pub const COMMIT: &str = "1111111111111111111111111111111111111111";

#[derive(Clone, Default)]
pub struct Route {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// `Authorization: Bearer {token}` required, else 401.
    pub token: Option<String>,
    pub delay: Option<Duration>,
    /// Answer 200 with the whole body even to a Range request.
    pub ignore_range: bool,
}

#[derive(Clone, Debug)]
pub struct Logged {
    pub path: String,
    pub auth: Option<String>,
    pub range: Option<String>,
    pub bytes_sent: usize,
}

#[derive(Clone)]
pub struct Server {
    pub port: u16,
    routes: Arc<Mutex<HashMap<String, Route>>>,
    log: Arc<Mutex<Vec<Logged>>>,
}

impl Server {
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = Self {
            port,
            routes: Arc::default(),
            log: Arc::default(),
        };
        let s = server.clone();
        thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let s = s.clone();
                thread::spawn(move || s.handle(stream));
            }
        });
        server
    }

    /// `http://127.0.0.1:{port}`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The same server under another host name.
    pub fn localhost_url(&self) -> String {
        format!("http://localhost:{}", self.port)
    }

    pub fn route(&self, path: &str, route: Route) {
        self.routes.lock().unwrap().insert(path.to_owned(), route);
    }

    /// A Hub file at `main`, with the headers the Hub sends.
    pub fn file(&self, repo: &str, file: &str, body: Vec<u8>) {
        self.route(
            &format!("/{repo}/resolve/main/{file}"),
            Route {
                status: 200,
                headers: hub_headers(&body),
                body,
                ..Route::default()
            },
        );
    }

    pub fn log(&self) -> Vec<Logged> {
        self.log.lock().unwrap().clone()
    }

    fn handle(&self, stream: TcpStream) {
        let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut head = Vec::new();
        loop {
            let mut line = String::new();
            match reader.by_ref().take(8192).read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            if line == "\r\n" || line == "\n" {
                break;
            }
            head.push(line.trim_end().to_owned());
            if head.len() > 100 {
                return;
            }
        }
        let Some(path) = head
            .first()
            .and_then(|l| l.split(' ').nth(1))
            .map(str::to_owned)
        else {
            return;
        };
        let get = |name: &str| {
            head.iter().skip(1).find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.trim()
                    .eq_ignore_ascii_case(name)
                    .then(|| v.trim().to_owned())
            })
        };
        let (auth, range) = (get("authorization"), get("range"));
        let route = self.routes.lock().unwrap().get(&path).cloned();
        let (status, mut headers, mut body) = match &route {
            None => (
                404,
                vec![("X-Error-Code".into(), "EntryNotFound".into())],
                b"not found".to_vec(),
            ),
            Some(r)
                if r.token
                    .as_ref()
                    .is_some_and(|t| auth.as_deref() != Some(&format!("Bearer {t}"))) =>
            {
                (
                    401,
                    vec![("X-Error-Code".into(), "GatedRepo".into())],
                    b"gated".to_vec(),
                )
            }
            Some(r) => (r.status, r.headers.clone(), r.body.clone()),
        };
        if let Some(d) = route.as_ref().and_then(|r| r.delay) {
            thread::sleep(d);
        }
        let mut status = status;
        if let (200, Some(range), false) = (
            status,
            &range,
            route.as_ref().is_some_and(|r| r.ignore_range),
        ) {
            let spec = range.trim_start_matches("bytes=");
            let (a, b) = spec.split_once('-').unwrap();
            let total = body.len();
            let a: usize = a.parse().unwrap();
            let b: usize = b.parse::<usize>().unwrap().min(total.saturating_sub(1));
            body = if a < total {
                body[a..=b].to_vec()
            } else {
                Vec::new()
            };
            headers.push(("Content-Range".into(), format!("bytes {a}-{b}/{total}")));
            status = 206;
        }
        self.log.lock().unwrap().push(Logged {
            path,
            auth,
            range,
            bytes_sent: body.len(),
        });
        let mut out = format!(
            "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n",
            body.len()
        );
        for (k, v) in headers {
            out.push_str(&format!("{k}: {v}\r\n"));
        }
        out.push_str("\r\n");
        let mut stream = reader.into_inner();
        let _ = stream.write_all(out.as_bytes());
        let _ = stream.write_all(&body);
        let _ = stream.flush();
    }
}

/// `X-Repo-Commit` and an `ETag` derived from the content, as the Hub sends them.
pub fn hub_headers(body: &[u8]) -> Vec<(String, String)> {
    let sum: u64 = body.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    vec![
        ("X-Repo-Commit".into(), COMMIT.into()),
        ("ETag".into(), format!("\"{sum:016x}\"")),
    ]
}
