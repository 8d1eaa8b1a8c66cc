//! How a training run ended, from its exit status and the tail of its output.
//!
//! Pure: [`classify`] looks at bytes and numbers handed in, nothing else. It decides between
//! success, an out-of-memory failure (which the heal ladder may fix), any other failure (which
//! it must not touch) and an interruption (never restarted).
//!
//! Recognised out-of-memory messages, newest line first:
//! - PyTorch's caching allocator on CUDA: `torch.OutOfMemoryError: CUDA out of memory. Tried
//!   to allocate …` (torch ≥ 2.5), `torch.cuda.OutOfMemoryError`, `RuntimeError: CUDA out of
//!   memory.` (older), and the CUDA runtime's own `CUDA error: out of memory`;
//! - ROCm (`HIP out of memory`) and Apple (`MPS backend out of memory`);
//! - cuBLAS / cuDNN allocation failures (`CUBLAS_STATUS_ALLOC_FAILED`,
//!   `CUDNN_STATUS_ALLOC_FAILED`, `CUDNN_STATUS_NOT_ENOUGH_WORKSPACE`);
//! - bitsandbytes' native library (`Error out of memory at line N in file …pythonInterface…`,
//!   printed when `cudaMallocManaged` fails for paged optimizers) and its managed-pointer
//!   failures;
//! - the host OOM killer. This one is a **heuristic**: the kernel leaves no message in the
//!   child's output, so a child killed by `SIGKILL` (or exiting 137, a shell's way of saying
//!   the same) that moro did not kill itself is taken as the OOM killer's work; a shell's
//!   `Killed` line, when present, is quoted.
//!
//! Allocation figures (`Tried to allocate`, `of which … is free`, `total capacity`,
//! `this process has … memory in use`) are parsed when present, in both the current and the
//! pre-2.5 wording, so the supervisor can say how far off a prediction was.

use std::fmt;

/// How the child process ended, as the OS reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// It exited with this code.
    Code(i32),
    /// It was killed by this signal number.
    Signal(i32),
}

impl Exit {
    /// The shell convention for an exit status: the code, or 128 + the signal number.
    #[must_use]
    pub const fn shell_code(self) -> i32 {
        match self {
            Self::Code(c) => c,
            Self::Signal(s) => 128 + s,
        }
    }
}

/// Which allocator or mechanism reported the out-of-memory condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OomKind {
    /// PyTorch / CUDA runtime on NVIDIA.
    Cuda,
    /// PyTorch on ROCm.
    Hip,
    /// PyTorch on Apple's Metal backend.
    Mps,
    /// cuBLAS workspace or handle allocation.
    Cublas,
    /// cuDNN workspace or allocation.
    Cudnn,
    /// bitsandbytes' native allocations (paged optimizer states, managed memory).
    Bitsandbytes,
    /// Killed by the kernel's OOM killer (heuristic: see the module docs).
    HostOomKiller,
}

impl OomKind {
    /// A short name for messages.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Cuda => "CUDA",
            Self::Hip => "HIP",
            Self::Mps => "MPS",
            Self::Cublas => "cuBLAS",
            Self::Cudnn => "cuDNN",
            Self::Bitsandbytes => "bitsandbytes",
            Self::HostOomKiller => "host OOM killer",
        }
    }
}

impl fmt::Display for OomKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An out-of-memory failure and what its message says about memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Oom {
    /// Who reported it.
    pub kind: OomKind,
    /// The line that matched, trimmed (or a description for the OOM killer).
    pub text: String,
    /// `Tried to allocate X`.
    pub tried_to_allocate: Option<u64>,
    /// `of which Y is free` / `Y free`.
    pub free: Option<u64>,
    /// `total capacity of T` / `T total capacity`.
    pub total: Option<u64>,
    /// `this process has Z memory in use` (torch ≥ 2.5).
    pub process_in_use: Option<u64>,
}

impl Oom {
    /// A lower bound on the device memory the failed configuration needed, when the message
    /// carries enough figures: what the process held plus what it asked for, or the device's
    /// capacity minus what was free plus the request.
    #[must_use]
    pub fn observed_need(&self) -> Option<u64> {
        let x = self.tried_to_allocate?;
        if let Some(z) = self.process_in_use {
            return Some(z.saturating_add(x));
        }
        let t = self.total?;
        Some(t.saturating_sub(self.free.unwrap_or(0)).saturating_add(x))
    }
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Exit code 0.
    Success,
    /// Out of memory: the heal ladder may help.
    Oom(Oom),
    /// Interrupted by the user or by a termination signal: never restarted.
    Interrupted {
        /// The signal, when known (by number).
        signal: Option<i32>,
    },
    /// Any other failure: not healed.
    OtherFailure,
}

