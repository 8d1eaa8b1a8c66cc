//! `moro fit` as a picture: for each GPU class that runs the job, the peak of one GPU as a
//! share of its memory, with the bound.

use crate::svg::{Anchor, Panel, line, rect, text};
use crate::{PALETTE, gib};

/// One GPU class that runs the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FitRow {
    /// `2 × NVIDIA A100 80GB`.
    pub label: String,
    /// How (`one GPU`, `ZeRO-3`), with the price when known.
    pub detail: String,
    /// Predicted peak of one GPU.
    pub peak: u64,
    /// Its upper bound.
    pub bound: u64,
    /// Usable memory of one GPU.
    pub memory: u64,
}

/// The fit table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FitTable {
    /// The heading.
    pub title: String,
    /// The classes that run it, in the order to show (cheapest first).
    pub rows: Vec<FitRow>,
    /// The classes on which it does not run, by name.
    pub does_not_fit: Vec<String>,
}

const LABEL_W: f64 = 230.0;
const BAR_W: f64 = 300.0;
const ROW_H: f64 = 24.0;
const TOP: f64 = 48.0;

impl FitTable {
    /// The chart.
    #[must_use]
    pub fn panel(&self) -> Panel {
        let mut out = String::new();
        text(&mut out, 16.0, 22.0, Anchor::Start, 15, &self.title);
        let x0 = 16.0 + LABEL_W;
        text(
            &mut out,
            x0,
            TOP - 8.0,
            Anchor::Start,
            11,
            "peak of one GPU / its memory",
        );
        let mut y = TOP;
        for r in &self.rows {
            #[allow(clippy::cast_precision_loss)]
            let share = |b: u64| (b as f64 / r.memory.max(1) as f64).min(1.25);
            text(&mut out, 16.0, y + 15.0, Anchor::Start, 12, &r.label);
            rect(
                &mut out,
                x0,
                y + 4.0,
                BAR_W,
                ROW_H - 8.0,
                "#eeeeee",
                "memory",
            );
            let tip = format!(
                "{}: {} GiB of {} GiB (at most {})",
                r.label,
                gib(r.peak),
                gib(r.memory),
                gib(r.bound)
            );
            rect(
                &mut out,
                x0,
                y + 4.0,
                BAR_W * share(r.peak),
                ROW_H - 8.0,
                PALETTE[0],
                &tip,
            );
            let bx = x0 + BAR_W * share(r.bound);
            line(&mut out, (bx, y + 1.0), (bx, y + ROW_H - 1.0), "#444", true);
            text(
                &mut out,
                x0 + BAR_W * 1.25 + 8.0,
                y + 15.0,
                Anchor::Start,
                11,
                &format!("{} / {} GiB · {}", gib(r.peak), gib(r.memory), r.detail),
            );
            y += ROW_H;
        }
        let full = x0 + BAR_W;
        line(
            &mut out,
            (full, TOP - 2.0),
            (full, y + 2.0),
            "#C00000",
            false,
        );
        if !self.does_not_fit.is_empty() {
            y += 18.0;
            text(
                &mut out,
                16.0,
                y,
                Anchor::Start,
                12,
                &format!(
                    "does not fit on 64 GPUs of: {}",
                    self.does_not_fit.join(", ")
                ),
            );
        }
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let height = (y + 16.0).ceil() as u32;
        Panel { height, body: out }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_half_full_gpu_fills_half_the_bar() {
        // 12 of 24 GiB: 150 of the 300-wide bar, from x = 246.
        let t = FitTable {
            title: "t".into(),
            rows: vec![FitRow {
                label: "1 × RTX 4090".into(),
                detail: "one GPU".into(),
                peak: 12 << 30,
                bound: 18 << 30,
                memory: 24 << 30,
            }],
            does_not_fit: vec!["T4".into()],
        };
        let p = t.panel();
        assert!(
            p.body.contains(r#"x="246" y="52" width="150""#),
            "{}",
            p.body
        );
        // The bound at 18/24 of the bar: 246 + 225.
        assert!(p.body.contains(r#"x1="471""#), "{}", p.body);
        assert!(p.body.contains("does not fit on 64 GPUs of: T4"));
    }
}
