//! NVIDIA: NVML first, `nvidia-smi --query-gpu` as the fallback (hardware doc §2).
//!
//! The I/O wrappers ([`probe_nvml`], [`probe_nvidia_smi`]) only gather raw readings; the
//! pure functions ([`parse_query_gpu`], [`nvidia_device`], [`bandwidth_from_clock`]) turn
//! them into [`Device`]s and are tested on captured output.

use std::time::Duration;

use moro_core::hardware::{
    Device, Vendor, match_detected, nvidia_bf16, nvidia_flash_attention, parse_compute_capability,
};
use moro_core::units::MIB;

use crate::process::{self, RunError};

/// Fields moro asks nvidia-smi for, in this order (hardware doc §2.3).
pub const QUERY_FIELDS: [&str; 7] = [
    "index",
    "name",
    "memory.total",
    "memory.used",
    "memory.free",
    "compute_cap",
    "mig.mode.current",
];

/// The same without the fields older drivers reject (`Field "compute_cap" is not a valid
/// field to query.`; hardware doc §2.3 says older drivers lack `compute_cap`).
pub const QUERY_FIELDS_OLD: [&str; 5] = [
    "index",
    "name",
    "memory.total",
    "memory.used",
    "memory.free",
];

/// Largest relative gap between the clock × bus-width bandwidth and the catalog figure for
/// the computed one to be used; beyond it the catalog wins (hardware doc §2.4: "if it
/// disagrees with the catalog by more than about 10%, keep the catalog value").
pub const BANDWIDTH_TOLERANCE_PCT: u64 = 10;

/// Data-rate factor between the reported max memory clock and transfers per second: ×2
/// (DDR), as in the B200 worked example (3996 MHz × 8192 bit → 8.18 TB/s) and PyTorch's
/// `memory_clock_rate * 1e3 * (memory_bus_width/8) * 2` (hardware doc §2.4).
pub const DATA_RATE_FACTOR: u64 = 2;

/// One NVIDIA GPU (or MIG slice) as read from NVML or nvidia-smi, before enrichment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NvidiaReading {
    /// Index as the driver numbers it (`None` when not reported).
    pub index: Option<u32>,
    /// Name as NVML / nvidia-smi prints it.
    pub name: String,
    /// Total memory, bytes.
    pub total_bytes: u64,
    /// Free memory, bytes.
    pub free_bytes: Option<u64>,
    /// Used memory, bytes.
    pub used_bytes: Option<u64>,
    /// CUDA compute capability.
    pub compute_capability: Option<(u32, u32)>,
    /// Memory bus width in bits (NVML `nvmlDeviceGetMemoryBusWidth`).
    pub bus_width_bits: Option<u32>,
    /// Max memory clock in MHz (NVML `nvmlDeviceGetMaxClockInfo(NVML_CLOCK_MEM)`).
    pub max_memory_clock_mhz: Option<u32>,
    /// MIG mode is on for this GPU (nvidia-smi: the total is the whole GPU's).
    pub mig_enabled: bool,
    /// This reading is one MIG instance (NVML MIG handle), not a whole GPU.
    pub mig_slice: bool,
}

/// Peak bandwidth from the max memory clock and bus width, bytes per second:
/// `2 × clock_MHz × 10^6 × bus_bits / 8` (hardware doc §2.4). `None` if either is missing
/// or zero.
#[must_use]
pub fn bandwidth_from_clock(
    bus_width_bits: Option<u32>,
    max_clock_mhz: Option<u32>,
) -> Option<u64> {
    let bits = u64::from(bus_width_bits?);
    let mhz = u64::from(max_clock_mhz?);
    if bits == 0 || mhz == 0 {
        return None;
    }
    DATA_RATE_FACTOR
        .checked_mul(mhz)?
        .checked_mul(1_000_000)?
        .checked_mul(bits)
        .map(|b| b / 8)
}

