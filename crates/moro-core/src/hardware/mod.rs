//! GPUs: the built-in catalog, the [`Device`] type the estimator plans for, and the
//! `--hardware` spec parser.
//!
//! Pure: the catalog is `data/hardware/gpus.json` compiled in with `include_str!`; detecting
//! the local GPUs lives in the `moro-gpu` crate, which hands back [`Hardware`] built from
//! these types. Facts and rules cite `docs/hardware-detection.md` ("the hardware
//! doc" below) by section.

mod catalog;
mod names;
mod spec;

use serde::{Deserialize, Serialize};

use crate::units::GIB;

pub use catalog::{nvidia_bf16, nvidia_flash_attention, parse_compute_capability, preset, presets};
pub use names::{match_detected, match_name, nearest_presets};
pub use spec::parse_hardware_spec;

/// Apple unified memory up to this size gets the smaller default GPU fraction
/// ([`APPLE_SMALL_FRACTION_PCT`]); the hardware doc §4 "Recommendation".
pub const APPLE_SMALL_RAM_LIMIT: u64 = 36 * GIB;
/// Percent of unified memory the GPU may use on Macs with at most 36 GiB (estimate):
/// observed `recommendedMaxWorkingSetSize` fractions 0.67 (M4 16 GB, exo#1672) and 0.74
/// (M3 16 GB, llmfit#754); the hardware doc §4 recommends 0.67 for offline planning.
pub const APPLE_SMALL_FRACTION_PCT: u64 = 67;
/// Percent of unified memory the GPU may use on Macs above 36 GiB (estimate): observed
/// 0.78 (M5 Pro 48 GB) and 0.84 (M5 Max 128 GB) and the "75% of total RAM" claim
/// (gpustack#1375); the hardware doc §4 recommends 0.75.
pub const APPLE_LARGE_FRACTION_PCT: u64 = 75;

/// Most GPUs `N×preset` accepts. A sanity bound against typos such as `80xh100`; the largest
/// single training jobs moro plans for are far below it.
pub const MAX_GPU_COUNT: u32 = 1024;

/// Smallest plain size `--hardware` accepts. Below it the user almost surely typed `MB`
/// for `GB`; the smallest catalogued GPU has 8 GiB (hardware doc §1 catalog).
pub const MIN_GENERIC_BYTES: u64 = GIB;

/// GPU maker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Vendor {
    /// NVIDIA (CUDA).
    Nvidia,
    /// AMD (ROCm).
    Amd,
    /// Apple Silicon (Metal / MPS / MLX).
    Apple,
    /// Intel (XPU).
    Intel,
    /// Unknown maker: a device named only by its memory size.
    Generic,
}

impl Vendor {
    /// Lower-case name, as in `gpus.json`.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Nvidia => "nvidia",
            Self::Amd => "amd",
            Self::Apple => "apple",
            Self::Intel => "intel",
            Self::Generic => "generic",
        }
    }
}

/// One catalogued GPU model (one entry of `gpus.json`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuModel {
    /// Preset id, e.g. `rtx-4090`, `h100-sxm`, `apple-m3-max`.
    pub id: String,
    /// Maker.
    pub vendor: Vendor,
    /// Exact name as NVML / `nvidia-smi --query-gpu=name` prints it (AMD: marketing name;
    /// Apple: `machdep.cpu.brand_string`).
    pub name: String,
    /// Other observed names, e.g. table-truncated `NVIDIA GeForce RTX 4080 ...`.
    pub aliases: Vec<String>,
    /// Marketing memory size in GB (Apple: the largest unified-memory option).
    pub memory_gb: u32,
    /// Total memory as the driver reports it, in bytes: `memory_mib_reported` × MiB for
    /// NVIDIA; `memory_gb` GiB for AMD (ROCm's arch table gives GiB and no reported value was
    /// verified, hardware doc §7.6). `None` for Apple, where it depends on the unified-memory
    /// size: see [`GpuModel::memory_bytes_for`].
    pub memory_bytes: Option<u64>,
    /// Peak memory bandwidth, bytes per second (catalog GB/s × 10^9).
    pub bandwidth_bytes_per_s: u64,
    /// Dense bf16 tensor TFLOPS without sparsity (GeForce: FP32-accumulate rate), if known.
    pub bf16_tflops: Option<f64>,
    /// Dense fp16 tensor TFLOPS without sparsity, if known.
    pub fp16_tflops: Option<f64>,
    /// CUDA compute capability (NVIDIA only).
    pub compute_capability: Option<(u32, u32)>,
    /// AMD gfx target, e.g. `gfx942`.
    pub gfx_target: Option<String>,
    /// bf16 arithmetic is supported.
    pub supports_bf16: bool,
    /// Upstream FlashAttention-2 supports the architecture (hardware doc §2.6).
    pub flash_attention_2: bool,
    /// Apple: the unified-memory sizes sold, in GB (= GiB, `hw.memsize` is a power of two).
    pub unified_memory_gb_options: Vec<u32>,
    /// Board power in watts, if known.
    pub tdp_w: Option<u32>,
}

