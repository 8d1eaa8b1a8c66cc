//! `moro run` end to end through the built binary, with a trainer stand-in
//! (tests/fixtures/fake_trainer.py, python3) that reads the materialised moro.yaml.
//!
//! The stand-in's memory model (MiB): weights 4000, plus optimizer 2000 (500 paged 8-bit),
//! plus micro_batch × seq_len / 1024 × (256, or 64 with checkpointing), plus 4 × LoRA rank.
//! With the recipe below (LoRA r16, 1024 tokens): micro-batch 2 needs 6576, micro-batch 1 needs 6320.
//! Every run uses `--no-detect` or `--memory`, an empty Hugging Face cache (the model comes from
//! the embedded catalog) and its own config directory.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const RECIPE: &str = "\
# my experiment: comments like this one must survive
name: qwen-sft
model:
  base: Qwen/Qwen2.5-0.5B
  method: lora
  lora_rank: 16
training:
  micro_batch_size: 2
  gradient_accumulation_steps: 4
  max_seq_length: 1024
  auto_heal: true
";

/// [`RECIPE`] with its loss named: a job that cannot take Liger's kernels (they replace the
/// loss), so the ladder starts at the micro-batch.
fn recipe_without_liger() -> String {
    format!("{RECIPE}  loss: standard\n")
}

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fake_trainer.py")
}

struct Case {
    dir: tempfile::TempDir,
}

impl Case {
    fn new(recipe: &str) -> Self {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        fs::write(dir.path().join("moro.yaml"), recipe).unwrap_or_else(|e| panic!("write: {e}"));
        fs::create_dir(dir.path().join("hf")).unwrap_or_else(|e| panic!("mkdir: {e}"));
        Self { dir }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// `moro run ARGS -- python3 fake_trainer.py --recipe {recipe} --output_dir out`.
    fn command(&self, args: &[&str], env: &[(&str, &str)]) -> Command {
        let mut cmd = common::isolated();
        cmd.current_dir(self.dir.path())
            .arg("run")
            .args(args)
            .arg("--")
            .arg("python3")
            .arg(fixture())
            .args(["--recipe", "{recipe}", "--output_dir", "out"])
            .env("HF_HOME", self.path("hf"))
            .env("HF_HUB_CACHE", self.path("hf/hub"))
            .env("MORO_CONFIG_DIR", self.path("config"))
            .env("FAKE_LOG", self.path("starts.jsonl"))
            .env("NO_COLOR", "1")
            .envs(env.iter().copied());
        cmd
    }

    fn run(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        self.command(args, env)
            .output()
            .unwrap_or_else(|e| panic!("cannot run moro: {e}"))
    }

    fn starts(&self) -> Vec<Value> {
        fs::read_to_string(self.path("starts.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad log line {l}: {e}")))
            .collect()
    }

    fn journal(&self) -> Vec<Value> {
        fs::read_to_string(self.path(".moro/heal.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad journal {l}: {e}")))
            .collect()
    }

    fn read(&self, rel: &str) -> String {
        fs::read_to_string(self.path(rel)).unwrap_or_default()
    }

    fn assert_recipe_unchanged(&self, original: &str) {
        assert_eq!(
            self.read("moro.yaml"),
            original,
            "the user's recipe was modified"
        );
    }
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The value of `key:` in a moro.yaml text.
fn yaml_value(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let (k, v) = l.trim().split_once(':')?;
        (k == key).then(|| v.trim().to_owned())
    })
}

