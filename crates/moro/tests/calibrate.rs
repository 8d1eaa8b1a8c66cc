//! `moro calibrate` without a GPU: the harness's own tests (python3, no torch), its rows read
//! by `moro validate`, fitting / showing / resetting the profile, the profile's exact effect
//! on `moro estimate`, the messages when torch or a GPU is missing (fake pythons), and a whole
//! run with a fake python standing in for torch + harness.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::Out;
use serde_json::Value;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn fixture() -> PathBuf {
    root().join("calibration/tests/fixtures/sample_rows.jsonl")
}

fn run_in(config: &Path, args: &[&str], env: &[(&str, &str)]) -> Out {
    let mut c = common::isolated();
    c.env("MORO_CONFIG_DIR", config);
    for (k, v) in env {
        c.env(k, v);
    }
    Out::of(c.args(args))
}

fn python3() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("python3"))
        .find(|p| p.is_file())
}

#[test]
fn harness_python_tests_pass_without_torch() {
    let Some(py) = python3() else {
        eprintln!("skipped: no python3 on PATH");
        return;
    };
    let o = Command::new(&py)
        .current_dir(root())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env_remove("MORO_UPDATE_FIXTURES")
        .args(["-m", "unittest", "discover", "-s", "calibration/tests"])
        .output()
        .expect("python3 runs");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "python unittest failed:\n{err}");
    assert!(err.contains("OK"), "{err}");
    // The harness compiles on its own (python3 -m py_compile, without writing bytecode).
    let o = Command::new(&py)
        .current_dir(root())
        .args([
            "-c",
            "import sys; compile(open(sys.argv[1]).read(), sys.argv[1], 'exec')",
            "calibration/harness.py",
        ])
        .output()
        .expect("python3 runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn validate_reads_every_harness_row_at_its_level() {
    let dir = tempfile::tempdir().unwrap();
    let o = run_in(
        dir.path(),
        &["validate", "--json", fixture().to_str().unwrap()],
        &[],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let v = o.json();
    let rows = v["rows"].as_array().unwrap();
    let lines = std::fs::read_to_string(fixture()).unwrap().lines().count();
    assert_eq!(rows.len(), lines);
    for r in rows {
        let id = r["id"].as_str().unwrap();
        let status = r["status"].as_str().unwrap();
        assert_ne!(status, "skipped", "{id}: {}", r["reason"]);
        if id.ends_with("-oom") {
            assert!(status.starts_with("oom"), "{id}: {status}");
            continue;
        }
        let level = id.rsplit('-').next().unwrap();
        assert_eq!(r["metric"].as_str(), Some(level), "{id}");
        assert!(r["measured_bytes"].as_u64().unwrap() > GIB);
        assert!(r["predicted_bytes"].as_u64().unwrap() > GIB);
    }
    // Methods as the harness meant them.
    let method = |prefix: &str| {
        rows.iter()
            .find(|r| r["id"].as_str().unwrap().starts_with(prefix))
            .unwrap()["method"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(method("moro-cal-0894874744"), "qlora");
    assert_eq!(method("moro-cal-e00578d00b"), "full");
    assert_eq!(method("moro-cal-a9d50f6316"), "inference");
    assert_eq!(v["summary"]["skipped"], 0);
}

#[test]
fn fit_show_reset() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("cfg");
    let fx = fixture();
    let o = run_in(
        &cfg,
        &["calibrate", "--from-rows", fx.to_str().unwrap(), "--json"],
        &[],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let v = o.json();
    let path = PathBuf::from(v["path"].as_str().unwrap());
    assert_eq!(path, cfg.join("profile-nvidia-h200.json"));
    assert!(path.is_file());
    let p = &v["profile"];
    assert_eq!(p["gpu_name"], "NVIDIA H200");
    // Context: the median device − reserved of the jobs (900 MiB each in the fixture); the
    // bare context is kept as evidence.
    assert_eq!(p["device"]["cuda_context_bytes"], 900 * MIB);
    assert_eq!(p["fit"]["context_bare_bytes"], 520 * MIB);
    assert_eq!(p["device"]["cublas_workspace_bytes"], 32 * MIB);
    assert_eq!(p["fit"]["jobs_ok"], 6);
    assert_eq!(p["fit"]["jobs_oom"], 1);
    assert_eq!(p["stack"]["torch"], "2.6.0");
    assert_eq!(p["measured_at"], "2026-01-02T03:04:05Z");

    let o = run_in(&cfg, &["calibrate", "--show"], &[]);
    assert_eq!(o.code, 0);
    assert!(
        o.stdout.contains("calibration profile for NVIDIA H200"),
        "{}",
        o.stdout
    );
    assert!(
        o.stdout.contains("cuda context      900 MiB"),
        "{}",
        o.stdout
    );
    let o = run_in(&cfg, &["calibrate", "--show", "--json"], &[]);
    assert_eq!(o.json()["profiles"].as_array().unwrap().len(), 1);

    let o = run_in(&cfg, &["calibrate", "--reset", "--json"], &[]);
    assert_eq!(o.code, 0);
    assert_eq!(o.json()["removed"].as_array().unwrap().len(), 1);
    assert!(!path.exists());
    let o = run_in(&cfg, &["calibrate", "--show", "--json"], &[]);
    assert_eq!(o.json()["profiles"].as_array().unwrap().len(), 0);
    let o = run_in(&cfg, &["calibrate", "--show"], &[]);
    assert_eq!(o.code, 0);
    assert!(
        o.stderr.contains("no calibration profile in"),
        "{}",
        o.stderr
    );

    // Not harness rows: a one-line error, exit 2.
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, "{\"id\": 1}\n").unwrap();
    let o = run_in(
        &cfg,
        &["calibrate", "--from-rows", bad.to_str().unwrap()],
        &[],
    );
    assert_eq!(o.code, 2);
    assert!(o.stderr.contains("cannot fit a profile"), "{}", o.stderr);
}

/// Rows whose measured allocated bytes are moro's prediction plus 512 MiB: the fit finds
/// exactly that offset.
#[test]
fn consistent_offset_is_fitted() {
    let dir = tempfile::tempdir().unwrap();
    let fx = fixture();
    let o = run_in(
        dir.path(),
        &["validate", "--json", fx.to_str().unwrap()],
        &[],
    );
    let report = o.json();
    let predicted: std::collections::HashMap<String, u64> = report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| Some((r["id"].as_str()?.to_owned(), r["predicted_bytes"].as_u64()?)))
        .collect();
    let mut out = String::new();
    for line in std::fs::read_to_string(&fx).unwrap().lines() {
        let mut row: Value = serde_json::from_str(line).unwrap();
        // `moro validate` ignores `model_overrides`; keep the rows it predicts as measured.
        if row.get("model_overrides").is_some() || row["outcome"] == "OOM" {
            continue;
        }
        let id = row["id"]
            .as_str()
            .unwrap()
            .replace("-reserved", "-allocated")
            .replace("-device", "-allocated");
        let alloc = predicted[&id] + 512 * MIB;
        row["calibration"]["allocated_bytes"] = alloc.into();
        row["calibration"]["reserved_bytes"] = (alloc + GIB).into();
        out.push_str(&row.to_string());
        out.push('\n');
    }
    let rows = dir.path().join("rows.jsonl");
    std::fs::write(&rows, out).unwrap();
    std::fs::copy(
        root().join("calibration/tests/fixtures/sample_rows.jsonl.machine.json"),
        dir.path().join("rows.jsonl.machine.json"),
    )
    .unwrap();
    let p = &fit_profile(&dir.path().join("cfg"), &rows);
    assert_eq!(p["device"]["offset_bytes"], 512 * MIB, "{p}");
    assert_eq!(p["fit"]["offset_samples"], 5);
    assert_eq!(p["fit"]["offset_mad_bytes"], 0);
}

fn estimate_json(cfg: &Path, extra: &[&str]) -> (Value, String) {
    let mut args = vec![
        "estimate",
        "--model",
        "meta-llama/Llama-3.1-8B",
        "--method",
        "qlora",
        "--seq-len",
        "2048",
        "--json",
    ];
    args.extend_from_slice(extra);
    let o = run_in(cfg, &args, &[]);
    assert!(o.code == 0 || o.code == 1, "{}", o.stderr);
    (o.json(), o.stderr)
}

#[test]
fn profile_moves_the_estimate_by_exactly_what_it_measured() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("cfg");
    let (before, err) = estimate_json(&cfg, &["--hardware", "h200"]);
    assert!(!err.contains("calibration profile"), "{err}");
    let ctx = before["components"]["cuda_context"].as_u64().unwrap();

    // A context 1 GiB bigger than moro's default: the device level grows by exactly 1 GiB,
    // the other levels not at all.
    common::write_h200_profile(
        &cfg,
        &serde_json::json!({ "cuda_context_bytes": ctx + GIB }),
    );
    let (after, err) = estimate_json(&cfg, &["--hardware", "h200"]);
    assert!(
        err.contains("using calibration profile for NVIDIA H200 (measured 2026-02-03)"),
        "{err}"
    );
    let level = |v: &Value, k: &str| v[k].as_u64().unwrap();
    assert_eq!(
        level(&after, "peak_device_bytes"),
        level(&before, "peak_device_bytes") + GIB
    );
    assert_eq!(
        level(&after, "peak_reserved_bytes"),
        level(&before, "peak_reserved_bytes")
    );
    assert_eq!(
        level(&after, "peak_allocated_bytes"),
        level(&before, "peak_allocated_bytes")
    );

    // With no --hardware, the machine's only profile applies too.
    let (_, err) = estimate_json(&cfg, &[]);
    assert!(err.contains("using calibration profile"), "{err}");
    // Another GPU: not applied.
    let (other, err) = estimate_json(&cfg, &["--hardware", "a100-sxm4-80gb"]);
    assert!(!err.contains("calibration profile"), "{err}");
    assert!(other["components"]["cuda_context"].as_u64().unwrap() < ctx + GIB);

    // A correction from `moro run` adds to the allocated level.
    std::fs::write(
        cfg.join("corrections.json"),
        r#"{"nvidia-h200": {"offset_bytes": 268435456, "observed_at": "2026-02-04T00:00:00Z"}}"#,
    )
    .unwrap();
    let (corr, err) = estimate_json(&cfg, &["--hardware", "h200"]);
    assert!(err.contains("out-of-memory run predicted to fit"), "{err}");
    assert_eq!(
        level(&corr, "peak_allocated_bytes"),
        level(&before, "peak_allocated_bytes") + 256 * MIB
    );
}

