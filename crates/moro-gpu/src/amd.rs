//! AMD: amdgpu sysfs first, `rocm-smi --showmeminfo vram --json` as the fallback
//! (hardware doc §3). The sysfs root is a parameter so tests read fixture trees.

use std::fs;
use std::path::Path;
use std::time::Duration;

use moro_core::hardware::{Device, Vendor, match_name};
use moro_core::units::GIB;

use crate::nvidia::ProbeFailure;
use crate::process::{self, RunError};

/// PCI vendor id of AMD/ATI as the `vendor` sysfs file prints it (hardware doc §3).
pub const AMD_PCI_VENDOR: &str = "0x1002";

/// ollama's APU heuristic (hardware doc §3, `discover/amd.go` @fb30760): VRAM at most this…
pub const APU_MAX_VRAM: u64 = 4 * GIB;
/// …and GTT at least this…
pub const APU_MIN_GTT: u64 = 8 * GIB;
/// …and GTT at least this many times VRAM means an integrated GPU, whose usable memory is
/// GTT.
pub const APU_GTT_RATIO: u64 = 4;

/// PCI device ids mapped to names where the hardware doc gives them (§3, from gpuhunt's
/// device-id table): MI300X `0x74A1`, MI210 `0x740F`; Strix Halo's integrated GPU `0x1586`
/// (amdgpu_top's DeviceID 5510, gfx1151; hardware doc §3.4).
const DEVICE_IDS: [(&str, &str); 3] = [
    ("0x74a1", "AMD Instinct MI300X"),
    ("0x740f", "AMD Instinct MI210"),
    ("0x1586", "AMD Radeon 8060S (Ryzen AI Max, Strix Halo)"),
];

/// PCI device ids of integrated GPUs whatever their carve-out: Strix Halo (`0x1586`), whose
/// BIOS carve-out ranges from 0.5 GiB to 96 GiB, beyond the size heuristic below.
const APU_DEVICE_IDS: [&str; 1] = ["0x1586"];

/// The sysfs files of one `/sys/class/drm/card<N>/device`, as read (missing = `None`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AmdCardFiles {
    /// `card<N>`.
    pub card: String,
    /// `vendor`, e.g. `0x1002`.
    pub vendor: Option<String>,
    /// `device`, the PCI device id, e.g. `0x74a1`.
    pub device: Option<String>,
    /// `product_name` (present on some boards only).
    pub product_name: Option<String>,
    /// `mem_info_vram_total`, decimal bytes.
    pub vram_total: Option<String>,
    /// `mem_info_vram_used`, decimal bytes.
    pub vram_used: Option<String>,
    /// `mem_info_gtt_total`, decimal bytes.
    pub gtt_total: Option<String>,
    /// TTM's `pages_limit` (`/sys/module/ttm/parameters/pages_limit`, or `amdttm`'s under
    /// AMD's DKMS driver), 4 KiB pages: what ROCm may allocate in GTT, whatever
    /// `mem_info_gtt_total` says (`amdgpu.gttsize` is deprecated for it).
    pub ttm_pages_limit: Option<String>,
}

fn bytes(v: Option<&str>) -> Option<u64> {
    v?.trim().parse().ok()
}