/// Chooses between the computed and the catalog bandwidth (see
/// [`BANDWIDTH_TOLERANCE_PCT`]).
#[must_use]
pub fn reconcile_bandwidth(computed: Option<u64>, catalog: Option<u64>) -> Option<u64> {
    match (computed, catalog.filter(|&c| c > 0)) {
        (Some(c), Some(k)) => {
            if c.abs_diff(k).saturating_mul(100) <= k.saturating_mul(BANDWIDTH_TOLERANCE_PCT) {
                Some(c)
            } else {
                Some(k)
            }
        }
        (c, k) => c.or(k),
    }
}

/// A [`Device`] from a reading, enriched from the catalog (bandwidth, bf16 TFLOPS, and
/// bf16 / FlashAttention when the compute capability is unknown). The reported total is
/// kept: vGPU and cloud slices report less than the catalog (hardware doc §2.3).
#[must_use]
pub fn nvidia_device(r: &NvidiaReading) -> Device {
    let model = match_detected(&r.name, r.total_bytes).filter(|m| m.vendor == Vendor::Nvidia);
    let cc = r
        .compute_capability
        .or(model.and_then(|m| m.compute_capability));
    let supports_bf16 = cc.map_or(model.is_some_and(|m| m.supports_bf16), nvidia_bf16);
    let supports_fa = cc.map_or(
        model.is_some_and(|m| m.flash_attention_2),
        nvidia_flash_attention,
    );
    // A MIG slice gets a fraction of the GPU's bandwidth and compute.
    let whole_gpu = !r.mig_slice;
    let bandwidth = whole_gpu
        .then(|| {
            reconcile_bandwidth(
                bandwidth_from_clock(r.bus_width_bits, r.max_memory_clock_mhz),
                model.map(|m| m.bandwidth_bytes_per_s),
            )
        })
        .flatten();
    Device {
        name: r.name.clone(),
        vendor: Vendor::Nvidia,
        total_bytes: r.total_bytes,
        free_bytes: r.free_bytes,
        used_bytes: r.used_bytes,
        compute_capability: cc,
        bandwidth_bytes_per_s: bandwidth,
        supports_bf16,
        supports_flash_attention: supports_fa,
        unified_memory: false,
        memory_estimated: false,
        catalog_id: model.map(|m| m.id.clone()),
        bf16_tflops: model.and_then(|m| m.bf16_tflops).filter(|_| whole_gpu),
    }
}

/// A value nvidia-smi could not give: `[N/A]`, `[Not Supported]`, `[Unknown Error]`,
/// `[Insufficient Permissions]`, `N/A`, or empty.
fn unavailable(v: &str) -> bool {
    v.is_empty() || v.starts_with('[') || v.eq_ignore_ascii_case("n/a")
}

/// MiB value (`24564`, or `24564 MiB` without `nounits`) to bytes.
fn mib(v: &str) -> Option<u64> {
    let v = v.trim();
    if unavailable(v) {
        return None;
    }
    let n = v.strip_suffix("MiB").unwrap_or(v).trim();
    n.parse::<u64>().ok()?.checked_mul(MIB)
}

