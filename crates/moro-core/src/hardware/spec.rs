//! The `--hardware` value: [`parse_hardware_spec`].

use super::catalog::{catalog, preset};
use super::names::{
    contains_token, exact_candidates, name_candidates, names_of, nearest_presets, normalize,
};
use super::{
    Device, GpuModel, Hardware, HardwareSpec, HwError, MAX_GPU_COUNT, MIN_GENERIC_BYTES, Vendor,
};
use crate::units::{GIB, parse_size};

/// Parses the `--hardware` value.
///
/// Accepted forms (comma-separated lists of them are concatenated):
/// - `detect`: probe this machine ([`HardwareSpec::Detect`]).
/// - a preset id: `rtx-4090`, `a100-sxm4-80gb`, `h100-sxm`, …; Apple chips with their RAM
///   size, `apple-m3-max-64gb` (the GPU limit for 64 GiB, see
///   [`apple_gpu_limit`](super::apple_gpu_limit)).
/// - a GPU name as nvidia-smi prints it (`NVIDIA GeForce RTX 4090`), table-truncated names
///   (`NVIDIA RTX 6000 Ada Gene...`), or a unique part of one (`rtx 4090`).
/// - a memory size with a unit: `24GiB`, `80GB` (a generic device, [`Device::generic`]).
/// - any of these with a count: `8xh100-sxm`, `8×h100-sxm`, `2x24GiB`.
///
/// # Errors
/// [`HwError`] naming the unknown, ambiguous or malformed part; unknown names carry the
/// three nearest preset ids.
pub fn parse_hardware_spec(spec: &str) -> Result<HardwareSpec, HwError> {
    let spec = spec.trim();
    if spec.is_empty() {
        return Err(HwError::Invalid(
            "empty value; use `detect`, a preset such as `rtx-4090`, or a size such as `24GiB`"
                .into(),
        ));
    }
    if spec.eq_ignore_ascii_case("detect") || spec.eq_ignore_ascii_case("auto") {
        return Ok(HardwareSpec::Detect);
    }
    let mut devices = Vec::new();
    for part in spec.split(',') {
        let part = part.trim();
        if part.is_empty() {
            return Err(HwError::Invalid(format!("empty entry in `{spec}`")));
        }
        if part.eq_ignore_ascii_case("detect") {
            return Err(HwError::Invalid(
                "`detect` cannot be combined with named hardware".into(),
            ));
        }
        let (count, rest) = split_count(part)?;
        let device = parse_one(rest)?;
        for _ in 0..count {
            devices.push(device.clone());
        }
    }
    Ok(HardwareSpec::Given(Hardware { devices }))
}

/// Splits `8xh100-sxm` / `8 × h100-sxm` / `8*24GiB` into `(8, "h100-sxm")`; no count → 1.
fn split_count(part: &str) -> Result<(u32, &str), HwError> {
    let digits = part
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(part.len());
    if digits == 0 {
        return Ok((1, part));
    }
    let after = part[digits..].trim_start();
    let Some(rest) = ['x', 'X', '×', '*']
        .iter()
        .find_map(|sep| after.strip_prefix(*sep))
    else {
        return Ok((1, part));
    };
    let rest = rest.trim();
    if rest.is_empty() {
        return Err(HwError::Invalid(format!(
            "`{part}` has a gpu count but no gpu; use e.g. `8xh100-sxm`"
        )));
    }
    let count: u32 = part[..digits].parse().unwrap_or(u32::MAX);
    if count == 0 || count > MAX_GPU_COUNT {
        return Err(HwError::Invalid(format!(
            "gpu count in `{part}` must be between 1 and {MAX_GPU_COUNT}"
        )));
    }
    Ok((count, rest))
}

/// One device from a preset id, Apple id with RAM size, GPU name or size.
fn parse_one(text: &str) -> Result<Device, HwError> {
    if let Some(m) = preset(text) {
        return preset_device(m, None, text);
    }
    if let Some((m, ram)) = split_apple_size(text) {
        return preset_device(m, Some(ram), text);
    }
    let starts_with_digit = text.starts_with(|c: char| c.is_ascii_digit());
    let has_unit = text.chars().any(|c| c.is_ascii_alphabetic());
    if starts_with_digit
        && has_unit
        && let Ok(bytes) = parse_size(text)
    {
        if bytes < MIN_GENERIC_BYTES {
            return Err(HwError::Invalid(format!(
                "size `{text}` is below 1 GiB; did you mean GB?"
            )));
        }
        return Ok(Device::generic(bytes));
    }
    let candidates = spec_candidates(text);
    match candidates.as_slice() {
        [one] => preset_device(one, None, text),
        [] => Err(HwError::Unknown {
            input: text.to_string(),
            nearest: nearest_presets(text),
        }),
        many => Err(HwError::Ambiguous {
            input: text.to_string(),
            candidates: many.iter().map(|m| m.id.clone()).collect(),
        }),
    }
}

