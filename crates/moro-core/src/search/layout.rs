//! GPU layouts: how many GPUs, which sharding, what is offloaded, per stack.

use serde::Serialize;

use crate::job::{Offload, Sharding};

use super::*;

/// The GPUs a multi-GPU search may use: `nodes` × `gpus_per_node` of one kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Cluster {
    /// Nodes (machines).
    pub nodes: u64,
    /// GPUs in each node.
    pub gpus_per_node: u64,
    /// Use every GPU of the cluster (`moro fit` asks whether exactly this many suffice);
    /// `false` lets the search also try fewer ([`gpu_counts`]).
    pub exact: bool,
    /// Whether CPU offload layouts are searched (they need host RAM:
    /// [`Estimate::host_bytes`]).
    pub offload: bool,
}

impl Cluster {
    /// Every GPU of one node of `gpus` GPUs, the search free to use fewer.
    #[must_use]
    pub const fn node(gpus: u64) -> Self {
        Self {
            nodes: 1,
            gpus_per_node: gpus,
            exact: false,
            offload: true,
        }
    }

    /// All GPUs.
    #[must_use]
    pub const fn gpus(&self) -> u64 {
        self.nodes.saturating_mul(self.gpus_per_node)
    }
}

/// GPU counts a search over `cluster` tries, fewest first: powers of two below one node, the
/// node, then 2, 4, … whole nodes and all of them. With `exact`, only all of them.
#[must_use]
pub fn gpu_counts(cluster: &Cluster) -> Vec<u64> {
    let g = cluster.gpus_per_node.max(1);
    let nodes = cluster.nodes.max(1);
    if cluster.exact {
        return vec![g.saturating_mul(nodes)];
    }
    let mut v: Vec<u64> = (0..63).map(|k| 1u64 << k).take_while(|&c| c < g).collect();
    let mut m = 1;
    while m < nodes {
        v.push(g * m);
        m *= 2;
    }
    v.push(g.saturating_mul(nodes));
    v
}

/// How one configuration spreads over GPUs: the count, the sharding strategy and the CPU
/// offload. One GPU is [`Layout::SINGLE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Layout {
    /// GPUs used (data-parallel degree × the request's tensor and pipeline degrees).
    pub gpus: u64,
    /// Nodes those GPUs span.
    pub nodes: u64,
    /// Sharding strategy over the data-parallel GPUs.
    pub sharding: Sharding,
    /// CPU offload.
    pub offload: Offload,
}

impl Layout {
    /// One GPU, nothing sharded or offloaded.
    pub const SINGLE: Self = Self {
        gpus: 1,
        nodes: 1,
        sharding: Sharding::None,
        offload: Offload::None,
    };

    /// The communication a layout costs, smaller is less (issue 6 §3: "preferring the least
    /// communication that fits"): `5 × offload level + sharding level`, where
    ///
    /// - sharding: 0 one GPU or DDP (one all-reduce of the gradients per step); 1 ZeRO-1 (the
    ///   same volume, reduce-scatter + all-gather); 2 ZeRO-2 / FSDP SHARD_GRAD_OP (gradients
    ///   reduce-scattered per bucket during backward); 3 ZeRO-3 / FSDP FULL_SHARD within one
    ///   node, or HYBRID_SHARD (full shard within each node, replicas across nodes: the
    ///   parameter all-gathers stay on NVLink); 4 ZeRO-3 / FULL_SHARD across nodes (every
    ///   layer's all-gather, forward and backward, crosses the network);
    /// - offload: 0 none; 1 optimizer states (the step runs on the CPU and every gradient and
    ///   updated parameter crosses PCIe); 2 optimizer and parameters (the parameters too,
    ///   every forward and backward).
    ///
    /// Any offload costs more than any sharding: CPU Adam and PCIe are an order of magnitude
    /// slower than NVLink collectives.
    #[must_use]
    pub const fn comm_cost(&self) -> u64 {
        let across = self.nodes > 1;
        let shard = match self.sharding {
            Sharding::None => 0,
            Sharding::Zero1 => 1,
            Sharding::Zero2 | Sharding::FsdpShardGradOp => 2,
            Sharding::FsdpHybridShard => 3,
            Sharding::Zero3 | Sharding::FsdpFullShard => {
                if across {
                    4
                } else {
                    3
                }
            }
        };
        let off = match self.offload {
            Offload::None => 0,
            Offload::Optimizer => 1,
            Offload::OptimizerAndParams => 2,
        };
        5 * off + shard
    }

