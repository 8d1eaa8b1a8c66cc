//! `moro run` end to end, with a trainer stand-in (crates/moro/tests/fixtures/fake_trainer.py, python3).
//!
//! The recipe stand-in is the job as JSON; the estimator mirrors the stand-in's memory model.

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use moro_core::job::{Job, Method, Optimizer, Quantization};
use moro_supervise::journal::{read_correction, read_journal};
use moro_supervise::{End, Error, HookError, Hooks, ResumeFlag, RunOptions, RunReport, run};
use rustix::process::{Pid, test_kill_process, test_kill_process_group};
use serde_json::Value;

const MIB: u64 = 1 << 20;

/// The fixture's memory model, in bytes.
fn need(j: &Job) -> u64 {
    let weights = if j.quantization.is_bnb4() || j.quantization == Quantization::Gptq4 {
        1200
    } else {
        4000
    };
    let opt = if j.optimizer == Optimizer::PagedAdamw8bit {
        500
    } else {
        2000
    };
    let act =
        j.micro_batch_size * j.seq_len / 1024 * if j.gradient_checkpointing { 64 } else { 256 };
    let rank = if j.method.is_peft() {
        j.adapter.rank
    } else {
        0
    };
    (weights + opt + act + 4 * rank) * MIB
}

fn exact(j: &Job) -> Option<u64> {
    Some(need(j))
}

fn unknown(_: &Job) -> Option<u64> {
    None
}

fn render_json(j: &Job) -> Result<Vec<u8>, HookError> {
    Ok(serde_json::to_vec_pretty(j)?)
}

fn job(mb: u64) -> Job {
    Job {
        method: Method::Adapters,
        quantization: Quantization::None,
        micro_batch_size: mb,
        grad_accum: 1,
        seq_len: 1024,
        optimizer: Optimizer::AdamwTorchFused,
        gradient_checkpointing: false,
        ..Job::default()
    }
}

/// The trainer stand-in the `moro` CLI tests use too (it reads the job as JSON here).
fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../moro/tests/fixtures/fake_trainer.py")
}

struct Case {
    dir: tempfile::TempDir,
    recipe: PathBuf,
    recipe_bytes: Vec<u8>,
    log: PathBuf,
    out: PathBuf,
}

impl Case {
    fn new(job: &Job) -> Self {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let recipe = dir.path().join("moro.yaml");
        // The user's recipe, with a comment only a human would write: it must survive.
        let mut recipe_bytes = serde_json::to_vec_pretty(job).unwrap_or_default();
        recipe_bytes.extend_from_slice(b"\n");
        fs::write(&recipe, &recipe_bytes).unwrap_or_else(|e| panic!("write recipe: {e}"));
        let log = dir.path().join("starts.jsonl");
        let out = dir.path().join("out");
        Self {
            dir,
            recipe,
            recipe_bytes,
            log,
            out,
        }
    }

    fn options(
        &self,
        job: Job,
        budget_mib: u64,
        max_heals: u32,
        env: &[(&str, &str)],
    ) -> RunOptions {
        let command: Vec<OsString> = vec![
            "python3".into(),
            fixture().into(),
            "--recipe".into(),
            "{recipe}".into(),
            "--output_dir".into(),
            self.out.clone().into(),
        ];
        let mut o = RunOptions::new(command, self.recipe.clone(), job);
        o.budget = Some(budget_mib * MIB);
        o.max_heals = max_heals;
        o.resume = ResumeFlag::HfTrainer;
        o.output_dir = Some(self.out.clone());
        o.correction = Some(self.dir.path().join("machine/correction.json"));
        o.forward_signals = false;
        o.grace = Duration::from_secs(5);
        o.env = vec![
            ("FAKE_BUDGET_MIB".into(), budget_mib.to_string().into()),
            ("FAKE_LOG".into(), self.log.clone().into()),
        ];
        o.env.extend(
            env.iter()
                .map(|(k, v)| (OsString::from(k), OsString::from(v))),
        );
        o
    }

