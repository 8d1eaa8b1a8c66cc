//! `moro calibrate`: measure this machine's GPU with the calibration harness
//! (`calibration/harness.py`, embedded in the binary) and store a per-machine profile that
//! `moro estimate` folds into its device levels.
//!
//! Flow: find a python with torch + CUDA (a short probe says what is missing), write the
//! harness and the catalog's configs to a temporary directory, run the harness's short grid
//! within `--budget-seconds` (rows are kept in the config directory, so a second run resumes),
//! then fit the profile from the rows ([`fit`]) and save it atomically.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

use anyhow::Result;
use clap::Args;
use moro_core::estimate::{DeviceProfile, estimate};
use moro_core::model::ModelSpec;
use moro_core::units::MIB;
use moro_core::validation::{gpu_facts, interpret};
use serde::Serialize;
use serde_json::Value;

use crate::error::{user, user_hint};
use crate::output::{json, note, stdout};
use crate::profile::{self, FitReport, Overrides, PROFILE_VERSION, Profile};

/// The harness, embedded so an installed moro works outside the repository.
pub(crate) const HARNESS_PY: &str = include_str!("../../../../calibration/harness.py");

/// Environment variable naming the python to use.
pub(crate) const MORO_PYTHON: &str = "MORO_PYTHON";

/// Arguments of `moro calibrate`.
#[derive(Debug, Args)]
pub(crate) struct CalibrateArgs {
    /// Python with torch (CUDA build), transformers and peft [default: $MORO_PYTHON, python3,
    /// python].
    #[arg(long)]
    pub(crate) python: Option<PathBuf>,
    /// Stop starting new measurements after this many seconds (rows so far are kept; run
    /// again to resume).
    #[arg(long, default_value_t = 900)]
    pub(crate) budget_seconds: u64,
    /// Where the measured rows go [default: <config dir>/measured-<gpu>.jsonl].
    #[arg(long)]
    pub(crate) output: Option<PathBuf>,
    /// Fit the profile from rows already measured (a harness output file); runs no python.
    #[arg(long, conflicts_with_all = ["show", "reset"])]
    pub(crate) from_rows: Option<PathBuf>,
    /// Print the stored profile(s) and exit.
    #[arg(long, conflicts_with = "reset")]
    pub(crate) show: bool,
    /// Delete the stored profile(s) and the correction file, and exit.
    #[arg(long)]
    pub(crate) reset: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    pub(crate) json: bool,
}

pub(crate) fn run(args: &CalibrateArgs) -> Result<ExitCode> {
    let dir = profile::config_dir().ok_or_else(|| {
        user_hint(
            "cannot find a config directory (HOME is not set)",
            "set MORO_CONFIG_DIR to a directory moro may write to",
        )
    })?;
    if args.reset {
        return reset(&dir, args.json);
    }
    if args.show {
        return show(&dir, args.json);
    }
    let (rows_file, machine) = if let Some(rows) = &args.from_rows {
        (rows.clone(), None)
    } else {
        measure(args, &dir)?
    };
    let text = std::fs::read_to_string(&rows_file)
        .map_err(|e| user(format!("cannot read `{}`: {e}", rows_file.display())))?;
    let machine = machine.or_else(|| read_machine(&rows_file));
    let mut prof = fit(&text, machine.as_ref()).map_err(|e| {
        user_hint(
            format!("cannot fit a profile from `{}`: {e}", rows_file.display()),
            "the file must hold rows written by calibration/harness.py (`moro calibrate` runs it)",
        )
    })?;
    prof.fit.rows_file = Some(rows_file.display().to_string());
    let path = profile::save(&dir, &prof).map_err(|e| {
        user(format!(
            "cannot write the profile to `{}`: {e}",
            dir.display()
        ))
    })?;
    if args.json {
        stdout(&json(&ShowJson {
            path: path.display().to_string(),
            profile: &prof,
        })?)?;
    } else {
        stdout(&render(&prof, &path))?;
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Debug, Serialize)]
struct ShowJson<'a> {
    path: String,
    profile: &'a Profile,
}

