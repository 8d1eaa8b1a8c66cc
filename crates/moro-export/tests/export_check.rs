//! Every export snapshot was run through its trainer's own code since it last changed.
//!
//! `calibration/check_exports.py --record calibration/export-check.json` checks each snapshot
//! folder with the trainer it is for (issue 18) and records a hash of the folder's files. A
//! snapshot that changed after that run, or a new one, fails here until the check is run
//! again; so does a file the check failed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;
use sha2::{Digest, Sha256};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `calibration/export-check.json`, the last run of the check.
fn record() -> Value {
    serde_json::from_str(
        &std::fs::read_to_string(root().join("calibration/export-check.json")).unwrap(),
    )
    .unwrap()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// As `snapshot_hash` in check_exports.py: SHA-256 over `name\n` and the file's SHA-256 in
/// hex, `\n`, for each file of the folder in name order.
fn snapshot_hash(dir: &Path) -> String {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    let mut h = Sha256::new();
    for f in files {
        let name = f.file_name().unwrap().to_str().unwrap();
        let digest = hex(&Sha256::digest(std::fs::read(&f).unwrap()));
        h.update(format!("{name}\n{digest}\n").as_bytes());
    }
    hex(&h.finalize())
}

/// The trainer folders of the snapshots, `snapshot/trainer`.
fn snapshot_folders() -> BTreeMap<String, PathBuf> {
    let snapshots = root().join("crates/moro-export/tests/snapshots");
    let mut out = BTreeMap::new();
    for snap in std::fs::read_dir(&snapshots).unwrap() {
        let snap = snap.unwrap().path();
        if !snap.is_dir() {
            continue;
        }
        for trainer in std::fs::read_dir(&snap).unwrap() {
            let trainer = trainer.unwrap().path();
            let name = trainer.file_name().unwrap().to_str().unwrap().to_owned();
            if trainer.is_dir() && name != "__pycache__" {
                let snap_name = snap.file_name().unwrap().to_str().unwrap();
                out.insert(format!("{snap_name}/{name}"), trainer);
            }
        }
    }
    out
}

#[test]
fn every_snapshot_was_checked_by_its_trainer_since_it_last_changed() {
    let record = record();
    let checked: BTreeMap<String, &Value> = record["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let key = format!(
                "{}/{}",
                f["snapshot"].as_str().unwrap(),
                f["trainer"].as_str().unwrap()
            );
            (key, f)
        })
        .collect();
    let mut problems = Vec::new();
    for (key, dir) in snapshot_folders() {
        match checked.get(&key) {
            None => problems.push(format!("{key}: never checked")),
            Some(f) => {
                if f["sha256"].as_str() != Some(snapshot_hash(&dir).as_str()) {
                    problems.push(format!("{key}: changed since it was checked"));
                }
                if f["status"].as_str() != Some("ok") {
                    problems.push(format!(
                        "{key}: {} ({})",
                        f["status"].as_str().unwrap_or("?"),
                        f["detail"].as_str().unwrap_or("")
                    ));
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "run calibration/check_exports.py again (calibration/README.md):\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_record_names_the_trainer_releases_it_ran() {
    let record = record();
    for (env, packages) in [
        (
            "default",
            &["transformers", "trl", "peft", "accelerate", "deepspeed"][..],
        ),
        ("llamafactory", &["llamafactory"][..]),
        ("axolotl", &["axolotl"][..]),
        ("unsloth", &["unsloth", "trl", "transformers"][..]),
        ("mlx", &["mlx", "mlx-lm"][..]),
    ] {
        for p in packages {
            assert!(
                record["versions"][env][p].is_string(),
                "export-check.json has no {p} version in its {env} environment"
            );
        }
    }
}
