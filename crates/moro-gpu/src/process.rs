//! Running a probe command with a deadline, so detection never hangs on a wedged driver.

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// Output kept per stream; probe outputs are a few KiB, the rest is read and dropped so the
/// child never blocks on a full pipe.
const MAX_CAPTURE: usize = 1 << 20;

/// How often the child is polled.
const POLL: Duration = Duration::from_millis(10);

/// What a finished command printed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    /// Exit code (`None` when killed by a signal).
    pub code: Option<i32>,
    /// Standard output, lossily decoded.
    pub stdout: String,
    /// Standard error, lossily decoded.
    pub stderr: String,
}

impl Output {
    /// Exit code 0.
    #[must_use]
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }

    /// First non-empty line of stderr, else of stdout, for notes.
    #[must_use]
    pub fn first_line(&self) -> String {
        self.stderr
            .lines()
            .chain(self.stdout.lines())
            .map(str::trim)
            .find(|l| !l.is_empty())
            .unwrap_or("")
            .to_string()
    }
}

/// Why a command gave no output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunError {
    /// The program is not installed (not on `PATH`).
    NotFound,
    /// It ran past the deadline and was killed.
    Timeout(Duration),
    /// Spawning or waiting failed otherwise.
    Io(String),
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotFound => write!(f, "not found"),
            Self::Timeout(t) => write!(f, "no answer within {} s, killed", t.as_secs_f32()),
            Self::Io(e) => write!(f, "{e}"),
        }
    }
}

fn drain(mut r: impl Read) -> Vec<u8> {
    let mut kept = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match r.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = MAX_CAPTURE.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
    kept
}

/// Runs `program args…` with stdin closed, killing it after `timeout`.
///
/// # Errors
/// [`RunError`] when the program is missing, times out or cannot be run.
pub fn run(program: &str, args: &[&str], timeout: Duration) -> Result<Output, RunError> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => RunError::NotFound,
            _ => RunError::Io(e.to_string()),
        })?;
    let (tx, rx) = mpsc::channel::<(bool, Vec<u8>)>();
    if let Some(out) = child.stdout.take() {
        let tx = tx.clone();
        thread::spawn(move || tx.send((true, drain(out))));
    }
    if let Some(err) = child.stderr.take() {
        let tx = tx.clone();
        thread::spawn(move || tx.send((false, drain(err))));
    }
    drop(tx);
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if start.elapsed() >= timeout => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(RunError::Timeout(timeout));
            }
            Ok(None) => thread::sleep(POLL),
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(RunError::Io(e.to_string()));
            }
        }
    };
    // The pipes close when the child exits; a grandchild still holding them must not
    // hang us either, so the readers get a short grace period.
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let grace = Instant::now() + Duration::from_secs(1);
    for _ in 0..2 {
        let left = grace.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((true, b)) => stdout = b,
            Ok((false, b)) => stderr = b,
            Err(_) => break,
        }
    }
    Ok(Output {
        code: status.code(),
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    })
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    #[test]
    fn captures_both_streams_and_the_code() {
        let out = run(
            "sh",
            &["-c", "echo hi; echo oops >&2; exit 3"],
            Duration::from_secs(5),
        )
        .unwrap();
        assert_eq!(out.code, Some(3));
        assert_eq!(out.stdout, "hi\n");
        assert_eq!(out.stderr, "oops\n");
        assert_eq!(out.first_line(), "oops");
        assert!(!out.success());
    }

    #[test]
    fn kills_a_hung_command() {
        let start = Instant::now();
        let err = run("sh", &["-c", "sleep 30"], Duration::from_millis(200)).unwrap_err();
        assert!(matches!(err, RunError::Timeout(_)), "{err:?}");
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn missing_program_is_not_found() {
        let err = run("moro-no-such-tool-xyz", &[], Duration::from_secs(1)).unwrap_err();
        assert_eq!(err, RunError::NotFound);
        assert_eq!(err.to_string(), "not found");
    }

    #[test]
    fn large_output_does_not_block() {
        let out = run(
            "sh",
            &["-c", "head -c 3000000 /dev/zero"],
            Duration::from_secs(10),
        )
        .unwrap();
        assert!(out.success());
        assert_eq!(out.stdout.len(), MAX_CAPTURE);
    }
}