/// A [`Device`] from one card's sysfs files; `Ok(None)` for a non-AMD card.
///
/// # Errors
/// A one-line message when an AMD card has no readable `mem_info_vram_total`.
pub fn amd_sysfs_device(f: &AmdCardFiles) -> Result<Option<Device>, String> {
    let vendor = f.vendor.as_deref().map(|v| v.trim().to_ascii_lowercase());
    if vendor.as_deref() != Some(AMD_PCI_VENDOR) {
        return Ok(None);
    }
    let Some(vram) = bytes(f.vram_total.as_deref()).filter(|&v| v > 0) else {
        return Err(format!(
            "amd sysfs: {}: mem_info_vram_total is missing or not a number of bytes",
            f.card
        ));
    };
    let gtt = bytes(f.gtt_total.as_deref());
    let device = f.device.as_deref().map(|d| d.trim().to_ascii_lowercase());
    let known_apu = device
        .as_deref()
        .is_some_and(|d| APU_DEVICE_IDS.contains(&d));
    let apu = known_apu
        || gtt.is_some_and(|g| {
            vram <= APU_MAX_VRAM && g >= APU_MIN_GTT && g >= vram.saturating_mul(APU_GTT_RATIO)
        });
    let id_name = device
        .as_deref()
        .and_then(|d| DEVICE_IDS.iter().find(|(id, _)| *id == d).map(|(_, n)| *n));
    let name = f
        .product_name
        .as_deref()
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(str::to_string)
        .or_else(|| id_name.map(str::to_string))
        .unwrap_or_else(|| {
            format!(
                "AMD GPU ({} {})",
                f.card,
                f.device.as_deref().map_or("", str::trim)
            )
            .replace(" )", ")")
        });
    let (total, used) = if apu {
        (apu_pool(vram, gtt, f), None)
    } else {
        (vram, bytes(f.vram_used.as_deref()).filter(|&u| u <= vram))
    };
    Ok(Some(amd_device(name, total, used, apu)))
}

/// The one pool ROCm gives an integrated GPU: the GTT, capped by TTM's page limit, when the
/// carve-out is the smaller (the kernel's `apu_prefer_gtt`, torvalds/linux 759e764f "Let
/// VRAM allocations go to GTT domain on small APUs"), else the carve-out; never both
/// (hardware doc §3.4).
fn apu_pool(vram: u64, gtt: Option<u64>, f: &AmdCardFiles) -> u64 {
    let ttm = bytes(f.ttm_pages_limit.as_deref()).map(|p| p.saturating_mul(4096));
    match gtt {
        Some(g) if vram < g => ttm.map_or(g, |t| g.min(t)),
        _ => vram,
    }
}

/// An AMD [`Device`] enriched from the catalog by name. Unknown boards get no bf16 or
/// FlashAttention (their gfx target is unknown; hardware doc §2.6 lists the supported ones).
fn amd_device(name: String, total: u64, used: Option<u64>, unified: bool) -> Device {
    let model = match_name(&name).filter(|m| m.vendor == Vendor::Amd);
    Device {
        name,
        vendor: Vendor::Amd,
        total_bytes: total,
        free_bytes: used.map(|u| total.saturating_sub(u)),
        used_bytes: used,
        compute_capability: None,
        bandwidth_bytes_per_s: model.map(|m| m.bandwidth_bytes_per_s),
        supports_bf16: model.is_some_and(|m| m.supports_bf16),
        supports_flash_attention: model.is_some_and(|m| m.flash_attention_2),
        unified_memory: unified,
        memory_estimated: false,
        catalog_id: model.map(|m| m.id.clone()),
        bf16_tflops: model.and_then(|m| m.bf16_tflops),
    }
}

fn read(dir: &Path, file: &str) -> Option<String> {
    fs::read_to_string(dir.join(file)).ok()
}

/// Reads `<root>/class/drm/card<N>/device/*` for every card (connector entries such as
/// `card0-DP-1` are skipped). Returns AMD devices in card order and notes.
///
/// # Errors
/// [`ProbeFailure::Absent`] when `<root>/class/drm` does not exist.
pub fn probe_amd_sysfs(root: &Path) -> Result<(Vec<Device>, Vec<String>), ProbeFailure> {
    let drm = root.join("class").join("drm");
    let entries = fs::read_dir(&drm)
        .map_err(|e| ProbeFailure::Absent(format!("amd sysfs: {}: {e}", drm.display())))?;
    let mut cards: Vec<(u32, String)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let n: u32 = name.strip_prefix("card")?.parse().ok()?;
            Some((n, name))
        })
        .collect();
    cards.sort_unstable();
    let mut devices = Vec::new();
    let mut notes = Vec::new();
    let module = root.join("module");
    let ttm_pages_limit = ["ttm", "amdttm"]
        .iter()
        .find_map(|m| read(&module.join(m).join("parameters"), "pages_limit"));
    for (_, card) in cards {
        let dir = drm.join(&card).join("device");
        let files = AmdCardFiles {
            vendor: read(&dir, "vendor"),
            device: read(&dir, "device"),
            product_name: read(&dir, "product_name"),
            vram_total: read(&dir, "mem_info_vram_total"),
            vram_used: read(&dir, "mem_info_vram_used"),
            gtt_total: read(&dir, "mem_info_gtt_total"),
            ttm_pages_limit: ttm_pages_limit.clone(),
            card,
        };
        match amd_sysfs_device(&files) {
            Ok(Some(d)) => devices.push(d),
            Ok(None) => {}
            Err(e) => notes.push(e),
        }
    }
    Ok((devices, notes))
}