/// Name candidates for a hand-typed value: exact or truncated names, then catalog names
/// that contain the typed words (`rtx 4090`, `4090`, `H100 PCIe`).
fn spec_candidates(text: &str) -> Vec<&'static GpuModel> {
    let exact = exact_candidates(text);
    if !exact.is_empty() {
        return exact;
    }
    let n = normalize(text);
    if n.len() < 2 {
        return Vec::new();
    }
    let typed: Vec<&'static GpuModel> = catalog()
        .iter()
        .filter(|m| names_of(m).any(|x| contains_token(&x, &n)))
        .collect();
    if typed.is_empty() {
        // A detected-style name longer than any catalog name.
        name_candidates(text)
    } else {
        typed
    }
}

fn preset_device(m: &GpuModel, ram: Option<u64>, input: &str) -> Result<Device, HwError> {
    if m.vendor == Vendor::Apple && ram.is_none() {
        let sizes: Vec<String> = m
            .unified_memory_gb_options
            .iter()
            .map(|g| format!("{}-{g}gb", m.id))
            .collect();
        return Err(HwError::Invalid(format!(
            "`{input}` needs the unified memory size, e.g. {}",
            sizes.join(", ")
        )));
    }
    m.to_device(ram).ok_or_else(|| {
        HwError::Invalid(format!(
            "preset `{}` has no memory size in the catalog",
            m.id
        ))
    })
}

/// `apple-m3-max-64gb` / `Apple M3 Max 64GB` → (apple-m3-max, 64 GiB).
fn split_apple_size(text: &str) -> Option<(&'static GpuModel, u64)> {
    let t = text.trim();
    let cut = t.rfind(['-', ' '])?;
    let (head, size) = (&t[..cut], &t[cut + 1..]);
    if !size.starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    let ram = parse_size(size).ok()?;
    let model = preset(head).or_else(|| match exact_candidates(head).as_slice() {
        [one] => Some(*one),
        _ => None,
    })?;
    (model.vendor == Vendor::Apple && ram >= GIB).then_some((model, ram))
}

#[cfg(test)]
mod tests {
    use super::super::{apple_gpu_limit, match_detected, match_name};
    use super::*;
    use crate::units::MIB;

    fn given(spec: &str) -> Hardware {
        match parse_hardware_spec(spec) {
            Ok(HardwareSpec::Given(h)) => h,
            other => panic!("{spec}: {other:?}"),
        }
    }

    #[test]
    fn detect_and_presets() {
        assert_eq!(parse_hardware_spec("detect"), Ok(HardwareSpec::Detect));
        assert_eq!(parse_hardware_spec(" DETECT "), Ok(HardwareSpec::Detect));
        let h = given("rtx-4090");
        assert_eq!(h.devices.len(), 1);
        let d = &h.devices[0];
        assert_eq!(d.name, "NVIDIA GeForce RTX 4090");
        assert_eq!(d.total_bytes, 24564 * MIB);
        assert_eq!(d.compute_capability, Some((8, 9)));
        assert_eq!(d.bandwidth_bytes_per_s, Some(1_008_000_000_000));
        assert!(d.supports_bf16 && d.supports_flash_attention && !d.unified_memory);
        assert_eq!(d.catalog_id.as_deref(), Some("rtx-4090"));
        assert_eq!(given("RTX-3060-12GB").devices[0].total_bytes, 12288 * MIB);
        assert_eq!(given("a100-sxm4-80gb").devices[0].total_bytes, 81920 * MIB);
    }

    #[test]
    fn counts() {
        for spec in [
            "8xh100-sxm",
            "8×h100-sxm",
            "8 x h100-sxm",
            "8Xh100-sxm",
            "8*h100-sxm",
        ] {
            let h = given(spec);
            assert_eq!(h.devices.len(), 8, "{spec}");
            assert!(
                h.devices
                    .iter()
                    .all(|d| d.catalog_id.as_deref() == Some("h100-sxm"))
            );
        }
        let h = given("2x24GiB");
        assert_eq!(h.devices.len(), 2);
        assert_eq!(h.min_total_bytes(), Some(24 * GIB));
        let mixed = given("rtx-4090, rtx-3090");
        assert_eq!(mixed.devices.len(), 2);
        assert_eq!(mixed.min_total_bytes(), Some(24564 * MIB));
        assert!(matches!(
            parse_hardware_spec("0xh100-sxm"),
            Err(HwError::Invalid(_))
        ));
        assert!(matches!(
            parse_hardware_spec("8x"),
            Err(HwError::Invalid(_))
        ));
        assert!(matches!(
            parse_hardware_spec("99999999999999999999xh100-sxm"),
            Err(HwError::Invalid(_))
        ));
        assert!(matches!(
            parse_hardware_spec("2000xrtx-4090"),
            Err(HwError::Invalid(_))
        ));
    }