/// A fake python (shell script) in `dir`.
fn fake_python(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    p
}

const PROBE_OK: &str = r#"{"moro_probe": 1, "python": "/fake/python", "torch": "2.6.0", "cuda_build": "12.4", "cuda_available": true, "device_count": 1, "gpu_name": "NVIDIA H200", "transformers": "4.51.3", "peft": "0.15.2", "accelerate": "1.6.0", "bitsandbytes": "0.45.5"}"#;

#[cfg(unix)]
#[test]
fn missing_torch_cuda_gpu_or_python_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("cfg");
    let no_torch = fake_python(
        dir.path(),
        "py-no-torch",
        "echo 'Traceback (most recent call last):' >&2\n\
         echo '  File \"<string>\", line 1, in <module>' >&2\n\
         echo \"ModuleNotFoundError: No module named 'torch'\" >&2\nexit 1",
    );
    let o = run_in(
        &cfg,
        &["calibrate", "--python", no_torch.to_str().unwrap()],
        &[],
    );
    assert_eq!(o.code, 2);
    let want = format!(
        "torch is not installed in {} (pip install torch)",
        no_torch.display()
    );
    assert!(o.stderr.contains(&want), "{}", o.stderr);
    assert!(o.stderr.contains("hint:"), "{}", o.stderr);
    assert_eq!(
        o.stderr.lines().filter(|l| l.starts_with("error")).count(),
        1
    );

    let cpu = fake_python(
        dir.path(),
        "py-cpu",
        r#"echo '{"moro_probe": 1, "torch": "2.6.0+cpu", "cuda_build": null, "cuda_available": false}'"#,
    );
    let o = run_in(&cfg, &["calibrate", "--python", cpu.to_str().unwrap()], &[]);
    assert_eq!(o.code, 2);
    assert!(
        o.stderr.contains("torch has no CUDA (CPU-only build"),
        "{}",
        o.stderr
    );

    let no_gpu = fake_python(
        dir.path(),
        "py-no-gpu",
        r#"echo '{"moro_probe": 1, "torch": "2.6.0", "cuda_build": "12.4", "cuda_available": false, "device_count": 0}'"#,
    );
    // Found through MORO_PYTHON this time.
    let o = run_in(
        &cfg,
        &["calibrate"],
        &[("MORO_PYTHON", no_gpu.to_str().unwrap())],
    );
    assert_eq!(o.code, 2);
    assert!(o.stderr.contains("no NVIDIA GPU visible"), "{}", o.stderr);

    let no_peft = fake_python(
        dir.path(),
        "py-no-peft",
        &format!(
            "echo '{}'",
            PROBE_OK.replace(r#""peft": "0.15.2""#, r#""peft": null"#)
        ),
    );
    let o = run_in(
        &cfg,
        &["calibrate", "--python", no_peft.to_str().unwrap()],
        &[],
    );
    assert_eq!(o.code, 2);
    assert!(
        o.stderr.contains("peft is not installed in"),
        "{}",
        o.stderr
    );

    let o = run_in(
        &cfg,
        &["calibrate", "--python", "/nonexistent/python3"],
        &[],
    );
    assert_eq!(o.code, 2);
    assert!(
        o.stderr
            .contains("--python `/nonexistent/python3`: no such file"),
        "{}",
        o.stderr
    );
    // Nothing was written.
    assert!(!cfg.join("profile-nvidia-h200.json").exists());
}

