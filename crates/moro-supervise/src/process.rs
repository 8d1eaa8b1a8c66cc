//! One attempt of the training command: spawn, stream, forward signals, reap, clean up.
//!
//! The child runs in its **own process group** (`CommandExt::process_group(0)`), so that
//! launchers that fork workers (torchrun, accelerate, DeepSpeed) can be signalled and cleaned
//! up as a whole. Being in its own group also means the terminal no longer delivers Ctrl-C to
//! it: the terminal signals only its foreground group, which is moro's. So unlike `just`
//! (whose children share its group, and which therefore ignores SIGINT while they run), moro
//! forwards SIGINT, SIGTERM, SIGHUP and SIGQUIT to the child's whole group with `kill(-pgid)`.
//! A third signal, or the grace period running out, sends SIGKILL to the group.
//!
//! The child's stdout and stderr are piped and copied chunk by chunk, byte for byte, to moro's
//! stdout and stderr (so tqdm's carriage returns survive), while the last lines of both are
//! kept for classification ([`Tail`]). stdin is `/dev/null` (a background process group must not
//! read the terminal), and `PYTHONUNBUFFERED=1` keeps Python's output live through the pipe.
//!
//! When the group leader exits, whatever is left of its group gets SIGTERM and, after
//! [`LEFTOVER_GRACE`], SIGKILL: an out-of-memory restart must not find the old workers still
//! holding the GPU.

use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, ChildStderr, ChildStdout, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process_group, test_kill_process_group};
use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM};
use signal_hook::iterator::{Handle, Signals};

use crate::classify::Exit;
use crate::tail::{Stream, Tail};

/// How long leftover members of the group get after the leader exits, before SIGKILL.
pub const LEFTOVER_GRACE: Duration = Duration::from_secs(5);
const POLL: Duration = Duration::from_millis(20);

/// The end of one attempt.
#[derive(Debug)]
pub(crate) struct Attempt {
    pub exit: Exit,
    pub tail: Vec<u8>,
    /// The first signal forwarded on the user's behalf during the attempt.
    pub interrupt: Option<i32>,
    pub pgid: u32,
}

#[derive(Debug, Default)]
struct Shared {
    pgid: Option<Pid>,
    interrupt: Option<i32>,
    interrupt_at: Option<Instant>,
    count: u32,
}

/// Receives SIGINT/SIGTERM/SIGHUP/SIGQUIT for the whole supervised run and forwards them to
/// the current child's process group.
///
/// Once installed, these signals no longer terminate moro, and signal-hook cannot restore
/// their default action afterwards: the caller is expected to exit soon after the run.
pub(crate) struct Forwarder {
    shared: Arc<Mutex<Shared>>,
    thread: Option<(Handle, JoinHandle<()>)>,
}

