//! What moro models of Gemma 3n ([`crate::model::Gemma3nSpec`]): its text model in
//! transformers' own modules on the hf and trl stacks, eager, with LoRA or full fine-tuning,
//! packed batches, whole layers on each GPU. The rest is refused by name.

use super::{Attention, Job, JobError, Quantization, Stack};
use crate::model::ModelSpec;

impl Job {
    /// Refuses the settings whose memory on Gemma 3n was not traced.
    pub(super) fn validate_gemma3n(&self, model: &ModelSpec) -> Result<(), JobError> {
        if model.gemma3n.is_none() {
            return Ok(());
        }
        let m = &model.model_type;
        let err = |field, message: String| Err(JobError { field, message });
        if self.images.per_sample > 0 {
            return err(
                "training.images_per_sample",
                format!(
                    "`{m}`'s vision and audio towers are counted as weights, but images and \
                     audio are not modelled yet: train its text model (images_per_sample: 0)"
                ),
            );
        }
        if !matches!(self.stack, Stack::Hf | Stack::Trl) {
            return err(
                "stack",
                format!(
                    "`{m}` is modelled as transformers runs it; the {} stack was not traced \
                     there: use stack hf or trl",
                    self.stack.as_str()
                ),
            );
        }
        if self.attention != Attention::Sdpa {
            return err(
                "attention",
                format!("moro models `{m}` with transformers' default attention, sdpa"),
            );
        }
        if self.quantization != Quantization::None {
            return err(
                "quantization",
                format!("QLoRA of `{m}` was not traced: use lora or full"),
            );
        }
        if self.compile {
            return err(
                "compile",
                format!("torch.compile of `{m}` was not traced; turn it off"),
            );
        }
        if self.padding.has_mask() {
            return err(
                "padding",
                format!("a padding mask on `{m}` was not traced; pack the batch (padding: packed)"),
            );
        }
        if self.parallel.tensor_parallel > 1 || self.parallel.pipeline > 1 {
            return err(
                "parallel",
                format!(
                    "tensor and pipeline parallelism of `{m}` are not modelled; shard it with \
                     ZeRO or FSDP instead"
                ),
            );
        }
        Ok(())
    }
}
