//! SVG text: escaping, the few elements the charts use, and the document around panels.

use std::fmt::Write;

/// One chart: its height at [`crate::WIDTH`] and its SVG elements, drawn from (0, 0).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Panel {
    /// Height in user units.
    pub height: u32,
    /// The elements (no `<svg>` around them).
    pub body: String,
}

/// `s` with XML's five special characters escaped, for text and attribute values.
pub(crate) fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
}

/// A number for an attribute: one decimal, no trailing `.0`.
pub(crate) fn num(v: f64) -> String {
    let r = (v * 10.0).round() / 10.0;
    if r.fract() == 0.0 {
        format!("{r:.0}")
    } else {
        format!("{r:.1}")
    }
}

/// A filled rectangle with a tooltip.
pub(crate) fn rect(out: &mut String, x: f64, y: f64, w: f64, h: f64, fill: &str, title: &str) {
    let _ = write!(
        out,
        r#"<rect x="{}" y="{}" width="{}" height="{}" fill="{fill}"><title>{}</title></rect>"#,
        num(x),
        num(y),
        num(w.max(0.0)),
        num(h.max(0.0)),
        escape(title)
    );
}

/// A line; `dash` draws it dashed.
pub(crate) fn line(
    out: &mut String,
    (x1, y1): (f64, f64),
    (x2, y2): (f64, f64),
    stroke: &str,
    dash: bool,
) {
    let dash = if dash {
        r#" stroke-dasharray="5 4""#
    } else {
        ""
    };
    let _ = write!(
        out,
        r#"<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="{stroke}" stroke-width="1.5"{dash}/>"#,
        num(x1),
        num(y1),
        num(x2),
        num(y2)
    );
}

/// Where a text's anchor point is.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Anchor {
    Start,
    Middle,
    End,
}

/// A text at (x, y), `size` pixels high.
pub(crate) fn text(out: &mut String, x: f64, y: f64, anchor: Anchor, size: u32, s: &str) {
    let anchor = match anchor {
        Anchor::Start => "start",
        Anchor::Middle => "middle",
        Anchor::End => "end",
    };
    let _ = write!(
        out,
        r#"<text x="{}" y="{}" text-anchor="{anchor}" font-size="{size}">{}</text>"#,
        num(x),
        num(y),
        escape(s)
    );
}

/// The panels one above the other, as one standalone SVG document.
#[must_use]
pub fn document(panels: &[Panel]) -> String {
    let height: u32 = panels.iter().map(|p| p.height).sum();
    let w = crate::WIDTH;
    let mut out = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{height}" viewBox="0 0 {w} {height}" font-family="system-ui, -apple-system, 'Segoe UI', sans-serif" fill="#222">"##
    );
    let _ = write!(
        out,
        r##"<rect x="0" y="0" width="{w}" height="{height}" fill="#ffffff"/>"##
    );
    let mut y = 0;
    for p in panels {
        let _ = write!(out, r#"<g transform="translate(0 {y})">{}</g>"#, p.body);
        y += p.height;
    }
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_drops_control_characters() {
        assert_eq!(
            escape("a<b & \"c\" 'd'>\u{7}"),
            "a&lt;b &amp; &quot;c&quot; &apos;d&apos;&gt;"
        );
    }

    #[test]
    fn numbers_have_one_decimal_at_most() {
        assert_eq!(num(12.0), "12");
        assert_eq!(num(12.345), "12.3");
        assert_eq!(num(-0.04), "-0");
    }
}
