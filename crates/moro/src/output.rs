//! Printing: plain tables and bars for terminals (colour only when stdout is a terminal and
//! `NO_COLOR` is unset, via anstream), JSON for scripts.

use std::cell::RefCell;
use std::io::Write;

use moro_core::units::human;

thread_local! {
    /// While [`captured`] runs a command on this thread: what it would have printed.
    static CAPTURE: RefCell<Option<Captured>> = const { RefCell::new(None) };
}

/// What a command printed while [`captured`] ran it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Captured {
    /// Its stdout: the data.
    pub(crate) stdout: String,
    /// Its notes and warnings, one per line, as stderr would have shown them.
    pub(crate) notes: Vec<String>,
}

/// Runs `f` with [`stdout`] and [`note`] collected instead of printed (`moro serve` answers
/// with exactly what the command prints).
pub(crate) fn captured<R>(f: impl FnOnce() -> R) -> (R, Captured) {
    /// Puts the outer capture back even when `f` panics (a server thread lives on).
    struct Restore(Option<Option<Captured>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            if let Some(outer) = self.0.take() {
                CAPTURE.with(|c| c.replace(outer));
            }
        }
    }
    let mut restore = Restore(Some(CAPTURE.with(|c| c.replace(Some(Captured::default())))));
    let r = f();
    let got = CAPTURE.with(|c| c.replace(restore.0.take().unwrap_or_default()));
    (r, got.unwrap_or_default())
}

/// Appends to the capture when one is running; `false` when none is.
fn capture(f: impl FnOnce(&mut Captured)) -> bool {
    CAPTURE.with(|c| c.borrow_mut().as_mut().map(f).is_some())
}

/// Writes `s` to stdout; a closed pipe (`moro … | head`) ends quietly.
pub(crate) fn stdout(s: &str) -> anyhow::Result<()> {
    if capture(|c| c.stdout.push_str(s)) {
        return Ok(());
    }
    let mut out = anstream::stdout();
    match out.write_all(s.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

/// Writes a line to stderr (progress, notes).
pub(crate) fn note(s: &str) {
    if capture(|c| c.notes.extend(s.lines().map(str::to_owned))) {
        return;
    }
    let mut err = anstream::stderr();
    let _ = writeln!(err, "{s}");
}

/// Pretty JSON of a value, with a trailing newline.
pub(crate) fn json<T: serde::Serialize>(v: &T) -> anyhow::Result<String> {
    let mut s = serde_json::to_string_pretty(v)?;
    s.push('\n');
    Ok(s)
}

/// A left/right aligned text table.
pub(crate) struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
    right: Vec<bool>,
}

impl Table {
    pub(crate) fn new(header: &[&str], right: &[bool]) -> Self {
        Self {
            header: header.iter().map(|s| (*s).to_owned()).collect(),
            rows: Vec::new(),
            right: right.to_vec(),
        }
    }

    pub(crate) fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub(crate) fn render(&self) -> String {
        let n = self.header.len();
        let mut w = vec![0usize; n];
        for r in std::iter::once(&self.header).chain(self.rows.iter()) {
            for (i, c) in r.iter().enumerate().take(n) {
                w[i] = w[i].max(c.chars().count());
            }
        }
        let bold = anstyle::Style::new().bold();
        let mut out = String::new();
        let line = |cells: &Vec<String>, out: &mut String, style: Option<anstyle::Style>| {
            let mut l = String::new();
            for (i, c) in cells.iter().enumerate().take(n) {
                let pad = w[i].saturating_sub(c.chars().count());
                if i > 0 {
                    l.push_str("  ");
                }
                if self.right.get(i).copied().unwrap_or(false) {
                    l.push_str(&" ".repeat(pad));
                    l.push_str(c);
                } else {
                    l.push_str(c);
                    if i + 1 < n {
                        l.push_str(&" ".repeat(pad));
                    }
                }
            }
            match style {
                Some(s) => out.push_str(&format!("{s}{}{s:#}\n", l.trim_end())),
                None => {
                    out.push_str(l.trim_end());
                    out.push('\n');
                }
            }
        };
        line(&self.header, &mut out, Some(bold));
        for r in &self.rows {
            line(r, &mut out, None);
        }
        out
    }
}

/// A horizontal bar of `frac` (0..=1) of `width` cells.
pub(crate) fn bar(frac: f64, width: usize) -> String {
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let cells = (frac.clamp(0.0, 1.0) * width as f64).round() as usize;
    format!(
        "{}{}",
        "█".repeat(cells),
        "·".repeat(width - cells.min(width))
    )
}

/// A count with its thousands separated: `2,097,152`.
pub(crate) fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// GiB with two decimals.
pub(crate) fn gib(bytes: u64) -> String {
    format!("{:.2}", moro_core::units::gib(bytes))
}

/// Human size.
pub(crate) fn size(bytes: u64) -> String {
    human(bytes)
}

/// Writes `bytes` to a temporary file beside `path`, then renames it over `path`: a reader
/// never sees half a file, and a failed write leaves the old one.
pub(crate) use moro_supervise::journal::write_atomic;

/// [`write_atomic`] with an error naming the file.
pub(crate) fn write_file(path: &std::path::Path, bytes: &[u8]) -> anyhow::Result<()> {
    write_atomic(path, bytes)
        .map_err(|e| crate::error::user(format!("cannot write `{}`: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_are_separated() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(2_097_152), "2,097,152");
    }

    #[test]
    fn captures_nest_and_survive_a_panic() {
        let (_, outer) = captured(|| {
            stdout("a").unwrap();
            let (_, inner) = captured(|| note("n"));
            assert_eq!(inner.notes, ["n"]);
            let caught = std::panic::catch_unwind(|| captured(|| panic!("inside")));
            assert!(caught.is_err());
            stdout("b").unwrap();
        });
        assert_eq!(outer.stdout, "ab");
        assert!(outer.notes.is_empty());
        assert!(
            !capture(|_| {}),
            "nothing is captured after the outermost ends"
        );
    }
}
