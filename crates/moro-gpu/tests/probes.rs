//! Probes over captured outputs (`tests/fixtures/`, provenance in the READMEs there).

use std::path::{Path, PathBuf};
use std::time::Duration;

use moro_core::hardware::Vendor;
use moro_core::units::{GIB, MIB};
use moro_gpu::amd::{AmdCardFiles, amd_sysfs_device, parse_rocm_smi_json, probe_amd_sysfs};
use moro_gpu::apple::{AppleSysctl, apple_device};
use moro_gpu::nvidia::{
    NvidiaReading, ProbeFailure, QUERY_FIELDS, QUERY_FIELDS_OLD, bandwidth_from_clock,
    is_unknown_field_error, nvidia_device, parse_query_gpu, reconcile_bandwidth,
};

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(rel)
}

fn text(rel: &str) -> String {
    std::fs::read_to_string(fixture(rel)).unwrap()
}

// ---- nvidia-smi ----

#[test]
fn nvidia_smi_documented_capture_with_uuid_and_driver() {
    let fields = ["name", "uuid", "driver_version", "memory.total"];
    let (r, notes) = parse_query_gpu(
        &fields,
        &text("nvidia-smi/a100-80gb-pcie.name-uuid-driver-total.csv"),
    );
    assert!(notes.is_empty(), "{notes:?}");
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].name, "NVIDIA A100 80GB PCIe");
    assert_eq!(r[0].total_bytes, 81920 * MIB);
    assert_eq!(r[0].compute_capability, None);
    let d = nvidia_device(&r[0]);
    assert_eq!(d.catalog_id.as_deref(), Some("a100-pcie-80gb"));
    // cc, bf16, FA and bandwidth come from the catalog when nvidia-smi gave none.
    assert_eq!(d.compute_capability, Some((8, 0)));
    assert!(d.supports_bf16 && d.supports_flash_attention);
    assert_eq!(d.bandwidth_bytes_per_s, Some(1_935_000_000_000));
}

#[test]
fn nvidia_smi_values_with_units() {
    let fields = [
        "memory.used",
        "memory.total",
        "power.limit",
        "clocks.max.memory",
    ];
    let (r, notes) = parse_query_gpu(
        &fields,
        &text("nvidia-smi/units.used-total-power-clock.csv"),
    );
    assert!(notes.is_empty(), "{notes:?}");
    assert_eq!(r[0].used_bytes, Some(1024 * MIB));
    assert_eq!(r[0].total_bytes, 49140 * MIB);
    assert_eq!(r[0].max_memory_clock_mhz, Some(1800));
}

#[test]
fn nvidia_smi_eight_h100() {
    let (r, notes) = parse_query_gpu(&QUERY_FIELDS, &text("nvidia-smi/8x-h100.query.csv"));
    assert!(notes.is_empty(), "{notes:?}");
    assert_eq!(r.len(), 8);
    assert_eq!(
        r.iter().map(|g| g.index).collect::<Vec<_>>(),
        (0..8).map(Some).collect::<Vec<_>>()
    );
    let d = nvidia_device(&r[7]);
    assert_eq!(d.total_bytes, 81559 * MIB);
    assert_eq!(d.free_bytes, Some(81008 * MIB));
    assert_eq!(d.used(), Some(0));
    assert_eq!(d.compute_capability, Some((9, 0)));
    assert_eq!(d.catalog_id.as_deref(), Some("h100-sxm"));
    assert_eq!(d.bandwidth_bytes_per_s, Some(3_350_000_000_000));
}

#[test]
fn nvidia_smi_mig_row_is_flagged() {
    let (r, notes) = parse_query_gpu(&QUERY_FIELDS, &text("nvidia-smi/h100-mig.query.csv"));
    assert_eq!(r.len(), 1);
    assert!(r[0].mig_enabled);
    assert_eq!(r[0].used_bytes, Some(87 * MIB));
    assert_eq!(notes.len(), 1);
    assert!(notes[0].contains("MIG enabled"), "{notes:?}");
}