    #[test]
    fn sizes() {
        let d = &given("24GiB").devices[0];
        assert_eq!(d.total_bytes, 24 * GIB);
        assert_eq!(d.vendor, Vendor::Generic);
        assert_eq!(d.name, "generic 24 GiB GPU");
        assert_eq!(given("80GB").devices[0].total_bytes, 80 * GIB);
        assert_eq!(given("16384MiB").devices[0].total_bytes, 16 * GIB);
        let err = parse_hardware_spec("24MB").unwrap_err().to_string();
        assert!(err.contains("below 1 GiB"), "{err}");
    }

    #[test]
    fn nvidia_smi_names() {
        let d = &given("NVIDIA H100 80GB HBM3").devices[0];
        assert_eq!(d.catalog_id.as_deref(), Some("h100-sxm"));
        // Table-truncated names via aliases (hardware doc §2.3).
        let d = &given("NVIDIA RTX 6000 Ada Gene...").devices[0];
        assert_eq!(d.catalog_id.as_deref(), Some("rtx-6000-ada"));
        let d = &given("NVIDIA GeForce RTX 4080 ...").devices[0];
        assert_eq!(d.catalog_id.as_deref(), Some("rtx-4080-super"));
        // Older driver without the NVIDIA prefix.
        let d = &given("GeForce RTX 2080 Ti").devices[0];
        assert_eq!(d.catalog_id.as_deref(), Some("rtx-2080-ti"));
        let d = &given("Tesla T4").devices[0];
        assert_eq!(d.catalog_id.as_deref(), Some("t4"));
        // Unique words.
        assert_eq!(
            given("rtx 4090").devices[0].catalog_id.as_deref(),
            Some("rtx-4090")
        );
        assert_eq!(
            given("4090").devices[0].catalog_id.as_deref(),
            Some("rtx-4090")
        );
    }

    #[test]
    fn shared_names_are_ambiguous_by_hand() {
        match parse_hardware_spec("NVIDIA GeForce RTX 3080") {
            Err(HwError::Ambiguous { candidates, .. }) => {
                assert_eq!(candidates, ["rtx-3080-10gb", "rtx-3080-12gb"]);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse_hardware_spec("h100"),
            Err(HwError::Ambiguous { .. })
        ));
    }

    #[test]
    fn apple_needs_and_takes_a_size() {
        let d = &given("apple-m3-max-64gb").devices[0];
        assert_eq!(d.total_bytes, 48 * GIB);
        assert!(d.unified_memory && d.memory_estimated && !d.supports_flash_attention);
        assert_eq!(d.name, "Apple M3 Max (64 GiB unified)");
        assert_eq!(d.vendor, Vendor::Apple);
        assert_eq!(d.bandwidth_bytes_per_s, Some(400_000_000_000));
        let d = &given("Apple M2 16GB").devices[0];
        assert_eq!(d.total_bytes, apple_gpu_limit(16 * GIB));
        let err = parse_hardware_spec("apple-m3-max").unwrap_err().to_string();
        assert!(err.contains("apple-m3-max-64gb"), "{err}");
        assert_eq!(given("2xapple-m2-ultra-192gb").devices.len(), 2);
    }

    #[test]
    fn unknown_names_suggest_nearest_presets() {
        match parse_hardware_spec("rtx-4900") {
            Err(HwError::Unknown { nearest, .. }) => {
                assert_eq!(nearest.len(), 3);
                assert!(nearest.contains(&"rtx-4090".to_string()), "{nearest:?}");
            }
            other => panic!("{other:?}"),
        }
        let msg = parse_hardware_spec("h100-sxn").unwrap_err().to_string();
        assert!(
            msg.starts_with("--hardware: unknown gpu `h100-sxn`; nearest presets: h100-sxm"),
            "{msg}"
        );
        assert!(!msg.contains('\n'));
    }

    #[test]
    fn garbage_never_panics() {
        for s in [
            "",
            " ",
            ",",
            "x",
            "8",
            "0",
            "-1",
            "…",
            "××",
            "1x",
            "x8",
            "apple-",
            "apple-m3-max-",
            "apple-m3-max-0gb",
            "apple-m3-max-lots",
            "NVIDIA ...",
            "...",
            "1e400GiB",
            "NaNGiB",
            "\u{0}",
            "🦀",
            "9x🦀",
            "24 GiB",
            "rtx-4090,",
            ",rtx-4090",
            "detect,rtx-4090",
        ] {
            let _ = parse_hardware_spec(s);
            let _ = match_name(s);
            let _ = match_detected(s, 0);
            let _ = nearest_presets(s);
        }
        assert!(parse_hardware_spec("").is_err());
        assert!(parse_hardware_spec("detect,rtx-4090").is_err());
    }

    #[test]
    fn errors_are_one_line_lowercase() {
        for s in ["", "8x", "0xrtx-4090", "24MB", "apple-m1", "zzz", "rtx 30"] {
            let e = parse_hardware_spec(s).unwrap_err().to_string();
            assert!(e.starts_with("--hardware: "), "{e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }
}
