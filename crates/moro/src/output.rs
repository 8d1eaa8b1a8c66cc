//! Printing: plain tables and bars for terminals (colour only when stdout is a terminal and
//! `NO_COLOR` is unset, via anstream), JSON for scripts.

use std::io::Write;

use moro_core::units::human;

/// Writes `s` to stdout; a closed pipe (`moro … | head`) ends quietly.
pub(crate) fn stdout(s: &str) -> anyhow::Result<()> {
    let mut out = anstream::stdout();
    match out.write_all(s.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

/// Writes a line to stderr (progress, notes).
pub(crate) fn note(s: &str) {
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

/// GiB with two decimals.
pub(crate) fn gib(bytes: u64) -> String {
    format!("{:.2}", moro_core::units::gib(bytes))
}

/// Human size.
pub(crate) fn size(bytes: u64) -> String {
    human(bytes)
}