fn reset(dir: &Path, as_json: bool) -> Result<ExitCode> {
    let mut removed = Vec::new();
    let mut targets: Vec<PathBuf> = profile::list(dir).into_iter().map(|f| f.path).collect();
    targets.push(dir.join(profile::CORRECTIONS_FILE));
    for p in targets {
        match std::fs::remove_file(&p) {
            Ok(()) => removed.push(p.display().to_string()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(user(format!("cannot remove `{}`: {e}", p.display()))),
        }
    }
    if as_json {
        stdout(&json(
            &serde_json::json!({ "config_dir": dir, "removed": removed }),
        )?)?;
    } else if removed.is_empty() {
        note(&format!(
            "nothing to reset: no calibration profile in `{}`",
            dir.display()
        ));
    } else {
        let mut out = String::new();
        for r in &removed {
            out.push_str(&format!("removed {r}\n"));
        }
        stdout(&out)?;
    }
    Ok(ExitCode::SUCCESS)
}

fn show(dir: &Path, as_json: bool) -> Result<ExitCode> {
    let found = profile::list(dir);
    let corrections = std::fs::read_to_string(dir.join(profile::CORRECTIONS_FILE))
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok());
    if as_json {
        let profiles: Vec<Value> = found
            .iter()
            .map(|f| match &f.profile {
                Ok(p) => serde_json::json!({ "path": f.path, "profile": p }),
                Err(e) => serde_json::json!({ "path": f.path, "error": e }),
            })
            .collect();
        let doc = serde_json::json!({
            "config_dir": dir,
            "profiles": profiles,
            "corrections": corrections,
        });
        stdout(&json(&doc)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    if found.is_empty() {
        note(&format!(
            "no calibration profile in `{}` (run `moro calibrate` on a machine with an NVIDIA GPU)",
            dir.display()
        ));
    }
    let mut out = String::new();
    for f in &found {
        match &f.profile {
            Ok(p) => out.push_str(&render(p, &f.path)),
            Err(e) => out.push_str(&format!("{}: unreadable ({e})\n", f.path.display())),
        }
    }
    if let Some(c) = corrections {
        out.push_str(&format!(
            "\ncorrections from `moro run` ({}):\n{}\n",
            dir.join(profile::CORRECTIONS_FILE).display(),
            serde_json::to_string_pretty(&c)?
        ));
    }
    stdout(&out)?;
    Ok(ExitCode::SUCCESS)
}

fn mib(b: u64) -> String {
    #[allow(clippy::cast_precision_loss)]
    let m = b as f64 / MIB as f64;
    if m >= 1024.0 {
        format!("{:.2} GiB", m / 1024.0)
    } else {
        format!("{m:.0} MiB")
    }
}

/// The text form of a profile.
pub(crate) fn render(p: &Profile, path: &Path) -> String {
    let d = &p.device;
    let f = &p.fit;
    let mut out = format!(
        "calibration profile for {} (measured {})\n  file              {}\n",
        p.gpu_name,
        p.measured_at,
        path.display()
    );
    let ctx = d
        .cuda_context_bytes
        .map_or_else(|| "moro's default".to_owned(), mib);
    let bare = f
        .context_bare_bytes
        .map_or_else(String::new, |b| format!(", bare context {}", mib(b)));
    out.push_str(&format!(
        "  cuda context      {ctx} (outside PyTorch's allocator{bare})\n"
    ));
    let ratio = d.reserve_ratio.map_or_else(
        || "moro's default".to_owned(),
        |r| format!("{r:.3} ({} jobs)", f.reserve_ratio_samples),
    );
    out.push_str(&format!("  reserve ratio     {ratio}\n"));
    let off = d
        .offset_bytes
        .map_or_else(|| "none".to_owned(), profile::signed_size);
    out.push_str(&format!("  offset            {off} ({})\n", f.offset_note));
    if let Some(w) = d.cublas_workspace_bytes {
        out.push_str(&format!("  cuBLAS workspace  {}\n", mib(w)));
    }
    if let Some(e) = f.median_abs_error {
        out.push_str(&format!(
            "  moro's error      {:.1}% median |error| at the allocated level\n",
            e * 100.0
        ));
    }
    out.push_str(&format!(
        "  jobs              {} measured, {} out of memory",
        f.jobs_ok, f.jobs_oom
    ));
    if let Some(r) = &f.rows_file {
        out.push_str(&format!(" (rows: {r})"));
    }
    out.push('\n');
    if !p.stack.is_empty() {
        let s: Vec<String> = p.stack.iter().map(|(k, v)| format!("{k} {v}")).collect();
        out.push_str(&format!("  stack             {}\n", s.join(", ")));
    }
    out
}

// ------------------------------------------------------------------------------------------
// Finding python and probing it
// ------------------------------------------------------------------------------------------

/// The probe run with `python -c`: one JSON line, whatever is missing.
pub(crate) const PROBE_PY: &str = r#"
import json, sys
out = {"moro_probe": 1, "python": sys.executable, "version": sys.version.split()[0]}
try:
    import torch
except Exception as e:
    out["torch_error"] = "%s: %s" % (type(e).__name__, e)
    print(json.dumps(out)); sys.exit(0)
out["torch"] = torch.__version__
out["cuda_build"] = torch.version.cuda
try:
    out["cuda_available"] = bool(torch.cuda.is_available())
    out["device_count"] = torch.cuda.device_count() if out["cuda_available"] else 0
    if out["device_count"]:
        out["gpu_name"] = torch.cuda.get_device_name(0)
except Exception as e:
    out["cuda_available"] = False
    out["cuda_error"] = str(e)
for name in ("transformers", "peft", "accelerate", "bitsandbytes"):
    try:
        out[name] = getattr(__import__(name), "__version__", "present")
    except Exception:
        out[name] = None
print(json.dumps(out))
"#;

/// What the probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProbeInfo {
    /// torch version.
    pub(crate) torch: String,
    /// First GPU's name.
    pub(crate) gpu_name: Option<String>,
}

/// Reads the probe's output; `Err((message, hint))` says what is missing.
pub(crate) fn diagnose(
    python: &str,
    stdout_text: &str,
    stderr_text: &str,
) -> Result<ProbeInfo, (String, String)> {
    let pip_torch = "install PyTorch in that python (`pip install torch transformers peft`) or \
                     point `--python` / MORO_PYTHON at one that has it";
    let v = stdout_text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l.trim()).ok())
        .find(|v| v.get("moro_probe").is_some());
    let Some(v) = v else {
        if stderr_text.contains("No module named 'torch'")
            || stderr_text.contains("No module named torch")
        {
            return Err((
                format!("torch is not installed in {python} (pip install torch)"),
                pip_torch.into(),
            ));
        }
        let last = stderr_text
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no output");
        return Err((
            format!("`{python}` did not answer the probe: {}", last.trim()),
            "is it a Python 3 interpreter? pass `--python PATH`".into(),
        ));
    };
    let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
    if let Some(e) = s("torch_error") {
        if e.contains("No module named") {
            return Err((
                format!("torch is not installed in {python} (pip install torch)"),
                pip_torch.into(),
            ));
        }
        return Err((
            format!("torch cannot be imported in {python}: {e}"),
            pip_torch.into(),
        ));
    }
    let torch = s("torch").unwrap_or_default();
    if s("cuda_build").is_none() {
        return Err((
            format!("torch has no CUDA (CPU-only build: torch {torch} in {python})"),
            "install a CUDA build of torch (`pip install torch` on Linux x86_64 brings one)".into(),
        ));
    }
    if v.get("cuda_available").and_then(Value::as_bool) != Some(true)
        || v.get("device_count").and_then(Value::as_u64) == Some(0)
    {
        let why = s("cuda_error").map_or_else(String::new, |e| format!(": {e}"));
        return Err((
            format!(
                "no NVIDIA GPU visible (torch {torch}, CUDA {}){why}",
                s("cuda_build").unwrap_or_default()
            ),
            "check `nvidia-smi` and CUDA_VISIBLE_DEVICES; calibration measures a real GPU".into(),
        ));
    }
    for (pkg, hint) in [
        ("transformers", "pip install transformers"),
        ("peft", "pip install peft"),
        ("accelerate", "pip install accelerate"),
    ] {
        if v.get(pkg).is_none_or(Value::is_null) {
            return Err((
                format!("{pkg} is not installed in {python} ({hint})"),
                pip_torch.into(),
            ));
        }
    }
    Ok(ProbeInfo {
        torch,
        gpu_name: s("gpu_name"),
    })
}

