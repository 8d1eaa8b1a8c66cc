//! The hardware a recipe is searched for: `--hardware`, clusters, capabilities, layouts.

use anyhow::Result;
use moro_core::hardware::{Device, HardwareSpec, parse_hardware_spec};
use moro_core::job::Job;
use moro_core::search::{Caps, Cluster, Layout};

use crate::error::user;
use crate::hw::Target;

/// Search capabilities of a target. Usable memory: the smallest GPU's total, or for
/// detected GPUs what is free on them now (other processes hold the rest). bf16 and
/// FlashAttention only when every GPU has them.
pub(crate) fn caps_of(target: &Target) -> Option<Caps> {
    let devices = &target.hardware.devices;
    let first = devices.first()?;
    let usable = devices
        .iter()
        .map(|d| {
            if target.detected {
                d.free_bytes.unwrap_or(d.total_bytes)
            } else {
                d.total_bytes
            }
        })
        .min()?;
    Some(Caps {
        usable_bytes: usable,
        bf16: devices.iter().all(|d| d.supports_bf16),
        flash_attention: devices.iter().all(|d| d.supports_flash_attention),
        profile: crate::setup::machine_profile(Some(first)).0,
        host_bytes: None,
        bitsandbytes: devices
            .iter()
            .all(|d| d.vendor != moro_core::hardware::Vendor::Apple),
        triton: devices
            .iter()
            .all(|d| d.vendor != moro_core::hardware::Vendor::Apple),
    })
}

/// Search capabilities of one catalog device, with this machine's calibration profile and
/// corrections for that GPU.
pub(crate) fn caps_of_device(d: &Device) -> Caps {
    Caps {
        profile: crate::setup::machine_profile(Some(d)).0,
        ..Caps::of_device(d)
    }
}

/// Parses `--host-memory` (`2TiB`, `1536GiB`).
pub(crate) fn parse_host_memory(s: &str) -> Result<u64, String> {
    moro_core::units::parse_size(s)
}

pub(crate) use moro_core::search::alternatives::{DEFAULT_GPUS_PER_NODE, exact_cluster};

/// A cluster spec `NODES×GPUS×rest` (`2x8xh100-sxm`): `(nodes, gpus per node, rest)`.
/// `None` for anything else (a preset, `8xh100-sxm`, a list).
pub(crate) fn parse_cluster_spec(spec: &str) -> Option<(u64, u64, &str)> {
    fn count(s: &str) -> Option<(u64, &str)> {
        let s = s.trim_start();
        let digits = s.find(|c: char| !c.is_ascii_digit())?;
        let n: u64 = s[..digits].parse().ok()?;
        let rest = s[digits..].trim_start();
        let rest = ['x', 'X', '×', '*']
            .iter()
            .find_map(|sep| rest.strip_prefix(*sep))?;
        (n > 0).then_some((n, rest))
    }
    if spec.contains(',') {
        return None;
    }
    let (nodes, rest) = count(spec)?;
    let (per, rest) = count(rest)?;
    let rest = rest.trim();
    (!rest.is_empty()).then_some((nodes, per, rest))
}

/// Resolves `--hardware`, accepting a cluster spec (`2x8xh100-sxm`, normalized to
/// `16xh100-sxm` for the hardware parser), and the cluster the search may spread over:
/// `None` for one GPU; `N×preset` is one node up to [`DEFAULT_GPUS_PER_NODE`] GPUs, and
/// nodes of that many above it when they divide `N`.
pub(crate) fn resolve_target(spec: &str) -> Result<(Target, Option<Cluster>)> {
    let (target, nodes) = match parse_cluster_spec(spec) {
        Some((nodes, per, rest)) => {
            let total = nodes
                .checked_mul(per)
                .filter(|t| *t <= u64::from(moro_core::hardware::MAX_GPU_COUNT))
                .ok_or_else(|| {
                    user(format!(
                        "--hardware `{spec}`: at most {} GPUs in all",
                        moro_core::hardware::MAX_GPU_COUNT
                    ))
                })?;
            let flat = format!("{total}x{rest}");
            let Some(t) = crate::hw::resolve(Some(&flat), None)? else {
                return Err(user("--hardware: empty value"));
            };
            (t, Some((nodes, per)))
        }
        None => {
            let Some(t) = crate::hw::resolve(Some(spec), None)? else {
                return Err(user("--hardware: empty value"));
            };
            (t, None)
        }
    };
    let n = target.hardware.devices.len() as u64;
    let cluster = match nodes {
        _ if n <= 1 => None,
        Some((nodes, per)) => Some(Cluster {
            nodes,
            gpus_per_node: per,
            exact: false,
            offload: true,
        }),
        None if n > DEFAULT_GPUS_PER_NODE && n.is_multiple_of(DEFAULT_GPUS_PER_NODE) => {
            Some(Cluster {
                nodes: n / DEFAULT_GPUS_PER_NODE,
                gpus_per_node: DEFAULT_GPUS_PER_NODE,
                exact: false,
                offload: true,
            })
        }
        None => Some(Cluster::node(n)),
    };
    Ok((target, cluster))
}