    fn starts(&self) -> Vec<Value> {
        fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad log line {l}: {e}")))
            .collect()
    }

    fn assert_user_recipe_unchanged(&self) {
        assert_eq!(
            fs::read(&self.recipe).unwrap_or_default(),
            self.recipe_bytes
        );
    }

    fn healed(&self) -> Job {
        let bytes = fs::read(self.dir.path().join("moro.healed.yaml"))
            .unwrap_or_else(|e| panic!("healed recipe: {e}"));
        serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("healed recipe: {e}"))
    }

    fn journal(&self) -> PathBuf {
        self.dir.path().join(".moro/heal.jsonl")
    }
}

struct Output {
    report: RunReport,
    stdout: Vec<u8>,
    stderr: String,
    raw_stderr: Vec<u8>,
}

fn go(opts: RunOptions, estimate: &dyn Fn(&Job) -> Option<u64>) -> Output {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let hooks = Hooks {
        estimate,
        render_recipe: &render_json,
        render_config: Some(&render_json),
        stdout: &mut out,
        stderr: &mut err,
    };
    let report = run(opts, hooks).unwrap_or_else(|e| panic!("run: {e}"));
    let stderr = String::from_utf8_lossy(&err).into_owned();
    Output {
        report,
        stdout: out,
        stderr,
        raw_stderr: err,
    }
}

fn resumed(start: &Value) -> u64 {
    start["resumed_from_step"].as_u64().unwrap_or(u64::MAX)
}

fn assert_groups_gone(report: &RunReport) {
    for &pgid in &report.pgids {
        let pid = Pid::from_raw(i32::try_from(pgid).unwrap_or(1)).unwrap_or(Pid::INIT);
        assert!(
            test_kill_process_group(pid).is_err(),
            "process group {pgid} still exists"
        );
    }
}

#[test]
fn recovers_after_one_heal_and_resumes_from_the_checkpoint() {
    // mb 8 needs 8112 MiB, mb 4 7088 MiB: one heal with an exact estimator.
    let c = Case::new(&job(8));
    let o = go(c.options(job(8), 7200, 5, &[]), &exact);
    assert_eq!(o.report.exit_code, 0, "{}", o.stderr);
    assert_eq!(o.report.end, End::Succeeded);
    assert_eq!(o.report.heals.len(), 1);
    assert_eq!(
        o.report.summary,
        format!(
            "moro: run succeeded after 1 heal (micro_batch 8→4); healed recipe: {}",
            c.dir.path().join("moro.healed.yaml").display()
        )
    );
    assert!(
        o.stderr.ends_with(&format!("{}\n", o.report.summary)),
        "{}",
        o.stderr
    );
    assert!(
        o.stderr
            .contains("moro: out of memory (CUDA): torch.OutOfMemoryError: CUDA out of memory.")
    );
    assert!(o.stderr.contains(
        "moro: heal 1 of at most 5 (level 1): micro_batch_size 8→4, gradient_accumulation_steps 1→2 (effective batch 8 kept)"
    ));
    let healed = c.healed();
    assert_eq!((healed.micro_batch_size, healed.grad_accum), (4, 2));
    assert_eq!(o.report.job, healed);
    c.assert_user_recipe_unchanged();

    let starts = c.starts();
    assert_eq!(starts.len(), 2);
    assert_eq!(resumed(&starts[0]), 0);
    // The first attempt saved checkpoint-2 and ran out of memory at step 3.
    assert_eq!(resumed(&starts[1]), 2);
    let ckpt = c.out.join("checkpoint-2");
    assert_eq!(starts[1]["argv"][4], "--resume_from_checkpoint");
    assert_eq!(starts[1]["argv"][5], ckpt.to_string_lossy().as_ref());
    assert!(
        o.stderr
            .contains(&format!("restarting from `{}`", ckpt.display()))
    );
    // {recipe} and MORO_RECIPE point at the user's recipe first, then at the healed one.
    assert_eq!(starts[0]["recipe"], c.recipe.to_string_lossy().as_ref());
    assert_eq!(starts[0]["env_recipe"], c.recipe.to_string_lossy().as_ref());
    let healed_path = c.dir.path().join("moro.healed.yaml");
    assert_eq!(starts[1]["recipe"], healed_path.to_string_lossy().as_ref());
    assert_eq!(
        starts[1]["env_recipe"],
        healed_path.to_string_lossy().as_ref()
    );
    assert!(String::from_utf8_lossy(&o.stdout).contains("training done"));
    assert_groups_gone(&o.report);
}