#[test]
fn heals_once_resumes_and_succeeds() {
    let recipe = recipe_without_liger();
    let case = Case::new(&recipe);
    let out = case.run(
        &["--no-detect", "--output-dir", "out", "--resume-flag", "hf"],
        &[("FAKE_BUDGET_MIB", "6400")],
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("heal 1 of at most 5 (level 1): micro_batch_size 2→1"),
        "{err}"
    );
    assert!(err.contains("run succeeded after 1 heal"), "{err}");
    assert!(stdout(&out).contains("training done"));

    // The journal: one heal at level 1 with predictions from the real estimator.
    let journal = case.journal();
    assert_eq!(journal.len(), 1, "{journal:?}");
    let h = &journal[0];
    assert_eq!(h["level"], 1);
    assert_eq!(h["oom_kind"], "cuda");
    assert!(
        h["oom_text"]
            .as_str()
            .unwrap_or("")
            .contains("CUDA out of memory")
    );
    let before = h["predicted_before_bytes"].as_u64().unwrap_or(0);
    let after = h["predicted_after_bytes"].as_u64().unwrap_or(u64::MAX);
    assert!(after < before, "{h}");
    assert_eq!(h["fit"], "unknown");
    assert_eq!(h["recipe"], "moro.healed.yaml");
    assert_eq!(h["resume_from"], "out/checkpoint-2");

    // The healed recipe: a moro.yaml with the effective batch kept; the user's is untouched.
    let healed = case.read("moro.healed.yaml");
    assert_eq!(
        yaml_value(&healed, "micro_batch_size").as_deref(),
        Some("1"),
        "{healed}"
    );
    assert_eq!(
        yaml_value(&healed, "gradient_accumulation_steps").as_deref(),
        Some("8")
    );
    assert_eq!(yaml_value(&healed, "name").as_deref(), Some("qwen-sft"));
    let job = moro_recipe::parse(&healed)
        .and_then(|r| r.to_job())
        .unwrap_or_else(|e| panic!("the healed recipe does not read back: {e}"));
    assert_eq!((job.micro_batch_size, job.grad_accum), (1, 8));
    assert_eq!(
        yaml_value(&healed, "base").as_deref(),
        Some("Qwen/Qwen2.5-0.5B")
    );
    case.assert_recipe_unchanged(&recipe);

    // Two starts: the second on the healed recipe, resuming from the checkpoint.
    let starts = case.starts();
    assert_eq!(starts.len(), 2);
    assert_eq!(starts[0]["recipe"], "moro.yaml");
    assert_eq!(starts[0]["env_recipe"], "moro.yaml");
    assert_eq!(starts[1]["recipe"], "moro.healed.yaml");
    assert_eq!(starts[1]["env_recipe"], "moro.healed.yaml");
    assert_eq!(starts[1]["resumed_from_step"], 2);
    assert_eq!(starts[1]["job"]["micro_batch_size"], 1);
    let argv = starts[1]["argv"].to_string();
    assert!(argv.contains("--resume_from_checkpoint"), "{argv}");
}

/// Where the job takes Liger's kernels they are the first heal: the same micro-batch and
/// hyper-parameters, written as `liger: true` into the healed recipe, resumed from the
/// checkpoint. (Qwen2.5-0.5B, 2 × 1024 tokens: the real estimator predicts 10.72 GiB → 5.43
/// GiB, most of it the logits of a 151,936-token vocabulary.)
#[test]
fn liger_is_the_first_heal_where_the_job_takes_it() {
    let case = Case::new(RECIPE);
    let out = case.run(
        &["--no-detect", "--output-dir", "out", "--resume-flag", "hf"],
        &[("FAKE_BUDGET_MIB", "6400")],
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("heal 1 of at most 5 (level 1): liger false→true"),
        "{err}"
    );
    assert!(
        err.contains("run succeeded after 1 heal (Liger's kernels on)"),
        "{err}"
    );
    let healed = case.read("moro.healed.yaml");
    assert_eq!(
        yaml_value(&healed, "liger").as_deref(),
        Some("true"),
        "{healed}"
    );
    assert_eq!(
        yaml_value(&healed, "micro_batch_size").as_deref(),
        Some("2"),
        "{healed}"
    );
    let starts = case.starts();
    assert_eq!(starts.len(), 2);
    assert_eq!(starts[1]["resumed_from_step"], 2);
    let h = &case.journal()[0];
    let (before, after) = (
        h["predicted_before_bytes"].as_u64().unwrap(),
        h["predicted_after_bytes"].as_u64().unwrap(),
    );
    assert!(after < before, "{h}");
    case.assert_recipe_unchanged(RECIPE);
}

