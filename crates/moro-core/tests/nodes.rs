//! Jobs spread over several nodes: FSDP HYBRID_SHARD shards within a node.

use moro_core::catalog;
use moro_core::estimate::{Component, DeviceProfile, estimate};
use moro_core::job::{Job, Method, Parallel, Precision, Sharding};

fn llama2_7b() -> moro_core::model::ModelSpec {
    catalog::load(catalog::find("meta-llama/Llama-2-7b-hf").expect("catalog")).unwrap()
}

fn hybrid(gpus: u64, nodes: u64) -> Job {
    Job {
        method: Method::Full,
        precision: Precision::Bf16,
        gradient_checkpointing: true,
        parallel: Parallel {
            data_parallel: gpus,
            sharding: Sharding::FsdpHybridShard,
            nodes,
            ..Parallel::single()
        },
        ..Job::default()
    }
}

/// Full fine-tune of Llama-2-7B (6,738,415,616 parameters, docs/model-params.md) in bf16:
/// 2 B per parameter, 13,476,831,232 B of weights. HYBRID_SHARD
/// (`torch.distributed.fsdp.ShardingStrategy`: "FULL_SHARD within a node, and replicate
/// parameters across nodes") on 16 GPUs: 2 nodes of 8 shard them 8 ways, 1,684,603,904 B per
/// GPU; one node of 16 shards them 16 ways, 842,301,952 B.
#[test]
fn hybrid_shard_groups_one_node() {
    let m = llama2_7b();
    let total: u64 = 6_738_415_616;
    assert_eq!(m.total_params(), total);
    let p = DeviceProfile::default();

    let two_nodes = estimate(&m, &hybrid(16, 2), &p).unwrap();
    assert_eq!(two_nodes.component(Component::Weights), 1_684_603_904);
    assert_eq!(two_nodes.component(Component::Weights), total * 2 / 8);

    let one_node = estimate(&m, &hybrid(16, 1), &p).unwrap();
    assert_eq!(one_node.component(Component::Weights), 842_301_952);
    assert_eq!(one_node.component(Component::Weights), total * 2 / 16);

    // Gradients and optimizer states shard the same way: the two-node job holds more.
    let states = |e: &moro_core::estimate::Estimate| e.component(Component::OptimizerStates);
    assert!(states(&two_nodes) > states(&one_node));
    assert!(two_nodes.peak_allocated_bytes > one_node.peak_allocated_bytes);

    // Eight GPUs on one node: the group is the node, as before nodes were known.
    let eight = estimate(&m, &hybrid(8, 1), &p).unwrap();
    assert_eq!(eight.component(Component::Weights), total * 2 / 8);
    // FULL_SHARD ignores the node count.
    let mut full = hybrid(16, 2);
    full.parallel.sharding = Sharding::FsdpFullShard;
    let mut full_one = full.clone();
    full_one.parallel.nodes = 1;
    assert_eq!(
        estimate(&m, &full, &p).unwrap(),
        estimate(&m, &full_one, &p).unwrap()
    );
}

#[test]
fn nodes_must_divide_the_gpus() {
    let m = llama2_7b();
    let e = estimate(&m, &hybrid(12, 5), &DeviceProfile::default()).unwrap_err();
    assert_eq!(e.field, "parallel.nodes");
    let e = estimate(&m, &hybrid(8, 0), &DeviceProfile::default()).unwrap_err();
    assert_eq!(e.field, "parallel.nodes");
}

#[test]
fn jobs_written_before_nodes_existed_read_as_one_node() {
    let job = hybrid(16, 1);
    let text = serde_json::to_string(&job).unwrap();
    assert!(!text.contains("nodes"), "{text}");
    let back: Job = serde_json::from_str(&text).unwrap();
    assert_eq!(back.parallel.nodes, 1);
    let two = hybrid(16, 2);
    let text = serde_json::to_string(&two).unwrap();
    assert!(text.contains("\"nodes\":2"), "{text}");
    assert_eq!(serde_json::from_str::<Job>(&text).unwrap(), two);
}