impl GpuModel {
    /// Memory the GPU can use, in bytes. For Apple chips this is the GPU working-set limit
    /// for `unified_bytes` of RAM ([`apple_gpu_limit`]); `None` when `unified_bytes` is
    /// missing. For other vendors `unified_bytes` is ignored.
    #[must_use]
    pub fn memory_bytes_for(&self, unified_bytes: Option<u64>) -> Option<u64> {
        if self.vendor == Vendor::Apple {
            unified_bytes.map(apple_gpu_limit)
        } else {
            self.memory_bytes
        }
    }

    /// A [`Device`] for this model. Apple chips need `unified_bytes` (the RAM size); without
    /// it the catalog's largest option is assumed. Returns `None` only for a catalog entry
    /// with no memory figure at all.
    #[must_use]
    pub fn to_device(&self, unified_bytes: Option<u64>) -> Option<Device> {
        let apple = self.vendor == Vendor::Apple;
        let unified = if apple {
            Some(unified_bytes.unwrap_or(u64::from(self.memory_gb) * GIB))
        } else {
            None
        };
        let total = self.memory_bytes_for(unified)?;
        let name = match unified {
            Some(ram) => format!("{} ({} GiB unified)", self.name, ram / GIB),
            None => self.name.clone(),
        };
        Some(Device {
            name,
            vendor: self.vendor,
            total_bytes: total,
            free_bytes: None,
            used_bytes: None,
            compute_capability: self.compute_capability,
            bandwidth_bytes_per_s: Some(self.bandwidth_bytes_per_s),
            supports_bf16: self.supports_bf16,
            supports_flash_attention: self.flash_attention_2,
            unified_memory: apple,
            memory_estimated: apple,
            catalog_id: Some(self.id.clone()),
            bf16_tflops: self.bf16_tflops,
        })
    }
}

/// One usable GPU, as the estimator sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Device {
    /// Name as detected (NVML, nvidia-smi, rocm-smi, sysctl) or from the catalog.
    pub name: String,
    /// Maker.
    pub vendor: Vendor,
    /// Memory the GPU can use, bytes (reported total; Apple: the GPU working-set limit).
    pub total_bytes: u64,
    /// Memory free right now, bytes, when detected.
    pub free_bytes: Option<u64>,
    /// Memory in use right now, bytes, when detected.
    pub used_bytes: Option<u64>,
    /// CUDA compute capability `(major, minor)`.
    pub compute_capability: Option<(u32, u32)>,
    /// Peak memory bandwidth, bytes per second.
    pub bandwidth_bytes_per_s: Option<u64>,
    /// bf16 arithmetic is supported.
    pub supports_bf16: bool,
    /// FlashAttention-2 can run.
    pub supports_flash_attention: bool,
    /// Memory is shared with the CPU (Apple Silicon, AMD APUs).
    pub unified_memory: bool,
    /// `total_bytes` is a planning estimate, not a reported number (Apple default limit).
    pub memory_estimated: bool,
    /// Catalog id this device matched, if any.
    pub catalog_id: Option<String>,
    /// Dense bf16 tensor TFLOPS from the catalog, if known.
    pub bf16_tflops: Option<f64>,
}

impl Device {
    /// A device known only by its memory size (`--hardware 24GiB`). bf16 is assumed (every
    /// catalogued GPU since Ampere has it); FlashAttention is not, so estimates stay on the
    /// safe (larger) side.
    #[must_use]
    pub fn generic(total_bytes: u64) -> Self {
        Self {
            name: format!("generic {} GPU", format_gib(total_bytes)),
            vendor: Vendor::Generic,
            total_bytes,
            free_bytes: None,
            used_bytes: None,
            compute_capability: None,
            bandwidth_bytes_per_s: None,
            supports_bf16: true,
            supports_flash_attention: false,
            unified_memory: false,
            memory_estimated: false,
            catalog_id: None,
            bf16_tflops: None,
        }
    }