    /// Whether the strategy is DeepSpeed's.
    #[must_use]
    pub const fn is_deepspeed(&self) -> bool {
        matches!(
            self.sharding,
            Sharding::Zero1 | Sharding::Zero2 | Sharding::Zero3
        )
    }

    /// The strategy in words: `DDP`, `ZeRO-3 + optimizer offload`, `FSDP FULL_SHARD`, ...
    #[must_use]
    pub fn strategy_text(&self) -> String {
        self.strategy_words(false)
    }

    /// [`Self::strategy_text`] in fewer letters, for narrow tables: `FSDP full + offload`.
    #[must_use]
    pub fn strategy_short(&self) -> String {
        self.strategy_words(true)
    }

    fn strategy_words(&self, short: bool) -> String {
        let s = match (self.gpus, self.sharding, short) {
            (1, Sharding::None, _) => "one GPU",
            (_, Sharding::None, _) => "DDP",
            (_, Sharding::Zero1, _) => "ZeRO-1",
            (_, Sharding::Zero2, _) => "ZeRO-2",
            (_, Sharding::Zero3, _) => "ZeRO-3",
            (_, Sharding::FsdpFullShard, false) => "FSDP FULL_SHARD",
            (_, Sharding::FsdpShardGradOp, false) => "FSDP SHARD_GRAD_OP",
            (_, Sharding::FsdpHybridShard, false) => "FSDP HYBRID_SHARD",
            (_, Sharding::FsdpFullShard, true) => "FSDP full",
            (_, Sharding::FsdpShardGradOp, true) => "FSDP grad-op",
            (_, Sharding::FsdpHybridShard, true) => "FSDP hybrid",
        };
        let off = match (self.offload, self.is_deepspeed(), short) {
            (Offload::None, _, _) => "",
            (Offload::Optimizer, true, false) => " + optimizer offload",
            (Offload::OptimizerAndParams, true, false) => " + optimizer and parameter offload",
            (Offload::Optimizer, true, true) => " + opt. offload",
            (Offload::OptimizerAndParams, true, true) => " + offload",
            // FSDP's CPUOffload moves parameters, gradients and the optimizer step together.
            (_, false, false) => " + CPU offload",
            (_, false, true) => " + offload",
        };
        format!("{s}{off}")
    }
}

/// The layouts a request searches, best first by [`Layout::comm_cost`] then more GPUs.
///
/// Without a cluster: the request's fixed `parallel` layout alone. With one, for each count
/// of [`gpu_counts`]: one GPU plain; above one, per stack:
///
/// - hf, trl (the HF Trainer launches DeepSpeed and FSDP through accelerate): DDP, ZeRO-1,
///   ZeRO-2, FSDP SHARD_GRAD_OP, ZeRO-3, FSDP FULL_SHARD, FSDP HYBRID_SHARD when the GPUs span
///   nodes; ZeRO-2 and ZeRO-3 with the optimizer offloaded; ZeRO-3 and FSDP FULL_SHARD with
///   optimizer and parameters offloaded (offload only with [`Cluster::offload`]);
/// - torchtune (its distributed recipes always shard with FSDP2, `fsdp_cpu_offload`
///   optional): FSDP FULL_SHARD, with and without CPU offload;
/// - litgpt (Fabric's `FSDPStrategy`, full shard, no offload in its fine-tuning scripts):
///   FSDP FULL_SHARD.
#[must_use]
pub fn layouts(request: &Request) -> Vec<Layout> {
    let Some(cluster) = request.cluster.filter(|c| c.gpus() > 1 || c.exact) else {
        let p = &request.parallel;
        return vec![Layout {
            gpus: p.gpus().max(1),
            nodes: p.nodes.max(1),
            sharding: p.sharding,
            offload: p.offload,
        }];
    };
    let g = cluster.gpus_per_node.max(1);
    let mut out = Vec::new();
    for n in gpu_counts(&cluster) {
        if n <= 1 {
            out.push(Layout::SINGLE);
            continue;
        }
        let nodes = n.div_ceil(g);
        let l = |sharding, offload| Layout {
            gpus: n,
            nodes,
            sharding,
            offload,
        };
        let profile = request.stack.profile();
        let offload = if cluster.offload {
            profile.offload_layouts
        } else {
            &[]
        };
        out.extend(
            profile
                .multi_gpu_layouts
                .iter()
                .chain(offload)
                .filter(|(s, _)| *s != Sharding::FsdpHybridShard || nodes > 1)
                .map(|&(s, o)| l(s, o)),
        );
    }
    out.sort_by_key(|l| (l.comm_cost(), std::cmp::Reverse(l.gpus)));
    out
}
