//! Multi-node plans through the real binary: `moro recipe generate --hardware 2x8xh200`
//! writes `parallel.nodes`, the recipe reads back to the same prediction, the exports launch
//! 8 processes on each of 2 nodes, and `moro estimate --nodes` shards HYBRID_SHARD per node.

mod common;

use common::{export_json, generate_70b_full, json_of, moro};

#[test]
fn generate_on_two_nodes_writes_nodes_and_exports_multi_node_launches() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let out = generate_70b_full(d, "2x8xh200", &["--output", "moro.yaml"]);
    let stdout = String::from_utf8_lossy(&out);
    assert!(stdout.contains("16 GPUs"), "{stdout}");
    let text = std::fs::read_to_string(d.join("moro.yaml")).unwrap();
    assert!(
        text.contains("\nparallel:\n  gpus: 16\n  nodes: 2\n"),
        "{text}"
    );
    assert!(
        text.contains("16 of the 16 GPUs (2 nodes of 8) with "),
        "{text}"
    );

    // The recipe reads back: `moro estimate` predicts the recorded peak.
    let recorded: u64 = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("peak_device_bytes: "))
        .unwrap()
        .parse()
        .unwrap();
    let v = json_of(
        &moro(d)
            .args(["estimate", "moro.yaml", "--json"])
            .assert()
            .code(0)
            .get_output()
            .stdout,
    );
    assert_eq!(v["peak_device_bytes"].as_u64(), Some(recorded));
    assert_eq!(v["job"]["parallel"]["nodes"], 2);

    // Exports: 2 nodes of 8 processes.
    let export = |to: &str| export_json(d, to, &format!("{to}/"));
    let strategy = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("strategy: "))
        .unwrap()
        .to_owned();
    let trl = export("trl");
    let launch = trl["launch"].as_str().unwrap();
    if strategy.starts_with("zero") {
        assert_eq!(
            launch,
            "deepspeed --hostfile hostfile --num_nodes 2 --num_gpus 8 train_trl.py"
        );
    } else if strategy.starts_with("fsdp") {
        assert!(
            launch.contains("--machine_rank $NODE_RANK --main_process_ip $MASTER_ADDR"),
            "{launch}"
        );
    }
    let acc = export("accelerate");
    assert_eq!(
        acc["launch"],
        "accelerate launch --config_file accelerate.yaml --machine_rank $NODE_RANK \
         --main_process_ip $MASTER_ADDR --main_process_port 29500 <train.py>"
    );
    let cfg = std::fs::read_to_string(d.join("accelerate/accelerate.yaml")).unwrap();
    for line in [
        "num_machines: 2\n",
        "num_processes: 16\n",
        "machine_rank: 0\n",
    ] {
        assert!(cfg.contains(line), "{line:?} missing in\n{cfg}");
    }
    let warnings = acc["warnings"].as_array().unwrap();
    assert!(
        warnings
            .iter()
            .all(|w| !w.as_str().unwrap().contains("on one node")),
        "{warnings:?}"
    );
}

#[test]
fn one_node_recipes_write_no_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let v = json_of(
        &moro(d)
            .args([
                "recipe",
                "generate",
                "--model",
                "Qwen/Qwen2.5-7B",
                "--hardware",
                "8xh100-sxm",
                "--method",
                "full",
                "--seq-len",
                "4096",
                "--json",
            ])
            .assert()
            .code(0)
            .get_output()
            .stdout,
    );
    assert!(v["recipe"]["parallel"].get("nodes").is_none(), "{v}");
}

/// `--nodes` reaches the estimator: FSDP HYBRID_SHARD on 16 GPUs keeps an eighth of the
/// weights per GPU on 2 nodes of 8, a sixteenth on one node of 16.
#[test]
fn estimate_nodes_flag_shards_hybrid_per_node() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let weights = |nodes: &str| {
        let v = json_of(
            &moro(d)
                .args([
                    "estimate",
                    "--model",
                    "meta-llama/Llama-2-7b-hf",
                    "--method",
                    "full",
                    "--precision",
                    "bf16",
                    "--gpus",
                    "16",
                    "--strategy",
                    "fsdp_hybrid_shard",
                    "--nodes",
                    nodes,
                    "--json",
                ])
                .assert()
                .code(0)
                .get_output()
                .stdout,
        );
        v["components"]["weights"].as_u64().unwrap()
    };
    // Llama-2-7B: 6,738,415,616 parameters, 2 B each.
    assert_eq!(weights("2"), 6_738_415_616 * 2 / 8);
    assert_eq!(weights("1"), 6_738_415_616 * 2 / 16);
    // Nodes that do not divide the GPUs: invalid input, the field named.
    let out = moro(d)
        .args([
            "estimate",
            "--model",
            "meta-llama/Llama-2-7b-hf",
            "--gpus",
            "16",
            "--nodes",
            "3",
        ])
        .assert()
        .code(2)
        .get_output()
        .clone();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("nodes"), "{err}");
}
