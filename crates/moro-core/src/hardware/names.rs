//! GPU names to catalog entries: detected and hand-typed names, and the nearest preset ids.

use super::GpuModel;
use super::catalog::catalog;

/// Lower case, whitespace collapsed.
pub(super) fn normalize(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase()
}

/// Names without the vendor prefix older drivers omitted (`GeForce RTX 2080 Ti` for
/// `NVIDIA GeForce RTX 2080 Ti`, hardware doc §2.3).
fn strip_vendor(normalized: &str) -> &str {
    normalized
        .strip_prefix("nvidia ")
        .or_else(|| normalized.strip_prefix("amd "))
        .unwrap_or(normalized)
}

pub(super) fn names_of(model: &GpuModel) -> impl Iterator<Item = String> + '_ {
    std::iter::once(normalize(&model.name)).chain(model.aliases.iter().map(|a| normalize(a)))
}

/// Whether a (detected) name belongs to a laptop part, which must not match the desktop
/// entry by substring (hardware doc §2.3).
fn is_laptop(normalized: &str) -> bool {
    normalized.contains("laptop") || normalized.contains("mobile")
}

/// Catalog entries whose name or alias equals `name` (normalised, vendor prefix optional),
/// or, for a table-truncated `...` name, starts with it.
pub(super) fn exact_candidates(name: &str) -> Vec<&'static GpuModel> {
    let n = normalize(name);
    if n.is_empty() {
        return Vec::new();
    }
    let bare = strip_vendor(&n);
    let mut out: Vec<&'static GpuModel> = catalog()
        .iter()
        .filter(|m| names_of(m).any(|x| x == n || strip_vendor(&x) == bare))
        .collect();
    if out.is_empty()
        && let Some(prefix) = bare.strip_suffix("...")
    {
        let prefix = prefix.trim_end();
        if prefix.len() >= 8 {
            out = catalog()
                .iter()
                .filter(|m| names_of(m).any(|x| strip_vendor(&x).starts_with(prefix)))
                .collect();
        }
    }
    out
}

/// Among `candidates`, the one whose reported memory is nearest `total_bytes` (the way to
/// tell the 10 and 12 GB RTX 3080 apart, hardware doc §2.3).
fn nearest_by_memory(
    candidates: &[&'static GpuModel],
    total_bytes: u64,
) -> Option<&'static GpuModel> {
    candidates
        .iter()
        .copied()
        .min_by_key(|m| m.memory_bytes.map_or(u64::MAX, |b| b.abs_diff(total_bytes)))
}

/// The catalog entry for a detected GPU name (NVML / nvidia-smi / rocm-smi / sysctl), to
/// enrich a detected device with bandwidth, bf16 and FlashAttention support. Exact
/// normalised name or alias first, then the longest catalog name contained in `name`
/// (laptop parts never match desktop entries). `None` when unknown or when the name is
/// shared by several boards (RTX 3080 10/12 GB): use [`match_detected`] with the memory
/// size for those.
#[must_use]
pub fn match_name(name: &str) -> Option<&'static GpuModel> {
    let c = name_candidates(name);
    match c.as_slice() {
        [one] => Some(one),
        _ => None,
    }
}

/// Like [`match_name`], but a name shared by several boards is resolved by the reported
/// total memory.
#[must_use]
pub fn match_detected(name: &str, total_bytes: u64) -> Option<&'static GpuModel> {
    let c = name_candidates(name);
    match c.as_slice() {
        [] => None,
        [one] => Some(one),
        many => nearest_by_memory(many, total_bytes),
    }
}

pub(super) fn name_candidates(name: &str) -> Vec<&'static GpuModel> {
    let exact = exact_candidates(name);
    if !exact.is_empty() {
        return exact;
    }
    let n = normalize(name);
    let bare = strip_vendor(&n);
    if is_laptop(bare) {
        return Vec::new();
    }
    // Longest contained catalog name wins ("rtx 4070 ti" before "rtx 4070").
    let mut best: Vec<&'static GpuModel> = Vec::new();
    let mut best_len = 0;
    for m in catalog() {
        for x in names_of(m) {
            let pat = strip_vendor(&x).to_string();
            if pat.ends_with("...") || pat.len() < 4 {
                continue;
            }
            if contains_token(bare, &pat) {
                if pat.len() > best_len {
                    best_len = pat.len();
                    best.clear();
                }
                if pat.len() == best_len && !best.iter().any(|b| b.id == m.id) {
                    best.push(m);
                }
            }
        }
    }
    best
}

/// `haystack` contains `needle` starting and ending at word boundaries, so `rtx 4070`
/// is not found in `rtx 40700`.
pub(super) fn contains_token(haystack: &str, needle: &str) -> bool {
    let is_word = |c: char| c.is_ascii_alphanumeric();
    haystack.match_indices(needle).any(|(i, _)| {
        let before = haystack[..i].chars().next_back();
        let after = haystack[i + needle.len()..].chars().next();
        !before.is_some_and(is_word) && !after.is_some_and(is_word)
    })
}

/// The three preset ids nearest `input` by edit distance (ties in catalog order).
#[must_use]
pub fn nearest_presets(input: &str) -> Vec<String> {
    let n = normalize(input);
    let mut scored: Vec<(usize, usize, &str)> = catalog()
        .iter()
        .enumerate()
        .map(|(i, m)| (crate::catalog::levenshtein(&n, &m.id), i, m.id.as_str()))
        .collect();
    scored.sort_unstable();
    scored
        .into_iter()
        .take(3)
        .map(|(_, _, id)| id.to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::MIB;

    #[test]
    fn match_name_enriches_detected_devices() {
        assert_eq!(
            match_name("NVIDIA GeForce RTX 4090").unwrap().id,
            "rtx-4090"
        );
        assert_eq!(
            match_name("NVIDIA A100 80GB PCIe").unwrap().id,
            "a100-pcie-80gb"
        );
        assert_eq!(match_name("NVIDIA GH200 120GB").unwrap().id, "gh200");
        // Longest contained name wins.
        assert_eq!(
            match_name("NVIDIA GeForce RTX 4070 Ti SUPER").unwrap().id,
            "rtx-4070-ti-super"
        );
        // MIG device names contain the parent's name.
        assert_eq!(
            match_name("NVIDIA A100-SXM4-40GB MIG 1g.5gb").unwrap().id,
            "a100-sxm4-40gb"
        );
        // Laptop parts do not match desktop entries.
        assert!(match_name("NVIDIA GeForce RTX 4090 Laptop GPU").is_none());
        // Shared names need memory.
        assert!(match_name("NVIDIA GeForce RTX 3080").is_none());
        assert_eq!(
            match_detected("NVIDIA GeForce RTX 3080", 10240 * MIB)
                .unwrap()
                .id,
            "rtx-3080-10gb"
        );
        assert_eq!(
            match_detected("NVIDIA GeForce RTX 3080", 12288 * MIB)
                .unwrap()
                .id,
            "rtx-3080-12gb"
        );
        assert_eq!(match_name("Apple M2 Max").unwrap().id, "apple-m2-max");
        assert_eq!(match_name("AMD Instinct MI300X").unwrap().id, "mi300x");
        assert!(match_name("Some Other GPU").is_none());
        // Word boundaries: 40700 is not a 4070.
        assert!(match_name("NVIDIA GeForce RTX 40700").is_none());
    }
}
