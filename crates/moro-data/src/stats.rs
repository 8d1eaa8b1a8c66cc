//! What the token lengths say about `max_seq_length`: percentiles, the tail a length cuts,
//! how many packed sequences the data makes, a histogram. Pure functions over lengths.

use std::collections::BTreeMap;

/// A percentile in tenths of a percent (`990` is p99, `999` p99.9), so that its rank is exact
/// integer arithmetic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Permille(u16);

impl Permille {
    pub const P50: Self = Self(500);
    pub const P90: Self = Self(900);
    pub const P95: Self = Self(950);
    pub const P99: Self = Self(990);

    /// From a percentage with at most one decimal (`99`, `99.5`); `None` outside (0, 100].
    pub fn from_percent(p: f64) -> Option<Self> {
        let tenths = (p * 10.0).round();
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        ((p * 10.0 - tenths).abs() < 1e-6 && (1.0..=1000.0).contains(&tenths))
            .then_some(Self(tenths as u16))
    }

    pub fn tenths(self) -> u16 {
        self.0
    }

    /// `99`, `99.5`.
    pub fn percent_label(self) -> String {
        if self.0.is_multiple_of(10) {
            (self.0 / 10).to_string()
        } else {
            format!("{}.{}", self.0 / 10, self.0 % 10)
        }
    }
}

/// The nearest-rank percentile of sorted lengths: the smallest length that at least `p` of the
/// samples do not exceed (`max_seq_length` = p99 truncates at most 1 % of samples).
pub fn percentile(sorted: &[u32], p: Permille) -> Option<u32> {
    let n = sorted.len() as u64;
    if n == 0 {
        return None;
    }
    let rank = (u64::from(p.0) * n).div_ceil(1000).max(1);
    sorted.get(usize::try_from(rank - 1).ok()?).copied()
}

/// Count, mean and percentiles of one series of lengths.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LengthSummary {
    pub count: u64,
    pub total_tokens: u64,
    pub mean: f64,
    pub min: u32,
    pub p50: u32,
    pub p90: u32,
    pub p95: u32,
    pub p99: u32,
    pub max: u32,
}

impl LengthSummary {
    /// The summary of `lengths` (sorted or not); `None` when there are none.
    pub fn of(lengths: &[u32]) -> Option<Self> {
        let mut sorted = lengths.to_vec();
        sorted.sort_unstable();
        Self::of_sorted(&sorted)
    }

    pub fn of_sorted(sorted: &[u32]) -> Option<Self> {
        let total: u64 = sorted.iter().map(|&l| u64::from(l)).sum();
        let count = sorted.len() as u64;
        Some(Self {
            count,
            total_tokens: total,
            mean: total as f64 / count.max(1) as f64,
            min: *sorted.first()?,
            p50: percentile(sorted, Permille::P50)?,
            p90: percentile(sorted, Permille::P90)?,
            p95: percentile(sorted, Permille::P95)?,
            p99: percentile(sorted, Permille::P99)?,
            max: *sorted.last()?,
        })
    }
}

/// What truncating every sample to `max_seq_length` drops.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Truncation {
    pub max_seq_length: u32,
    /// Samples longer than the length.
    pub samples: u64,
    /// Tokens past the length, summed over the samples.
    pub tokens_cut: u64,
    /// Of those, tokens that carry loss: the completion's under completion-only training
    /// (training truncates the end, where the completion is), all of them for plain text.
    pub loss_tokens_cut: u64,
}

/// Truncation at `max` of samples `tokens[i]` long whose first `prompt[i]` tokens carry no
/// loss (`None`: every token does).
pub fn truncation(tokens: &[u32], prompt: Option<&[u32]>, max: u32) -> Truncation {
    let mut t = Truncation {
        max_seq_length: max,
        samples: 0,
        tokens_cut: 0,
        loss_tokens_cut: 0,
    };
    for (i, &len) in tokens.iter().enumerate() {
        if len <= max {
            continue;
        }
        let cut = u64::from(len - max);
        t.samples += 1;
        t.tokens_cut += cut;
        let completion = prompt
            .and_then(|p| p.get(i))
            .map_or(u64::from(len), |&p| u64::from(len.saturating_sub(p)));
        t.loss_tokens_cut += cut.min(completion);
    }
    t
}

/// How many sequences of `max_seq_length` the data packs into.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Packing {
    pub max_seq_length: u32,
    /// Concatenated and cut into pieces (TRL `packing_strategy="wrapped"`): no padding.
    pub wrapped: u64,
    /// Each sample truncated to the length, then placed best-fit decreasing (TRL's default
    /// `packing_strategy="bfd"`, `trl/data_utils.py` `_pack_bfd`): samples are never split.
    pub best_fit: u64,
    /// The share of the best-fit sequences' tokens that are data, not padding (0–1).
    pub best_fit_fill: f64,
}

/// Packing of samples `tokens[i]` long into sequences of `max` (≥ 1).
pub fn packing(tokens: &[u32], max: u32) -> Packing {
    let max = max.max(1);
    let total: u64 = tokens.iter().map(|&l| u64::from(l)).sum();
    let mut sorted: Vec<u32> = tokens.iter().map(|&l| l.min(max)).collect();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    // Bins by remaining space; the best fit is the bin with the least space that still holds
    // the sample.
    let mut space: BTreeMap<u32, u64> = BTreeMap::new();
    let mut bins = 0u64;
    let mut kept = 0u64;
    for len in sorted {
        kept += u64::from(len);
        let fit = space.range(len..).next().map(|(&s, _)| s);
        let left = match fit {
            Some(s) => {
                remove_one(&mut space, s);
                s - len
            }
            None => {
                bins += 1;
                max - len
            }
        };
        if left > 0 {
            *space.entry(left).or_default() += 1;
        }
    }
    Packing {
        max_seq_length: max,
        wrapped: total.div_ceil(u64::from(max)),
        best_fit: bins,
        best_fit_fill: if bins == 0 {
            0.0
        } else {
            kept as f64 / (bins * u64::from(max)) as f64
        },
    }
}