/// `name` on PATH.
fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    }
    #[cfg(not(unix))]
    {
        p.is_file()
    }
}

/// `--python`, `$MORO_PYTHON`, `python3`, `python`.
fn find_python(flag: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = flag {
        if p.components().count() > 1 || p.is_absolute() {
            if !p.exists() {
                return Err(user(format!("--python `{}`: no such file", p.display())));
            }
            return Ok(p.to_path_buf());
        }
        return which(&p.to_string_lossy())
            .ok_or_else(|| user(format!("--python `{}`: not found on PATH", p.display())));
    }
    if let Some(p) = std::env::var_os(MORO_PYTHON).filter(|v| !v.is_empty()) {
        let p = PathBuf::from(p);
        if p.exists() {
            return Ok(p);
        }
        return which(&p.to_string_lossy())
            .ok_or_else(|| user(format!("{MORO_PYTHON}=`{}`: no such file", p.display())));
    }
    which("python3").or_else(|| which("python")).ok_or_else(|| {
        user_hint(
            "no python found (tried --python, MORO_PYTHON, python3, python)",
            "install Python 3 with torch, transformers and peft, or pass `--python PATH`",
        )
    })
}

fn probe(python: &Path) -> Result<ProbeInfo> {
    let shown = python.display().to_string();
    let out = Command::new(python)
        .arg("-c")
        .arg(PROBE_PY)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| user(format!("cannot run `{shown}`: {e}")))?;
    diagnose(
        &shown,
        &String::from_utf8_lossy(&out.stdout),
        &String::from_utf8_lossy(&out.stderr),
    )
    .map_err(|(m, h)| user_hint(m, h))
}