#[test]
fn recovers_after_two_heals() {
    // Without predictions the ladder goes one step at a time: 8→4 (7088 MiB) still fails,
    // 4→2 (6576 MiB) fits 6700.
    let c = Case::new(&job(8));
    let o = go(c.options(job(8), 6700, 5, &[]), &unknown);
    assert_eq!(o.report.exit_code, 0, "{}", o.stderr);
    assert_eq!(o.report.heals.len(), 2);
    assert!(
        o.report
            .summary
            .starts_with("moro: run succeeded after 2 heals (micro_batch 8→4, micro_batch 4→2)"),
        "{}",
        o.report.summary
    );
    let healed = c.healed();
    assert_eq!((healed.micro_batch_size, healed.grad_accum), (2, 4));
    let starts = c.starts();
    assert_eq!(starts.len(), 3);
    assert_eq!(
        starts.iter().map(resumed).collect::<Vec<_>>(),
        vec![0, 2, 2]
    );
    c.assert_user_recipe_unchanged();
}

#[test]
fn recovers_after_five_heals_through_every_level() {
    // mb 4 → 2 → 1 → checkpointing → paged 8-bit AdamW → NF4: only the last fits 2000 MiB.
    let c = Case::new(&job(4));
    let o = go(c.options(job(4), 2000, 5, &[]), &unknown);
    assert_eq!(o.report.exit_code, 0, "{}", o.stderr);
    assert_eq!(o.report.heals.len(), 5);
    assert!(
        o.report.summary.starts_with(
            "moro: run succeeded after 5 heals (micro_batch 4→2, micro_batch 2→1, gradient checkpointing on, \
             optimizer paged_adamw_8bit, base model in 4-bit NF4 (QLoRA))"
        ),
        "{}",
        o.report.summary
    );
    let levels: Vec<u8> = o.report.heals.iter().map(|h| h.level).collect();
    assert_eq!(levels, vec![1, 1, 2, 3, 4]);
    let healed = c.healed();
    assert_eq!(healed.method, Method::QuantizedAdapters);
    assert_eq!(healed.quantization, Quantization::Nf4Dq);
    assert_eq!(healed.optimizer, Optimizer::PagedAdamw8bit);
    assert!(healed.gradient_checkpointing);
    assert_eq!((healed.micro_batch_size, healed.grad_accum), (1, 4));
    // Checkpoints from before the optimizer change are not resumed; the attempt after it
    // starts afresh, and the one after NF4 (LoRA → QLoRA keeps the adapters) resumes again.
    let starts = c.starts();
    assert_eq!(
        starts.iter().map(resumed).collect::<Vec<_>>(),
        vec![0, 2, 2, 2, 0, 2]
    );
    assert!(o.stderr.contains(
        "restarting from the start (checkpoints from before this change cannot be resumed)"
    ));
    c.assert_user_recipe_unchanged();
    assert_groups_gone(&o.report);
}