fn lock(m: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Forwarder {
    /// Starts forwarding (`listen`), or only tracks the child (`!listen`, for embedding).
    pub(crate) fn install(listen: bool) -> io::Result<Self> {
        let shared = Arc::new(Mutex::new(Shared::default()));
        if !listen {
            return Ok(Self {
                shared,
                thread: None,
            });
        }
        let mut signals = Signals::new([SIGINT, SIGTERM, SIGHUP, SIGQUIT])?;
        let handle = signals.handle();
        let sh = Arc::clone(&shared);
        let thread = thread::Builder::new()
            .name("moro-signals".to_owned())
            .spawn(move || {
                for sig in signals.forever() {
                    let mut s = lock(&sh);
                    s.count += 1;
                    if s.interrupt.is_none() {
                        s.interrupt = Some(sig);
                        s.interrupt_at = Some(Instant::now());
                    }
                    if let Some(pgid) = s.pgid {
                        let signal = if s.count >= 3 {
                            Some(Signal::KILL)
                        } else {
                            Signal::from_named_raw(sig)
                        };
                        if let Some(signal) = signal {
                            // ESRCH: the group is already gone; nothing to do.
                            let _ = kill_process_group(pgid, signal);
                        }
                    }
                }
            })?;
        Ok(Self {
            shared,
            thread: Some((handle, thread)),
        })
    }

    /// The first signal received so far, if any.
    pub(crate) fn interrupted(&self) -> Option<i32> {
        lock(&self.shared).interrupt
    }

    fn interrupt_age(&self) -> Option<Duration> {
        lock(&self.shared).interrupt_at.map(|t| t.elapsed())
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        if let Some((handle, thread)) = self.thread.take() {
            handle.close();
            let _ = thread.join();
        }
    }
}

enum Event {
    Out(Vec<u8>),
    Err(Vec<u8>),
    Closed,
}

fn pump<R: Read>(mut r: R, tx: &Sender<Event>, wrap: fn(Vec<u8>) -> Event) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match r.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if tx.send(wrap(buf[..n].to_vec())).is_err() {
                    break;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    let _ = tx.send(Event::Closed);
}

fn spawn_readers(out: ChildStdout, err: ChildStderr) -> io::Result<Receiver<Event>> {
    let (tx, rx) = mpsc::channel();
    let tx2 = tx.clone();
    thread::Builder::new()
        .name("moro-stdout".to_owned())
        .spawn(move || pump(out, &tx, Event::Out))?;
    thread::Builder::new()
        .name("moro-stderr".to_owned())
        .spawn(move || pump(err, &tx2, Event::Err))?;
    Ok(rx)
}

/// A sink that stops being written to after its first error (a closed pipe downstream must
/// not stop the training run, whose output is still drained).
struct Sink<'a> {
    w: &'a mut dyn Write,
    ok: bool,
}

impl Sink<'_> {
    fn put(&mut self, bytes: &[u8]) {
        if self.ok
            && self
                .w
                .write_all(bytes)
                .and_then(|()| self.w.flush())
                .is_err()
        {
            self.ok = false;
        }
    }
}

fn group_alive(pgid: Pid) -> bool {
    test_kill_process_group(pgid).is_ok()
}

/// Runs `argv` once. `Ok(None)` when an interrupt arrived before it could start.
pub(crate) fn run_attempt(
    argv: &[OsString],
    env: &[(OsString, OsString)],
    fwd: &Forwarder,
    grace: Duration,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> io::Result<Option<Attempt>> {
    let Some((program, args)) = argv.split_first() else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty command"));
    };
    let mut cmd = Command::new(program);
    cmd.args(args)
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env("PYTHONUNBUFFERED", "1")
        .envs(env.iter().map(|(k, v)| (k, v)));
    // Spawn under the lock, so that a signal arriving now is either seen before the spawn
    // (and nothing starts) or forwarded to the new group.
    let mut child = {
        let mut s = lock(&fwd.shared);
        if s.interrupt.is_some() {
            return Ok(None);
        }
        let child = cmd.spawn()?;
        s.pgid = Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
        child
    };
    let pgid = Pid::from_child(&child);
    let result = supervise(&mut child, pgid, fwd, grace, stdout, stderr);
    lock(&fwd.shared).pgid = None;
    result.map(Some)
}

