//! Launch commands, one node or several: torchrun, the DeepSpeed launcher, accelerate.

use crate::plan::{Dist, HOSTFILE_NAME, MASTER_PORT, Plan};

/// How a launcher reaches the nodes of a multi-node run.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Launcher {
    /// The same command on every node, each with its own `NODE_RANK` (torchrun, accelerate,
    /// LLaMA-Factory's torchrun).
    EachNode,
    /// The DeepSpeed launcher on node 0 only: it starts the others over ssh (pdsh) from the
    /// hostfile.
    DeepSpeedHostfile,
}

/// `torchrun` for the plan's GPUs. Several nodes: the static multi-node form of
/// `torch.distributed.run`, run on every node (`--nnodes`, `--nproc_per_node`, `--node_rank`,
/// `--master_addr`, `--master_port`).
pub(super) fn torchrun(p: &Plan<'_>, script: &str) -> String {
    if p.multi_node() {
        format!(
            "torchrun --nnodes {} --nproc_per_node {} --node_rank $NODE_RANK --master_addr \
             $MASTER_ADDR --master_port {MASTER_PORT} {script}",
            p.nodes,
            p.gpus_per_node()
        )
    } else {
        format!("torchrun --nproc_per_node {} {script}", p.dist.gpus())
    }
}

/// The DeepSpeed launcher for the plan's GPUs. Several nodes: `--hostfile`, `--num_nodes`
/// (the first N hosts of the hostfile) and `--num_gpus` ("max number of GPUs to use on each
/// node"), as `deepspeed/launcher/runner.py` names them.
pub(super) fn deepspeed_launch(p: &Plan<'_>, script: &str) -> String {
    if p.multi_node() {
        format!(
            "deepspeed --hostfile {HOSTFILE_NAME} --num_nodes {} --num_gpus {} {script}",
            p.nodes,
            p.gpus_per_node()
        )
    } else {
        format!("deepspeed --num_gpus {} {script}", p.dist.gpus())
    }
}

/// `accelerate launch` flags that make one node's launch part of a multi-node run
/// (`--machine_rank`, `--main_process_ip`, `--main_process_port` in
/// `accelerate/commands/launch.py`; they override the config file's values). Empty on one node.
pub(super) fn accelerate_machine_flags(p: &Plan<'_>) -> String {
    if p.multi_node() {
        format!(
            " --machine_rank $NODE_RANK --main_process_ip $MASTER_ADDR --main_process_port \
             {MASTER_PORT}"
        )
    } else {
        String::new()
    }
}

/// `accelerate launch --config_file CONFIG [machine flags] SCRIPT`.
pub(super) fn accelerate_launch(p: &Plan<'_>, config: &str, script: &str) -> String {
    format!(
        "accelerate launch --config_file {config}{} {script}",
        accelerate_machine_flags(p)
    )
}

/// The node a multi-node accelerate config names as the main one: a placeholder for its
/// address (the launch command's `--main_process_ip $MASTER_ADDR` overrides it).
pub(super) const MAIN_NODE_PLACEHOLDER: &str = "node-0";

/// Header lines saying how a multi-node launch is run; none on one node.
pub(super) fn node_header(p: &Plan<'_>, launcher: Launcher) -> Vec<String> {
    if !p.multi_node() {
        return Vec::new();
    }
    let others = match p.nodes - 1 {
        1 => "1 on the other".to_owned(),
        last => format!("1 to {last} on the others"),
    };
    match launcher {
        Launcher::EachNode => vec![format!(
            "{} nodes of {} GPUs: run the command on every node, with NODE_RANK set to the node's \
             rank (0 on the main node, {others}) and MASTER_ADDR to the main node's address.",
            p.nodes,
            p.gpus_per_node()
        )],
        Launcher::DeepSpeedHostfile => {
            let mut v = vec![
                format!(
                    "{} nodes of {} GPUs: run the command on the main node only; the deepspeed \
                     launcher starts the others over passwordless ssh (pdsh).",
                    p.nodes,
                    p.gpus_per_node()
                ),
                format!(
                    "`{HOSTFILE_NAME}` lists the nodes, one `HOST slots=GPUS` line each, the main \
                     node first:"
                ),
            ];
            for i in 0..p.nodes {
                v.push(format!("  node-{i} slots={}", p.gpus_per_node()));
            }
            v
        }
    }
}

/// The warning of a multi-node export: what each node has to do; `None` on one node.
pub(super) fn node_warning(p: &Plan<'_>, launcher: Launcher) -> Option<String> {
    if !p.multi_node() {
        return None;
    }
    let last = p.nodes - 1;
    Some(match launcher {
        Launcher::EachNode => format!(
            "parallel.nodes = {}: run the launch command on each node with NODE_RANK (0 to {last}) \
             and MASTER_ADDR (the main node's address) set; every node needs the same files",
            p.nodes
        ),
        Launcher::DeepSpeedHostfile => format!(
            "parallel.nodes = {}: run the launch command on the main node only; the deepspeed \
             launcher reaches the other nodes over passwordless ssh, listed in `{HOSTFILE_NAME}` \
             one per line as `HOST slots={}`, the main node first",
            p.nodes,
            p.gpus_per_node()
        ),
    })
}

/// A Python script's multi-node header comment lines (and its warning); empty on one node.
pub(super) fn script_node_header(p: &Plan<'_>, warnings: &mut Vec<String>) -> String {
    let launcher = script_launcher(p);
    warnings.extend(node_warning(p, launcher));
    node_header(p, launcher)
        .iter()
        .map(|l| format!("# {l}\n"))
        .collect()
}

/// The launcher a Python-launched trainer's command uses ([`script_launch`]).
pub(super) const fn script_launcher(p: &Plan<'_>) -> Launcher {
    match p.dist {
        Dist::Zero { .. } => Launcher::DeepSpeedHostfile,
        _ => Launcher::EachNode,
    }
}