#[test]
fn nvidia_smi_placeholders_and_shared_names() {
    let (r, notes) = parse_query_gpu(&QUERY_FIELDS, &text("nvidia-smi/mixed.query.csv"));
    // The GH200 row has no memory.total and is skipped with a note.
    assert_eq!(r.len(), 3, "{r:?}");
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(notes[0].contains("memory.total `[N/A]`"), "{notes:?}");

    let rtx3080 = nvidia_device(&r[0]);
    assert_eq!(rtx3080.catalog_id.as_deref(), Some("rtx-3080-10gb"));
    assert_eq!(rtx3080.bandwidth_bytes_per_s, Some(760_000_000_000));

    let t4 = nvidia_device(&r[1]);
    assert_eq!(t4.compute_capability, Some((7, 5)));
    assert!(!t4.supports_bf16 && !t4.supports_flash_attention);

    let rtx4090 = &r[2];
    assert_eq!(rtx4090.used_bytes, None);
    assert_eq!(rtx4090.free_bytes, None);
    assert_eq!(rtx4090.compute_capability, None);
    let d = nvidia_device(rtx4090);
    assert_eq!(d.compute_capability, Some((8, 9)));
    assert!(d.supports_flash_attention);
}

#[test]
fn nvidia_smi_old_driver() {
    assert!(is_unknown_field_error(&text(
        "nvidia-smi/compute-cap-rejected.txt"
    )));
    let (r, notes) = parse_query_gpu(
        &QUERY_FIELDS_OLD,
        &text("nvidia-smi/v100-old-driver.query-old.csv"),
    );
    assert!(notes.is_empty(), "{notes:?}");
    let d = nvidia_device(&r[0]);
    assert_eq!(d.catalog_id.as_deref(), Some("v100-sxm2-16gb"));
    assert_eq!(d.compute_capability, Some((7, 0)));
    assert!(!d.supports_bf16);
    assert_eq!(d.used_bytes, Some(240 * MIB));
}

#[test]
fn nvidia_smi_garbage_gives_notes_not_devices() {
    for t in [
        text("nvidia-smi/no-devices.txt"),
        text("nvidia-smi/compute-cap-rejected.txt"),
        "0, , , , , ,".to_string(),
        "\u{0}\u{1}\u{ff}".to_string(),
        "0, NVIDIA GeForce RTX 4090, 99999999999999999999, 0, 0, 8.9, [N/A]".to_string(),
        "0, NVIDIA GeForce RTX 4090, -5, 0, 0, 8.9, [N/A]".to_string(),
    ] {
        let (r, _) = parse_query_gpu(&QUERY_FIELDS, &t);
        assert!(r.is_empty(), "{t:?} gave {r:?}");
    }
    let (r, notes) = parse_query_gpu(&["name"], "NVIDIA GeForce RTX 4090\n");
    assert!(r.is_empty());
    assert_eq!(notes, ["nvidia-smi: memory.total was not queried"]);
}

// ---- bandwidth ----

#[test]
fn bandwidth_from_clock_matches_the_b200_worked_example() {
    // ml-engineering: B200 nvidia-smi max memory clock 3996 MHz, 8192-bit bus → 8.18 TB/s.
    let bw = bandwidth_from_clock(Some(8192), Some(3996)).unwrap();
    assert_eq!(bw, 8_183_808_000_000);
    assert_eq!(bandwidth_from_clock(None, Some(3996)), None);
    assert_eq!(bandwidth_from_clock(Some(0), Some(3996)), None);
    // Overflow gives no figure rather than a panic.
    assert_eq!(bandwidth_from_clock(Some(u32::MAX), Some(u32::MAX)), None);
    // Within 10% of the catalog's 8.0 TB/s: the measured figure is kept.
    let r = NvidiaReading {
        name: "NVIDIA B200".into(),
        total_bytes: 183_359 * MIB,
        bus_width_bits: Some(8192),
        max_memory_clock_mhz: Some(3996),
        ..NvidiaReading::default()
    };
    assert_eq!(
        nvidia_device(&r).bandwidth_bytes_per_s,
        Some(8_183_808_000_000)
    );
    // Far off (idle clock, odd reporting): the catalog wins.
    assert_eq!(
        reconcile_bandwidth(Some(1_000_000_000_000), Some(8_000_000_000_000)),
        Some(8_000_000_000_000)
    );
    assert_eq!(reconcile_bandwidth(Some(5), None), Some(5));
    assert_eq!(reconcile_bandwidth(None, Some(7)), Some(7));
}

