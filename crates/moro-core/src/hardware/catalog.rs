//! The built-in GPU catalog (`data/hardware/gpus.json`) and the capability helpers.

use std::sync::OnceLock;

use serde::Deserialize;

use super::{GpuModel, Vendor};
use crate::units::{GIB, MIB};

/// The catalog text, `data/hardware/gpus.json` (64 entries; schema in the hardware doc §1).
const CATALOG_JSON: &str = include_str!("../../../../data/hardware/gpus.json");

/// Raw catalog entry (only the fields moro uses; unknown fields are ignored).
#[derive(Deserialize)]
struct RawEntry {
    id: String,
    vendor: Vendor,
    name: String,
    #[serde(default)]
    name_aliases: Vec<String>,
    compute_capability: Option<String>,
    gfx_target: Option<String>,
    memory_gb: Option<u32>,
    memory_mib_reported: Option<u64>,
    #[serde(default)]
    unified_memory_gb_options: Option<Vec<u32>>,
    memory_bandwidth_gbps: Option<f64>,
    bf16_tflops_dense: Option<f64>,
    fp16_tflops_dense: Option<f64>,
    #[serde(default)]
    supports_bf16: bool,
    #[serde(default)]
    flash_attention_2: bool,
    tdp_w: Option<u32>,
}

impl RawEntry {
    fn into_model(self) -> GpuModel {
        let memory_gb = self.memory_gb.unwrap_or(0);
        let memory_bytes = match self.vendor {
            Vendor::Apple => None,
            _ => self
                .memory_mib_reported
                .map(|m| m.saturating_mul(MIB))
                .or_else(|| (memory_gb > 0).then(|| u64::from(memory_gb) * GIB)),
        };
        GpuModel {
            id: self.id,
            vendor: self.vendor,
            name: self.name,
            aliases: self.name_aliases,
            memory_gb,
            memory_bytes,
            bandwidth_bytes_per_s: gbps_to_bytes(self.memory_bandwidth_gbps.unwrap_or(0.0)),
            bf16_tflops: self.bf16_tflops_dense,
            fp16_tflops: self.fp16_tflops_dense,
            compute_capability: self
                .compute_capability
                .as_deref()
                .and_then(parse_compute_capability),
            gfx_target: self.gfx_target,
            supports_bf16: self.supports_bf16,
            flash_attention_2: self.flash_attention_2,
            unified_memory_gb_options: self.unified_memory_gb_options.unwrap_or_default(),
            tdp_w: self.tdp_w,
        }
    }
}

/// Decimal GB/s (the catalog's unit, hardware doc "Units") to bytes per second.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn gbps_to_bytes(gbps: f64) -> u64 {
    if gbps.is_finite() && gbps > 0.0 && gbps < 1.0e6 {
        (gbps * 1.0e9).round() as u64
    } else {
        0
    }
}

/// Parses a compute capability such as `8.9` or `12.0` (nvidia-smi `compute_cap`: "Major
/// DOT Minor", hardware doc §2.3). `None` on anything else.
#[must_use]
pub fn parse_compute_capability(text: &str) -> Option<(u32, u32)> {
    let (major, minor) = text.trim().split_once('.')?;
    let major = major.trim().parse().ok()?;
    let minor = minor.trim().parse().ok()?;
    Some((major, minor))
}

/// FlashAttention-2 support on NVIDIA from the compute capability: Ampere or newer,
/// `cc >= 8.0` (hardware doc §2.6, flash-attention README and `setup.py` @0251105).
#[must_use]
pub const fn nvidia_flash_attention(cc: (u32, u32)) -> bool {
    cc.0 >= 8
}

/// bf16 support on NVIDIA from the compute capability: "bf16 requires Ampere, Ada, or
/// Hopper" (flash-attention README, hardware doc §2.6), i.e. `cc >= 8.0`.
#[must_use]
pub const fn nvidia_bf16(cc: (u32, u32)) -> bool {
    cc.0 >= 8
}

pub(super) fn catalog() -> &'static [GpuModel] {
    static CATALOG: OnceLock<Vec<GpuModel>> = OnceLock::new();
    CATALOG.get_or_init(|| {
        // The JSON is compiled in and checked by `catalog_parses`; an unreadable catalog
        // degrades to an empty one rather than a panic.
        serde_json::from_str::<Vec<RawEntry>>(CATALOG_JSON)
            .map(|raw| raw.into_iter().map(RawEntry::into_model).collect())
            .unwrap_or_default()
    })
}

/// All catalogued GPU models, in catalog order (GeForce, workstation, datacenter, AMD,
/// Apple), for listings such as `moro tiers`.
#[must_use]
pub fn presets() -> &'static [GpuModel] {
    catalog()
}

/// The catalog entry with this preset id (case-insensitive).
#[must_use]
pub fn preset(id: &str) -> Option<&'static GpuModel> {
    let id = id.trim();
    catalog().iter().find(|m| m.id.eq_ignore_ascii_case(id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalog_parses() {
        let all = presets();
        // 64 entries: the hardware doc's 62 and the two Strix Halo budgets.
        assert_eq!(all.len(), 64);
        let ids: std::collections::HashSet<_> = all.iter().map(|m| m.id.as_str()).collect();
        assert_eq!(ids.len(), all.len(), "duplicate ids");
        for m in all {
            if m.vendor != Vendor::Apple {
                assert!(m.memory_bytes.is_some(), "{} has no memory", m.id);
            } else {
                assert!(!m.unified_memory_gb_options.is_empty(), "{}", m.id);
            }
            assert!(m.bandwidth_bytes_per_s > 0, "{} has no bandwidth", m.id);
            if m.vendor == Vendor::Nvidia {
                let cc = m.compute_capability.expect("nvidia cc");
                assert_eq!(m.flash_attention_2, nvidia_flash_attention(cc), "{}", m.id);
            }
        }
    }

    #[test]
    fn catalog_values_match_the_doc() {
        // Reported totals from real nvidia-smi captures (hardware doc §2.5).
        assert_eq!(preset("rtx-4090").unwrap().memory_bytes, Some(24564 * MIB));
        assert_eq!(preset("rtx-3090").unwrap().memory_bytes, Some(24576 * MIB));
        assert_eq!(preset("h100-sxm").unwrap().memory_bytes, Some(81559 * MIB));
        assert_eq!(
            preset("a100-sxm4-80gb").unwrap().memory_bytes,
            Some(81920 * MIB)
        );
        assert_eq!(preset("gh200").unwrap().memory_bytes, Some(97871 * MIB));
        let b200 = preset("b200").unwrap();
        assert_eq!(b200.bandwidth_bytes_per_s, 8_000_000_000_000);
        assert_eq!(b200.compute_capability, Some((10, 0)));
        assert_eq!(preset("mi300x").unwrap().memory_bytes, Some(192 * GIB));
        assert!(!preset("t4").unwrap().supports_bf16);
        assert!(preset("apple-m3-max").unwrap().memory_bytes.is_none());
    }

    #[test]
    fn compute_capability_parses() {
        assert_eq!(parse_compute_capability("8.9"), Some((8, 9)));
        assert_eq!(parse_compute_capability(" 12.0 "), Some((12, 0)));
        assert_eq!(parse_compute_capability("[N/A]"), None);
        assert_eq!(parse_compute_capability("8"), None);
        assert_eq!(parse_compute_capability("a.b"), None);
        assert_eq!(parse_compute_capability(""), None);
    }
}
