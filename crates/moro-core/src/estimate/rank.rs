//! One rank of a sharded job, its bytes named by what they are: the shard, what every rank
//! keeps whole, the units gathered while they compute, the blocks FSDP's hooks hold, and
//! what loading would leave if the script put the whole model on each GPU first.
//!
//! The sums are the estimator's own ([`super::parallel::Sharded`]); this only names them.

use serde::{Deserialize, Serialize};

use crate::job::{Job, Method, Offload, Sharding};
use crate::model::ModelSpec;

use super::Regime;
use super::parallel::Sharded;
use super::streams::SideStreams;
use super::weights::{added_params, base_weight_bytes, bnb4_quant_state_bytes};

/// One rank's sharded bytes, by part (all at the allocated level).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankParts {
    /// Ranks the parameters are sharded over.
    pub shard_group: u64,
    /// This rank's shard of the parameters (and adapters), without what is replicated.
    pub weights_shard: u64,
    /// Kept whole on every rank: bitsandbytes' 4-bit quantization states, which are not
    /// parameters and which FSDP does not flatten.
    pub replicated: u64,
    /// Layer units gathered at once, the running one and the prefetched one. FSDP makes them
    /// on its all-gather stream, so their cached blocks serve only that stream: the compute
    /// stream's reserve cannot reuse them.
    pub gathered_layers: u64,
    /// The root unit (embeddings, final norm, lm_head), gathered from the forward to the end
    /// of backward.
    pub gathered_root: u64,
    /// A unit's gradient while autograd assembles it, before its reduce-scatter.
    pub grad_assembly: u64,
    /// Finished layers' checkpoints and input gradients that FSDP1's hooks keep until the
    /// end of backward ([`super::parallel::fsdp1_holds_recomputed_inputs`]); 0 when none.
    pub held_recomputed_inputs: u64,
    /// On FSDP's all-gather stream at the peak (FSDP1's unshard stream: the gathered units;
    /// FSDP2's copy-in stream: a unit's all-gather output). Part of the parts above.
    #[serde(default)]
    pub all_gather_stream: u64,
    /// On FSDP's reduce-scatter stream at the peak: the sharded gradients its
    /// reduce-scatters made (FSDP1's post-backward stream). Part of the parts above.
    #[serde(default)]
    pub reduce_scatter_stream: u64,
    /// On FSDP1's pre-unshard stream at the peak: under CPU offload, the gathered units'
    /// shards copied back from the host for their all-gathers. Part of the parts above.
    #[serde(default)]
    pub pre_unshard_stream: u64,
    /// Reserved by those streams' pools and not in use at the peak: blocks freed there
    /// (last step's gradients, gathered units) that the compute stream cannot take. Part of
    /// the reserved level, not of the allocated parts above.
    #[serde(default)]
    pub stream_cached: u64,
    /// What each rank holds when the script loads the whole model onto its GPU before
    /// wrapping (a quantized model placed by `device_map`): the run's floor then. moro's
    /// estimate assumes the model is sharded as it is wrapped (rank 0 loads on the host,
    /// accelerate's `cpu_ram_efficient_loading`). 0 under DeepSpeed.
    pub whole_model_load: u64,
}

/// The parts of `par` for a job sharded by FSDP or DeepSpeed ZeRO; `None` for one GPU,
/// plain data parallelism and inference.
#[must_use]
pub fn parts(
    model: &ModelSpec,
    job: &Job,
    r: &Regime,
    par: &Sharded,
    held_recomputed_inputs: u64,
    side: Option<SideStreams>,
) -> Option<RankParts> {
    let sharding = job.parallel.sharding;
    if sharding == Sharding::None || job.method == Method::Inference {
        return None;
    }
    let group = match sharding {
        Sharding::FsdpHybridShard => job.parallel.hybrid_shard_group(),
        Sharding::Zero1 | Sharding::Zero2 | Sharding::FsdpShardGradOp => 1,
        _ => job.parallel.data_parallel.max(1),
    };
    let split = job.parallel.tensor_parallel.max(1) * job.parallel.pipeline.max(1);
    let fsdp = !super::parallel::is_deepspeed(sharding);
    let replicated = if fsdp && !matches!(job.parallel.offload, Offload::None) {
        par.weights
    } else if fsdp {
        bnb4_quant_state_bytes(model, job) / job.parallel.tensor_parallel.max(1)
    } else {
        0
    };
    let adapters = if job.method.is_peft() {
        added_params(model, job) * r.adapter_bytes
    } else {
        0
    };
    let whole = if fsdp {
        (base_weight_bytes(model, job, r) + adapters) / split
    } else {
        0
    };
    Some(RankParts {
        shard_group: group,
        weights_shard: (par.weights + par.adapters).saturating_sub(replicated),
        replicated,
        gathered_layers: par.gathered_params.saturating_sub(par.gathered_root),
        gathered_root: par.gathered_root,
        grad_assembly: par.unit_grad_assembly,
        held_recomputed_inputs,
        all_gather_stream: side.map_or(0, |s| s.all_gather.live),
        reduce_scatter_stream: side.map_or(0, |s| s.reduce_scatter.live),
        pre_unshard_stream: side.map_or(0, |s| s.pre_unshard.live),
        stream_cached: side.map_or(0, |s| s.cached()),
        whole_model_load: whole,
    })
}
