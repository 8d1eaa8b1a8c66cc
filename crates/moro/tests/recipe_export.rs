//! `moro recipe export`: writes the files, refuses to overwrite without --force, exit 2 on an
//! invalid recipe with its line and column.

mod common;

use assert_cmd::Command;

const RECIPE: &str = "model:\n  base: Qwen/Qwen2.5-0.5B\n  method: lora\ntraining:\n  micro_batch_size: 2\n\
                      parallel:\n  gpus: 2\n  strategy: zero2\n";

/// The binary without the developer's environment ([`common::isolated`]).
fn moro() -> Command {
    Command::from_std(common::isolated())
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn export_writes_files_and_refuses_to_overwrite() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let recipe = dir.path().join("moro.yaml");
    std::fs::write(&recipe, RECIPE).unwrap_or_else(|e| panic!("{e}"));
    let out = dir.path().join("out/axo.yml");

    let run = |force: bool| {
        let mut c = moro();
        c.args(["recipe", "export"])
            .arg(&recipe)
            .args(["--to", "axolotl", "--output"])
            .arg(&out);
        if force {
            c.arg("--force");
        }
        c.output().unwrap_or_else(|e| panic!("{e}"))
    };

    let first = run(false);
    assert_eq!(first.status.code(), Some(0), "{}", text(&first.stderr));
    let yaml = std::fs::read_to_string(&out).unwrap_or_default();
    assert!(yaml.contains("base_model: Qwen/Qwen2.5-0.5B\n"), "{yaml}");
    assert!(yaml.contains("deepspeed: ds_config.json\n"), "{yaml}");
    let ds = std::fs::read_to_string(dir.path().join("out/ds_config.json")).unwrap_or_default();
    assert!(ds.contains("\"stage\": 2"), "{ds}");
    let stdout = text(&first.stdout);
    assert!(
        stdout.contains("launch: accelerate launch --num_processes 2 -m axolotl.cli.train axo.yml"),
        "{stdout}"
    );
    // The recipe names no dataset: said on stderr.
    assert!(
        text(&first.stderr).contains("warning: training.dataset is not set"),
        "{}",
        text(&first.stderr)
    );

    std::fs::write(&out, "mine\n").unwrap_or_else(|e| panic!("{e}"));
    let second = run(false);
    assert_eq!(second.status.code(), Some(2));
    assert!(
        text(&second.stderr).contains("exists"),
        "{}",
        text(&second.stderr)
    );
    assert_eq!(std::fs::read_to_string(&out).unwrap_or_default(), "mine\n");

    let third = run(true);
    assert_eq!(third.status.code(), Some(0), "{}", text(&third.stderr));
    assert_eq!(std::fs::read_to_string(&out).unwrap_or_default(), yaml);
    // No temporary files left behind.
    let names: Vec<String> = std::fs::read_dir(dir.path().join("out"))
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    assert!(names.iter().all(|n| !n.starts_with('.')), "{names:?}");
}

#[test]
fn json_report_lists_files_warnings_and_launch() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let recipe = dir.path().join("moro.yaml");
    std::fs::write(&recipe, RECIPE).unwrap_or_else(|e| panic!("{e}"));
    let o = moro()
        .current_dir(dir.path())
        .args(["recipe", "export", "moro.yaml", "--to", "trl", "--json"])
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    assert_eq!(v["format"], "trl");
    assert_eq!(v["launch"], "deepspeed --num_gpus 2 train_trl.py");
    assert_eq!(v["files"][0], "train_trl.py");
    assert!(v["warnings"].as_array().is_some_and(|w| !w.is_empty()));
    assert!(dir.path().join("train_trl.py").exists() && dir.path().join("ds_config.json").exists());
}

#[test]
fn invalid_recipe_exits_2_with_line_and_column() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let recipe = dir.path().join("bad.yaml");
    std::fs::write(
        &recipe,
        "model:\n  base: Qwen/Qwen2.5-0.5B\ntraining:\n  micro_batch_size: 0\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let o = moro()
        .current_dir(dir.path())
        .args(["recipe", "export", "bad.yaml", "--to", "llamafactory"])
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(o.status.code(), Some(2));
    let err = text(&o.stderr);
    assert!(
        err.contains("bad.yaml:4:21: field `training.micro_batch_size`"),
        "{err}"
    );
    assert!(!dir.path().join("llamafactory.yaml").exists());
}