// ------------------------------------------------------------------------------------------
// Running the harness
// ------------------------------------------------------------------------------------------

/// Runs the harness's short grid; returns the rows file and the machine facts it wrote.
fn measure(args: &CalibrateArgs, dir: &Path) -> Result<(PathBuf, Option<Value>)> {
    let python = find_python(args.python.as_deref())?;
    let info = probe(&python)?;
    let gpu = info.gpu_name.clone().unwrap_or_else(|| "gpu".to_owned());
    note(&format!(
        "calibrating {gpu} with torch {} ({})",
        info.torch,
        python.display()
    ));
    let output = match &args.output {
        Some(o) => o.clone(),
        None => dir.join(format!("measured-{}.jsonl", profile::slug(&gpu))),
    };
    if let Some(parent) = output.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .map_err(|e| user(format!("cannot create `{}`: {e}", parent.display())))?;
    }
    let work =
        TempDir::new().map_err(|e| user(format!("cannot create a temporary directory: {e}")))?;
    let harness = work.path().join("harness.py");
    std::fs::write(&harness, HARNESS_PY)
        .map_err(|e| user(format!("cannot write `{}`: {e}", harness.display())))?;
    let configs = work.path().join("models");
    std::fs::create_dir_all(&configs)?;
    for e in moro_core::catalog::entries() {
        let f = configs.join(format!("{}.json", e.id.replace('/', "--")));
        std::fs::write(&f, e.config_json)
            .map_err(|err| user(format!("cannot write `{}`: {err}", f.display())))?;
    }
    let mut cmd = Command::new(&python);
    cmd.arg(&harness)
        .args(["--grid", "quick", "--budget-seconds"])
        .arg(args.budget_seconds.to_string())
        .arg("--output")
        .arg(&output)
        .arg("--configs")
        .arg(&configs)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    match std::env::current_exe() {
        Ok(exe) => {
            cmd.arg("--moro").arg(exe);
        }
        Err(_) => {
            cmd.arg("--no-moro");
        }
    }
    note(&format!(
        "measuring (budget {} s; rows go to {}; interrupt and run again to resume)",
        args.budget_seconds,
        output.display()
    ));
    let out = cmd
        .output()
        .map_err(|e| user(format!("cannot run `{}`: {e}", python.display())))?;
    if !out.status.success() {
        return Err(user_hint(
            format!(
                "the calibration harness failed ({})",
                out.status
                    .code()
                    .map_or_else(|| "killed by a signal".to_owned(), |c| format!("exit {c}"))
            ),
            format!(
                "its messages are above; rows measured so far are in `{}`",
                output.display()
            ),
        ));
    }
    if !output.exists() {
        return Err(user_hint(
            "the calibration harness measured nothing",
            "its messages are above (a budget too small? `--budget-seconds 900`)",
        ));
    }
    Ok((output.clone(), read_machine(&output)))
}

/// A private temporary directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> std::io::Result<Self> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let p = std::env::temp_dir().join(format!("moro-calibrate-{}-{nanos}", std::process::id()));
        std::fs::create_dir(&p)?;
        Ok(Self(p))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The machine facts the harness writes next to its rows (`FILE.machine.json`).
