//! The supervisor: run the training command, heal it on out-of-memory, restart, report.
//!
//! [`run`] owns the loop; the I/O of one attempt lives in `process`, the decisions in the
//! pure [`classify`](crate::classify) and [`ladder`](crate::ladder) modules, and everything
//! format-specific (estimating, writing moro.yaml, exporting the trainer's config) comes in
//! through [`Hooks`], so this crate depends on neither the estimator nor the recipe crate.
//!
//! Files: the user's recipe is never written. Each heal writes the healed recipe to
//! `moro.healed.yaml` beside it (see [`healed_recipe_path`]) and, when a trainer config is in
//! use, the healed config to `<name>.healed.<ext>` beside that; both atomically. Heals are
//! appended to the journal and printed on stderr; an out-of-memory failure at a configuration
//! predicted to fit is recorded in the correction file.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use moro_core::job::Job;
use moro_core::units::human;

use crate::classify::{Oom, Outcome, classify};
use crate::journal::{self, JournalEntry};
use crate::ladder::{Fit, Heal, LadderContext, next_heal};
use crate::process::{Forwarder, run_attempt};

/// An error from a hook (rendering a recipe or config).
pub type HookError = Box<dyn std::error::Error + Send + Sync>;

/// Environment variable holding the recipe path of the current attempt.
pub const ENV_RECIPE: &str = "MORO_RECIPE";
/// Environment variable holding the trainer config path of the current attempt.
pub const ENV_CONFIG: &str = "MORO_CONFIG";

/// How the trainer is told to resume from a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResumeFlag {
    /// Never resume.
    None,
    /// HF Trainer scripts and TRL (`trl sft`): `--resume_from_checkpoint <dir>`.
    HfTrainer,
    /// axolotl (`axolotl train cfg.yml`): `--resume_from_checkpoint=<dir>`.
    Axolotl,
    /// LLaMA-Factory (`llamafactory-cli train cfg.yaml`): `resume_from_checkpoint=<dir>`.
    LlamaFactory,
}

impl ResumeFlag {
    /// The arguments that resume from `checkpoint`.
    #[must_use]
    pub fn args(self, checkpoint: &Path) -> Vec<OsString> {
        let with = |prefix: &str| {
            let mut s = OsString::from(prefix);
            s.push(checkpoint.as_os_str());
            s
        };
        match self {
            Self::None => Vec::new(),
            Self::HfTrainer => {
                vec![
                    "--resume_from_checkpoint".into(),
                    checkpoint.as_os_str().to_owned(),
                ]
            }
            Self::Axolotl => vec![with("--resume_from_checkpoint=")],
            Self::LlamaFactory => vec![with("resume_from_checkpoint=")],
        }
    }
}

/// The newest complete HF-Trainer-style checkpoint (`checkpoint-N` holding a
/// `trainer_state.json`, largest N) in `output_dir`, ignoring those last modified before
/// `not_before`.
#[must_use]
pub fn newest_checkpoint(output_dir: &Path, not_before: Option<SystemTime>) -> Option<PathBuf> {
    let mut best: Option<(u64, PathBuf)> = None;
    for entry in fs::read_dir(output_dir).ok()?.filter_map(Result::ok) {
        let name = entry.file_name();
        let Some(step) = name.to_str().and_then(|n| n.strip_prefix("checkpoint-")) else {
            continue;
        };
        let Ok(step) = step.parse::<u64>() else {
            continue;
        };
        let path = entry.path();
        let Ok(state) = fs::metadata(path.join("trainer_state.json")) else {
            continue;
        };
        if let Some(t) = not_before
            && state.modified().is_ok_and(|m| m < t)
        {
            continue;
        }
        if best.as_ref().is_none_or(|(s, _)| step > *s) {
            best = Some((step, path));
        }
    }
    best.map(|(_, p)| p)
}

/// Where the healed recipe goes: `moro.healed.yaml` beside the user's recipe, or
/// `<stem>.healed.<ext>` when the user's recipe is itself called `moro.healed.yaml`.
#[must_use]
pub fn healed_recipe_path(recipe: &Path) -> PathBuf {
    let dir = recipe.parent().unwrap_or(Path::new(""));
    if recipe.file_name().is_some_and(|n| n == "moro.healed.yaml") {
        healed_sibling(recipe)
    } else {
        dir.join("moro.healed.yaml")
    }
}