/// An Unsloth export drops Liger for Unsloth's own kernels, so the ladder does not offer it.
#[test]
fn no_liger_heal_for_an_unsloth_export() {
    let case = Case::new(RECIPE);
    let out = case.run(
        &["--no-detect", "--to", "unsloth"],
        &[("FAKE_BUDGET_MIB", "6400")],
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("heal 1 of at most 5 (level 1): micro_batch_size 2→1"),
        "{err}"
    );
    assert!(!err.contains("liger"), "{err}");
}

#[test]
fn walks_down_the_ladder_to_the_optimizer() {
    // 6000 MiB: micro-batch 1 (6320) and checkpointing (6128) still OOM; paged 8-bit fits.
    let recipe = recipe_without_liger();
    let case = Case::new(&recipe);
    let out = case.run(&["--no-detect"], &[("FAKE_BUDGET_MIB", "6000")]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let levels: Vec<u64> = case
        .journal()
        .iter()
        .map(|h| h["level"].as_u64().unwrap_or(0))
        .collect();
    assert_eq!(levels, [1, 2, 3], "{err}");
    let healed = case.read("moro.healed.yaml");
    assert_eq!(
        yaml_value(&healed, "gradient_checkpointing").as_deref(),
        Some("true")
    );
    assert_eq!(
        yaml_value(&healed, "optimizer").as_deref(),
        Some("paged_adamw_8bit")
    );
    assert!(err.contains("run succeeded after 3 heals"), "{err}");
    case.assert_recipe_unchanged(&recipe);
}

#[test]
fn to_axolotl_exports_the_config_and_heals_it() {
    let recipe = recipe_without_liger();
    let case = Case::new(&recipe);
    let out = case
        .command(
            &["--no-detect", "--to", "axolotl", "--output-dir", "out"],
            &[("FAKE_BUDGET_MIB", "6400")],
        )
        .args(["--config", "{config}"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run moro: {e}"));
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    // The first attempt's config and the healed one, both axolotl YAML beside the journal.
    let first = case.read(".moro/axolotl.yaml");
    let healed = case.read(".moro/axolotl.healed.yaml");
    assert_eq!(
        yaml_value(&first, "micro_batch_size").as_deref(),
        Some("2"),
        "{first}"
    );
    assert_eq!(
        yaml_value(&healed, "micro_batch_size").as_deref(),
        Some("1"),
        "{healed}"
    );
    assert_eq!(
        yaml_value(&healed, "gradient_accumulation_steps").as_deref(),
        Some("8")
    );
    assert_eq!(yaml_value(&healed, "output_dir").as_deref(), Some("out"));
    assert_eq!(
        yaml_value(&healed, "base_model").as_deref(),
        Some("Qwen/Qwen2.5-0.5B")
    );
    let starts = case.starts();
    assert_eq!(starts.len(), 2);
    assert_eq!(starts[0]["config"], ".moro/axolotl.yaml");
    assert_eq!(starts[0]["env_config"], ".moro/axolotl.yaml");
    assert_eq!(starts[1]["config"], ".moro/axolotl.healed.yaml");
    assert_eq!(starts[1]["env_config"], ".moro/axolotl.healed.yaml");
    // axolotl's resume flag, in its `--flag=value` form.
    let argv = starts[1]["argv"].to_string();
    assert!(
        argv.contains("--resume_from_checkpoint=out/checkpoint-2"),
        "{argv}"
    );
    assert_eq!(starts[1]["resumed_from_step"], 2);
    case.assert_recipe_unchanged(&recipe);
}

#[test]
fn a_failure_that_is_not_oom_is_not_healed() {
    let case = Case::new(RECIPE);
    let out = case.run(&["--no-detect"], &[("FAKE_FAIL", "1")]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("ValueError: dataset has no column `text`"),
        "{err}"
    );
    assert!(err.contains("not out-of-memory, exit code 1"), "{err}");
    assert_eq!(case.starts().len(), 1);
    assert!(!case.path("moro.healed.yaml").exists());
    assert!(!case.path(".moro/heal.jsonl").exists());
    case.assert_recipe_unchanged(RECIPE);
}

#[test]
fn exits_with_the_childs_exit_code() {
    let case = Case::new(RECIPE);
    let out = common::isolated()
        .current_dir(case.dir.path())
        .args(["run", "--no-detect", "--", "sh", "-c", "echo hello; exit 7"])
        .env("HF_HUB_CACHE", case.path("hf/hub"))
        .env("MORO_CONFIG_DIR", case.path("config"))
        .output()
        .unwrap_or_else(|e| panic!("cannot run moro: {e}"));
    assert_eq!(out.status.code(), Some(7), "{}", stderr(&out));
    assert_eq!(stdout(&out), "hello\n");
}

#[test]
fn max_heals_zero_detects_and_reports_only() {
    let case = Case::new(RECIPE);
    let out = case.run(
        &["--no-detect", "--max-heals", "0"],
        &[("FAKE_BUDGET_MIB", "6400")],
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("out of memory (CUDA)"), "{err}");
    assert!(err.contains("auto-heal is off (max heals 0)"), "{err}");
    assert!(
        !err.contains("hint: set `training.auto_heal: true`"),
        "{err}"
    );
    assert_eq!(case.starts().len(), 1);
    assert!(!case.path("moro.healed.yaml").exists());
    assert!(case.journal().is_empty());
}

#[test]
fn auto_heal_false_in_the_recipe_means_no_heal_by_default() {
    let recipe = RECIPE.replace("auto_heal: true", "auto_heal: false");
    let case = Case::new(&recipe);
    let out = case.run(&["--no-detect"], &[("FAKE_BUDGET_MIB", "6400")]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("auto-heal off"), "{err}");
    assert!(
        err.contains("hint: set `training.auto_heal: true`"),
        "{err}"
    );
    assert_eq!(case.starts().len(), 1);

    // --max-heals turns it on for this run.
    let case = Case::new(&recipe);
    let out = case.run(
        &["--no-detect", "--max-heals", "2"],
        &[("FAKE_BUDGET_MIB", "6400")],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(case.journal().len(), 1);
}

#[test]
fn a_run_that_never_fits_is_bounded() {
    let case = Case::new(RECIPE);
    let out = case.run(
        &["--no-detect", "--max-heals", "2"],
        &[("FAKE_BUDGET_MIB", "1000")],
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("gave up after 2 heals"), "{err}");
    assert_eq!(case.starts().len(), 3);
    assert_eq!(case.journal().len(), 2);
}

#[test]
fn an_oom_predicted_to_fit_is_recorded_in_the_config_dir() {
    // A 1 TiB budget: the estimator says it fits, the trainer says otherwise.
    let case = Case::new(RECIPE);
    let out = case.run(&["--memory", "1TiB"], &[("FAKE_BUDGET_MIB", "6400")]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("was predicted to fit"), "{err}");
    let correction: Value =
        serde_json::from_str(&case.read("config/corrections.json")).unwrap_or(Value::Null);
    assert!(
        correction["max_under_prediction_bytes"]
            .as_u64()
            .unwrap_or(0)
            > 0,
        "{correction}"
    );
    let journal = case.journal();
    assert_eq!(journal.len(), 1);
    assert!(journal[0]["prediction_miss_bytes"].as_u64().unwrap_or(0) > 0);
    assert_eq!(journal[0]["budget_bytes"], 1u64 << 40);
}

#[test]
fn sigint_is_forwarded_and_never_restarts() {
    let case = Case::new(RECIPE);
    let child = case
        .command(
            &["--no-detect"],
            &[("FAKE_STEP_SLEEP", "1"), ("FAKE_STEPS", "30")],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run moro: {e}"));
    let deadline = Instant::now() + Duration::from_secs(30);
    while case.starts().is_empty() {
        assert!(Instant::now() < deadline, "the trainer never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap_or_else(|e| panic!("kill: {e}"));
    assert!(status.success());
    let out = child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("wait: {e}"));
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(
        err.contains("interrupted by SIGINT; not restarted"),
        "{err}"
    );
    let starts = case.starts();
    assert_eq!(starts.len(), 1);
    // The trainer is gone.
    let pid = starts[0]["pid"].to_string();
    let alive = Command::new("kill")
        .args(["-0", &pid])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(!alive, "trainer {pid} survived");
}

#[test]
fn an_invalid_recipe_is_exit_2_with_the_position() {
    let bad = RECIPE.replace("micro_batch_size: 2", "micro_batch_size: 0");
    let case = Case::new(&bad);
    let out = case.run(&["--no-detect"], &[]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("moro.yaml:8:21: field `training.micro_batch_size`"),
        "{err}"
    );
    assert_eq!(err.lines().filter(|l| l.starts_with("error")).count(), 1);
    assert!(case.starts().is_empty());

    let case = Case::new("model:\n  base: Qwen/Qwen2.5-0.5B\ntraining:\n  batch: 4\n");
    let out = case.run(&["--no-detect"], &[]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("moro.yaml:4:3"), "{err}");
    assert!(case.starts().is_empty());
}

#[test]
fn usage_errors_are_exit_2() {
    let case = Case::new(RECIPE);
    let moro = || {
        let mut c = common::isolated();
        c.current_dir(case.dir.path())
            .env("HF_HUB_CACHE", case.path("hf/hub"))
            .env("MORO_CONFIG_DIR", case.path("config"))
            .env("NO_COLOR", "1");
        c
    };
    let check = |args: &[&str], needle: &str| {
        let out = moro()
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run moro: {e}"));
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    };
    check(&["run", "--no-detect"], "no command to run");
    check(
        &["run", "--recipe", "missing.yaml", "--", "true"],
        "cannot read the recipe `missing.yaml`",
    );
    check(
        &["run", "--no-detect", "--", "cat", "{config}"],
        "uses `{config}` but no trainer format",
    );
    check(
        &["run", "--no-detect", "--to", "nope", "--", "true"],
        "--to: unknown format `nope`",
    );
    check(&["run", "--memory", "lots", "--", "true"], "--memory");
    let wrong_model = RECIPE.replace("Qwen/Qwen2.5-0.5B", "no-such/model-xyz");
    fs::write(case.path("other.yaml"), wrong_model).unwrap_or_else(|e| panic!("{e}"));
    check(
        &["run", "--no-detect", "--recipe", "other.yaml", "--", "true"],
        "field `model.base`",
    );
}

/// The README's `moro run` transcript is what the binary prints: its recipe, run as the
/// README shows it (two out-of-memory starts in a 24 GiB budget), gives the README's `moro:`
/// lines, the config directory aside (the README's is `/tmp/demo-config`).
#[test]
fn readme_heal_transcript_is_true() {
    let readme = include_str!("../../../README.md");
    let start = readme
        .find("$ cat moro.yaml\n")
        .expect("the transcript is in the README");
    let block = &readme[start..start + readme[start..].find("\n```").unwrap()];
    let recipe: String = block
        .lines()
        .skip(1)
        .take_while(|l| !l.starts_with('$'))
        .map(|l| format!("{l}\n"))
        .collect();
    let case = Case::new(&recipe);
    let out = case.run(
        &[
            "--memory",
            "24GiB",
            "--output-dir",
            "out",
            "--resume-flag",
            "hf",
        ],
        &[("FAKE_OOM_STARTS", "2"), ("FAKE_BUDGET_MIB", "24576")],
    );
    let config = case.path("config");
    let printed = stderr(&out).replace(&*config.to_string_lossy(), "/tmp/demo-config");
    let moro_lines = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.starts_with("moro: "))
            .map(str::to_owned)
            .collect()
    };
    let shown = moro_lines(block);
    assert!(shown.len() >= 8, "{block}");
    assert_eq!(shown, moro_lines(&printed));
}
