//! BOFT's block size and butterfly factors checked against every target, as PEFT checks
//! them when it builds the layers (`tuners/boft/layer.py` `BOFTLayer.update_layer`, 0.21.2).

use super::{Job, JobError, Quantization};
use crate::model::ModelSpec;

impl Job {
    /// `boft_block_size` b and `boft_n_butterfly_factor` D: b ≥ 1 divides every target's
    /// input width; with D ≥ 2, b · 2^(D−1) divides it too, and b and the block count
    /// (in / b) are even. PEFT raises each of these when it builds the layer.
    pub(super) fn check_boft(&self, model: &ModelSpec) -> Result<(), JobError> {
        let err = |field, message: String| Err(JobError { field, message });
        let b = self.adapter.boft_block_size();
        let d = self.adapter.boft_butterfly_factor();
        if b == 0 {
            return err(
                "boft_block_size",
                "must be at least 1 (PEFT's default is 4)".to_owned(),
            );
        }
        if d == 0 {
            return err(
                "boft_n_butterfly_factor",
                "must be at least 1 (PEFT's default is 1)".to_owned(),
            );
        }
        if self.quantization != Quantization::None
            && self.versions.peft.is_some_and(|v| v < (0, 20))
        {
            return err(
                "peft",
                "BOFT on a quantized base came in PEFT 0.20.0 (before it, BOFT rotates the \
                 base weight itself, which a 4-bit weight packs); use method lora or PEFT \
                 0.20 or later"
                    .to_owned(),
            );
        }
        // b · 2^(D−1); none past u64, which divides no width.
        let span = u32::try_from(d - 1)
            .ok()
            .and_then(|shift| 1u64.checked_shl(shift))
            .and_then(|factor| b.checked_mul(factor));
        for (_, l) in model.linears().filter(|(_, l)| self.adapts(l)) {
            let i = l.in_features;
            if !i.is_multiple_of(b) {
                return err(
                    "boft_block_size",
                    format!(
                        "{b} must divide the input width of every target; `{}` has {i}",
                        l.name
                    ),
                );
            }
            let spans = span.is_some_and(|span| i.is_multiple_of(span));
            if d >= 2 && (!spans || b % 2 == 1 || (i / b) % 2 == 1) {
                return err(
                    "boft_n_butterfly_factor",
                    format!(
                        "{d} factors of blocks of {b} need an even block size and an even \
                         block count, and b · 2^(D−1) to divide the input width of every \
                         target; `{}` has {i}",
                        l.name
                    ),
                );
            }
        }
        Ok(())
    }
}