/// `dir/name.ext` → `dir/name.healed.ext`.
#[must_use]
pub fn healed_sibling(path: &Path) -> PathBuf {
    let stem = path.file_stem().map(OsString::from).unwrap_or_default();
    let mut name = stem;
    name.push(".healed");
    if let Some(ext) = path.extension() {
        name.push(".");
        name.push(ext);
    }
    path.with_file_name(name)
}

/// What to run and how.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Program and arguments. `{recipe}` and `{config}` are replaced in every argument.
    pub command: Vec<OsString>,
    /// The user's recipe (moro.yaml). Never written.
    pub recipe: PathBuf,
    /// The job the recipe describes.
    pub job: Job,
    /// Where the exported trainer config of the first attempt is written (`{config}`,
    /// `MORO_CONFIG`); healed ones go to `<name>.healed.<ext>` beside it. The caller picks a
    /// path moro owns: it is overwritten.
    pub config: Option<PathBuf>,
    /// How to resume after a heal.
    pub resume: ResumeFlag,
    /// The trainer's output directory, where `checkpoint-N` directories appear.
    pub output_dir: Option<PathBuf>,
    /// Device bytes available to the run, when known.
    pub budget: Option<u64>,
    /// The dataset's p99 sample length in tokens, when known (ladder level 5).
    pub dataset_p99: Option<u64>,
    /// Lengths at the dataset's lower percentiles (p95, p90), where known (ladder level 5).
    pub dataset_shorter: Vec<u64>,
    /// Most heals before giving up (0: detect and report only).
    pub max_heals: u32,
    /// The heal journal (default `.moro/heal.jsonl` beside the recipe).
    pub journal: PathBuf,
    /// The per-machine correction file, when one is kept.
    pub correction: Option<PathBuf>,
    /// Extra environment for the child.
    pub env: Vec<(OsString, OsString)>,
    /// After a forwarded signal, how long the child gets before its group is killed.
    pub grace: Duration,
    /// Catch and forward SIGINT/SIGTERM/SIGHUP/SIGQUIT (the CLI sets this; see `process`).
    pub forward_signals: bool,
    /// Whether the job takes Liger's kernels, so the ladder may turn them on
    /// ([`crate::ladder::LadderContext::liger`]).
    pub liger_heal: bool,
}

impl RunOptions {
    /// Options with defaults: 5 heals, the journal beside the recipe, no config, no resume,
    /// 30 s grace, signals forwarded.
    #[must_use]
    pub fn new(command: Vec<OsString>, recipe: PathBuf, job: Job) -> Self {
        let journal = recipe
            .parent()
            .unwrap_or(Path::new(""))
            .join(".moro")
            .join("heal.jsonl");
        Self {
            command,
            recipe,
            job,
            config: None,
            resume: ResumeFlag::None,
            output_dir: None,
            budget: None,
            dataset_p99: None,
            dataset_shorter: Vec::new(),
            max_heals: 5,
            journal,
            correction: None,
            env: Vec::new(),
            grace: Duration::from_secs(30),
            forward_signals: true,
            liger_heal: false,
        }
    }
}

/// Renders a file for a job.
pub type Render<'a> = &'a dyn Fn(&Job) -> Result<Vec<u8>, HookError>;

/// What the supervisor calls out to.
pub struct Hooks<'a> {
    /// Predicted peak device bytes of a job (`None`: cannot say).
    pub estimate: &'a dyn Fn(&Job) -> Option<u64>,
    /// The moro.yaml bytes for a job (written to the healed recipe path).
    pub render_recipe: Render<'a>,
    /// The trainer config bytes for a job, when [`RunOptions::config`] is set.
    pub render_config: Option<Render<'a>>,
    /// Where the child's stdout goes.
    pub stdout: &'a mut dyn Write,
    /// Where the child's stderr and moro's messages go.
    pub stderr: &'a mut dyn Write,
}