/// Parses `nvidia-smi --query-gpu=<fields> --format=csv,noheader,nounits` output (one GPU
/// per line, values separated by `, `). Unknown fields are ignored; a line without a
/// usable `memory.total`, or with the wrong number of values, is skipped with a note.
/// Never fails: garbage gives no readings and notes saying why.
#[must_use]
pub fn parse_query_gpu(fields: &[&str], text: &str) -> (Vec<NvidiaReading>, Vec<String>) {
    let mut readings = Vec::new();
    let mut notes = Vec::new();
    let pos = |f: &str| fields.iter().position(|x| *x == f);
    let Some(total_at) = pos("memory.total") else {
        notes.push("nvidia-smi: memory.total was not queried".to_string());
        return (readings, notes);
    };
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let values: Vec<&str> = line.split(',').map(str::trim).collect();
        if values.len() != fields.len() {
            notes.push(format!(
                "nvidia-smi: line {} has {} values, expected {}: `{}`",
                n + 1,
                values.len(),
                fields.len(),
                truncate(line)
            ));
            continue;
        }
        let get = |f: &str| pos(f).map(|i| values[i]).filter(|v| !unavailable(v));
        let Some(total) = mib(values[total_at]).filter(|&t| t > 0) else {
            notes.push(format!(
                "nvidia-smi: line {}: memory.total `{}` is not a size in MiB",
                n + 1,
                truncate(values[total_at])
            ));
            continue;
        };
        let mig_enabled =
            get("mig.mode.current").is_some_and(|v| v.eq_ignore_ascii_case("enabled"));
        let reading = NvidiaReading {
            index: get("index").and_then(|v| v.parse().ok()),
            name: get("name").unwrap_or("NVIDIA GPU").to_string(),
            total_bytes: total,
            free_bytes: get("memory.free").and_then(mib),
            used_bytes: get("memory.used").and_then(mib),
            compute_capability: get("compute_cap").and_then(parse_compute_capability),
            bus_width_bits: None,
            max_memory_clock_mhz: get("clocks.max.memory")
                .or_else(|| get("clocks.max.mem"))
                .and_then(|v| v.trim_end_matches("MHz").trim().parse().ok()),
            mig_enabled,
            mig_slice: false,
        };
        if mig_enabled {
            notes.push(format!(
                "nvidia-smi: gpu {} has MIG enabled; its total is the whole GPU, a MIG slice has less",
                reading.index.map_or_else(|| "?".to_string(), |i| i.to_string())
            ));
        }
        readings.push(reading);
    }
    (readings, notes)
}

/// Whether nvidia-smi rejected a field name (older drivers and `compute_cap`).
#[must_use]
pub fn is_unknown_field_error(text: &str) -> bool {
    text.contains("is not a valid field")
}

fn truncate(s: &str) -> String {
    const MAX: usize = 80;
    if s.chars().count() <= MAX {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(MAX).collect();
        t.push('…');
        t
    }
}

/// Where a probe stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeFailure {
    /// The tool or library is not on this machine (normal without that vendor).
    Absent(String),
    /// It is there but failed.
    Failed(String),
}

/// Runs nvidia-smi (retrying without `compute_cap` / `mig.mode.current` for older
/// drivers) and parses it.
///
/// # Errors
/// [`ProbeFailure`] when nvidia-smi is missing, hangs or exits non-zero.
pub fn probe_nvidia_smi(
    program: &str,
    timeout: Duration,
) -> Result<(Vec<NvidiaReading>, Vec<String>), ProbeFailure> {
    let run = |fields: &[&str]| {
        let query = format!("--query-gpu={}", fields.join(","));
        process::run(program, &[&query, "--format=csv,noheader,nounits"], timeout)
    };
    let mut fields: &[&str] = &QUERY_FIELDS;
    let mut out = run(fields);
    if let Ok(o) = &out
        && !o.success()
        && is_unknown_field_error(&format!("{}{}", o.stdout, o.stderr))
    {
        fields = &QUERY_FIELDS_OLD;
        out = run(fields);
    }
    match out {
        Err(RunError::NotFound) => Err(ProbeFailure::Absent("nvidia-smi: not found".into())),
        Err(e) => Err(ProbeFailure::Failed(format!("nvidia-smi: {e}"))),
        Ok(o) if !o.success() => Err(ProbeFailure::Failed(format!(
            "nvidia-smi: exit code {}: {}",
            o.code.map_or_else(|| "none".to_string(), |c| c.to_string()),
            truncate(&o.first_line())
        ))),
        Ok(o) => Ok(parse_query_gpu(fields, &o.stdout)),
    }
}