    /// An Apple GPU known only by the memory it may use (`--device mps --memory 24GiB`):
    /// unified memory, bf16, no FlashAttention.
    #[must_use]
    pub fn generic_apple(total_bytes: u64) -> Self {
        Self {
            name: format!("Apple GPU ({} usable, MPS)", format_gib(total_bytes)),
            vendor: Vendor::Apple,
            unified_memory: true,
            ..Self::generic(total_bytes)
        }
    }

    /// Memory in use: the reported figure, else total − free.
    #[must_use]
    pub fn used(&self) -> Option<u64> {
        self.used_bytes
            .or_else(|| self.free_bytes.map(|f| self.total_bytes.saturating_sub(f)))
    }
}

/// The GPUs a job can use (possibly none: CPU only).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Hardware {
    /// Devices in probe order (NVIDIA by index, then AMD, then Apple).
    pub devices: Vec<Device>,
}

impl Hardware {
    /// No GPU.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    /// Smallest per-device total, the binding limit for data/tensor parallel jobs.
    #[must_use]
    pub fn min_total_bytes(&self) -> Option<u64> {
        self.devices.iter().map(|d| d.total_bytes).min()
    }
}

/// What `--hardware` asked for.
#[derive(Debug, Clone, PartialEq)]
pub enum HardwareSpec {
    /// `detect`: probe the local machine (done at the edge, `moro-gpu`).
    Detect,
    /// Hardware named by hand: presets, GPU names or sizes.
    Given(Hardware),
}

/// Why a `--hardware` value was not understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HwError {
    /// Nothing in the catalog looks like it.
    #[error("--hardware: unknown gpu `{input}`; nearest presets: {}", .nearest.join(", "))]
    Unknown {
        /// What was given.
        input: String,
        /// Up to three preset ids by edit distance.
        nearest: Vec<String>,
    },
    /// A name several presets share.
    #[error("--hardware: `{input}` matches several presets ({}); name one", .candidates.join(", "))]
    Ambiguous {
        /// What was given.
        input: String,
        /// The matching preset ids.
        candidates: Vec<String>,
    },
    /// Malformed count, size or empty value.
    #[error("--hardware: {0}")]
    Invalid(String),
}

/// Apple Silicon GPU memory limit for `unified_bytes` of RAM, for offline planning:
/// 67% up to 36 GiB, 75% above (hardware doc §4; an estimate, the real
/// `recommendedMaxWorkingSetSize` varies with machine and macOS).
#[must_use]
pub const fn apple_gpu_limit(unified_bytes: u64) -> u64 {
    let pct = if unified_bytes <= APPLE_SMALL_RAM_LIMIT {
        APPLE_SMALL_FRACTION_PCT
    } else {
        APPLE_LARGE_FRACTION_PCT
    };
    unified_bytes / 100 * pct + unified_bytes % 100 * pct / 100
}

/// `24.0 GiB`-style text for names.
#[allow(clippy::cast_precision_loss)]
fn format_gib(bytes: u64) -> String {
    let g = bytes as f64 / GIB as f64;
    if (g - g.round()).abs() < 0.005 {
        format!("{g:.0} GiB")
    } else {
        format!("{g:.2} GiB")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apple_limit_follows_the_doc_heuristic() {
        assert_eq!(apple_gpu_limit(16 * GIB), 16 * GIB * 67 / 100);
        assert_eq!(apple_gpu_limit(36 * GIB), 36 * GIB * 67 / 100);
        assert_eq!(apple_gpu_limit(64 * GIB), 48 * GIB);
        assert_eq!(apple_gpu_limit(0), 0);
        assert!(apple_gpu_limit(u64::MAX) < u64::MAX);
        // Observed recommendedMaxWorkingSetSize on 16 GB machines (hardware doc §4):
        // M4 ≈10.67 GB (exo#1672), M3 11.84 GB (llmfit#754); the estimate lies between.
        let small = apple_gpu_limit(16 * GIB);
        assert!(
            (10_670_000_000..=11_840_000_000).contains(&small),
            "{small}"
        );
        // Larger machines on macOS 26 report more (M5 Pro 48 GB: 37.44 GiB; M5 Max 128 GB:
        // 107.52 GiB); the planning estimate stays at or below them.
        assert!(apple_gpu_limit(48 * GIB) <= 37 * GIB + 44 * GIB / 100);
        assert!(apple_gpu_limit(128 * GIB) <= 107 * GIB + 52 * GIB / 100);
    }
}
