//! What moro models of a model with recurrent layers (Mamba-2, [`crate::model::SsmSpec`]; gated
//! DeltaNet, [`crate::model::GatedDeltaNetSpec`]): transformers'
//! own modules on the hf and trl stacks, eager (not compiled), packed batches, whole layers
//! on each GPU. The rest is refused by name rather than estimated as if the layers were
//! attention.

use super::{Job, JobError, Stack};
use crate::model::ModelSpec;

impl Job {
    /// Refuses the settings whose memory on a recurrent layer was not traced.
    pub(super) fn validate_recurrent(&self, model: &ModelSpec) -> Result<(), JobError> {
        if !model.has_recurrent_mixer() {
            return Ok(());
        }
        let m = &model.model_type;
        let err = |field, message: String| Err(JobError { field, message });
        if !matches!(self.stack, Stack::Hf | Stack::Trl) {
            return err(
                "stack",
                format!(
                    "`{m}` has recurrent (Mamba-2 or gated DeltaNet) layers, which moro models as transformers runs them; \
                     the {} stack was not traced there: use stack hf or trl",
                    self.stack.as_str()
                ),
            );
        }
        if self.compile {
            return err(
                "compile",
                format!("torch.compile of `{m}`'s recurrent layers was not traced; turn it off"),
            );
        }
        if self.padding.has_mask() {
            return err(
                "padding",
                format!(
                    "a padding mask makes `{m}`'s recurrent layers mask their inputs and \
                     convolution, which was not traced; pack the batch (padding: packed)"
                ),
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
