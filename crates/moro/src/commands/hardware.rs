//! `moro hardware`: the GPUs on this machine, as the estimator will see them.
//!
//! Self-contained (only moro-core, moro-gpu, anstream and serde_json) so the module compiles
//! on its own. Rendering is pure ([`render`]); [`run`] probes and prints.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use moro_core::hardware::Device;
use moro_core::units::GIB;
use moro_gpu::{DetectOptions, Detection};

/// What stderr says when no GPU was found.
pub(crate) const NO_GPU: &str = "no GPU found (CPU only); name hardware by hand with \
     --hardware rtx-4090, --hardware a100-sxm4-80gb, --hardware 8xh100-sxm, \
     --hardware apple-m3-max-64gb or --hardware 24GiB";

/// Show the GPUs on this machine.
#[derive(Debug, clap::Args)]
pub(crate) struct HardwareArgs {
    /// Print a JSON array of devices (sizes in bytes) instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
    /// Read AMD sysfs under this root instead of /sys (tests).
    #[arg(long, hide = true, value_name = "PATH")]
    sysfs_root: Option<PathBuf>,
}

/// Probes the machine and prints the devices. Exit 0 also when none is found.
///
/// # Errors
/// Only when stdout cannot be written.
pub(crate) fn run(args: &HardwareArgs) -> anyhow::Result<ExitCode> {
    let mut opts = DetectOptions::default();
    if let Some(root) = &args.sysfs_root {
        opts.sysfs_root.clone_from(root);
    }
    let detection = moro_gpu::detect(&opts);
    let (out, err) = render(&detection, args.json)?;
    let mut stderr = anstream::stderr();
    for line in &err {
        let _ = writeln!(stderr, "{line}");
    }
    let mut stdout = anstream::stdout();
    match stdout
        .write_all(out.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        other => other?,
    }
    Ok(ExitCode::SUCCESS)
}

/// Stdout text and stderr lines for a detection.
pub(crate) fn render(detection: &Detection, json: bool) -> anyhow::Result<(String, Vec<String>)> {
    let devices = &detection.hardware.devices;
    let mut err: Vec<String> = detection
        .notes
        .iter()
        .map(|n| format!("note: {n}"))
        .collect();
    if devices.is_empty() {
        err.push(NO_GPU.to_string());
    } else if !json && devices.iter().any(|d| d.memory_estimated) {
        err.push(
            "note: `~` marks an Apple GPU limit estimated from RAM (67% up to 36 GiB, 75% above); \
             raise it with `sudo sysctl iogpu.wired_limit_mb=<MiB>`"
                .to_string(),
        );
    }
    let out = if json {
        let mut s = serde_json::to_string_pretty(&to_json(devices))?;
        s.push('\n');
        s
    } else if devices.is_empty() {
        String::new()
    } else {
        table(devices)
    };
    Ok((out, err))
}

/// `[{index, name, vendor, total_bytes, …}]`.
fn to_json(devices: &[Device]) -> serde_json::Value {
    devices
        .iter()
        .enumerate()
        .map(|(i, d)| {
            serde_json::json!({
                "index": i,
                "name": d.name,
                "vendor": d.vendor.as_str(),
                "total_bytes": d.total_bytes,
                "free_bytes": d.free_bytes,
                "used_bytes": d.used(),
                "memory_estimated": d.memory_estimated,
                "unified_memory": d.unified_memory,
                "compute_capability": d.compute_capability.map(|(a, b)| format!("{a}.{b}")),
                "bandwidth_bytes_per_s": d.bandwidth_bytes_per_s,
                "supports_bf16": d.supports_bf16,
                "supports_flash_attention": d.supports_flash_attention,
                "catalog_id": d.catalog_id,
            })
        })
        .collect()
}

#[allow(clippy::cast_precision_loss)]
fn gib(bytes: u64) -> String {
    format!("{:.2}", bytes as f64 / GIB as f64)
}

#[allow(clippy::cast_precision_loss)]
fn gbps(bytes_per_s: u64) -> String {
    format!("{:.0}", bytes_per_s as f64 / 1e9)
}

fn yes_no(b: bool) -> String {
    if b { "yes" } else { "no" }.to_string()
}