const SIGHUP: i32 = 1;
const SIGINT: i32 = 2;
const SIGQUIT: i32 = 3;
const SIGKILL: i32 = 9;
const SIGTERM: i32 = 15;

/// Classifies a finished run.
///
/// `tail` is the end of the child's combined output (a few tens of KiB is plenty).
/// `interrupt` is the signal moro forwarded to the child on the user's behalf, if any: a user
/// interrupt wins over everything else, so a run stopped with Ctrl-C is never restarted even
/// when its last words were an out-of-memory error.
#[must_use]
pub fn classify(exit: Exit, tail: &[u8], interrupt: Option<i32>) -> Outcome {
    if exit == Exit::Code(0) {
        return Outcome::Success;
    }
    if let Some(sig) = interrupt {
        return Outcome::Interrupted { signal: Some(sig) };
    }
    match exit {
        Exit::Signal(s @ (SIGINT | SIGTERM | SIGHUP | SIGQUIT)) => {
            return Outcome::Interrupted { signal: Some(s) };
        }
        Exit::Code(130) => {
            return Outcome::Interrupted {
                signal: Some(SIGINT),
            };
        }
        Exit::Code(143) => {
            return Outcome::Interrupted {
                signal: Some(SIGTERM),
            };
        }
        _ => {}
    }
    let text = String::from_utf8_lossy(tail);
    if let Some(oom) = find_oom(&text) {
        return Outcome::Oom(oom);
    }
    if matches!(exit, Exit::Signal(SIGKILL) | Exit::Code(137)) {
        let killed = text
            .split(['\n', '\r'])
            .rev()
            .map(str::trim)
            .find(|l| l.split_whitespace().any(|w| w == "Killed"));
        let text = match killed {
            Some(line) => format!("{line} (killed by SIGKILL: likely the host OOM killer)"),
            None => "killed by SIGKILL: likely the host OOM killer".to_owned(),
        };
        return Outcome::Oom(Oom {
            kind: OomKind::HostOomKiller,
            text,
            tried_to_allocate: None,
            free: None,
            total: None,
            process_in_use: None,
        });
    }
    Outcome::OtherFailure
}

/// The last out-of-memory line in `text`, with the figures parsed from it.
#[must_use]
pub fn find_oom(text: &str) -> Option<Oom> {
    let lines: Vec<&str> = text.split(['\n', '\r']).map(str::trim).collect();
    let (i, kind) = lines
        .iter()
        .enumerate()
        .rev()
        .find_map(|(i, l)| line_kind(l).map(|k| (i, k)))?;
    // Old-style PyTorch messages and some loggers wrap the figures onto the next lines;
    // parse the matching line together with the two after it.
    let end = (i + 3).min(lines.len());
    let joined = lines[i..end].join(" ");
    Some(Oom {
        kind,
        text: truncate(lines[i], 600),
        tried_to_allocate: size_after(&joined, "Tried to allocate "),
        free: size_after(&joined, "of which ").or_else(|| size_before(&joined, " free")),
        total: size_after(&joined, "total capacity of ")
            .or_else(|| size_before(&joined, " total capacity")),
        process_in_use: size_after(&joined, "this process has "),
    })
}