#[test]
fn mig_slices_and_unknown_gpus() {
    let slice = NvidiaReading {
        name: "NVIDIA A100-SXM4-40GB MIG 1g.5gb".into(),
        total_bytes: 4864 * MIB,
        compute_capability: Some((8, 0)),
        mig_enabled: true,
        mig_slice: true,
        ..NvidiaReading::default()
    };
    let d = nvidia_device(&slice);
    assert_eq!(d.total_bytes, 4864 * MIB);
    assert_eq!(d.bandwidth_bytes_per_s, None);
    assert!(d.supports_flash_attention);
    let unknown = NvidiaReading {
        name: "NVIDIA Future GPU".into(),
        total_bytes: 100 * GIB,
        compute_capability: Some((13, 0)),
        ..NvidiaReading::default()
    };
    let d = nvidia_device(&unknown);
    assert_eq!(d.catalog_id, None);
    assert!(d.supports_bf16 && d.supports_flash_attention);
    assert_eq!(d.bandwidth_bytes_per_s, None);
    // A vGPU slice keeps its reported total, not the catalog's.
    let vgpu = NvidiaReading {
        name: "NVIDIA L40S".into(),
        total_bytes: 16384 * MIB,
        ..NvidiaReading::default()
    };
    assert_eq!(nvidia_device(&vgpu).total_bytes, 16384 * MIB);
}

// ---- AMD ----

#[test]
fn amd_sysfs_two_mi300x() {
    let (d, notes) = probe_amd_sysfs(&fixture("sysfs-mi300x")).unwrap();
    assert!(notes.is_empty(), "{notes:?}");
    assert_eq!(d.len(), 2);
    assert_eq!(d[0].name, "AMD Instinct MI300X");
    assert_eq!(d[0].vendor, Vendor::Amd);
    assert_eq!(d[0].total_bytes, 192 * GIB);
    assert_eq!(d[0].used_bytes, Some(293_601_280));
    assert_eq!(d[0].free_bytes, Some(192 * GIB - 293_601_280));
    assert_eq!(d[1].used_bytes, Some(12 * GIB));
    assert_eq!(d[0].catalog_id.as_deref(), Some("mi300x"));
    assert_eq!(d[0].bandwidth_bytes_per_s, Some(5_300_000_000_000));
    assert!(d[0].supports_bf16 && d[0].supports_flash_attention && !d[0].unified_memory);
}

#[test]
fn amd_sysfs_apu_uses_gtt() {
    let (d, _) = probe_amd_sysfs(&fixture("sysfs-apu")).unwrap();
    assert_eq!(d.len(), 1);
    assert!(d[0].unified_memory);
    assert_eq!(d[0].total_bytes, 16_777_216_000);
    assert_eq!(d[0].name, "AMD GPU (card0 0x1681)");
    assert!(!d[0].supports_flash_attention);
}

/// Strix Halo (Ryzen AI Max, PCI id 0x1586): ROCm uses one pool, never both. With a small
/// carve-out it is the GTT, capped by TTM's page limit (a 0.5 GiB carve-out and
/// `ttm.pages_limit=25165824`: 96 GiB; `amdgpu.gttsize` showing 128 GiB while TTM allows
/// 62.47 GiB: 62.47 GiB); with a 96 GiB BIOS carve-out it
/// is the carve-out.
#[test]
fn strix_halo_uses_the_pool_rocm_allocates_from() {
    for (dir, total) in [
        ("sysfs-strix-halo-gtt", 96 * GIB),
        ("sysfs-strix-halo-gttsize", 16_376_000 * 4096),
        ("sysfs-strix-halo-carveout", 96 * GIB),
    ] {
        let (d, notes) = probe_amd_sysfs(&fixture(dir)).unwrap();
        assert!(notes.is_empty(), "{notes:?}");
        assert_eq!(d.len(), 1, "{dir}");
        assert!(d[0].unified_memory, "{dir}");
        assert_eq!(d[0].total_bytes, total, "{dir}");
        assert_eq!(d[0].name, "AMD Radeon 8060S (Ryzen AI Max, Strix Halo)");
    }
}

#[test]
fn amd_sysfs_skips_other_vendors_and_reads_product_name() {
    let (d, notes) = probe_amd_sysfs(&fixture("sysfs-rx7900")).unwrap();
    assert!(notes.is_empty(), "{notes:?}");
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].name, "AMD Radeon RX 7900 XTX");
    assert_eq!(d[0].catalog_id.as_deref(), Some("rx-7900-xtx"));
    assert_eq!(d[0].total_bytes, 25_753_026_560);
    let (d, notes) = probe_amd_sysfs(&fixture("sysfs-nvidia-only")).unwrap();
    assert!(d.is_empty() && notes.is_empty());
}