fn remove_one(space: &mut BTreeMap<u32, u64>, key: u32) {
    if let Some(n) = space.get_mut(&key) {
        *n -= 1;
        if *n == 0 {
            space.remove(&key);
        }
    }
}

/// One bar of the histogram: samples longer than the previous bucket's `upto` and at most
/// this one's.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Bucket {
    pub upto: u32,
    pub samples: u64,
}

/// Samples per power-of-two length (≤ 64, ≤ 128, …), the lengths `max_seq_length` is set to.
pub fn histogram(sorted: &[u32]) -> Vec<Bucket> {
    let Some(&max) = sorted.last() else {
        return Vec::new();
    };
    let first = sorted[0].max(1).next_power_of_two().max(64);
    let mut out = Vec::new();
    let mut lo = 0usize;
    let mut upto = first;
    loop {
        let hi = sorted.partition_point(|&l| l <= upto);
        out.push(Bucket {
            upto,
            samples: (hi - lo) as u64,
        });
        lo = hi;
        if upto >= max || upto == 1 << 31 {
            break;
        }
        upto = upto.saturating_mul(2);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn nearest_rank_by_hand() {
        let sorted: Vec<u32> = (1..=1000).collect();
        assert_eq!(percentile(&sorted, Permille::P99), Some(990));
        assert_eq!(percentile(&sorted, Permille::P50), Some(500));
        assert_eq!(
            percentile(&sorted, Permille::from_percent(99.9).unwrap()),
            Some(999)
        );
        assert_eq!(
            percentile(&sorted, Permille::from_percent(100.0).unwrap()),
            Some(1000)
        );
        // Three samples: p50 is the 2nd (ceil(1.5)), p99 the 3rd.
        assert_eq!(percentile(&[5, 7, 9], Permille::P50), Some(7));
        assert_eq!(percentile(&[5, 7, 9], Permille::P99), Some(9));
        assert_eq!(percentile(&[], Permille::P99), None);
    }

    #[test]
    fn percentages_are_checked() {
        assert!(Permille::from_percent(0.0).is_none());
        assert!(Permille::from_percent(100.5).is_none());
        assert!(Permille::from_percent(99.95).is_none());
        assert_eq!(
            Permille::from_percent(99.5).unwrap().percent_label(),
            "99.5"
        );
    }

    #[test]
    fn truncation_by_hand() {
        // 10 and 20 tokens, prompts of 2 and 18, cut at 12: the second loses 8 tokens, of
        // which only 2 are completion.
        let t = truncation(&[10, 20], Some(&[2, 18]), 12);
        assert_eq!((t.samples, t.tokens_cut, t.loss_tokens_cut), (1, 8, 2));
        let t = truncation(&[10, 20], None, 12);
        assert_eq!((t.samples, t.tokens_cut, t.loss_tokens_cut), (1, 8, 8));
    }

    #[test]
    fn packing_by_hand() {
        // 7, 5, 3, 3, 2 into 8: best fit decreasing gives [7], [5,3], [3,2] — 3 bins; wrapped
        // is ceil(20 / 8) = 3. 9 truncated to 8 fills a bin of its own.
        let p = packing(&[3, 7, 2, 5, 3], 8);
        assert_eq!((p.wrapped, p.best_fit), (3, 3));
        let p = packing(&[9, 1], 8);
        assert_eq!((p.wrapped, p.best_fit), (2, 2));
        assert!((p.best_fit_fill - 9.0 / 16.0).abs() < 1e-12);
    }

    #[test]
    fn histogram_by_hand() {
        let h = histogram(&[10, 64, 65, 300]);
        let bars: Vec<(u32, u64)> = h.iter().map(|b| (b.upto, b.samples)).collect();
        assert_eq!(bars, vec![(64, 2), (128, 1), (256, 0), (512, 1)]);
    }

    proptest! {
        #[test]
        fn the_percentile_bounds_its_share(mut v in prop::collection::vec(1u32..10_000, 1..400), p in 1u16..=1000) {
            v.sort_unstable();
            let p = Permille(p);
            let x = percentile(&v, p).unwrap();
            let at_most = v.iter().filter(|&&l| l <= x).count() as u64;
            let below = v.iter().filter(|&&l| l < x).count() as u64;
            let n = v.len() as u64;
            // At least p of the samples fit, and no smaller length would do.
            prop_assert!(at_most * 1000 >= u64::from(p.0) * n);
            prop_assert!(below * 1000 < u64::from(p.0) * n);
        }

        #[test]
        fn best_fit_is_between_the_bounds(v in prop::collection::vec(1u32..600, 1..200), max in 1u32..700) {
            let p = packing(&v, max);
            let kept: u64 = v.iter().map(|&l| u64::from(l.min(max))).sum();
            prop_assert!(p.best_fit >= kept.div_ceil(u64::from(max)));
            prop_assert!(p.best_fit <= v.len() as u64);
        }
    }
}