fn line_kind(l: &str) -> Option<OomKind> {
    if l.contains("HIP out of memory") {
        Some(OomKind::Hip)
    } else if l.contains("MPS backend out of memory") {
        Some(OomKind::Mps)
    } else if l.contains("CUBLAS_STATUS_ALLOC_FAILED") {
        Some(OomKind::Cublas)
    } else if l.contains("CUDNN_STATUS_ALLOC_FAILED")
        || l.contains("CUDNN_STATUS_NOT_ENOUGH_WORKSPACE")
    {
        Some(OomKind::Cudnn)
    } else if (l.starts_with("Error out of memory at line") && l.contains(" in file "))
        || ((l.contains("cudaMallocManaged") || l.contains("cget_managed_ptr"))
            && l.contains("out of memory"))
    {
        Some(OomKind::Bitsandbytes)
    } else if l.contains("CUDA out of memory")
        || l.contains("torch.OutOfMemoryError")
        || l.contains("torch.cuda.OutOfMemoryError")
        || l.contains("CUDA error: out of memory")
    {
        Some(OomKind::Cuda)
    } else {
        None
    }
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// Parses `<number> <unit>` right after `marker`.
fn size_after(text: &str, marker: &str) -> Option<u64> {
    let at = text.find(marker)? + marker.len();
    parse_size_prefix(&text[at..])
}

/// Parses the `<number> <unit>` right before the first `marker` that has one (`3.12 MiB free`).
fn size_before(text: &str, marker: &str) -> Option<u64> {
    let mut from = 0;
    while let Some(rel) = text[from..].find(marker) {
        let at = from + rel;
        let before = &text[..at];
        // Take the last two whitespace-separated words: number and unit.
        let mut words = before.rsplitn(3, char::is_whitespace);
        let unit = words.next()?;
        let number = words.next().unwrap_or("");
        let number = number.trim_start_matches(['(', ';', ',']);
        if let Some(bytes) = parse_size_prefix(&format!("{number} {unit}")) {
            return Some(bytes);
        }
        from = at + marker.len();
    }
    None
}

/// Parses `2.00 GiB`, `415.28 MiB`, `20 bytes`, `1.5 GB` (PyTorch's 1024-based units, also
/// for MPS's `GB`/`MB` spellings) at the start of `s`.
fn parse_size_prefix(s: &str) -> Option<u64> {
    let s = s.trim_start();
    let num_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    if num_end == 0 {
        return None;
    }
    let value: f64 = s[..num_end].parse().ok()?;
    let rest = s[num_end..].trim_start();
    let unit_end = rest
        .find(|c: char| !c.is_ascii_alphabetic())
        .unwrap_or(rest.len());
    let mult: f64 = match &rest[..unit_end] {
        "bytes" | "B" | "byte" => 1.0,
        "KiB" | "KB" | "kB" => 1024.0,
        "MiB" | "MB" => 1024.0 * 1024.0,
        "GiB" | "GB" => 1024.0 * 1024.0 * 1024.0,
        "TiB" | "TB" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    let bytes = value * mult;
    if !bytes.is_finite() || !(0.0..=1.0e18).contains(&bytes) {
        return None;
    }
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Some(bytes.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
    const MIB: f64 = 1024.0 * 1024.0;

    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    fn gib(x: f64) -> u64 {
        (x * GIB).round() as u64
    }

    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    fn mib(x: f64) -> u64 {
        (x * MIB).round() as u64
    }

    const TORCH_25: &str = "Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\n    loss.backward()\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.65 GiB of which 1.12 GiB is free. Including non-PyTorch memory, this process has 22.52 GiB memory in use. Of the allocated memory 21.87 GiB is allocated by PyTorch, and 415.28 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)\n";

    fn oom(exit: Exit, text: &str) -> Oom {
        match classify(exit, text.as_bytes(), None) {
            Outcome::Oom(o) => o,
            other => panic!("expected an OOM, got {other:?}"),
        }
    }

    #[test]
    fn torch_25_message_with_figures() {
        let o = oom(Exit::Code(1), TORCH_25);
        assert_eq!(o.kind, OomKind::Cuda);
        assert!(
            o.text
                .starts_with("torch.OutOfMemoryError: CUDA out of memory. Tried")
        );
        assert_eq!(o.tried_to_allocate, Some(gib(2.0)));
        assert_eq!(o.free, Some(gib(1.12)));
        assert_eq!(o.total, Some(gib(23.65)));
        assert_eq!(o.process_in_use, Some(gib(22.52)));
        assert_eq!(o.observed_need(), Some(gib(22.52) + gib(2.0)));
    }

    #[test]
    fn pre_25_message_with_figures() {
        let t = "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; 14.56 GiB already allocated; 3.12 MiB free; 14.70 GiB reserved in total by PyTorch) If reserved memory is >> allocated memory try setting max_split_size_mb";
        let o = oom(Exit::Code(1), t);
        assert_eq!(o.kind, OomKind::Cuda);
        assert_eq!(o.tried_to_allocate, Some(mib(20.0)));
        assert_eq!(o.total, Some(gib(15.78)));
        assert_eq!(o.free, Some(mib(3.12)));
        assert_eq!(o.process_in_use, None);
        assert_eq!(o.observed_need(), Some(gib(15.78) - mib(3.12) + mib(20.0)));
    }

    #[test]
    fn bare_messages() {
        for (t, kind) in [
            ("RuntimeError: CUDA out of memory.", OomKind::Cuda),
            ("torch.cuda.OutOfMemoryError", OomKind::Cuda),
            ("RuntimeError: CUDA error: out of memory", OomKind::Cuda),
            (
                "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 1.00 GiB.",
                OomKind::Hip,
            ),
            (
                "RuntimeError: MPS backend out of memory (MPS allocated: 17.10 GB, other allocations: 1.2 GB, max allowed: 18.13 GB). Tried to allocate 256.00 MB on private pool.",
                OomKind::Mps,
            ),
            (
                "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
                OomKind::Cublas,
            ),
            (
                "RuntimeError: cuDNN error: CUDNN_STATUS_NOT_ENOUGH_WORKSPACE",
                OomKind::Cudnn,
            ),
            (
                "RuntimeError: cuDNN error: CUDNN_STATUS_ALLOC_FAILED",
                OomKind::Cudnn,
            ),
            (
                "Error out of memory at line 351 in file /home/dev/bitsandbytes/csrc/pythonInterface.c",
                OomKind::Bitsandbytes,
            ),
            (
                "cudaMallocManaged failed: out of memory",
                OomKind::Bitsandbytes,
            ),
        ] {
            let o = oom(Exit::Code(1), t);
            assert_eq!(o.kind, kind, "{t}");
            assert_eq!(o.text, t);
        }
    }

    #[test]
    fn mps_figures_use_1024() {
        let o = oom(
            Exit::Code(1),
            "RuntimeError: MPS backend out of memory (MPS allocated: 17.10 GB). Tried to allocate 256.00 MB on private pool.",
        );
        assert_eq!(o.tried_to_allocate, Some(mib(256.0)));
    }

    #[test]
    fn last_matching_line_wins() {
        let t = format!("warning: CUDA out of memory once, retrying\nstep 3\n{TORCH_25}");
        let o = oom(Exit::Code(1), &t);
        assert!(o.text.contains("Tried to allocate 2.00 GiB"));
    }

    #[test]
    fn host_oom_killer_is_a_heuristic_on_sigkill() {
        let o = oom(Exit::Signal(9), "step 10\n");
        assert_eq!(o.kind, OomKind::HostOomKiller);
        assert!(o.text.contains("likely the host OOM killer"));
        let o = oom(
            Exit::Code(137),
            "step 10\nbash: line 1:  4242 Killed  python train.py\n",
        );
        assert_eq!(o.kind, OomKind::HostOomKiller);
        assert!(o.text.starts_with("bash: line 1:"));
        let o = oom(Exit::Code(137), "Killed\n");
        assert_eq!(
            o.text,
            "Killed (killed by SIGKILL: likely the host OOM killer)"
        );
    }

    #[test]
    fn success_beats_an_oom_in_the_output() {
        // e.g. auto_find_batch_size recovered by itself.
        assert_eq!(
            classify(Exit::Code(0), TORCH_25.as_bytes(), None),
            Outcome::Success
        );
    }

    #[test]
    fn user_interrupt_beats_an_oom() {
        assert_eq!(
            classify(Exit::Code(1), TORCH_25.as_bytes(), Some(2)),
            Outcome::Interrupted { signal: Some(2) }
        );
        assert_eq!(
            classify(Exit::Signal(15), b"", None),
            Outcome::Interrupted { signal: Some(15) }
        );
        assert_eq!(
            classify(Exit::Code(130), b"", None),
            Outcome::Interrupted { signal: Some(2) }
        );
    }

    #[test]
    fn other_failures() {
        let t = "Traceback (most recent call last):\nValueError: dataset has no column `text`\n";
        assert_eq!(
            classify(Exit::Code(1), t.as_bytes(), None),
            Outcome::OtherFailure
        );
        assert_eq!(classify(Exit::Signal(11), b"", None), Outcome::OtherFailure);
        // "out of memory" in a filename or an unrelated sentence is not enough.
        assert_eq!(
            classify(
                Exit::Code(2),
                b"error: no such file: notes/out of memory.md\n",
                None
            ),
            Outcome::OtherFailure
        );
    }

    #[test]
    fn carriage_returns_and_invalid_utf8_are_fine() {
        let mut t = b"\r 10%|#    | 1/10\r 20%|##   | 2/10\xff\xfe\n".to_vec();
        t.extend_from_slice(TORCH_25.as_bytes());
        match classify(Exit::Code(1), &t, None) {
            Outcome::Oom(o) => assert_eq!(o.tried_to_allocate, Some(gib(2.0))),
            other => panic!("expected an OOM, got {other:?}"),
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size_prefix("20 bytes"), Some(20));
        assert_eq!(parse_size_prefix("1.50 KiB."), Some(1536));
        assert_eq!(parse_size_prefix("x GiB"), None);
        assert_eq!(parse_size_prefix("3 apples"), None);
        assert_eq!(
            size_before("(GPU 0; 7.93 GiB total capacity; 47.06 MiB free;", " free"),
            Some(mib(47.06))
        );
    }

    #[test]
    fn long_lines_are_truncated_on_a_char_boundary() {
        let t = format!("RuntimeError: CUDA out of memory. {}", "é".repeat(600));
        let o = oom(Exit::Code(1), &t);
        assert!(o.text.len() <= 604);
        assert!(o.text.ends_with('…'));
    }
}