/// How the run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// The last attempt exited 0.
    Succeeded,
    /// Interrupted by a signal; not restarted.
    Interrupted {
        /// The signal number, when known.
        signal: Option<i32>,
    },
    /// A failure that is not out-of-memory; not healed.
    Failed,
    /// Out of memory, and no further heal was made.
    GaveUp {
        /// Why not.
        reason: String,
    },
}

/// The result of a supervised run.
#[derive(Debug, Clone)]
pub struct RunReport {
    /// The child's final exit code (128 + signal when killed; 127 when a restart could not
    /// start the program).
    pub exit_code: i32,
    /// How it ended.
    pub end: End,
    /// The heals made, as journaled.
    pub heals: Vec<JournalEntry>,
    /// The job of the last attempt.
    pub job: Job,
    /// The process group id of each attempt.
    pub pgids: Vec<u32>,
    /// The one-line summary printed last.
    pub summary: String,
}

/// Errors that prevent the run from starting.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No command given.
    #[error("no command to run; give it after `--`, e.g. `moro run -- python train.py {{recipe}}`")]
    NoCommand,
    /// `{config}` used without a config path.
    #[error("the command uses `{{config}}` but no trainer format was chosen; pass `--to FORMAT`")]
    NoConfig,
    /// The program could not be started.
    #[error("cannot start `{program}`: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// Why.
        source: io::Error,
    },
    /// Signal handlers could not be installed.
    #[error("cannot install signal handlers: {0}")]
    Signals(io::Error),
    /// A file could not be written.
    #[error("cannot write `{}`: {message}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
}

fn substitute(arg: &OsString, recipe: &Path, config: Option<&Path>) -> OsString {
    let Some(s) = arg.to_str() else {
        return arg.clone();
    };
    if !s.contains("{recipe}") && !s.contains("{config}") {
        return arg.clone();
    }
    let r = recipe.to_string_lossy();
    let c = config.map(|c| c.to_string_lossy()).unwrap_or_default();
    OsString::from(s.replace("{recipe}", &r).replace("{config}", &c))
}

fn say(w: &mut dyn Write, msg: &str) {
    // moro's own messages: a broken stderr must not stop the run.
    let _ = writeln!(w, "moro: {msg}");
    let _ = w.flush();
}

fn short_text(s: &str) -> String {
    const MAX: usize = 200;
    if s.len() <= MAX {
        return s.to_owned();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

fn signal_name(sig: Option<i32>) -> String {
    match sig {
        Some(1) => "SIGHUP".to_owned(),
        Some(2) => "SIGINT".to_owned(),
        Some(3) => "SIGQUIT".to_owned(),
        Some(15) => "SIGTERM".to_owned(),
        Some(n) => format!("signal {n}"),
        None => "a signal".to_owned(),
    }
}

fn render_to(render: Render<'_>, job: &Job, path: &Path) -> Result<(), Error> {
    let fail = |message: String| Error::Write {
        path: path.to_owned(),
        message,
    };
    let bytes = render(job).map_err(|e| fail(e.to_string()))?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir).map_err(|e| fail(e.to_string()))?;
    }
    journal::write_atomic(path, &bytes).map_err(|e| fail(e.to_string()))
}