/// MIG mode "on" as returned in `MigMode::current` (`#define NVML_DEVICE_MIG_ENABLE 0x1`,
/// `nvml.h` in NVIDIA/go-nvml @2f9e261, hardware doc §2.1).
const NVML_DEVICE_MIG_ENABLE: u32 = 1;

/// Reads every GPU through NVML (nvml-wrapper loads `libnvidia-ml.so.1` at run time). With
/// MIG on, each MIG instance is read through its MIG handle (hardware doc §2.2).
///
/// Returns the readings, notes for devices that could not be read, and the device count
/// NVML announced (so the caller can tell a partial read).
///
/// # Errors
/// [`ProbeFailure::Absent`] when the library cannot be loaded, `Failed` for other NVML
/// errors: every error means "fall back to nvidia-smi".
pub fn probe_nvml() -> Result<(Vec<NvidiaReading>, Vec<String>, u32), ProbeFailure> {
    use nvml_wrapper::Nvml;
    use nvml_wrapper::enum_wrappers::device::Clock;
    use nvml_wrapper::error::NvmlError;

    let nvml = Nvml::init().map_err(|e| match e {
        NvmlError::LibloadingError(_) | NvmlError::LibraryNotFound => {
            ProbeFailure::Absent(format!("nvml: {e}"))
        }
        NvmlError::DriverNotLoaded => ProbeFailure::Absent(format!("nvml: {e}")),
        e => ProbeFailure::Failed(format!("nvml: {e}")),
    })?;
    let count = nvml
        .device_count()
        .map_err(|e| ProbeFailure::Failed(format!("nvml: device count: {e}")))?;
    let mut readings = Vec::new();
    let mut notes = Vec::new();
    for i in 0..count {
        let dev = match nvml.device_by_index(i) {
            Ok(d) => d,
            Err(e) => {
                notes.push(format!("nvml: gpu {i}: {e}"));
                continue;
            }
        };
        let name = dev.name().unwrap_or_else(|_| "NVIDIA GPU".to_string());
        let cc = dev
            .cuda_compute_capability()
            .ok()
            .and_then(|c| Some((u32::try_from(c.major).ok()?, u32::try_from(c.minor).ok()?)));
        let mig_on = dev
            .mig_mode()
            .is_ok_and(|m| m.current == NVML_DEVICE_MIG_ENABLE);
        if mig_on {
            let slots = dev.mig_device_count().unwrap_or(0);
            let mut found = 0;
            for j in 0..slots {
                // Empty slots return an error; skip them.
                let Ok(mig) = dev.mig_device_by_index(j) else {
                    continue;
                };
                let Ok(mem) = mig.memory_info() else { continue };
                found += 1;
                readings.push(NvidiaReading {
                    index: Some(i),
                    name: mig.name().unwrap_or_else(|_| format!("{name} MIG")),
                    total_bytes: mem.total,
                    free_bytes: Some(mem.free),
                    used_bytes: Some(mem.used),
                    compute_capability: cc,
                    bus_width_bits: None,
                    max_memory_clock_mhz: None,
                    mig_enabled: true,
                    mig_slice: true,
                });
            }
            if found == 0 {
                notes.push(format!(
                    "nvml: gpu {i} has MIG enabled but no readable MIG instance"
                ));
            }
            continue;
        }
        match dev.memory_info() {
            Ok(mem) => readings.push(NvidiaReading {
                index: Some(i),
                name,
                total_bytes: mem.total,
                free_bytes: Some(mem.free),
                used_bytes: Some(mem.used),
                compute_capability: cc,
                bus_width_bits: dev.memory_bus_width().ok(),
                max_memory_clock_mhz: dev.max_clock_info(Clock::Memory).ok(),
                mig_enabled: false,
                mig_slice: false,
            }),
            Err(e) => notes.push(format!("nvml: gpu {i} ({name}): memory info: {e}")),
        }
    }
    Ok((readings, notes, count))
}
