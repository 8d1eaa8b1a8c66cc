//! Peak memory against one setting (sequence length, micro batch): one line per series on a
//! base-2 x axis, with the GPU's memory across.

use std::fmt::Write;

use crate::axis::Scale;
use crate::svg::{Anchor, Panel, escape, line, num, text};
use crate::{PALETTE, WIDTH, gib};

/// One line: its name and its points (x, peak bytes); `None` where the job cannot run at all
/// (the estimator refused it), which breaks the line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Series {
    /// The legend's name (`flash attention`).
    pub name: String,
    /// The points, by increasing x.
    pub points: Vec<(u64, Option<u64>)>,
}

/// A chart of lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineChart {
    /// The heading.
    pub title: String,
    /// What x is (`sequence length, tokens`).
    pub x_label: String,
    /// The lines.
    pub series: Vec<Series>,
    /// The GPU's memory and its name, drawn across.
    pub capacity: Option<(String, u64)>,
    /// The x of the job itself, marked on the axis.
    pub marked: Option<u64>,
    /// The axis ends at this many bytes; lines above it leave the plot at its top edge (a
    /// 100 GiB eager point would flatten everything that matters).
    pub ceiling: Option<u64>,
}

const LEFT: f64 = 56.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 62.0;
const PLOT_H: f64 = 190.0;

impl LineChart {
    fn x_range(&self) -> Option<(u64, u64)> {
        let xs = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.0));
        let lo = xs.clone().filter(|x| *x > 0).min()?;
        let hi = xs.max()?;
        Some((lo, hi.max(lo)))
    }

    /// The chart.
    #[must_use]
    pub fn panel(&self) -> Panel {
        let plot_w = f64::from(WIDTH) - LEFT - RIGHT;
        let largest = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().filter_map(|p| p.1))
            .max()
            .unwrap_or(0)
            .max(self.capacity.as_ref().map_or(0, |c| c.1));
        let scale = Scale::new(self.ceiling.map_or(largest, |c| largest.min(c)), PLOT_H, 5);
        let clip = format!("plot-{:x}", fnv(&[&self.title, &self.x_label]));
        let y_of = |b: u64| TOP + PLOT_H - scale.at(b);
        let above = |b: u64| scale.at(b) > PLOT_H + 0.5;
        let (lo, hi) = self.x_range().unwrap_or((1, 2));
        #[allow(clippy::cast_precision_loss)]
        let (llo, lhi) = ((lo as f64).log2(), (hi as f64).log2());
        let span = (lhi - llo).max(1e-9);
        #[allow(clippy::cast_precision_loss)]
        let x_of = |x: u64| LEFT + ((x.max(1) as f64).log2() - llo) / span * plot_w;

        let mut out = format!(
            r#"<clipPath id="{clip}"><rect x="{}" y="{}" width="{}" height="{}"/></clipPath>"#,
            num(LEFT - 4.0),
            num(TOP - 4.0),
            num(plot_w + 8.0),
            num(PLOT_H + 8.0)
        );
        text(&mut out, 16.0, 20.0, Anchor::Start, 15, &self.title);
        for (at, label) in scale.ticks() {
            let y = TOP + PLOT_H - at;
            line(&mut out, (LEFT, y), (LEFT + plot_w, y), "#e4e4e4", false);
            text(&mut out, LEFT - 6.0, y + 4.0, Anchor::End, 11, &label);
        }
        text(&mut out, 16.0, TOP - 8.0, Anchor::Start, 11, "GiB");
        let mut xs: Vec<u64> = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.0))
            .collect();
        xs.sort_unstable();
        xs.dedup();
        for x in &xs {
            let px = x_of(*x);
            line(
                &mut out,
                (px, TOP + PLOT_H),
                (px, TOP + PLOT_H + 4.0),
                "#888",
                false,
            );
            text(
                &mut out,
                px,
                TOP + PLOT_H + 17.0,
                Anchor::Middle,
                11,
                &short(*x),
            );
        }
        text(
            &mut out,
            LEFT + plot_w,
            TOP + PLOT_H + 33.0,
            Anchor::End,
            11,
            &self.x_label,
        );
        if let Some(m) = self.marked {
            let px = x_of(m);
            line(&mut out, (px, TOP), (px, TOP + PLOT_H), "#888", true);
        }
        if let Some((name, c)) = &self.capacity {
            let y = y_of(*c);
            line(&mut out, (LEFT, y), (LEFT + plot_w, y), "#C00000", false);
            text(
                &mut out,
                LEFT + plot_w,
                y - 5.0,
                Anchor::End,
                11,
                &format!("{name} {} GiB", gib(*c)),
            );
        }
        for (i, s) in self.series.iter().enumerate() {
            let colour = PALETTE[i % PALETTE.len()];
            for run in s.points.split(|p| p.1.is_none()) {
                let pts: Vec<String> = run
                    .iter()
                    .filter_map(|(x, y)| y.map(|y| format!("{},{}", num(x_of(*x)), num(y_of(y)))))
                    .collect();
                if pts.len() > 1 {
                    let _ = write!(
                        out,
                        r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="2.5" clip-path="url(#{clip})"/>"#,
                        pts.join(" ")
                    );
                }
            }
            for (x, y) in &s.points {
                if let Some(y) = y.filter(|y| !above(*y)).as_ref() {
                    let _ = write!(
                        out,
                        r#"<circle cx="{}" cy="{}" r="3.5" fill="{colour}"><title>{}: {} → {} GiB</title></circle>"#,
                        num(x_of(*x)),
                        num(y_of(*y)),
                        escape(&s.name),
                        short(*x),
                        gib(*y)
                    );
                }
            }
            #[allow(clippy::cast_precision_loss)]
            let lx = LEFT + 200.0 * i as f64;
            line(&mut out, (lx, 38.0), (lx + 18.0, 38.0), colour, false);
            text(&mut out, lx + 24.0, 42.0, Anchor::Start, 12, &s.name);
        }
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let height = (TOP + PLOT_H + 44.0) as u32;
        Panel { height, body: out }
    }
}

