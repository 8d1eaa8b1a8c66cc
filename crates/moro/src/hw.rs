//! `--hardware` and `--memory` at the edge: parse the spec (pure, moro-core) or probe the
//! machine (moro-gpu).

use anyhow::Result;
use moro_core::estimate::Backend;
use moro_core::hardware::{Hardware, HardwareSpec, parse_hardware_spec};

use crate::error::{flag, user, user_hint};

/// The hardware a command targets.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    /// The devices.
    pub(crate) hardware: Hardware,
    /// Whether they were detected on this machine.
    pub(crate) detected: bool,
    /// The spec as given.
    pub(crate) spec: String,
}

impl Target {
    /// Memory of the smallest device.
    pub(crate) fn memory_bytes(&self) -> Option<u64> {
        self.hardware.min_total_bytes()
    }

    /// Name for display (`2 × NVIDIA A100-SXM4-80GB`, `… (detected)`).
    pub(crate) fn display(&self) -> String {
        let Some(first) = self.hardware.devices.first() else {
            return self.spec.clone();
        };
        let n = self.hardware.devices.len();
        let name = if n > 1 {
            format!("{n} × {}", first.name)
        } else {
            first.name.clone()
        };
        if self.detected {
            format!("{name} (detected)")
        } else {
            name
        }
    }
}

/// Resolves `--hardware SPEC` (or `--memory SIZE`).
pub(crate) fn resolve(spec: Option<&str>, memory: Option<&str>) -> Result<Option<Target>> {
    if let Some(m) = memory {
        let bytes =
            moro_core::units::parse_size(m).map_err(|e| anyhow::Error::new(flag("--memory", e)))?;
        if bytes < moro_core::units::GIB {
            return Err(anyhow::Error::new(
                flag(
                    "--memory",
                    format!("`{m}` is under 1 GiB, smaller than any GPU"),
                )
                .hint("give the memory per GPU with its unit, e.g. --memory 24GiB"),
            ));
        }
        let d = moro_core::hardware::Device::generic(bytes);
        return Ok(Some(Target {
            hardware: Hardware { devices: vec![d] },
            detected: false,
            spec: m.to_owned(),
        }));
    }
    let Some(spec) = spec else { return Ok(None) };
    match parse_hardware_spec(spec).map_err(|e| user(e.to_string()))? {
        HardwareSpec::Given(hardware) => Ok(Some(Target {
            hardware,
            detected: false,
            spec: spec.to_owned(),
        })),
        HardwareSpec::Detect => {
            let found = moro_gpu::detect(&moro_gpu::DetectOptions::default());
            for n in &found.notes {
                crate::output::note(&format!("note: {n}"));
            }
            if found.hardware.is_empty() {
                return Err(user_hint(
                    "no GPU found on this machine (CPU only)",
                    "name the hardware by hand: --hardware rtx-4090, --hardware a100-sxm4-80gb, \
                     --hardware 24GiB (`moro hardware` shows what was probed)",
                ));
            }
            Ok(Some(Target {
                hardware: found.hardware,
                detected: true,
                spec: spec.to_owned(),
            }))
        }
    }
}

/// `--device`: the PyTorch backend the target runs on. `mps` makes a size (`--memory 24GiB`)
/// an Apple GPU of that size and refuses another maker's GPU; `cuda` refuses an Apple GPU.
pub(crate) fn on_device(target: Option<Target>, backend: Backend) -> Result<Target> {
    use moro_core::hardware::{Device, Vendor};
    let mps = backend == Backend::Mps;
    let Some(mut target) = target else {
        return Err(anyhow::Error::new(
            flag("--device", "needs the GPU: its memory or its name")
                .hint("e.g. --device mps --memory 24GiB, or --hardware apple-m4-24gb"),
        ));
    };
    for d in &mut target.hardware.devices {
        match (mps, d.vendor) {
            (true, Vendor::Generic) => *d = Device::generic_apple(d.total_bytes),
            (true, Vendor::Apple) | (false, Vendor::Nvidia | Vendor::Amd | Vendor::Generic) => {}
            (true, _) => {
                return Err(anyhow::Error::new(flag(
                    "--device",
                    format!("mps runs on Apple GPUs; {} is not one", d.name),
                )));
            }
            (false, _) => {
                return Err(anyhow::Error::new(
                    flag(
                        "--device",
                        format!("{} is an Apple GPU: PyTorch runs on it through MPS", d.name),
                    )
                    .hint("--device mps, or --stack mlx"),
                ));
            }
        }
    }
    Ok(target)
}