/// A fake python with "torch and a GPU": it answers the probe, and when run on the harness it
/// checks what moro gave it and writes the sample rows as its measurements.
#[cfg(unix)]
#[test]
fn a_whole_calibration_with_a_fake_python() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("cfg");
    let seen = dir.path().join("seen");
    let body = format!(
        r#"if [ "$1" = "-c" ]; then echo '{probe}'; exit 0; fi
harness="$1"; shift
out=""; configs=""; grid=""; budget=""; moro=""
while [ $# -gt 0 ]; do
  case "$1" in
    --output) out="$2"; shift;;
    --configs) configs="$2"; shift;;
    --grid) grid="$2"; shift;;
    --budget-seconds) budget="$2"; shift;;
    --moro) moro="$2"; shift;;
  esac
  shift
done
echo "[calibrate] fake harness running" >&2
{{ echo "grid=$grid"; echo "budget=$budget"; test -f "$configs/meta-llama--Llama-3.1-70B-Instruct.json" && echo configs=ok
   grep -q 'def build_rows' "$harness" && echo harness=ok; test -x "$moro" && echo moro=ok; }} > "{seen}"
cp "{rows}" "$out"; cp "{rows}.machine.json" "$out.machine.json"
echo '{{"ran": 6}}'"#,
        probe = PROBE_OK,
        seen = seen.display(),
        rows = fixture().display(),
    );
    let py = fake_python(dir.path(), "py-gpu", &body);
    let o = run_in(
        &cfg,
        &[
            "calibrate",
            "--python",
            py.to_str().unwrap(),
            "--budget-seconds",
            "120",
        ],
        &[],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stderr
            .contains("calibrating NVIDIA H200 with torch 2.6.0"),
        "{}",
        o.stderr
    );
    assert!(o.stderr.contains("fake harness running"), "{}", o.stderr);
    assert!(
        o.stdout.contains("calibration profile for NVIDIA H200"),
        "{}",
        o.stdout
    );
    let seen = std::fs::read_to_string(&seen).unwrap();
    for want in [
        "grid=quick",
        "budget=120",
        "configs=ok",
        "harness=ok",
        "moro=ok",
    ] {
        assert!(seen.contains(want), "{want} in {seen}");
    }
    // Rows kept in the config directory (a second run resumes from them), profile saved.
    assert!(cfg.join("measured-nvidia-h200.jsonl").is_file());
    assert!(cfg.join("profile-nvidia-h200.json").is_file());
    let o = run_in(&cfg, &["calibrate", "--show", "--json"], &[]);
    let shown = o.json();
    assert_eq!(
        shown["profiles"][0]["profile"]["device"]["cuda_context_bytes"],
        900 * MIB
    );

    // A harness that fails: exit 2 and where the rows are.
    let failing = fake_python(
        dir.path(),
        "py-fail",
        &format!(
            "if [ \"$1\" = \"-c\" ]; then echo '{PROBE_OK}'; exit 0; fi\necho boom >&2; exit 3"
        ),
    );
    let o = run_in(
        &cfg,
        &["calibrate", "--python", failing.to_str().unwrap()],
        &[],
    );
    assert_eq!(o.code, 2);
    assert!(
        o.stderr.contains("the calibration harness failed (exit 3)"),
        "{}",
        o.stderr
    );
}

