//! The last output of a child's stdout and stderr together, kept whole line by whole line.
//!
//! The two pipes are read by two threads, so their chunks reach the supervisor in any order: a
//! traceback that Python writes in several `write()` calls (`torch.OutOfMemoryError`, then
//! `: CUDA out of memory. …`) can arrive with a late stdout chunk between its pieces. Each
//! stream's unfinished line is therefore held back until its newline (or tqdm's carriage
//! return) comes, and only finished lines join the shared tail, so a line in the tail is always
//! a line one stream printed.

/// How much of the child's output is kept for classification.
pub const TAIL_BYTES: usize = 64 * 1024;

/// Which pipe a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stream {
    Out,
    Err,
}

/// The merged tail, and each stream's line in progress.
#[derive(Debug, Default)]
pub(crate) struct Tail {
    lines: Vec<u8>,
    out: Vec<u8>,
    err: Vec<u8>,
}

impl Tail {
    /// Adds a chunk read from `stream`.
    pub(crate) fn push(&mut self, stream: Stream, bytes: &[u8]) {
        let pending = match stream {
            Stream::Out => &mut self.out,
            Stream::Err => &mut self.err,
        };
        pending.extend_from_slice(bytes);
        let finished = match pending.iter().rposition(|&b| b == b'\n' || b == b'\r') {
            Some(end) => end + 1,
            // A line longer than the whole tail is kept only by its end anyway.
            None if pending.len() > TAIL_BYTES => pending.len(),
            None => return,
        };
        let line: Vec<u8> = pending.drain(..finished).collect();
        self.append(&line);
    }

    /// The kept output: finished lines, then each stream's unfinished last line (stdout's
    /// first), at most [`TAIL_BYTES`].
    pub(crate) fn finish(mut self) -> Vec<u8> {
        for pending in [std::mem::take(&mut self.out), std::mem::take(&mut self.err)] {
            if !pending.is_empty() {
                self.append(&pending);
                if !pending.ends_with(b"\n") {
                    self.append(b"\n");
                }
            }
        }
        let mut lines = self.lines;
        if lines.len() > TAIL_BYTES {
            lines.drain(..lines.len() - TAIL_BYTES);
        }
        lines
    }

    fn append(&mut self, bytes: &[u8]) {
        self.lines.extend_from_slice(bytes);
        if self.lines.len() > 2 * TAIL_BYTES {
            self.lines.drain(..self.lines.len() - TAIL_BYTES);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_late_chunk_of_one_stream_never_splits_a_line_of_the_other() {
        let mut t = Tail::default();
        t.push(
            Stream::Err,
            b"Traceback (most recent call last):\ntorch.OutOfMemoryError",
        );
        t.push(Stream::Out, b"fake trainer: need 8112 MiB\n");
        t.push(
            Stream::Err,
            b": CUDA out of memory. Tried to allocate 2.00 GiB\n",
        );
        let text = String::from_utf8(t.finish()).unwrap_or_default();
        assert!(
            text.lines()
                .any(|l| l
                    == "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"),
            "{text}"
        );
        assert!(text.lines().any(|l| l == "fake trainer: need 8112 MiB"));
    }

    #[test]
    fn carriage_returns_end_a_line_and_unfinished_lines_are_kept() {
        let mut t = Tail::default();
        t.push(Stream::Err, b" 50%|#####     | 1/2\r");
        t.push(Stream::Out, b"no newline at exit");
        t.push(Stream::Err, b"oops");
        assert_eq!(
            t.finish(),
            b" 50%|#####     | 1/2\rno newline at exit\noops\n".to_vec()
        );
    }

    #[test]
    fn the_tail_is_bounded() {
        let mut t = Tail::default();
        for _ in 0..100 {
            t.push(Stream::Out, &[b'x'; 4095]);
            t.push(Stream::Out, b"\n");
            t.push(Stream::Err, &[b'y'; 4096]);
        }
        assert!(t.lines.len() <= 2 * TAIL_BYTES);
        assert!(t.err.len() <= TAIL_BYTES);
        let kept = t.finish();
        assert_eq!(kept.len(), TAIL_BYTES);
        assert!(kept.ends_with(b"y\n"));
    }
}
