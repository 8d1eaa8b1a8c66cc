//! Apple Silicon: `sysctl` values → one unified-memory GPU (hardware doc §4).
//!
//! The parser is always compiled and tested; the `sysctl` calls run on macOS only.

use moro_core::hardware::{Device, Vendor, apple_gpu_limit, match_name};
use moro_core::units::MIB;

/// Raw `sysctl -n` outputs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AppleSysctl {
    /// `hw.memsize`: unified memory in bytes.
    pub memsize: Option<String>,
    /// `iogpu.wired_limit_mb`: the GPU wired-memory override in MiB; `0` = default.
    pub wired_limit_mb: Option<String>,
    /// `machdep.cpu.brand_string`, e.g. `Apple M2 Max`.
    pub brand: Option<String>,
}

/// The Apple GPU from `sysctl` values; `Ok(None)` on an Intel Mac.
///
/// Memory: `iogpu.wired_limit_mb` when set (> 0; `recommendedMaxWorkingSetSize` follows it,
/// llmfit#754, capped at RAM); otherwise the planning estimate [`apple_gpu_limit`] of
/// `hw.memsize`, flagged `memory_estimated` (hardware doc §4).
///
/// # Errors
/// A one-line message when `hw.memsize` is missing or not a number of bytes.
pub fn apple_device(s: &AppleSysctl) -> Result<Option<Device>, String> {
    let brand = s.brand.as_deref().map(str::trim).unwrap_or_default();
    if !brand.is_empty() && !brand.starts_with("Apple") {
        return Ok(None);
    }
    let Some(ram) = s
        .memsize
        .as_deref()
        .and_then(|m| m.trim().parse::<u64>().ok())
        .filter(|&m| m > 0)
    else {
        return Err("apple: hw.memsize is missing or not a number of bytes".to_string());
    };
    let wired = s
        .wired_limit_mb
        .as_deref()
        .and_then(|w| w.trim().parse::<u64>().ok())
        .filter(|&w| w > 0)
        .map(|w| w.saturating_mul(MIB));
    let (total, estimated) = match wired {
        Some(w) => (w.min(ram), false),
        None => (apple_gpu_limit(ram), true),
    };
    let name = if brand.is_empty() { "Apple GPU" } else { brand };
    let model = match_name(name).filter(|m| m.vendor == Vendor::Apple);
    Ok(Some(Device {
        name: name.to_string(),
        vendor: Vendor::Apple,
        total_bytes: total,
        free_bytes: None,
        used_bytes: None,
        compute_capability: None,
        bandwidth_bytes_per_s: model.map(|m| m.bandwidth_bytes_per_s),
        // bf16 works in MLX and in MPS on macOS 14+ (hardware doc §4); no FA2 (§2.6).
        supports_bf16: true,
        supports_flash_attention: false,
        unified_memory: true,
        memory_estimated: estimated,
        catalog_id: model.map(|m| m.id.clone()),
        bf16_tflops: None,
    }))
}

/// Reads the three sysctl values (macOS only).
#[cfg(target_os = "macos")]
pub fn read_sysctl(timeout: std::time::Duration) -> AppleSysctl {
    let get = |key: &str| {
        crate::process::run("sysctl", &["-n", key], timeout)
            .ok()
            .filter(crate::process::Output::success)
            .map(|o| o.stdout.trim().to_string())
    };
    AppleSysctl {
        memsize: get("hw.memsize"),
        wired_limit_mb: get("iogpu.wired_limit_mb"),
        brand: get("machdep.cpu.brand_string"),
    }
}