#[test]
fn amd_sysfs_broken_and_missing() {
    let (d, notes) = probe_amd_sysfs(&fixture("sysfs-broken")).unwrap();
    assert!(d.is_empty());
    assert_eq!(
        notes,
        ["amd sysfs: card0: mem_info_vram_total is missing or not a number of bytes"]
    );
    assert!(matches!(
        probe_amd_sysfs(&fixture("no-such-root")),
        Err(ProbeFailure::Absent(_))
    ));
    // Garbage in every file never panics.
    let f = AmdCardFiles {
        card: "card0".into(),
        vendor: Some("0x1002\n".into()),
        device: Some("\u{ff}".into()),
        product_name: Some("   ".into()),
        vram_total: Some("1".into()),
        vram_used: Some("99999999999999999999999".into()),
        gtt_total: Some("18446744073709551615".into()),
        ttm_pages_limit: Some("18446744073709551615".into()),
    };
    let d = amd_sysfs_device(&f).unwrap().unwrap();
    assert!(d.unified_memory);
}

#[test]
fn rocm_smi_json() {
    let (d, notes) = parse_rocm_smi_json(&text("rocm-smi/two-cards.json")).unwrap();
    assert!(notes.is_empty());
    assert_eq!(d.len(), 2);
    assert_eq!(d[0].total_bytes, 192 * GIB);
    assert_eq!(d[1].used_bytes, Some(12 * GIB));
    assert_eq!(d[0].name, "AMD GPU (card0)");
    let (d, _) = parse_rocm_smi_json(&text("rocm-smi/series-and-system.json")).unwrap();
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].catalog_id.as_deref(), Some("rx-7900-xtx"));
    assert_eq!(d[0].free_bytes, Some(25_753_026_560 - GIB));
    // A warning line before the JSON is tolerated.
    let noisy = format!(
        "WARNING: AMD GPU device(s) is/are in a low-power state\n{}",
        text("rocm-smi/two-cards.json")
    );
    assert_eq!(parse_rocm_smi_json(&noisy).unwrap().0.len(), 2);
    for bad in [
        "",
        "[]",
        "null",
        "{",
        "garbage",
        "{\"card0\": 5}",
        "{\"cardX\": {}}",
    ] {
        let r = parse_rocm_smi_json(bad);
        assert!(
            r.as_ref().map_or(true, |(d, _)| d.is_empty()),
            "{bad}: {r:?}"
        );
    }
}

// ---- Apple ----

fn sysctl(dir: &str) -> AppleSysctl {
    let read = |k: &str| std::fs::read_to_string(fixture(&format!("apple/{dir}/{k}"))).ok();
    AppleSysctl {
        memsize: read("hw.memsize"),
        wired_limit_mb: read("iogpu.wired_limit_mb"),
        brand: read("machdep.cpu.brand_string"),
    }
}

#[test]
fn apple_default_limit_is_an_estimate() {
    let d = apple_device(&sysctl("m2-max-32gb")).unwrap().unwrap();
    assert_eq!(d.name, "Apple M2 Max");
    assert_eq!(d.vendor, Vendor::Apple);
    assert_eq!(d.total_bytes, 32 * GIB * 67 / 100);
    assert!(d.memory_estimated && d.unified_memory && !d.supports_flash_attention);
    assert_eq!(d.catalog_id.as_deref(), Some("apple-m2-max"));
    assert_eq!(d.bandwidth_bytes_per_s, Some(400_000_000_000));
}

#[test]
fn apple_wired_limit_override_is_used() {
    // llmfit#754: on an M3 16 GB, iogpu.wired_limit_mb=12000 moved recommendedMaxWorkingSetSize.
    let d = apple_device(&sysctl("m3-16gb-wired-12000"))
        .unwrap()
        .unwrap();
    assert_eq!(d.total_bytes, 12000 * MIB);
    assert!(!d.memory_estimated);
    assert_eq!(d.catalog_id.as_deref(), Some("apple-m3"));
}