#[test]
fn a_failure_that_is_not_out_of_memory_is_not_healed() {
    let c = Case::new(&job(8));
    let o = go(c.options(job(8), 7200, 5, &[("FAKE_FAIL", "1")]), &exact);
    assert_eq!(o.report.exit_code, 1);
    assert_eq!(o.report.end, End::Failed);
    assert!(o.report.heals.is_empty());
    assert_eq!(
        o.report.summary,
        "moro: run failed (not out-of-memory, exit code 1); no heal attempted"
    );
    assert!(
        o.stderr
            .contains("ValueError: dataset has no column `text`")
    );
    assert_eq!(c.starts().len(), 1);
    assert!(!c.journal().exists());
    assert!(!c.dir.path().join("moro.healed.yaml").exists());
    c.assert_user_recipe_unchanged();
}

#[test]
fn a_run_that_never_fits_stops_at_the_heal_limit() {
    let c = Case::new(&job(8));
    let o = go(
        c.options(job(8), 500, 3, &[("FAKE_OOM_AT_STEP", "1")]),
        &unknown,
    );
    assert_eq!(o.report.exit_code, 1);
    assert_eq!(o.report.heals.len(), 3);
    assert_eq!(
        o.report.end,
        End::GaveUp {
            reason: "reached the limit of 3 heals".to_owned()
        }
    );
    assert!(
        o.report.summary.starts_with(
            "moro: gave up after 3 heals; last error: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate"
        ),
        "{}",
        o.report.summary
    );
    assert_eq!(c.starts().len(), 4);
    c.assert_user_recipe_unchanged();
}

#[test]
fn a_run_that_never_fits_stops_when_the_ladder_is_exhausted() {
    let c = Case::new(&job(8));
    let o = go(
        c.options(job(8), 500, 50, &[("FAKE_OOM_AT_STEP", "1")]),
        &unknown,
    );
    assert_eq!(o.report.exit_code, 1);
    // 8→4→2→1, checkpointing, 8-bit optimizer, NF4, then seq 1024→128 and rank 16→1 (4 steps).
    assert_eq!(o.report.heals.len(), 10);
    assert!(
        o.report.summary.starts_with(
            "moro: gave up after 10 heals: nothing left to change on the heal ladder; last error: torch.OutOfMemoryError"
        ),
        "{}",
        o.report.summary
    );
    let last = c.healed();
    assert_eq!((last.seq_len, last.adapter.rank), (128, 1));
    assert_eq!(c.starts().len(), 11);
}

#[test]
fn auto_heal_off_only_reports() {
    let c = Case::new(&job(8));
    let o = go(
        c.options(job(8), 500, 0, &[("FAKE_OOM_AT_STEP", "1")]),
        &unknown,
    );
    assert_eq!(o.report.exit_code, 1);
    assert!(o.report.summary.starts_with("moro: run ran out of memory and auto-heal is off (max heals 0); last error: torch.OutOfMemoryError"));
    assert_eq!(c.starts().len(), 1);
}

