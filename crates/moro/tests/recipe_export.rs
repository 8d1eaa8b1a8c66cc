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