#[test]
fn apple_intel_and_garbage() {
    assert_eq!(apple_device(&sysctl("intel-mac")).unwrap(), None);
    let err = apple_device(&AppleSysctl::default()).unwrap_err();
    assert_eq!(err, "apple: hw.memsize is missing or not a number of bytes");
    let d = apple_device(&AppleSysctl {
        memsize: Some("8589934592".into()),
        wired_limit_mb: Some("999999999999999999".into()),
        brand: Some("Apple M9 Hyper".into()),
    })
    .unwrap()
    .unwrap();
    assert_eq!(d.total_bytes, 8 * GIB);
    assert_eq!(d.catalog_id, None);
}

// ---- whole detection with fake tools ----

#[cfg(unix)]
fn script(dir: &Path, name: &str, body: &str) -> String {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(name);
    std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p.to_string_lossy().into_owned()
}

#[cfg(unix)]
#[test]
fn nvidia_smi_retries_without_compute_cap() {
    let dir = tempfile::tempdir().unwrap();
    let smi = script(
        dir.path(),
        "nvidia-smi",
        &format!(
            "case \"$1\" in *compute_cap*) cat '{}'; exit 2;; esac\ncat '{}'",
            fixture("nvidia-smi/compute-cap-rejected.txt").display(),
            fixture("nvidia-smi/v100-old-driver.query-old.csv").display()
        ),
    );
    let (r, _) = moro_gpu::nvidia::probe_nvidia_smi(&smi, Duration::from_secs(5)).unwrap();
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].name, "Tesla V100-SXM2-16GB");
}

#[cfg(unix)]
#[test]
fn detect_never_hangs_and_explains() {
    let dir = tempfile::tempdir().unwrap();
    let hang = script(dir.path(), "hang", "sleep 30");
    let opts = moro_gpu::DetectOptions {
        sysfs_root: fixture("sysfs-nvidia-only"),
        timeout: Duration::from_millis(300),
        nvidia_smi: hang.clone(),
        rocm_smi: hang,
        ..moro_gpu::DetectOptions::default()
    };
    let start = std::time::Instant::now();
    let det = moro_gpu::detect(&opts);
    assert!(start.elapsed() < Duration::from_secs(10));
    // On a machine with a working NVML the GPUs come from there; otherwise nothing.
    if det.hardware.is_empty() {
        assert!(
            det.notes
                .iter()
                .any(|n| n.starts_with("nvidia-smi: no answer within")),
            "{:?}",
            det.notes
        );
        assert!(
            det.notes
                .iter()
                .any(|n| n.starts_with("rocm-smi: no answer"))
        );
    }
}

#[cfg(unix)]
#[test]
fn detect_reads_amd_sysfs_and_nvidia_smi_together() {
    let dir = tempfile::tempdir().unwrap();
    let smi = script(
        dir.path(),
        "nvidia-smi",
        &format!(
            "cat '{}'",
            fixture("nvidia-smi/8x-h100.query.csv").display()
        ),
    );
    let opts = moro_gpu::DetectOptions {
        sysfs_root: fixture("sysfs-mi300x"),
        nvidia_smi: smi,
        rocm_smi: "moro-no-such-rocm-smi".into(),
        ..moro_gpu::DetectOptions::default()
    };
    let det = moro_gpu::detect(&opts);
    let amd = det
        .hardware
        .devices
        .iter()
        .filter(|d| d.vendor == Vendor::Amd)
        .count();
    assert_eq!(amd, 2);
    assert!(
        det.hardware
            .devices
            .iter()
            .any(|d| d.vendor == Vendor::Nvidia)
    );
    // Absent tools are not reported once something was found.
    assert!(
        !det.notes.iter().any(|n| n.contains("rocm-smi")),
        "{:?}",
        det.notes
    );
}

#[test]
fn detect_with_nothing_lists_why() {
    let opts = moro_gpu::DetectOptions {
        sysfs_root: fixture("no-such-root"),
        nvidia: false,
        rocm_smi: "moro-no-such-rocm-smi".into(),
        ..moro_gpu::DetectOptions::default()
    };
    let det = moro_gpu::detect(&opts);
    if cfg!(not(target_os = "macos")) {
        assert!(det.hardware.is_empty());
        assert!(
            det.notes.iter().any(|n| n == "rocm-smi: not found"),
            "{:?}",
            det.notes
        );
        assert!(
            det.notes.iter().any(|n| n.starts_with("amd sysfs: ")),
            "{:?}",
            det.notes
        );
    }
}