#[test]
fn journal_and_correction_after_an_under_prediction() {
    // The estimator says 1200 MiB less than the run needs: mb 8 is predicted to fit 7000 MiB
    // (6912) but needs 8112. The miss is learnt at once, so mb 4 (predicted 7088 with it) is
    // passed over and mb 2 (6576) is chosen.
    let under = |j: &Job| Some(need(j) - 1200 * MIB);
    let c = Case::new(&job(8));
    let opts = c.options(job(8), 7000, 5, &[]);
    let correction = opts.correction.clone().unwrap_or_default();
    let o = go(opts, &under);
    assert_eq!(o.report.exit_code, 0, "{}", o.stderr);
    assert!(
        o.report
            .summary
            .starts_with("moro: run succeeded after 1 heal (micro_batch 8→2)"),
        "{}",
        o.report.summary
    );
    assert!(o.stderr.contains("this configuration was predicted to fit (6.75 GiB of 6.84 GiB) but ran out of memory; the prediction was at least 1."), "{}", o.stderr);
    assert!(
        o.stderr
            .contains("passed over 1 smaller step predicted not to fit")
    );

    let entries = read_journal(&c.journal()).unwrap_or_else(|e| panic!("journal: {e}"));
    assert_eq!(entries, o.report.heals);
    assert_eq!(entries.len(), 1);
    let e = &entries[0];
    assert_eq!(e.time.len(), 20, "{}", e.time);
    assert!(
        e.time.ends_with('Z') && e.time.as_bytes()[10] == b'T',
        "{}",
        e.time
    );
    assert_eq!(e.heal, 1);
    assert_eq!(e.level, 1);
    assert_eq!(
        e.change,
        "micro_batch_size 8→2, gradient_accumulation_steps 1→4 (effective batch 8 kept)"
    );
    assert_eq!(e.predicted_before_bytes, Some(6912 * MIB));
    // The healed prediction includes the learnt miss (≈ 1200 MiB: PyTorch prints 2 decimals).
    let miss = e
        .prediction_miss_bytes
        .unwrap_or_else(|| panic!("no miss recorded"));
    assert!(miss.abs_diff(1200 * MIB) < 16 * MIB, "miss {miss}");
    assert_eq!(
        e.predicted_after_bytes,
        Some(6576 * MIB - 1200 * MIB + miss)
    );
    assert_eq!(e.budget_bytes, Some(7000 * MIB));
    assert_eq!(e.fit, "predicted");
    assert!(
        e.oom_text
            .starts_with("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate ")
    );
    assert_eq!(e.recipe, c.dir.path().join("moro.healed.yaml"));
    assert_eq!(e.resume_from, Some(c.out.join("checkpoint-2")));
    // One JSON object per line, with the documented keys.
    let line = fs::read_to_string(c.journal()).unwrap_or_default();
    let v: Value = serde_json::from_str(line.trim()).unwrap_or(Value::Null);
    for key in [
        "time",
        "level",
        "change",
        "predicted_before_bytes",
        "predicted_after_bytes",
        "oom_text",
        "prediction_miss_bytes",
    ] {
        assert!(v.get(key).is_some(), "journal lacks `{key}`: {line}");
    }

    let corr = read_correction(&correction)
        .ok()
        .flatten()
        .unwrap_or_else(|| panic!("no correction file"));
    assert_eq!(corr.max_under_prediction_bytes, miss);
    assert_eq!(corr.observations, 1);

    // A later run on this machine starts with the correction: mb 8 is no longer predicted to
    // fit, so no new miss is recorded.
    let c2 = Case::new(&job(8));
    let mut opts = c2.options(job(8), 7000, 5, &[]);
    opts.correction = Some(correction.clone());
    let o2 = go(opts, &under);
    assert_eq!(o2.report.exit_code, 0, "{}", o2.stderr);
    assert!(!o2.stderr.contains("predicted to fit"));
    assert_eq!(o2.report.heals[0].prediction_miss_bytes, None);
    let corr2 = read_correction(&correction)
        .ok()
        .flatten()
        .unwrap_or_else(|| panic!("no correction file"));
    assert_eq!(corr2.observations, 1);
}

#[test]
fn progress_bars_pass_through_byte_for_byte() {
    let c = Case::new(&job(1));
    let o = go(c.options(job(1), 100_000, 5, &[]), &exact);
    assert_eq!(o.report.exit_code, 0, "{}", o.stderr);
    let expected: &[u8] = b"\r 16%|#         | 1/6\r 33%|###       | 2/6\r 50%|#####     | 3/6\r 66%|######    | 4/6\r 83%|########  | 5/6\r100%|##########| 6/6\n";
    assert!(
        o.raw_stderr.windows(expected.len()).any(|w| w == expected),
        "{:?}",
        String::from_utf8_lossy(&o.raw_stderr)
    );
    assert_eq!(o.report.summary, "moro: run succeeded");
    assert_eq!(
        o.stdout,
        b"fake trainer: need 6320 MiB, budget 100000 MiB, from step 0\ntraining done\n"
    );
}

