//! A linear axis over bytes with "nice" GiB ticks (1, 2, 2.5 or 5 × 10ᵏ GiB).

const GIB: f64 = 1_073_741_824.0;

/// A linear scale from `0..=max` bytes onto `0..=length` user units.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Scale {
    /// The bytes at the far end (a whole number of ticks).
    pub(crate) max: f64,
    /// The tick step in bytes.
    pub(crate) step: f64,
    /// The axis length in user units.
    pub(crate) length: f64,
}

impl Scale {
    /// A scale that holds `largest` bytes with about `ticks` steps.
    pub(crate) fn new(largest: u64, length: f64, ticks: u32) -> Self {
        #[allow(clippy::cast_precision_loss)]
        let largest = (largest as f64).max(GIB / 4.0);
        let raw = largest / f64::from(ticks.max(1)) / GIB;
        let magnitude = 10f64.powf(raw.log10().floor());
        let step = [1.0, 2.0, 2.5, 5.0, 10.0]
            .into_iter()
            .map(|m| m * magnitude)
            .find(|s| *s >= raw)
            .unwrap_or(10.0 * magnitude)
            * GIB;
        let max = (largest / step).ceil() * step;
        Self { max, step, length }
    }

    /// Where `bytes` lies on the axis.
    pub(crate) fn at(&self, bytes: u64) -> f64 {
        #[allow(clippy::cast_precision_loss)]
        let b = bytes as f64;
        b / self.max * self.length
    }

    /// The ticks from 0 to the end: (bytes, label in GiB).
    pub(crate) fn ticks(&self) -> Vec<(f64, String)> {
        let n = (self.max / self.step).round() as u32;
        (0..=n)
            .map(|i| {
                let b = f64::from(i) * self.step;
                let g = b / GIB;
                let label = if (g - g.round()).abs() < 1e-9 {
                    format!("{g:.0}")
                } else {
                    format!("{g}")
                };
                (b / self.max * self.length, label)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ten_gib_in_five_ticks_steps_by_two() {
        let s = Scale::new(10 << 30, 500.0, 5);
        assert_eq!(s.step, 2.0 * GIB);
        assert_eq!(s.max, 10.0 * GIB);
        assert_eq!(s.at(5 << 30), 250.0);
        let labels: Vec<String> = s.ticks().into_iter().map(|t| t.1).collect();
        assert_eq!(labels, ["0", "2", "4", "6", "8", "10"]);
    }

    #[test]
    fn the_end_is_rounded_up_to_a_whole_step() {
        // 81 GiB over 5 ticks: raw 16.2 → step 20, end 100.
        let s = Scale::new(81 << 30, 100.0, 5);
        assert_eq!(s.step, 20.0 * GIB);
        assert_eq!(s.max, 100.0 * GIB);
    }

    #[test]
    fn fractional_steps_are_labelled() {
        let s = Scale::new(1 << 30, 100.0, 4);
        let labels: Vec<String> = s.ticks().into_iter().map(|t| t.1).collect();
        assert_eq!(labels, ["0", "0.25", "0.5", "0.75", "1"]);
    }
}