/// The device table: index, name, total/free/used GiB, compute capability, bandwidth GB/s,
/// bf16, FlashAttention.
fn table(devices: &[Device]) -> String {
    let header = [
        "#",
        "name",
        "total GiB",
        "free GiB",
        "used GiB",
        "cc",
        "GB/s",
        "bf16",
        "FlashAttention",
    ];
    let right = [true, false, true, true, true, true, true, false, false];
    let dash = || "-".to_string();
    let rows: Vec<Vec<String>> = devices
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let total = if d.memory_estimated {
                format!("~{}", gib(d.total_bytes))
            } else {
                gib(d.total_bytes)
            };
            vec![
                i.to_string(),
                d.name.clone(),
                total,
                d.free_bytes.map_or_else(dash, gib),
                d.used().map_or_else(dash, gib),
                d.compute_capability
                    .map_or_else(dash, |(a, b)| format!("{a}.{b}")),
                d.bandwidth_bytes_per_s.map_or_else(dash, gbps),
                yes_no(d.supports_bf16),
                yes_no(d.supports_flash_attention),
            ]
        })
        .collect();
    let mut width: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in &rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let header: Vec<String> = header.iter().map(|h| (*h).to_string()).collect();
    for r in std::iter::once(&header).chain(&rows) {
        let cells: Vec<String> = r
            .iter()
            .zip(&width)
            .zip(right)
            .map(|((c, &w), right)| {
                if right {
                    format!("{c:>w$}")
                } else {
                    format!("{c:<w$}")
                }
            })
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use moro_core::hardware::{Hardware, HardwareSpec, parse_hardware_spec};

    use super::*;

    fn fixture(rel: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../moro-gpu/tests/fixtures")
            .join(rel)
    }

    fn hw(spec: &str) -> Detection {
        let Ok(HardwareSpec::Given(hardware)) = parse_hardware_spec(spec) else {
            panic!("{spec}");
        };
        Detection {
            hardware,
            notes: Vec::new(),
        }
    }

    #[test]
    fn nothing_found_says_cpu_only() {
        let det = Detection {
            hardware: Hardware::default(),
            notes: vec!["nvml: libnvidia-ml.so.1: cannot open shared object file".into()],
        };
        let (out, err) = render(&det, false).unwrap();
        assert_eq!(out, "");
        assert_eq!(
            err[0],
            "note: nvml: libnvidia-ml.so.1: cannot open shared object file"
        );
        assert!(err[1].starts_with(
            "no GPU found (CPU only); name hardware by hand with --hardware rtx-4090"
        ));
        let (out, err) = render(&det, true).unwrap();
        assert_eq!(out, "[]\n");
        assert!(err.iter().any(|l| l.starts_with("no GPU found")));
    }

    #[test]
    fn table_of_detected_amd_cards() {
        let det = moro_gpu::detect(&DetectOptions {
            sysfs_root: fixture("sysfs-mi300x"),
            nvidia: false,
            rocm_smi: "moro-no-such-rocm-smi".into(),
            ..DetectOptions::default()
        });
        let (out, _) = render(&det, false).unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[0].starts_with("#  name"), "{out}");
        // 192 GiB MI300X, 280 MiB used; 5.3 TB/s from the catalog.
        let cells: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(
            cells,
            [
                "0", "AMD", "Instinct", "MI300X", "192.00", "191.73", "0.27", "-", "5300", "yes",
                "yes"
            ],
            "{out}"
        );
        assert!(lines[2].starts_with("1  AMD Instinct MI300X"), "{out}");
        assert_eq!(lines.len(), 3, "{out}");
    }

    #[test]
    fn json_has_bytes() {
        let (out, err) = render(&hw("2xrtx-4090"), true).unwrap();
        assert!(err.is_empty());
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let arr = v.as_array().unwrap();
        assert_eq!(arr.len(), 2);
        assert_eq!(arr[1]["index"], 1);
        assert_eq!(arr[0]["name"], "NVIDIA GeForce RTX 4090");
        assert_eq!(arr[0]["total_bytes"], 24564u64 << 20);
        assert_eq!(arr[0]["free_bytes"], serde_json::Value::Null);
        assert_eq!(arr[0]["compute_capability"], "8.9");
        assert_eq!(arr[0]["bandwidth_bytes_per_s"], 1_008_000_000_000u64);
        assert_eq!(arr[0]["supports_flash_attention"], true);
        assert_eq!(arr[0]["catalog_id"], "rtx-4090");
    }

    #[test]
    fn apple_estimate_is_marked() {
        let (out, err) = render(&hw("apple-m3-max-64gb"), false).unwrap();
        assert!(out.contains("~48.00"), "{out}");
        assert!(out.contains("Apple M3 Max (64 GiB unified)"), "{out}");
        assert!(err.iter().any(|l| l.contains("iogpu.wired_limit_mb")));
    }

    #[test]
    fn generic_device_has_dashes() {
        let (out, _) = render(&hw("24GiB"), false).unwrap();
        let row = out.lines().nth(1).unwrap();
        assert!(row.starts_with("0  generic 24 GiB GPU"), "{out}");
        assert!(row.contains("24.00"), "{out}");
        assert!(row.contains(" -  "), "{out}");
    }
}