#[test]
fn config_placeholder_and_env() {
    let c = Case::new(&job(8));
    let config = c.dir.path().join(".moro/trainer.json");
    let mut opts = c.options(job(8), 7200, 5, &[]);
    opts.command = vec![
        "python3".into(),
        fixture().into(),
        "--recipe={config}".into(),
        "--output_dir".into(),
        c.out.clone().into(),
    ];
    opts.config = Some(config.clone());
    let o = go(opts, &exact);
    assert_eq!(o.report.exit_code, 0, "{}", o.stderr);
    let starts = c.starts();
    let healed_config = c.dir.path().join(".moro/trainer.healed.json");
    assert_eq!(starts[0]["recipe"], config.to_string_lossy().as_ref());
    assert_eq!(starts[0]["env_config"], config.to_string_lossy().as_ref());
    assert_eq!(
        starts[1]["recipe"],
        healed_config.to_string_lossy().as_ref()
    );
    assert_eq!(
        starts[1]["env_config"],
        healed_config.to_string_lossy().as_ref()
    );
    assert_eq!(starts[1]["job"]["micro_batch_size"], 4);
    c.assert_user_recipe_unchanged();
}

fn try_run(opts: RunOptions) -> Result<RunReport, Error> {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let hooks = Hooks {
        estimate: &exact,
        render_recipe: &render_json,
        render_config: None,
        stdout: &mut out,
        stderr: &mut err,
    };
    run(opts, hooks)
}

#[test]
fn start_errors() {
    let c = Case::new(&job(1));
    let mut opts = c.options(job(1), 1000, 5, &[]);
    opts.command = vec!["/nonexistent/trainer".into()];
    let r = try_run(opts);
    assert!(matches!(r, Err(Error::Spawn { .. })), "{r:?}");
    let mut opts = c.options(job(1), 1000, 5, &[]);
    opts.command = vec!["echo".into(), "{config}".into()];
    assert_eq!(
        try_run(opts).err().map(|e| e.to_string()).as_deref(),
        Some("the command uses `{config}` but no trainer format was chosen; pass `--to FORMAT`")
    );
    let mut opts = c.options(job(1), 1000, 5, &[]);
    opts.command.clear();
    assert!(matches!(try_run(opts), Err(Error::NoCommand)));
}

// --- Signals -------------------------------------------------------------------------------
//
// A signal sent to the test process would reach every test, so these tests run the supervisor
// in a copy of this test binary (`supervisor_role`, started with MORO_TEST_ROLE set) in its
// own process group, and signal that group as a terminal would signal its foreground group.

const ROLE: &str = "MORO_SUPERVISE_TEST_ROLE";

#[test]
fn supervisor_role() {
    let Some(dir) = std::env::var_os(ROLE) else {
        return;
    };
    let dir = PathBuf::from(dir);
    let j = job(8);
    let c = Case {
        recipe: dir.join("moro.yaml"),
        recipe_bytes: Vec::new(),
        log: dir.join("starts.jsonl"),
        out: dir.join("out"),
        dir: tempfile::tempdir().unwrap_or_else(|e| panic!("{e}")),
    };
    fs::write(&c.recipe, serde_json::to_vec(&j).unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}"));
    // Would run out of memory at step 50 (and be healed) if it were not interrupted first.
    let extra = std::env::var("MORO_TEST_EXTRA").unwrap_or_default();
    let mut env = vec![
        ("FAKE_STEPS", "100"),
        ("FAKE_OOM_AT_STEP", "50"),
        ("FAKE_STEP_SLEEP", "0.1"),
        ("FAKE_WORKER", "1"),
    ];
    if !extra.is_empty() {
        env.push((extra.as_str(), "1"));
    }
    let mut opts = c.options(j, 7200, 5, &env);
    opts.forward_signals = true;
    opts.journal = dir.join(".moro/heal.jsonl");
    let mut out = std::io::stdout();
    let mut err = std::io::stderr();
    let hooks = Hooks {
        estimate: &exact,
        render_recipe: &render_json,
        render_config: None,
        stdout: &mut out,
        stderr: &mut err,
    };
    let code = match run(opts, hooks) {
        Ok(r) => r.exit_code,
        Err(e) => {
            eprintln!("error: {e}");
            2
        }
    };
    std::process::exit(code);
}