fn supervise(
    child: &mut Child,
    pgid: Pid,
    fwd: &Forwarder,
    grace: Duration,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> io::Result<Attempt> {
    let (Some(out), Some(err)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(io::Error::other("child pipes missing"));
    };
    let rx = match spawn_readers(out, err) {
        Ok(rx) => rx,
        Err(e) => {
            let _ = kill_process_group(pgid, Signal::KILL);
            let _ = child.wait();
            return Err(e);
        }
    };
    let mut out = Sink {
        w: stdout,
        ok: true,
    };
    let mut errs = Sink {
        w: stderr,
        ok: true,
    };
    let mut tail = Tail::default();
    let mut open = 2u8;
    let mut status = None;
    let mut exited_at: Option<Instant> = None;
    let mut term_sent = false;
    let mut kill_sent = false;
    loop {
        match rx.recv_timeout(POLL) {
            Ok(Event::Out(b)) => {
                out.put(&b);
                tail.push(Stream::Out, &b);
            }
            Ok(Event::Err(b)) => {
                errs.put(&b);
                tail.push(Stream::Err, &b);
            }
            Ok(Event::Closed) => open = open.saturating_sub(1),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => open = 0,
        }
        if status.is_none() {
            if let Some(s) = child.try_wait()? {
                status = Some(s);
                exited_at = Some(Instant::now());
            } else if !kill_sent && fwd.interrupt_age().is_some_and(|age| age >= grace) {
                let _ = kill_process_group(pgid, Signal::KILL);
                kill_sent = true;
            }
        }
        if let Some(at) = exited_at {
            let alive = group_alive(pgid);
            if open == 0 && !alive {
                break;
            }
            if alive && !term_sent {
                let _ = kill_process_group(pgid, Signal::TERM);
                term_sent = true;
            }
            if alive && !kill_sent && at.elapsed() >= LEFTOVER_GRACE {
                let _ = kill_process_group(pgid, Signal::KILL);
                kill_sent = true;
            }
            // Pipes still held open by a process that left the group (a daemon that called
            // setsid): stop waiting for them.
            if !alive && at.elapsed() >= LEFTOVER_GRACE + Duration::from_secs(1) {
                break;
            }
            if alive && at.elapsed() >= LEFTOVER_GRACE * 2 {
                break;
            }
        }
    }
    // Drain whatever is already buffered.
    while let Ok(ev) = rx.try_recv() {
        match ev {
            Event::Out(b) => {
                out.put(&b);
                tail.push(Stream::Out, &b);
            }
            Event::Err(b) => {
                errs.put(&b);
                tail.push(Stream::Err, &b);
            }
            Event::Closed => {}
        }
    }
    let status = match status {
        Some(s) => s,
        None => child.wait()?,
    };
    let exit = match (status.code(), status.signal()) {
        (Some(c), _) => Exit::Code(c),
        (None, Some(s)) => Exit::Signal(s),
        (None, None) => Exit::Code(1),
    };
    let interrupt = fwd.interrupted();
    Ok(Attempt {
        exit,
        tail: tail.finish(),
        interrupt,
        pgid: pgid.as_raw_nonzero().get().unsigned_abs(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Vec<OsString> {
        vec!["sh".into(), "-c".into(), script.into()]
    }

    #[test]
    fn streams_bytes_and_keeps_the_tail() {
        let fwd = Forwarder::install(false).unwrap_or_else(|e| panic!("{e}"));
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let a = run_attempt(
            &sh("printf 'a\\rb\\r'; printf 'oops\\n' >&2; exit 3"),
            &[],
            &fwd,
            Duration::from_secs(5),
            &mut out,
            &mut err,
        )
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("not started"));
        assert_eq!(out, b"a\rb\r");
        assert_eq!(err, b"oops\n");
        assert_eq!(a.exit, Exit::Code(3));
        assert!(
            a.tail == b"a\rb\roops\n" || a.tail == b"oops\na\rb\r",
            "{:?}",
            String::from_utf8_lossy(&a.tail)
        );
        assert_eq!(a.interrupt, None);
        assert!(!group_alive(
            Pid::from_raw(i32::try_from(a.pgid).unwrap_or(1)).unwrap_or(Pid::INIT)
        ));
    }

    #[test]
    fn leftovers_in_the_group_are_killed() {
        let fwd = Forwarder::install(false).unwrap_or_else(|e| panic!("{e}"));
        let (mut out, mut err) = (Vec::new(), Vec::new());
        // The leader exits at once, leaving a sleeping member that holds the pipes.
        let started = Instant::now();
        let a = run_attempt(
            &sh("sleep 30 & echo started"),
            &[],
            &fwd,
            Duration::from_secs(5),
            &mut out,
            &mut err,
        )
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("not started"));
        assert_eq!(a.exit, Exit::Code(0));
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "took {:?}",
            started.elapsed()
        );
        let pgid = Pid::from_raw(i32::try_from(a.pgid).unwrap_or(1)).unwrap_or(Pid::INIT);
        assert!(!group_alive(pgid));
    }

    #[test]
    fn a_missing_program_is_an_error() {
        let fwd = Forwarder::install(false).unwrap_or_else(|e| panic!("{e}"));
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let r = run_attempt(
            &["/nonexistent/moro-test-program".into()],
            &[],
            &fwd,
            Duration::from_secs(1),
            &mut out,
            &mut err,
        );
        assert!(r.is_err());
    }
}