fn read_machine(rows: &Path) -> Option<Value> {
    let mut p = rows.as_os_str().to_owned();
    p.push(".machine.json");
    let text = std::fs::read_to_string(PathBuf::from(p)).ok()?;
    serde_json::from_str(&text).ok()
}

// ------------------------------------------------------------------------------------------
// Fitting the profile
// ------------------------------------------------------------------------------------------

/// The architecture of a row's model: the catalog's config with the row's `model_overrides`
/// (the harness cuts models to fewer layers to fit the card).
pub(crate) fn spec_for_row(row: &Value) -> Result<ModelSpec, String> {
    use moro_core::validation::ModelSource as _;
    let id = row
        .get("model_hf_id")
        .and_then(Value::as_str)
        .ok_or("no model_hf_id")?;
    let overrides = row.get("model_overrides").and_then(Value::as_object);
    moro_core::validation::CatalogModels.model_with(id, overrides)
}

fn median_f(xs: &mut [f64]) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    Some(if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    })
}

fn median_i(xs: &[i64]) -> Option<i64> {
    let mut v: Vec<i64> = xs.to_vec();
    v.sort_unstable();
    let n = v.len();
    if n == 0 {
        return None;
    }
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        v[n / 2 - 1] / 2 + v[n / 2] / 2
    })
}

fn as_u64(v: &Value, k: &str) -> Option<u64> {
    v.get(k).and_then(|x| {
        x.as_u64().or_else(|| {
            x.as_f64().filter(|f| *f >= 0.0).map(|f| {
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                let u = f as u64;
                u
            })
        })
    })
}

fn as_i64(v: &Value, k: &str) -> Option<i64> {
    v.get(k).and_then(|x| {
        x.as_i64().or_else(|| {
            x.as_f64().map(|f| {
                #[allow(clippy::cast_possible_truncation)]
                let i = f as i64;
                i
            })
        })
    })
}

/// Smallest |median| offset worth applying: below it the difference is noise.
const OFFSET_NOISE: i64 = 64 * MIB as i64;