/// Runs the command, healing out-of-memory failures, and returns how it ended.
///
/// Prints the child's output live, each heal, and a final one-line summary (also in the
/// report). The caller exits with [`RunReport::exit_code`].
///
/// # Errors
/// Only when the first attempt cannot start: no command, `{config}` without a config path,
/// the trainer config cannot be written, the program cannot be spawned, or signal handlers
/// cannot be installed. Later failures end the run with a report instead.
pub fn run(opts: RunOptions, hooks: Hooks<'_>) -> Result<RunReport, Error> {
    let Hooks {
        estimate,
        render_recipe,
        render_config,
        stdout,
        stderr,
    } = hooks;
    if opts.command.is_empty() {
        return Err(Error::NoCommand);
    }
    let uses_config = opts
        .command
        .iter()
        .any(|a| a.to_str().is_some_and(|s| s.contains("{config}")));
    if uses_config && opts.config.is_none() {
        return Err(Error::NoConfig);
    }
    if let (Some(path), Some(render)) = (&opts.config, render_config) {
        render_to(render, &opts.job, path)?;
    }
    let mut margin = 0;
    if let Some(path) = &opts.correction {
        match journal::read_correction(path) {
            Ok(Some(c)) => margin = c.max_under_prediction_bytes,
            Ok(None) => {}
            Err(e) => say(
                stderr,
                &format!(
                    "warning: ignoring unreadable correction file `{}`: {e}",
                    path.display()
                ),
            ),
        }
    }
    let fwd = Forwarder::install(opts.forward_signals).map_err(Error::Signals)?;

    let healed_recipe = healed_recipe_path(&opts.recipe);
    let healed_config = opts.config.as_deref().map(healed_sibling);
    let mut job = opts.job.clone();
    let mut recipe_path = opts.recipe.clone();
    let mut config_path = opts.config.clone();
    let mut heals: Vec<JournalEntry> = Vec::new();
    let mut shorts: Vec<String> = Vec::new();
    let mut pgids = Vec::new();
    let mut resume_args: Vec<OsString> = Vec::new();
    let mut resume_not_before: Option<SystemTime> = None;

    let finish = |stderr: &mut dyn Write,
                  exit_code: i32,
                  end: End,
                  summary: String,
                  heals: Vec<JournalEntry>,
                  job: Job,
                  pgids: Vec<u32>| {
        say(stderr, &summary);
        RunReport {
            exit_code,
            end,
            heals,
            job,
            pgids,
            summary: format!("moro: {summary}"),
        }
    };
    // The ladder has no step left, or the healed recipe cannot be written.
    let give_up = |stderr: &mut dyn Write,
                   exit_code: i32,
                   reason: String,
                   last_error: &str,
                   heals: Vec<JournalEntry>,
                   job: Job,
                   pgids: Vec<u32>| {
        let summary = format!(
            "gave up after {} heal{}: {reason}; last error: {last_error}",
            heals.len(),
            plural(heals.len())
        );
        finish(
            stderr,
            exit_code,
            End::GaveUp { reason },
            summary,
            heals,
            job,
            pgids,
        )
    };

    loop {
        let mut argv: Vec<OsString> = opts
            .command
            .iter()
            .map(|a| substitute(a, &recipe_path, config_path.as_deref()))
            .collect();
        argv.extend(resume_args.iter().cloned());
        let mut env = opts.env.clone();
        env.push((ENV_RECIPE.into(), recipe_path.clone().into_os_string()));
        if let Some(c) = &config_path {
            env.push((ENV_CONFIG.into(), c.clone().into_os_string()));
        }
        let attempt = match run_attempt(&argv, &env, &fwd, opts.grace, stdout, stderr) {
            Ok(Some(a)) => a,
            Ok(None) => {
                let sig = fwd.interrupted();
                let summary = format!(
                    "interrupted by {} before a restart; not restarted",
                    signal_name(sig)
                );
                return Ok(finish(
                    stderr,
                    128 + sig.unwrap_or(2),
                    End::Interrupted { signal: sig },
                    summary,
                    heals,
                    job,
                    pgids,
                ));
            }
            Err(e) => {
                let program = argv[0].to_string_lossy().into_owned();
                if heals.is_empty() {
                    return Err(Error::Spawn { program, source: e });
                }
                let reason = format!("cannot start `{program}`: {e}");
                let summary = format!(
                    "gave up after {} heal{}: {reason}",
                    heals.len(),
                    plural(heals.len())
                );
                return Ok(finish(
                    stderr,
                    127,
                    End::GaveUp { reason },
                    summary,
                    heals,
                    job,
                    pgids,
                ));
            }
        };
        pgids.push(attempt.pgid);
        let code = attempt.exit.shell_code();
        let oom = match classify(attempt.exit, &attempt.tail, attempt.interrupt) {
            Outcome::Success => {
                let summary = if heals.is_empty() {
                    "run succeeded".to_owned()
                } else {
                    format!(
                        "run succeeded after {} heal{} ({}); healed recipe: {}",
                        heals.len(),
                        plural(heals.len()),
                        shorts.join(", "),
                        healed_recipe.display()
                    )
                };
                return Ok(finish(
                    stderr,
                    code,
                    End::Succeeded,
                    summary,
                    heals,
                    job,
                    pgids,
                ));
            }
            Outcome::Interrupted { signal } => {
                let summary = format!("run interrupted by {}; not restarted", signal_name(signal));
                return Ok(finish(
                    stderr,
                    code,
                    End::Interrupted { signal },
                    summary,
                    heals,
                    job,
                    pgids,
                ));
            }
            Outcome::OtherFailure => {
                let summary = if heals.is_empty() {
                    format!("run failed (not out-of-memory, exit code {code}); no heal attempted")
                } else {
                    format!(
                        "run failed (not out-of-memory, exit code {code}) after {} heal{}; not healed further",
                        heals.len(),
                        plural(heals.len())
                    )
                };
                return Ok(finish(
                    stderr,
                    code,
                    End::Failed,
                    summary,
                    heals,
                    job,
                    pgids,
                ));
            }
            Outcome::Oom(oom) => oom,
        };
        say(
            stderr,
            &format!("out of memory ({}): {}", oom.kind, short_text(&oom.text)),
        );

        // Was it predicted to fit? Then say by how much the prediction was off, and keep it.
        let ctx_pred = LadderContext {
            estimate,
            budget: opts.budget,
            margin,
            dataset_p99: opts.dataset_p99,
            dataset_shorter: &opts.dataset_shorter,
            liger: opts.liger_heal,
        };
        let predicted = ctx_pred.predict(&job);
        let miss = prediction_miss(predicted, opts.budget, &oom);
        if let (Some(miss), Some(pred)) = (miss, predicted) {
            let raw_miss = miss.saturating_add(margin);
            margin = margin.max(raw_miss);
            let mut msg = format!(
                "this configuration was predicted to fit ({} of {}) but ran out of memory; the \
                 prediction was at least {} too low",
                human(pred),
                opts.budget.map_or_else(|| "?".to_owned(), human),
                human(miss)
            );
            if let Some(path) = &opts.correction {
                match journal::record_under_prediction(path, raw_miss) {
                    Ok(_) => {
                        let _ = write!(
                            msg,
                            "; recorded in `{}` for later predictions",
                            path.display()
                        );
                    }
                    Err(e) => {
                        let _ = write!(msg, "; could not record it in `{}`: {e}", path.display());
                    }
                }
            }
            say(stderr, &msg);
        }

        let last_error = short_text(&oom.text);
        if heals.len() >= opts.max_heals as usize {
            let (reason, summary) = if opts.max_heals == 0 {
                let r = "auto-heal is off (max heals 0)".to_owned();
                let s = format!("run ran out of memory and {r}; last error: {last_error}");
                (r, s)
            } else {
                let r = format!("reached the limit of {} heals", opts.max_heals);
                let s = format!(
                    "gave up after {} heal{}; last error: {last_error}",
                    heals.len(),
                    plural(heals.len())
                );
                (r, s)
            };
            return Ok(finish(
                stderr,
                code,
                End::GaveUp { reason },
                summary,
                heals,
                job,
                pgids,
            ));
        }
        let ctx = LadderContext {
            estimate,
            budget: opts.budget,
            margin,
            dataset_p99: opts.dataset_p99,
            dataset_shorter: &opts.dataset_shorter,
            liger: opts.liger_heal,
        };
        let heal = match next_heal(&job, &ctx) {
            Ok(h) => h,
            Err(why) => {
                return Ok(give_up(
                    stderr,
                    code,
                    why.to_string(),
                    &last_error,
                    heals,
                    job,
                    pgids,
                ));
            }
        };

        // Write the healed recipe (and config) for the next attempt.
        let written = if same_file(&healed_recipe, &opts.recipe) {
            Err(Error::Write {
                path: healed_recipe.clone(),
                message: "it is the user's recipe; refusing to overwrite it".to_owned(),
            })
        } else {
            render_to(render_recipe, &heal.job, &healed_recipe).and_then(|()| {
                match (&healed_config, render_config) {
                    (Some(path), Some(render)) => render_to(render, &heal.job, path),
                    _ => Ok(()),
                }
            })
        };
        if let Err(e) = written {
            return Ok(give_up(
                stderr,
                code,
                e.to_string(),
                &last_error,
                heals,
                job,
                pgids,
            ));
        }

        if !heal.resume_compatible() {
            resume_not_before = Some(SystemTime::now());
        }
        let checkpoint = match (opts.resume, &opts.output_dir) {
            (ResumeFlag::None, _) | (_, None) => None,
            (_, Some(dir)) => newest_checkpoint(dir, resume_not_before),
        };
        resume_args = checkpoint
            .as_deref()
            .map(|c| opts.resume.args(c))
            .unwrap_or_default();

        let n = heals.len() + 1;
        let entry = JournalEntry {
            time: journal::rfc3339(SystemTime::now()),
            heal: u32::try_from(n).unwrap_or(u32::MAX),
            level: heal.level,
            change: heal.description(),
            predicted_before_bytes: predicted,
            predicted_after_bytes: heal.predicted_after,
            budget_bytes: opts.budget,
            fit: match heal.fit {
                Fit::Predicted => "predicted",
                Fit::Unknown => "unknown",
                Fit::NothingFits => "nothing_fits",
            }
            .to_owned(),
            oom_kind: oom.kind,
            oom_text: oom.text.clone(),
            prediction_miss_bytes: miss,
            recipe: healed_recipe.clone(),
            resume_from: checkpoint.clone(),
        };
        if let Err(e) = journal::append_journal(&opts.journal, &entry) {
            say(
                stderr,
                &format!(
                    "warning: cannot write the journal `{}`: {e}",
                    opts.journal.display()
                ),
            );
        }
        print_heal(
            stderr,
            n,
            opts.max_heals,
            &heal,
            predicted,
            opts.budget,
            &healed_recipe,
            checkpoint.as_deref(),
            opts.output_dir.is_some() && opts.resume != ResumeFlag::None,
        );

        shorts.push(heal.short());
        heals.push(entry);
        job = heal.job;
        recipe_path.clone_from(&healed_recipe);
        if healed_config.is_some() && render_config.is_some() {
            config_path.clone_from(&healed_config);
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn print_heal(
    stderr: &mut dyn Write,
    n: usize,
    max: u32,
    heal: &Heal,
    predicted_before: Option<u64>,
    budget: Option<u64>,
    recipe: &Path,
    checkpoint: Option<&Path>,
    resumable: bool,
) {
    let mut line = format!(
        "heal {n} of at most {max} (level {}): {}",
        heal.level,
        heal.description()
    );
    if let Some(after) = heal.predicted_after {
        let before = predicted_before.map_or_else(|| "?".to_owned(), human);
        let _ = write!(line, "; predicted peak {before} → {}", human(after));
        if let Some(b) = budget {
            let _ = write!(line, " (budget {})", human(b));
        }
    }
    if heal.passed_over > 0 {
        let _ = write!(
            line,
            "; passed over {} smaller step{} predicted not to fit",
            heal.passed_over,
            plural(heal.passed_over)
        );
    }
    say(stderr, &line);
    if heal.fit == Fit::NothingFits {
        say(
            stderr,
            "no step on the ladder is predicted to fit; trying the least harmful one anyway",
        );
    }
    if let Some(w) = &heal.warning {
        say(stderr, &format!("note: {w}"));
    }
    let restart = match checkpoint {
        Some(c) => format!("restarting from `{}`", c.display()),
        None if resumable && !heal.resume_compatible() => {
            "restarting from the start (checkpoints from before this change cannot be resumed)"
                .to_owned()
        }
        None => "restarting from the start".to_owned(),
    };
    say(stderr, &format!("wrote `{}`; {restart}", recipe.display()));
}

/// When the failing job was predicted to fit: a lower bound on the under-prediction.
fn prediction_miss(predicted: Option<u64>, budget: Option<u64>, oom: &Oom) -> Option<u64> {
    let (pred, budget) = (predicted?, budget?);
    if pred > budget {
        return None;
    }
    // The run needed more than the budget (it failed), and at least what the message says.
    let needed = oom.observed_need().unwrap_or(budget).max(budget);
    Some(needed.saturating_sub(pred).max(1))
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (fs::canonicalize(a), fs::canonicalize(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => std::path::absolute(a).ok() == std::path::absolute(b).ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::OomKind;

    #[test]
    fn placeholders() {
        let a = substitute(
            &"--config={config}".into(),
            Path::new("r.yaml"),
            Some(Path::new("c.yml")),
        );
        assert_eq!(a, "--config=c.yml");
        let a = substitute(&"{recipe}".into(), Path::new("dir/moro.healed.yaml"), None);
        assert_eq!(a, "dir/moro.healed.yaml");
        assert_eq!(substitute(&"plain".into(), Path::new("r"), None), "plain");
    }

    #[test]
    fn healed_paths() {
        assert_eq!(
            healed_recipe_path(Path::new("a/moro.yaml")),
            Path::new("a/moro.healed.yaml")
        );
        assert_eq!(
            healed_recipe_path(Path::new("a/exp1.yaml")),
            Path::new("a/moro.healed.yaml")
        );
        assert_eq!(
            healed_recipe_path(Path::new("a/moro.healed.yaml")),
            Path::new("a/moro.healed.healed.yaml")
        );
        assert_eq!(
            healed_sibling(Path::new(".moro/axolotl.yml")),
            Path::new(".moro/axolotl.healed.yml")
        );
        assert_eq!(
            healed_sibling(Path::new("train")),
            Path::new("train.healed")
        );
    }

    #[test]
    fn resume_flags() {
        let c = Path::new("out/checkpoint-20");
        assert_eq!(
            ResumeFlag::HfTrainer.args(c),
            vec![OsString::from("--resume_from_checkpoint"), c.into()]
        );
        assert_eq!(
            ResumeFlag::Axolotl.args(c),
            vec![OsString::from("--resume_from_checkpoint=out/checkpoint-20")]
        );
        assert_eq!(
            ResumeFlag::LlamaFactory.args(c),
            vec![OsString::from("resume_from_checkpoint=out/checkpoint-20")]
        );
        assert!(ResumeFlag::None.args(c).is_empty());
    }

    #[test]
    fn newest_complete_checkpoint() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let d = dir.path();
        for (name, complete) in [
            ("checkpoint-2", true),
            ("checkpoint-10", true),
            ("checkpoint-12", false),
            ("checkpoint-x", true),
            ("runs", true),
        ] {
            fs::create_dir(d.join(name)).unwrap_or_else(|e| panic!("{e}"));
            if complete {
                fs::write(d.join(name).join("trainer_state.json"), b"{}")
                    .unwrap_or_else(|e| panic!("{e}"));
            }
        }
        assert_eq!(newest_checkpoint(d, None), Some(d.join("checkpoint-10")));
        let later = SystemTime::now() + Duration::from_secs(3600);
        assert_eq!(newest_checkpoint(d, Some(later)), None);
        assert_eq!(newest_checkpoint(&d.join("missing"), None), None);
    }

    fn oom(need: Option<u64>) -> Oom {
        Oom {
            kind: OomKind::Cuda,
            text: String::new(),
            tried_to_allocate: need.map(|_| 10),
            free: None,
            total: None,
            process_in_use: need.map(|n| n - 10),
        }
    }

    #[test]
    fn misses() {
        // Predicted not to fit: no miss.
        assert_eq!(prediction_miss(Some(120), Some(100), &oom(Some(130))), None);
        // No prediction or no budget: no miss.
        assert_eq!(prediction_miss(None, Some(100), &oom(Some(130))), None);
        assert_eq!(prediction_miss(Some(90), None, &oom(Some(130))), None);
        // Predicted to fit: the gap to what the message says it needed.
        assert_eq!(
            prediction_miss(Some(90), Some(100), &oom(Some(130))),
            Some(40)
        );
        // Without figures: at least the gap to the budget.
        assert_eq!(prediction_miss(Some(90), Some(100), &oom(None)), Some(10));
        assert_eq!(prediction_miss(Some(100), Some(100), &oom(None)), Some(1));
    }
}
