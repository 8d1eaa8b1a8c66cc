//! SVG charts of moro's numbers, as pure functions from plain data to SVG text: the same
//! pictures in `moro serve`'s page, `moro estimate --svg` and `moro fit --svg`.
//!
//! Sizes are integer bytes; they become GiB only in labels. Every chart is one [`Panel`];
//! [`document`] stacks panels into one standalone SVG (no scripts, no external fonts or
//! styles), so a file can go into a README as it is.

mod axis;
mod breakdown;
mod fit;
mod lines;
mod svg;

pub use breakdown::{Breakdown, Segment};
pub use fit::{FitRow, FitTable};
pub use lines::{LineChart, Series};
pub use svg::{Panel, document};

/// The width every panel is drawn at, in SVG user units (pixels at 100 %).
pub const WIDTH: u32 = 760;

/// The colours of stacked components and series, in order (colour-blind-safe, Okabe–Ito).
pub const PALETTE: [&str; 8] = [
    "#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#999999",
];

/// `bytes` in GiB with two decimals, as the CLI prints them.
#[must_use]
pub fn gib(bytes: u64) -> String {
    #[allow(clippy::cast_precision_loss)]
    let g = bytes as f64 / f64::from(1u32 << 30);
    format!("{g:.2}")
}