/// The profile fitted from the real H200 rows (`validation/h200/`): the reserve ratio comes
/// only from the runs it governs, the non-checkpointed ones, where reserved − allocated was
/// 4–9 % of the churn; the checkpointed runs' gaps are the largest freed block's and would
/// have given a ratio six times too large. The context is the median device − reserved.
#[test]
fn h200_rows_fit_a_profile() {
    let dir = tempfile::tempdir().unwrap();
    let rows = root().join("validation/h200/measured.jsonl");
    let p = &fit_profile(&dir.path().join("cfg"), &rows);
    let ratio = p["device"]["reserve_ratio"].as_f64().unwrap();
    assert!((0.04..=0.09).contains(&ratio), "ratio {ratio}");
    assert!(p["fit"]["reserve_ratio_samples"].as_u64().unwrap() >= 4);
    let ctx = p["device"]["cuda_context_bytes"].as_u64().unwrap();
    assert!((700 * MIB..=820 * MIB).contains(&ctx), "context {ctx}");
    assert_eq!(p["fit"]["jobs_ok"], 37);
}

/// `moro calibrate --from-rows ROWS --json` with its config in `cfg`: the fitted profile.
fn fit_profile(cfg: &std::path::Path, rows: &std::path::Path) -> Value {
    let o = run_in(
        cfg,
        &["calibrate", "--from-rows", rows.to_str().unwrap(), "--json"],
        &[],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    o.json()["profile"].clone()
}

/// The allocator model in the core (`moro_core::caching_allocator`) and
/// `calibration/allocsim.py`, the one the H200 replays were checked with, agree to the byte on
/// a long pseudo-random sequence of small, medium and large allocations, frees and a reset.
#[test]
fn rust_and_python_allocator_models_agree() {
    use moro_core::caching_allocator::CachingAllocator;
    let Some(py) = python3() else {
        eprintln!("skipped: no python3 on PATH");
        return;
    };
    let mut state: u64 = 0x5eed;
    let mut next = move || {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        state >> 33
    };
    let mut a = CachingAllocator::new();
    let mut live = Vec::new();
    let mut events = Vec::new();
    for k in 0..4000u64 {
        if k == 2000 {
            a.empty_cache();
            a.reset_peaks();
            events.push(serde_json::json!(["reset"]));
        }
        if live.is_empty() || next() % 5 < 3 {
            let bytes = match next() % 3 {
                0 => next() % MIB,
                1 => MIB + next() % (9 * MIB),
                _ => 10 * MIB + next() % (190 * MIB),
            };
            live.push((k, a.malloc(bytes)));
            events.push(serde_json::json!(["a", k, bytes]));
        } else {
            let i = usize::try_from(next()).unwrap() % live.len();
            let (key, h) = live.swap_remove(i);
            a.free(h);
            events.push(serde_json::json!(["f", key]));
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("events.json");
    std::fs::write(&file, serde_json::to_string(&events).unwrap()).unwrap();
    let o = Command::new(&py)
        .current_dir(root())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .arg("calibration/allocsim.py")
        .arg(&file)
        .output()
        .expect("python3 runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let py: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        py["peak_allocated_bytes"].as_u64(),
        Some(a.peak_allocated())
    );
    assert_eq!(py["peak_reserved_bytes"].as_u64(), Some(a.peak_reserved()));
    assert!(
        a.peak_reserved() > a.peak_allocated(),
        "the sequence fragments the cache"
    );
}
