//! The peak as one stacked bar of its components, against the GPU's memory and the bound.

use crate::axis::Scale;
use crate::svg::{Anchor, Panel, line, rect, text};
use crate::{PALETTE, WIDTH, gib};

/// One component of the peak.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// Its name in words (`optimizer states`).
    pub label: String,
    /// Its bytes at the peak.
    pub bytes: u64,
}

/// The stacked bar of a peak.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Breakdown {
    /// The heading (the model and the job).
    pub title: String,
    /// The components, stacked left to right in this order; zero-byte ones are left out.
    pub segments: Vec<Segment>,
    /// The upper bound on the same level, drawn as a dashed mark.
    pub bound: Option<u64>,
    /// The GPU's memory and its name, drawn as a solid line across.
    pub capacity: Option<(String, u64)>,
}

const LEFT: f64 = 16.0;
const BAR_Y: f64 = 58.0;
const BAR_H: f64 = 34.0;

impl Breakdown {
    /// The bytes of the whole bar.
    #[must_use]
    pub fn total(&self) -> u64 {
        self.segments.iter().map(|s| s.bytes).sum()
    }

    /// The chart.
    #[must_use]
    pub fn panel(&self) -> Panel {
        let plot = f64::from(WIDTH) - 2.0 * LEFT;
        let total = self.total();
        let largest = total
            .max(self.bound.unwrap_or(0))
            .max(self.capacity.as_ref().map_or(0, |c| c.1));
        let scale = Scale::new(largest, plot, 8);
        let mut out = String::new();
        text(&mut out, LEFT, 20.0, Anchor::Start, 15, &self.title);
        let mut x = LEFT;
        let shown: Vec<&Segment> = self.segments.iter().filter(|s| s.bytes > 0).collect();
        for (i, s) in shown.iter().enumerate() {
            let w = scale.at(s.bytes);
            let tip = format!("{}: {} GiB", s.label, gib(s.bytes));
            rect(
                &mut out,
                x,
                BAR_Y,
                w,
                BAR_H,
                PALETTE[i % PALETTE.len()],
                &tip,
            );
            x += w;
        }
        let axis_y = BAR_Y + BAR_H + 8.0;
        for (at, label) in scale.ticks() {
            line(
                &mut out,
                (LEFT + at, axis_y),
                (LEFT + at, axis_y + 4.0),
                "#888",
                false,
            );
            text(
                &mut out,
                LEFT + at,
                axis_y + 16.0,
                Anchor::Middle,
                11,
                &label,
            );
        }
        text(&mut out, LEFT + plot, axis_y + 30.0, Anchor::End, 11, "GiB");
        if let Some(b) = self.bound {
            let bx = LEFT + scale.at(b);
            line(
                &mut out,
                (bx, BAR_Y - 4.0),
                (bx, BAR_Y + BAR_H + 6.0),
                "#444",
                true,
            );
            text(
                &mut out,
                bx,
                BAR_Y - 7.0,
                Anchor::Middle,
                11,
                &format!("at most {}", gib(b)),
            );
        }
        if let Some((name, c)) = &self.capacity {
            let cx = LEFT + scale.at(*c);
            line(
                &mut out,
                (cx, BAR_Y - 30.0),
                (cx, BAR_Y + BAR_H + 6.0),
                "#C00000",
                false,
            );
            text(
                &mut out,
                cx - 4.0,
                BAR_Y - 21.0,
                Anchor::End,
                11,
                &format!("{name} {} GiB", gib(*c)),
            );
        }
        let legend_y = axis_y + 48.0;
        let mut lx = LEFT;
        let mut ly = legend_y;
        for (i, s) in shown.iter().enumerate() {
            let label = format!("{} {}", s.label, gib(s.bytes));
            #[allow(clippy::cast_precision_loss)]
            let w = 18.0 + 6.5 * label.chars().count() as f64;
            if lx + w > f64::from(WIDTH) - LEFT {
                lx = LEFT;
                ly += 18.0;
            }
            rect(
                &mut out,
                lx,
                ly - 10.0,
                11.0,
                11.0,
                PALETTE[i % PALETTE.len()],
                &s.label,
            );
            text(&mut out, lx + 15.0, ly, Anchor::Start, 12, &label);
            lx += w + 10.0;
        }
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let height = (ly + 16.0).ceil() as u32;
        Panel { height, body: out }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(label: &str, gib: u64) -> Segment {
        Segment {
            label: label.into(),
            bytes: gib << 30,
        }
    }

    #[test]
    fn segments_are_proportional_to_their_bytes() {
        // 1 + 3 GiB against an 8 GiB GPU: the axis ends at 8 GiB (step 1), the plot is
        // 760 − 32 = 728 wide, so the bars are 91 and 273 wide and the GPU line is at
        // 16 + 728 = 744.
        let b = Breakdown {
            title: "t".into(),
            segments: vec![seg("weights", 1), seg("zero", 0), seg("activations", 3)],
            bound: None,
            capacity: Some(("GPU".into(), 8 << 30)),
        };
        let p = b.panel();
        assert!(p.body.contains(r#"x="16" y="58" width="91""#), "{}", p.body);
        assert!(
            p.body.contains(r#"x="107" y="58" width="273""#),
            "{}",
            p.body
        );
        assert!(p.body.contains(r#"x1="744""#), "{}", p.body);
        assert!(
            !p.body.contains("zero 0.00"),
            "zero-byte segments are left out"
        );
    }
}