#[test]
fn a_format_that_cannot_express_the_recipe_exits_2_naming_the_field() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(
        dir.path().join("moro.yaml"),
        "model:\n  base: Qwen/Qwen2.5-0.5B\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let o = moro()
        .current_dir(dir.path())
        .args(["recipe", "export", "--to", "deepspeed"])
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o.stderr).contains("field `parallel.strategy`"),
        "{}",
        text(&o.stderr)
    );
}

/// `recipe export --json` in `dir` for `recipe` to `format`: the report.
fn export_report(dir: &std::path::Path, recipe: &str, format: &str) -> serde_json::Value {
    std::fs::write(dir.join(format!("{format}.yaml")), recipe).unwrap_or_else(|e| panic!("{e}"));
    let o = moro()
        .current_dir(dir)
        .args([
            "recipe",
            "export",
            &format!("{format}.yaml"),
            "--to",
            format,
        ])
        .args(["--output", &format!("{format}/"), "--json"])
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o.stdout)))
}

#[test]
fn an_export_to_another_stack_is_estimated_there_too() {
    // Issue 18: a recipe sized on `hf` went to TRL and Unsloth without a word about their
    // memory. The export keeps every setting the recipe resolves to, so its figure is the
    // estimate of that job said in full with only the stack changed.
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let planned = "model:\n  base: meta-llama/Llama-3.1-8B\n  method: qlora\n  lora_rank: 16\n\
                   training:\n  stack: hf\n  max_seq_length: 4096\n  optimizer: adamw_torch_fused\n\
                   \x20 gradient_checkpointing: false\n  precision: bf16-mixed\n  attention: sdpa\n  \
                   loss: standard\n";
    let v = export_report(dir.path(), planned, "trl");
    let o = &v["on_trainer_stack"];
    assert_eq!(
        (o["recipe_stack"].as_str(), o["trainer_stack"].as_str()),
        (Some("hf"), Some("trl"))
    );
    let on_trl = planned.replace("stack: hf", "stack: trl");
    std::fs::write(dir.path().join("on_trl.yaml"), &on_trl).unwrap_or_else(|e| panic!("{e}"));
    let est = moro()
        .current_dir(dir.path())
        .args(["estimate", "on_trl.yaml", "--json"])
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let est: serde_json::Value = serde_json::from_slice(&est.stdout).unwrap_or_default();
    assert_eq!(
        o["trainer_peak_device_bytes"], est["peak_device_bytes"],
        "{v}\n{est}"
    );
    assert_ne!(
        o["trainer_peak_device_bytes"], o["recipe_peak_device_bytes"],
        "{v}"
    );
    // A stack that does not model the job says why instead of a figure.
    let full = planned.replace("method: qlora\n  lora_rank: 16\n", "method: full\n");
    let o = &export_report(dir.path(), &full, "unsloth")["on_trainer_stack"];
    assert!(o["trainer_peak_device_bytes"].is_null(), "{o}");
    assert!(
        o["refused"]
            .as_str()
            .is_some_and(|r| r.contains("full fine-tuning")),
        "{o}"
    );
    // TRL keeps QLoRA's adapters in bf16 where the HF Trainer's PEFT keeps them fp32
    // (`StackProfile::adapter_dtype`); that is the difference the note reports here.
    // The trainer's own stack: nothing to add.
    assert!(export_report(dir.path(), planned, "hf-trainer")["on_trainer_stack"].is_null());
}

#[test]
fn a_base_moro_cannot_estimate_is_still_exported() {
    // The estimate on the trainer's stack needs the model; the export does not. Offline, a
    // base outside the catalog is exported as before, with a note instead of the figure.
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let v = export_report(
        dir.path(),
        "model:\n  base: someorg/unknown-model-7b\n  method: lora\n",
        "trl",
    );
    assert!(v["on_trainer_stack"].is_null(), "{v}");
    assert!(dir.path().join("trl/train_trl.py").is_file());
}
