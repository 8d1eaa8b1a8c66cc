//! Helpers shared by the CLI tests that run the real binary in a scratch directory.

// Each test binary uses its own share of these helpers.
#![allow(dead_code)]

use std::path::Path;

use assert_cmd::Command;

/// The binary with none of the developer's environment that changes its answers: every
/// `HF_*`, `HUGGINGFACE_*`, `TRANSFORMERS_*` and `MORO_*` variable and the proxies removed,
/// then offline, an empty Hugging Face cache, a config dir that does not exist (no
/// calibration profile) and no colour. Tests set what they need on top.
pub fn isolated() -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_moro"));
    for (k, _) in std::env::vars_os() {
        let Some(k) = k.to_str() else { continue };
        let proxy = k.eq_ignore_ascii_case("http_proxy")
            || k.eq_ignore_ascii_case("https_proxy")
            || k.eq_ignore_ascii_case("all_proxy")
            || k.eq_ignore_ascii_case("no_proxy");
        if proxy
            || ["HF_", "HUGGINGFACE_", "TRANSFORMERS_", "MORO_"]
                .iter()
                .any(|p| k.starts_with(p))
        {
            c.env_remove(k);
        }
    }
    c.env("HF_HUB_CACHE", "/nonexistent-moro-test-cache")
        .env("HF_HUB_OFFLINE", "1")
        .env("MORO_CONFIG_DIR", "/nonexistent-moro-test-config")
        .env("NO_COLOR", "1");
    c
}

/// What a finished run of moro said.
pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    /// Runs `c` to its end.
    pub fn of(c: &mut std::process::Command) -> Self {
        let o = c.output().expect("moro runs");
        Self {
            code: o.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }

    /// stdout as JSON, showing both streams when it is not.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}\n{}", self.stdout, self.stderr))
    }

    /// An answer's JSON: exit 0 (fits) or 1 (does not), then stdout as JSON.
    pub fn answer_json(&self) -> serde_json::Value {
        assert!(
            self.code == 0 || self.code == 1,
            "exit {}: {}",
            self.code,
            self.stderr
        );
        self.json()
    }
}

/// `moro` in `dir` ([`isolated`]), with its own config dir there.
pub fn moro(dir: &Path) -> Command {
    let mut c = Command::from_std(isolated());
    c.current_dir(dir)
        .env("MORO_CONFIG_DIR", dir.join(".moro-config"));
    c
}

/// Issue 18's "does not fit" job: Llama-2-7B fully fine-tuned with AdamW in bf16-mixed on one
/// H100 (the README shows its answer).
pub const LLAMA2_FULL_ON_H100: [&str; 11] = [
    "estimate",
    "--model",
    "meta-llama/Llama-2-7b-hf",
    "--method",
    "full",
    "--precision",
    "bf16-mixed",
    "--optimizer",
    "adamw_torch",
    "--hardware",
    "h100-sxm",
];

/// `moro ARGS` in `dir`: asserts the exit code, returns stdout.
pub fn stdout_of(dir: &Path, args: &[&str], code: i32) -> Vec<u8> {
    moro(dir)
        .args(args)
        .assert()
        .code(code)
        .get_output()
        .stdout
        .clone()
}

/// Parses stdout as JSON, showing it when it is not.
pub fn json_of(out: &[u8]) -> serde_json::Value {
    serde_json::from_slice(out)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(out)))
}

/// `moro recipe generate` in `dir` for the 70B full fine-tune at 4096 tokens on `hardware`,
/// with `out` (`["--output", "moro.yaml"]` or `["--json"]`): exits 0; stdout.
pub fn generate_70b_full(dir: &Path, hardware: &str, out: &[&str]) -> Vec<u8> {
    moro(dir)
        .args([
            "recipe",
            "generate",
            "--model",
            "meta-llama/Llama-3.1-70B-Instruct",
            "--hardware",
            hardware,
            "--method",
            "full",
            "--seq-len",
            "4096",
        ])
        .args(out)
        .assert()
        .code(0)
        .get_output()
        .stdout
        .clone()
}

/// `moro recipe export moro.yaml --to TO -o OUT_DIR --json` in `dir`: exits 0; the JSON.
pub fn export_json(dir: &Path, to: &str, out_dir: &str) -> serde_json::Value {
    json_of(
        &moro(dir)
            .args([
                "recipe",
                "export",
                "moro.yaml",
                "--to",
                to,
                "-o",
                out_dir,
                "--json",
            ])
            .assert()
            .code(0)
            .get_output()
            .stdout,
    )
}

/// Writes `moro calibrate`'s profile of an NVIDIA H200 measured on 2026-02-03 into the config
/// directory `cfg`, with `device` as its estimator overrides.
pub fn write_h200_profile(cfg: &Path, device: &serde_json::Value) {
    std::fs::create_dir_all(cfg).unwrap();
    let p = serde_json::json!({
        "version": 1,
        "gpu_name": "NVIDIA H200",
        "gpu_slug": "nvidia-h200",
        "measured_at": "2026-02-03T04:05:06Z",
        "device": device,
    });
    std::fs::write(cfg.join("profile-nvidia-h200.json"), p.to_string()).unwrap();
}

pub mod server;