struct Interrupted {
    code: i32,
    stderr: String,
    starts: Vec<Value>,
    journal_written: bool,
}

fn interrupt_case(signal: rustix::process::Signal, extra: &str) -> Interrupted {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("{e}"));
    let mut child = Command::new(exe)
        .args([
            "--exact",
            "supervisor_role",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE, dir.path())
        .env("MORO_TEST_EXTRA", extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("spawn: {e}"));
    let log = dir.path().join("starts.jsonl");
    let t0 = Instant::now();
    while fs::read_to_string(&log).unwrap_or_default().is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the trainer never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    let pid = Pid::from_child(&child);
    rustix::process::kill_process_group(pid, signal).unwrap_or_else(|e| panic!("kill: {e}"));
    let t1 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap_or_else(|e| panic!("{e}")) {
            break s;
        }
        if t1.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("moro did not exit after the signal");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut stderr);
    }
    // Give the exit a moment to be observed (the trainer group was cleaned up before moro
    // exited; this only guards against a slow reaper).
    std::thread::sleep(Duration::from_millis(100));
    let starts: Vec<Value> = fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let journal_written = dir.path().join(".moro/heal.jsonl").exists();
    Interrupted {
        code: status.code().unwrap_or(-1),
        stderr,
        starts,
        journal_written,
    }
}

fn assert_trainer_gone(start: &Value) {
    let pgid = start["pgid"]
        .as_i64()
        .and_then(|p| i32::try_from(p).ok())
        .and_then(Pid::from_raw);
    let pid = start["pid"]
        .as_i64()
        .and_then(|p| i32::try_from(p).ok())
        .and_then(Pid::from_raw);
    let worker = start["worker_pid"]
        .as_i64()
        .and_then(|p| i32::try_from(p).ok())
        .and_then(Pid::from_raw);
    let (Some(pgid), Some(pid), Some(worker)) = (pgid, pid, worker) else {
        panic!("bad start record {start}")
    };
    // The trainer leads its own group, apart from moro's.
    assert_eq!(pgid, pid);
    assert!(
        test_kill_process_group(pgid).is_err(),
        "the trainer's process group is still there"
    );
    assert!(
        test_kill_process(worker).is_err(),
        "the worker is still there"
    );
}

#[test]
fn sigint_is_forwarded_to_the_group_and_never_restarts() {
    let Interrupted {
        code,
        stderr,
        starts,
        journal_written,
    } = interrupt_case(rustix::process::Signal::INT, "");
    assert_eq!(starts.len(), 1, "{stderr}");
    // Python dies of SIGINT after its KeyboardInterrupt; moro exits 128 + 2.
    assert_eq!(code, 130, "{stderr}");
    assert!(stderr.contains("KeyboardInterrupt"), "{stderr}");
    assert!(
        stderr.contains("moro: run interrupted by SIGINT; not restarted"),
        "{stderr}"
    );
    assert!(!journal_written);
    assert_trainer_gone(&starts[0]);
}

#[test]
fn sigterm_is_forwarded_and_an_oom_in_the_last_words_does_not_restart() {
    let Interrupted {
        code,
        stderr,
        starts,
        journal_written,
    } = interrupt_case(rustix::process::Signal::TERM, "FAKE_OOM_ON_TERM");
    assert_eq!(starts.len(), 1, "{stderr}");
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("torch.OutOfMemoryError: CUDA out of memory."),
        "{stderr}"
    );
    assert!(
        stderr.contains("moro: run interrupted by SIGTERM; not restarted"),
        "{stderr}"
    );
    assert!(!journal_written);
    assert_trainer_gone(&starts[0]);
}