/// Parses `rocm-smi --showmeminfo vram --json`: one object keyed `card<N>` with string
/// byte values under `VRAM Total Memory (B)` and `VRAM Total Used Memory (B)` (hardware doc
/// §3, `rocm_smi.py` @a129571). A `Card series` value, when present, names the card.
/// Other top-level keys (`system`) are ignored.
///
/// # Errors
/// A one-line message when the text is not a JSON object.
pub fn parse_rocm_smi_json(text: &str) -> Result<(Vec<Device>, Vec<String>), String> {
    // Tolerate warning lines printed around the JSON object.
    let body = match (text.find('{'), text.rfind('}')) {
        (Some(a), Some(b)) if a < b => &text[a..=b],
        _ => text.trim(),
    };
    let value: serde_json::Value =
        serde_json::from_str(body).map_err(|e| format!("rocm-smi: output is not json: {e}"))?;
    let obj = value
        .as_object()
        .ok_or_else(|| "rocm-smi: output is not a json object".to_string())?;
    let mut cards: Vec<(u32, &String, &serde_json::Value)> = obj
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix("card")?.parse().ok()?, k, v)))
        .collect();
    cards.sort_unstable_by_key(|(n, _, _)| *n);
    let mut devices = Vec::new();
    let mut notes = Vec::new();
    for (_, key, card) in cards {
        let field = |name: &str| -> Option<u64> {
            let v = card.get(name)?;
            v.as_str()
                .and_then(|s| s.trim().parse().ok())
                .or_else(|| v.as_u64())
        };
        let Some(total) = field("VRAM Total Memory (B)").filter(|&t| t > 0) else {
            notes.push(format!("rocm-smi: {key}: no `VRAM Total Memory (B)`"));
            continue;
        };
        let used = field("VRAM Total Used Memory (B)").filter(|&u| u <= total);
        let name = card
            .get("Card series")
            .or_else(|| card.get("Card Series"))
            .and_then(|v| v.as_str())
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map_or_else(|| format!("AMD GPU ({key})"), str::to_string);
        devices.push(amd_device(name, total, used, false));
    }
    Ok((devices, notes))
}

/// Runs rocm-smi and parses it.
///
/// # Errors
/// [`ProbeFailure`] when rocm-smi is missing, hangs, fails or prints no JSON.
pub fn probe_rocm_smi(
    program: &str,
    timeout: Duration,
) -> Result<(Vec<Device>, Vec<String>), ProbeFailure> {
    match process::run(program, &["--showmeminfo", "vram", "--json"], timeout) {
        Err(RunError::NotFound) => Err(ProbeFailure::Absent("rocm-smi: not found".into())),
        Err(e) => Err(ProbeFailure::Failed(format!("rocm-smi: {e}"))),
        Ok(o) if !o.success() => Err(ProbeFailure::Failed(format!(
            "rocm-smi: exit code {}: {}",
            o.code.map_or_else(|| "none".to_string(), |c| c.to_string()),
            o.first_line()
        ))),
        Ok(o) => parse_rocm_smi_json(&o.stdout).map_err(ProbeFailure::Failed),
    }
}