/// FNV-1a of the parts: a clip-path id that is the same for the same chart.
fn fnv(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in parts.iter().flat_map(|p| p.bytes().chain([0])) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// `32768` as `32k`, `1536` as `1.5k`, `8` as `8`.
fn short(x: u64) -> String {
    if x >= 1024 && x.is_multiple_of(1024) {
        format!("{}k", x / 1024)
    } else if x >= 1024 {
        #[allow(clippy::cast_precision_loss)]
        let k = x as f64 / 1024.0;
        format!("{k:.1}k")
    } else {
        x.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_lie_on_a_base_two_axis() {
        // x 1024, 2048, 4096 over a 688-wide plot starting at 56: log2 spans 2, so 2048 is
        // at 56 + 344 = 400. y: 10 GiB on a 0–10 GiB axis 190 high, from 62: at 62; 5 GiB at
        // 157.
        let c = LineChart {
            title: "t".into(),
            x_label: "tokens".into(),
            series: vec![Series {
                name: "flash".into(),
                points: vec![(1024, Some(5 << 30)), (2048, Some(10 << 30)), (4096, None)],
            }],
            capacity: None,
            marked: Some(2048),
            ceiling: None,
        };
        let p = c.panel();
        assert!(p.body.contains(r#"<circle cx="56" cy="157""#), "{}", p.body);
        assert!(p.body.contains(r#"<circle cx="400" cy="62""#), "{}", p.body);
        assert!(p.body.contains(r#"points="56,157 400,62""#), "{}", p.body);
        assert_eq!(
            p.body.matches("<circle").count(),
            2,
            "the refused point is not drawn"
        );
        assert!(p.body.contains(">4k<"));
    }

    #[test]
    fn short_labels() {
        assert_eq!(short(512), "512");
        assert_eq!(short(32_768), "32k");
        assert_eq!(short(1536), "1.5k");
    }
}

#[cfg(test)]
mod ceiling {
    use super::*;

    #[test]
    fn points_above_the_ceiling_leave_through_the_top() {
        // A 4 GiB ceiling: the axis ends at 4 GiB; the 40 GiB point is not drawn as a dot,
        // and the line towards it is clipped to the plot.
        let c = LineChart {
            title: "t".into(),
            x_label: "x".into(),
            series: vec![Series {
                name: "eager".into(),
                points: vec![(1, Some(1 << 30)), (2, Some(2 << 30)), (4, Some(40 << 30))],
            }],
            capacity: None,
            marked: None,
            ceiling: Some(4 << 30),
        };
        let p = c.panel();
        assert_eq!(p.body.matches("<circle").count(), 2);
        assert!(p.body.contains("clip-path=\"url(#plot-"));
        assert!(p.body.contains(">4<"), "the axis ends at 4 GiB");
        assert!(!p.body.contains(">40<"));
    }
}
