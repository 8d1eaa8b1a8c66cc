//! moro-gpu: finds the local GPUs (the I/O edge of moro's hardware model).
//!
//! Each probe is a thin I/O wrapper around a pure parser that is tested on captured output
//! (`tests/fixtures/`). [`detect`] runs them in order and never fails or hangs: every
//! probe error becomes a note, every subprocess has a deadline.
//!
//! 1. NVIDIA: NVML ([`nvidia::probe_nvml`]); on any NVML error, or a partial read,
//!    `nvidia-smi --query-gpu` ([`nvidia::probe_nvidia_smi`]).
//! 2. AMD: amdgpu sysfs ([`amd::probe_amd_sysfs`]); with no AMD card there, `rocm-smi`.
//! 3. Apple Silicon (macOS only): `sysctl` ([`apple::apple_device`]).

pub mod amd;
pub mod apple;
pub mod nvidia;
pub mod process;

use std::path::PathBuf;
use std::time::Duration;

use moro_core::hardware::Hardware;

use crate::nvidia::ProbeFailure;

/// Default deadline for one probe command.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// What [`detect`] may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DetectOptions {
    /// sysfs mount point (`/sys`); tests point it at a fixture tree.
    pub sysfs_root: PathBuf,
    /// Deadline for each subprocess.
    pub timeout: Duration,
    /// Probe NVIDIA (NVML, nvidia-smi).
    pub nvidia: bool,
    /// Probe AMD (sysfs, rocm-smi).
    pub amd: bool,
    /// Probe Apple Silicon (macOS only).
    pub apple: bool,
    /// nvidia-smi program (name on `PATH` or a path).
    pub nvidia_smi: String,
    /// rocm-smi program.
    pub rocm_smi: String,
}

impl Default for DetectOptions {
    fn default() -> Self {
        Self {
            sysfs_root: PathBuf::from("/sys"),
            timeout: DEFAULT_TIMEOUT,
            nvidia: true,
            amd: true,
            apple: true,
            nvidia_smi: "nvidia-smi".to_string(),
            rocm_smi: "rocm-smi".to_string(),
        }
    }
}

/// What [`detect`] found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Detection {
    /// The usable GPUs (empty: CPU only).
    pub hardware: Hardware,
    /// Which probes failed and why, one line each. Probes that merely found no tool or
    /// library are listed only when no GPU was found at all.
    pub notes: Vec<String>,
}

#[derive(Default)]
struct Notes {
    problems: Vec<String>,
    absent: Vec<String>,
}

impl Notes {
    fn failure(&mut self, f: ProbeFailure) {
        match f {
            ProbeFailure::Absent(m) => self.absent.push(m),
            ProbeFailure::Failed(m) => self.problems.push(m),
        }
    }
}

/// Probes this machine for GPUs. Never fails, never waits longer than a few `timeout`s.
#[must_use]
pub fn detect(opts: &DetectOptions) -> Detection {
    let mut devices = Vec::new();
    let mut notes = Notes::default();
    if opts.nvidia {
        devices.extend(detect_nvidia(opts, &mut notes));
    }
    if opts.amd {
        let sysfs = match amd::probe_amd_sysfs(&opts.sysfs_root) {
            Ok((d, n)) => {
                notes.problems.extend(n);
                d
            }
            Err(f) => {
                notes.failure(f);
                Vec::new()
            }
        };
        if sysfs.is_empty() {
            match amd::probe_rocm_smi(&opts.rocm_smi, opts.timeout) {
                Ok((d, n)) => {
                    notes.problems.extend(n);
                    devices.extend(d);
                }
                Err(f) => notes.failure(f),
            }
        } else {
            devices.extend(sysfs);
        }
    }
    #[cfg(target_os = "macos")]
    if opts.apple {
        match apple::apple_device(&apple::read_sysctl(opts.timeout)) {
            Ok(Some(d)) => devices.push(d),
            Ok(None) => notes.absent.push("apple: not Apple Silicon".to_string()),
            Err(e) => notes.problems.push(e),
        }
    }
    let mut all = notes.problems;
    if devices.is_empty() {
        all.extend(notes.absent);
    }
    Detection {
        hardware: Hardware { devices },
        notes: all,
    }
}

fn detect_nvidia(opts: &DetectOptions, notes: &mut Notes) -> Vec<moro_core::hardware::Device> {
    let mut nvml_readings = Vec::new();
    let mut complete = false;
    match nvidia::probe_nvml() {
        Ok((readings, n, count)) => {
            complete = n.is_empty() && readings.len() >= usize::try_from(count).unwrap_or(0);
            notes.problems.extend(n);
            nvml_readings = readings;
        }
        Err(f) => notes.failure(f),
    }
    if !complete {
        match nvidia::probe_nvidia_smi(&opts.nvidia_smi, opts.timeout) {
            Ok((readings, n)) if readings.len() > nvml_readings.len() => {
                notes.problems.extend(n);
                nvml_readings = readings;
            }
            Ok(_) => {}
            Err(f) => notes.failure(f),
        }
    }
    nvml_readings.iter().map(nvidia::nvidia_device).collect()
}