/// Fits the per-machine profile from harness rows (`rows_text`, JSONL) and the machine facts
/// (`FILE.machine.json`, optional).
///
/// - `cuda_context_bytes`: median over the completed jobs of what the process used on the
///   device beyond PyTorch's reserved memory (context plus the kernels training loads; jobs
///   with paged optimizers, whose states also sit outside the allocator, are left out), else
///   the bare context measured once;
/// - `reserve_ratio`: median over the jobs of (reserved − allocated) / churn, where churn is
///   the measured allocated bytes minus moro's resident part (weights, adapters, optimizer
///   states, gradients, KV cache): the estimator's own definition. Only jobs where the
///   ratio, not the largest freed block, sets the reserve count (long churn, such as runs
///   without checkpointing);
/// - `offset_bytes`: median of measured − predicted allocated bytes, only when at least three
///   jobs agree (80 % on one side, spread under half the median) and it is above 64 MiB;
/// - `cublas_workspace_bytes`: measured once when plausible (1–256 MiB).
///
/// # Errors
/// No usable row.
#[allow(clippy::too_many_lines)]
pub(crate) fn fit(rows_text: &str, machine: Option<&Value>) -> Result<Profile, String> {
    // One entry per job: the first row of each job key carries the raw numbers.
    let mut jobs: BTreeMap<String, Value> = BTreeMap::new();
    for line in rows_text.lines() {
        let Ok(v) = serde_json::from_str::<Value>(line.trim()) else {
            continue;
        };
        let Some(key) = v.get("job_key").and_then(Value::as_str) else {
            continue;
        };
        if v.get("calibration").is_none() {
            continue;
        }
        jobs.entry(key.to_owned()).or_insert(v);
    }
    if jobs.is_empty() {
        return Err("no harness rows (rows with `job_key` and `calibration`)".into());
    }
    let gpu_name = machine
        .and_then(|m| m.get("gpu_name"))
        .and_then(Value::as_str)
        .or_else(|| {
            jobs.values()
                .find_map(|v| v.get("gpu").and_then(Value::as_str))
        })
        .ok_or("the rows do not name the GPU")?
        .to_owned();
    let cc = machine
        .and_then(|m| m.get("compute_capability"))
        .and_then(Value::as_array)
        .and_then(|a| {
            let major = u32::try_from(a.first()?.as_u64()?).ok()?;
            let minor = u32::try_from(a.get(1)?.as_u64()?).ok()?;
            Some((major, minor))
        })
        .or_else(|| gpu_facts(&gpu_name).1);

    let cal = |v: &Value| v.get("calibration").cloned().unwrap_or(Value::Null);
    let first_cal = jobs.values().map(cal).next().unwrap_or(Value::Null);
    let context_bare = machine
        .and_then(|m| as_u64(m, "context_bytes"))
        .or_else(|| {
            jobs.values()
                .find_map(|v| as_u64(&cal(v), "context_bare_bytes"))
        });
    let cublas = machine
        .and_then(|m| as_u64(m, "cublas_workspace_bytes"))
        .or_else(|| as_u64(&first_cal, "cublas_workspace_bytes"))
        .filter(|w| (MIB..=256 * MIB).contains(w));

    let mut base = DeviceProfile::for_compute_capability(cc);
    if let Some(w) = cublas {
        base.cublas_workspace_bytes = w;
    }
    base.offset_bytes = 0;

    let mut report = FitReport::default();
    let mut nonalloc = Vec::new();
    let mut ratios = Vec::new();
    let mut deltas = Vec::new();
    let mut rel_errors = Vec::new();
    for v in jobs.values() {
        let c = cal(v);
        if v.get("outcome")
            .and_then(Value::as_str)
            .is_some_and(|o| o.eq_ignore_ascii_case("oom"))
        {
            report.jobs_oom += 1;
            continue;
        }
        let (Some(alloc), Some(reserved)) =
            (as_u64(&c, "allocated_bytes"), as_u64(&c, "reserved_bytes"))
        else {
            continue;
        };
        report.jobs_ok += 1;
        let paged = v
            .get("optimizer")
            .and_then(Value::as_str)
            .is_some_and(|o| o.to_ascii_lowercase().contains("paged"));
        if let Some(n) = as_i64(&c, "nonalloc_bytes").filter(|n| *n > 0 && !paged) {
            nonalloc.push(n);
        }
        // moro's prediction of the same job.
        let Ok(row) = interpret(v) else { continue };
        let Ok(spec) = spec_for_row(v) else { continue };
        let mut job = row.job.clone();
        job.adapter.targets = moro_core::targets::resolve(&spec, &job.adapter.targets);
        let Ok(est) = estimate(&spec, &job, &base) else {
            continue;
        };
        let resident: u64 = est
            .components
            .iter()
            .filter(|(k, _)| k.is_resident())
            .map(|(_, b)| *b)
            .sum();
        let churn = alloc.saturating_sub(resident);
        // Only jobs whose reserve the ratio sets: where the largest freed block is the floor
        // (`allocated_and_reserve`), the gap measures that block, not the ratio.
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
        let ratio_binds = (churn as f64 * base.reserve_ratio) as u64 >= est.largest_freed_block;
        if churn >= 256 * MIB && reserved >= alloc && ratio_binds {
            #[allow(clippy::cast_precision_loss)]
            ratios.push((reserved - alloc) as f64 / churn as f64);
        }
        let a = i64::try_from(alloc).unwrap_or(i64::MAX);
        let p = i64::try_from(est.peak_allocated_bytes).unwrap_or(i64::MAX);
        deltas.push(a - p);
        #[allow(clippy::cast_precision_loss)]
        rel_errors.push(((p - a) as f64 / a.max(1) as f64).abs());
    }
    if report.jobs_ok == 0 && report.jobs_oom == 0 {
        return Err("no row with measured bytes".into());
    }

    let mut o = Overrides::default();
    report.context_bare_bytes = context_bare;
    report.context_training_bytes = median_i(&nonalloc).and_then(|m| u64::try_from(m).ok());
    o.cuda_context_bytes = report.context_training_bytes.or(context_bare);
    report.reserve_ratio_samples = ratios.len();
    o.reserve_ratio = median_f(&mut ratios).map(|r| (r.clamp(0.0, 1.0) * 1000.0).round() / 1000.0);
    o.cublas_workspace_bytes = cublas;
    report.median_abs_error = median_f(&mut rel_errors);
    report.offset_samples = deltas.len();
    if let Some(m) = median_i(&deltas) {
        let devs: Vec<i64> = deltas.iter().map(|d| (d - m).abs()).collect();
        let mad = median_i(&devs).unwrap_or(0);
        report.offset_median_bytes = Some(m);
        report.offset_mad_bytes = u64::try_from(mad).ok();
        let same_side = deltas.iter().filter(|d| d.signum() == m.signum()).count();
        let n = deltas.len();
        report.offset_note = if n < 3 {
            format!("not applied: {n} job(s), at least 3 needed")
        } else if m.abs() < OFFSET_NOISE {
            format!(
                "not applied: median {} is within noise",
                profile::signed_size(m)
            )
        } else if same_side * 5 < n * 4 || mad > m.abs() / 2 {
            format!(
                "not applied: inconsistent (median {}, spread {})",
                profile::signed_size(m),
                mib(mad.unsigned_abs())
            )
        } else {
            o.offset_bytes = Some(m);
            format!("median of measured − predicted allocated over {n} jobs")
        };
    } else {
        report.offset_note = "not applied: moro predicted none of the jobs".into();
    }

    let mut stack = BTreeMap::new();
    let versions = machine
        .and_then(|m| m.get("versions"))
        .or_else(|| first_cal.get("versions"));
    if let Some(Value::Object(vs)) = versions {
        for k in ["torch", "transformers", "peft", "bitsandbytes", "cuda"] {
            if let Some(s) = vs.get(k).and_then(Value::as_str) {
                stack.insert(k.to_owned(), s.to_owned());
            }
        }
    } else if let Some(fw) = jobs
        .values()
        .find_map(|v| v.get("framework_version").and_then(Value::as_str))
    {
        for part in fw.split(',') {
            if let Some((k, ver)) = part.trim().split_once(' ') {
                stack.insert(k.to_owned(), ver.to_owned());
            }
        }
    }
    let driver = machine
        .and_then(|m| m.get("driver"))
        .or_else(|| first_cal.get("driver"))
        .and_then(Value::as_str);
    if let Some(d) = driver {
        stack.insert("driver".to_owned(), d.to_owned());
    }
    let measured_at = machine
        .and_then(|m| m.get("measured_at"))
        .and_then(Value::as_str)
        .map_or_else(
            || profile::rfc3339(std::time::SystemTime::now()),
            str::to_owned,
        );
    Ok(Profile {
        version: PROFILE_VERSION,
        gpu_slug: profile::slug(&gpu_name),
        gpu_name,
        measured_at,
        device: o,
        stack,
        fit: report,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diagnoses() {
        let e = diagnose(
            "/usr/bin/python3",
            "",
            "Traceback\nModuleNotFoundError: No module named 'torch'\n",
        )
        .unwrap_err();
        assert_eq!(
            e.0,
            "torch is not installed in /usr/bin/python3 (pip install torch)"
        );
        let cpu =
            r#"{"moro_probe":1,"torch":"2.5.1+cpu","cuda_build":null,"cuda_available":false}"#;
        assert!(
            diagnose("py", cpu, "")
                .unwrap_err()
                .0
                .starts_with("torch has no CUDA (CPU-only build")
        );
        let nogpu = r#"{"moro_probe":1,"torch":"2.5.1","cuda_build":"12.4","cuda_available":false,"device_count":0}"#;
        assert!(
            diagnose("py", nogpu, "")
                .unwrap_err()
                .0
                .starts_with("no NVIDIA GPU visible")
        );
        let nopeft = r#"{"moro_probe":1,"torch":"2.5.1","cuda_build":"12.4","cuda_available":true,"device_count":1,"gpu_name":"NVIDIA H200","transformers":"4.48.1","peft":null,"accelerate":"1.0"}"#;
        assert_eq!(
            diagnose("py", nopeft, "").unwrap_err().0,
            "peft is not installed in py (pip install peft)"
        );
        let ok = nopeft.replace("\"peft\":null", "\"peft\":\"0.13.2\"");
        assert_eq!(
            diagnose("py", &ok, "").unwrap().gpu_name.as_deref(),
            Some("NVIDIA H200")
        );
        assert!(
            diagnose("py", "", "SyntaxError: x")
                .unwrap_err()
                .0
                .contains("did not answer the probe")
        );
    }

    #[test]
    fn medians() {
        assert_eq!(median_i(&[3, 1, 2]), Some(2));
        assert_eq!(median_i(&[4, 1, 2, 3]), Some(2));
        assert_eq!(median_i(&[]), None);
        assert_eq!(median_f(&mut [0.3, 0.1]), Some(0.2));
    }
}