/// The layout of a job (for display).
pub(crate) fn layout_of(job: &Job) -> Layout {
    let p = &job.parallel;
    Layout {
        gpus: p.gpus(),
        // The job's own node count; a job that does not give one (1) spans nodes of
        // [`DEFAULT_GPUS_PER_NODE`].
        nodes: if p.nodes > 1 {
            p.nodes
        } else {
            p.gpus().div_ceil(DEFAULT_GPUS_PER_NODE)
        },
        sharding: p.sharding,
        offload: p.offload,
    }
}

/// The catalog preset a recipe names: the hand-typed preset (count stripped), or the
/// detected GPU's catalog id.
pub(super) fn preset_of(target: &Target) -> Option<String> {
    let first = target.hardware.devices.first()?;
    if !target.detected && !target.spec.contains(',') {
        let spec = target.spec.trim();
        let rest = spec
            .split_once(['x', 'X', '×', '*'])
            .filter(|(n, _)| !n.is_empty() && n.trim().chars().all(|c| c.is_ascii_digit()))
            .map_or(spec, |(_, r)| r.trim());
        if let Ok(HardwareSpec::Given(h)) = parse_hardware_spec(rest)
            && h.devices.first().is_some_and(|d| d.catalog_id.is_some())
        {
            return Some(rest.to_owned());
        }
    }
    first.catalog_id.clone()
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(crate) fn target_of(spec: &str) -> Target {
        match parse_hardware_spec(spec).unwrap() {
            HardwareSpec::Given(hardware) => Target {
                hardware,
                detected: false,
                spec: spec.to_owned(),
            },
            HardwareSpec::Detect => unreachable!(),
        }
    }

    #[test]
    fn cluster_specs() {
        assert_eq!(parse_cluster_spec("2x8xh100-sxm"), Some((2, 8, "h100-sxm")));
        assert_eq!(
            parse_cluster_spec("4 × 8 × a100-sxm4-80gb"),
            Some((4, 8, "a100-sxm4-80gb"))
        );
        assert_eq!(parse_cluster_spec("8xh100-sxm"), None);
        assert_eq!(parse_cluster_spec("h100-sxm"), None);
        assert_eq!(parse_cluster_spec("2x8x"), None);
        assert_eq!(parse_cluster_spec("0x8xh100-sxm"), None);
        assert_eq!(parse_cluster_spec("2x8xh100-sxm,rtx-4090"), None);
        let (t, c) = resolve_target("2x8xh100-sxm").unwrap();
        assert_eq!(t.hardware.devices.len(), 16);
        assert_eq!(t.spec, "16xh100-sxm");
        assert_eq!(preset_of(&t).as_deref(), Some("h100-sxm"));
        let c = c.unwrap();
        assert_eq!((c.nodes, c.gpus_per_node, c.exact), (2, 8, false));
        let (_, c) = resolve_target("16xh100-sxm").unwrap();
        assert_eq!(c.map(|c| (c.nodes, c.gpus_per_node)), Some((2, 8)));
        let (_, c) = resolve_target("8xh100-sxm").unwrap();
        assert_eq!(c.map(|c| (c.nodes, c.gpus_per_node)), Some((1, 8)));
        let (_, c) = resolve_target("h100-sxm").unwrap();
        assert!(c.is_none());
        assert!(resolve_target("1000x8xh100-sxm").is_err());
    }

    #[test]
    fn preset_of_strips_counts_and_keeps_apple_sizes() {
        assert_eq!(
            preset_of(&target_of("rtx-4090")).as_deref(),
            Some("rtx-4090")
        );
        assert_eq!(
            preset_of(&target_of("2xa100-sxm4-80gb")).as_deref(),
            Some("a100-sxm4-80gb")
        );
        assert_eq!(
            preset_of(&target_of("apple-m3-max-64gb")).as_deref(),
            Some("apple-m3-max-64gb")
        );
        assert_eq!(preset_of(&target_of("24GiB")), None);
    }
}
