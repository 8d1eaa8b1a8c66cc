//! Load on `moro serve`'s API from a local generator (loopback only, bounded in count and
//! time): keep-alive HTTP/1.1 connections each sending one `POST /api/estimate` after
//! another. Prints throughput, latency percentiles, errors and the server's resident memory
//! before and after each round (flat memory: no growth from round to round).
//!
//! `cargo bench -p moro --bench serve_load [-- CONNECTIONS REQUESTS]` (default 4 × 10,000 per
//! round, 5 rounds, 60 s at most per round).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BODY: &str = r#"{"model": "Qwen/Qwen2.5-7B", "method": "qlora", "seq_len": 2048, "micro_batch_size": 1, "hardware": "rtx-4090"}"#;
const ROUNDS: usize = 5;
const ROUND_LIMIT: Duration = Duration::from_secs(60);

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// Sends one request on `conn` and reads its answer; the status code.
fn one(conn: &mut BufReader<TcpStream>, request: &[u8]) -> std::io::Result<u16> {
    conn.get_mut().write_all(request)?;
    let mut line = String::new();
    conn.read_line(&mut line)?;
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let mut length = 0usize;
    loop {
        line.clear();
        conn.read_line(&mut line)?;
        if line == "\r\n" || line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':')
            && k.eq_ignore_ascii_case("content-length")
        {
            length = v.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0; length];
    conn.read_exact(&mut body)?;
    Ok(status)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let connections: usize = args.first().and_then(|s| s.parse().ok()).unwrap_or(4);
    let per_round: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(10_000);

    let mut server = Command::new(env!("CARGO_BIN_EXE_moro"))
        .args(["serve", "--port", "0", "--offline"])
        .env("HF_HUB_CACHE", "/nonexistent-moro-bench-cache")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("moro serve starts");
    let mut banner = String::new();
    BufReader::new(server.stderr.take().unwrap())
        .read_line(&mut banner)
        .unwrap();
    let addr = banner
        .split_whitespace()
        .find_map(|w| w.strip_prefix("http://"))
        .unwrap()
        .trim_end_matches('/')
        .to_owned();
    assert!(addr.starts_with("127.0.0.1:"), "loopback only: {addr}");
    let request = format!(
        "POST /api/estimate HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{BODY}",
        BODY.len()
    )
    .into_bytes();
    let pid = server.id();
    println!("moro serve: {connections} connections × {per_round} POST /api/estimate per round");
    for round in 1..=ROUNDS {
        let before = rss_kib(pid);
        let start = Instant::now();
        let per_conn = per_round.div_ceil(connections);
        let results: Vec<(Vec<Duration>, usize)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..connections)
                .map(|_| {
                    let (addr, request) = (&addr, &request);
                    s.spawn(move || {
                        let mut conn = BufReader::new(TcpStream::connect(addr).unwrap());
                        conn.get_ref().set_nodelay(true).unwrap();
                        let mut times = Vec::with_capacity(per_conn);
                        let mut errors = 0;
                        for _ in 0..per_conn {
                            if start.elapsed() > ROUND_LIMIT {
                                break;
                            }
                            let t = Instant::now();
                            match one(&mut conn, request) {
                                Ok(200) => times.push(t.elapsed()),
                                _ => errors += 1,
                            }
                        }
                        (times, errors)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let wall = start.elapsed();
        let mut times: Vec<Duration> = results.iter().flat_map(|r| r.0.iter().copied()).collect();
        let errors: usize = results.iter().map(|r| r.1).sum();
        times.sort_unstable();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "round {round}: {} ok, {errors} errors in {:.2} s: {:.0} requests/s; latency ms p50 {:.2} \
             p90 {:.2} p99 {:.2} max {:.2}; server RSS {} → {} KiB",
            times.len(),
            wall.as_secs_f64(),
            times.len() as f64 / wall.as_secs_f64(),
            ms(percentile(&times, 50.0)),
            ms(percentile(&times, 90.0)),
            ms(percentile(&times, 99.0)),
            ms(times.last().copied().unwrap_or_default()),
            before,
            rss_kib(pid)
        );
    }
    let _ = server.kill();
    let _ = server.wait();
}
