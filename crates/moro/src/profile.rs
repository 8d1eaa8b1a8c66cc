//! The per-machine calibration profile (`moro calibrate`) and the correction file
//! (`moro run`), both in the user's config directory, and the hook that folds them into the
//! estimator's [`DeviceProfile`].
//!
//! Files, in [`config_dir`]:
//! - `profile-<gpu slug>.json`: a [`Profile`], written atomically by `moro calibrate`;
//! - `corrections.json`: under-predictions `moro run` observed (an out-of-memory failure at a
//!   configuration predicted to fit), keyed by GPU slug:
//!   `{ "<gpu slug>": { "offset_bytes": N, "observed_at": "2026-…" } }`. A flat file as
//!   `moro-supervise` writes it (`{"max_under_prediction_bytes": N, …}`) applies to every GPU.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use moro_core::estimate::DeviceProfile;
use serde::{Deserialize, Serialize};

/// Environment variable naming the config directory (overrides the platform default).
pub(crate) const MORO_CONFIG_DIR: &str = "MORO_CONFIG_DIR";

/// Format version of [`Profile`].
pub(crate) const PROFILE_VERSION: u32 = 1;

/// Name of the correction file in the config directory.
pub(crate) const CORRECTIONS_FILE: &str = "corrections.json";

/// moro's config directory: `$MORO_CONFIG_DIR`, else `$XDG_CONFIG_HOME/moro`, else
/// `~/Library/Application Support/moro` on macOS and `~/.config/moro` elsewhere.
pub(crate) fn config_dir() -> Option<PathBuf> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(d) = var(MORO_CONFIG_DIR) {
        return Some(d);
    }
    if let Some(x) = var("XDG_CONFIG_HOME").filter(|p| p.is_absolute()) {
        return Some(x.join("moro"));
    }
    let home = var("HOME")?;
    if cfg!(target_os = "macos") {
        Some(
            home.join("Library")
                .join("Application Support")
                .join("moro"),
        )
    } else {
        Some(home.join(".config").join("moro"))
    }
}

/// `NVIDIA H200` → `nvidia-h200`: lowercase ASCII letters and digits, runs of anything else
/// become one `-`.
pub(crate) fn slug(gpu_name: &str) -> String {
    let mut out = String::new();
    for c in gpu_name.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
    }
    while out.ends_with('-') {
        out.pop();
    }
    out
}

/// Path of the profile of `gpu_name` in `dir`.
pub(crate) fn profile_path(dir: &Path, gpu_name: &str) -> PathBuf {
    dir.join(format!("profile-{}.json", slug(gpu_name)))
}

/// What `moro calibrate` measured on one GPU model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Profile {
    /// Format version ([`PROFILE_VERSION`]).
    pub(crate) version: u32,
    /// GPU name as the driver reports it (`NVIDIA H200`).
    pub(crate) gpu_name: String,
    /// [`slug`] of the name (the file name's key).
    pub(crate) gpu_slug: String,
    /// When it was measured (RFC 3339, UTC).
    pub(crate) measured_at: String,
    /// The estimator fields this machine overrides; absent ones keep moro's defaults.
    pub(crate) device: Overrides,
    /// Software the measurements ran on (torch, transformers, peft, bitsandbytes, cuda,
    /// driver): an offset learned on one stack may not hold on another.
    #[serde(default)]
    pub(crate) stack: BTreeMap<String, String>,
    /// How the fields were fitted.
    #[serde(default)]
    pub(crate) fit: FitReport,
}

/// Measured values of [`DeviceProfile`] fields.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Overrides {
    /// [`DeviceProfile::cuda_context_bytes`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) cuda_context_bytes: Option<u64>,
    /// [`DeviceProfile::reserve_ratio`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) reserve_ratio: Option<f64>,
    /// [`DeviceProfile::offset_bytes`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) offset_bytes: Option<i64>,
    /// [`DeviceProfile::cublas_workspace_bytes`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) cublas_workspace_bytes: Option<u64>,
}

impl Overrides {
    /// Writes the present fields into `p`.
    pub(crate) fn apply_to(&self, p: &mut DeviceProfile) {
        if let Some(v) = self.cuda_context_bytes {
            p.cuda_context_bytes = v;
        }
        if let Some(v) = self.reserve_ratio {
            p.reserve_ratio = v;
        }
        if let Some(v) = self.offset_bytes {
            p.offset_bytes = v;
        }
        if let Some(v) = self.cublas_workspace_bytes {
            p.cublas_workspace_bytes = v;
        }
    }
}

/// The evidence behind a profile.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct FitReport {
    /// Jobs measured (completed).
    pub(crate) jobs_ok: usize,
    /// Jobs that ran out of memory.
    pub(crate) jobs_oom: usize,
    /// The bare CUDA context (after `torch.cuda.init()` and a tiny op), bytes.
    pub(crate) context_bare_bytes: Option<u64>,
    /// Median over the jobs of device-used minus reserved at the end of the job (context plus
    /// the kernels training loaded), bytes; what `cuda_context_bytes` is set to.
    pub(crate) context_training_bytes: Option<u64>,
    /// Jobs the reserve ratio was fitted on.
    pub(crate) reserve_ratio_samples: usize,
    /// Median of measured − predicted allocated bytes, over the jobs moro could predict.
    pub(crate) offset_median_bytes: Option<i64>,
    /// Median absolute deviation of those differences, bytes.
    pub(crate) offset_mad_bytes: Option<u64>,
    /// Jobs the offset was computed on.
    pub(crate) offset_samples: usize,
    /// Why the offset was (not) applied.
    pub(crate) offset_note: String,
    /// Median |predicted − measured| / measured at the allocated level before the offset.
    pub(crate) median_abs_error: Option<f64>,
    /// The rows file the profile was fitted from.
    pub(crate) rows_file: Option<String>,
}

/// A profile file found in the config directory.
#[derive(Debug, Clone)]
pub(crate) struct Found {
    /// Its path.
    pub(crate) path: PathBuf,
    /// The profile, or why it could not be read.
    pub(crate) profile: Result<Profile, String>,
}

/// Reads a profile file.
pub(crate) fn load(path: &Path) -> Result<Profile, String> {
    let bytes = fs::read(path).map_err(|e| e.to_string())?;
    let p: Profile = serde_json::from_slice(&bytes).map_err(|e| format!("not a profile: {e}"))?;
    if p.version > PROFILE_VERSION {
        return Err(format!(
            "profile version {} is newer than this moro understands ({PROFILE_VERSION})",
            p.version
        ));
    }
    Ok(p)
}

/// Every `profile-*.json` in `dir`, sorted by path.
pub(crate) fn list(dir: &Path) -> Vec<Found> {
    let Ok(rd) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut paths: Vec<PathBuf> = rd
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("profile-") && n.ends_with(".json"))
        })
        .collect();
    paths.sort();
    paths
        .into_iter()
        .map(|path| Found {
            profile: load(&path),
            path,
        })
        .collect()
}

/// Saves `profile` to `dir` atomically; returns its path.
pub(crate) fn save(dir: &Path, profile: &Profile) -> io::Result<PathBuf> {
    fs::create_dir_all(dir)?;
    let path = profile_path(dir, &profile.gpu_name);
    let mut bytes = serde_json::to_vec_pretty(profile).map_err(io::Error::other)?;
    bytes.push(b'\n');
    crate::output::write_atomic(&path, &bytes)?;
    Ok(path)
}

/// Whether two GPU slugs name the same model: equal, or one extends the other by whole
/// `-`-separated words (`nvidia-h200` and `nvidia-h200-141gb`).
fn same_gpu(a: &str, b: &str) -> bool {
    if a.is_empty() || b.is_empty() {
        return false;
    }
    let (short, long) = if a.len() <= b.len() { (a, b) } else { (b, a) };
    long == short
        || long
            .strip_prefix(short)
            .is_some_and(|rest| rest.starts_with('-'))
}

/// The usable profile for `gpu_name` in `dir`: the one whose slug matches; with no name, the
/// only profile there (a machine with one kind of GPU).
fn pick(dir: &Path, gpu_name: Option<&str>) -> (Option<Profile>, Vec<String>) {
    let mut warnings = Vec::new();
    let found = list(dir);
    let mut usable = Vec::new();
    for f in found {
        match f.profile {
            Ok(p) => usable.push(p),
            Err(e) => warnings.push(format!(
                "warning: ignoring unreadable calibration profile `{}`: {e}",
                f.path.display()
            )),
        }
    }
    let chosen = match gpu_name {
        Some(name) => {
            let s = slug(name);
            usable
                .iter()
                .find(|p| p.gpu_slug == s)
                .or_else(|| usable.iter().find(|p| same_gpu(&p.gpu_slug, &s)))
                .cloned()
        }
        None if usable.len() == 1 => usable.pop(),
        None => None,
    };
    (chosen, warnings)
}

/// One correction for a GPU: bytes to add at the allocated level, and when it was seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Correction {
    /// Bytes.
    pub(crate) offset_bytes: i64,
    /// When (as written).
    pub(crate) observed_at: String,
}

/// Reads the correction for `gpu_slug` (`None`: the only keyed entry, or a flat file) from
/// the text of `corrections.json`.
pub(crate) fn parse_corrections(
    text: &str,
    gpu_slug: Option<&str>,
) -> Result<Option<Correction>, String> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let obj = v.as_object().ok_or("not a JSON object")?;
    let read = |e: &serde_json::Value| -> Option<Correction> {
        let n = e
            .get("offset_bytes")
            .and_then(serde_json::Value::as_i64)
            .or_else(|| {
                e.get("max_under_prediction_bytes")
                    .and_then(serde_json::Value::as_u64)
                    .and_then(|u| i64::try_from(u).ok())
            })?;
        let at = e
            .get("observed_at")
            .or_else(|| e.get("updated"))
            .and_then(serde_json::Value::as_str)
            .unwrap_or("")
            .to_owned();
        Some(Correction {
            offset_bytes: n,
            observed_at: at,
        })
    };
    // Flat file (moro-supervise's `Correction`): one value for the machine.
    if obj.contains_key("max_under_prediction_bytes") || obj.contains_key("offset_bytes") {
        return Ok(read(&v));
    }
    let entry = match gpu_slug {
        Some(s) => obj
            .get(s)
            .or_else(|| obj.iter().find(|(k, _)| same_gpu(k, s)).map(|(_, e)| e)),
        None if obj.len() == 1 => obj.values().next(),
        None => None,
    };
    Ok(entry.and_then(read))
}

/// Folds the calibration profile and the correction file of `gpu_name` (from
/// [`config_dir`]) into `device`. Returns a note for stderr when anything was applied (or a
/// warning when a file could not be read); `None` when there is nothing for this GPU.
pub(crate) fn apply(device: &mut DeviceProfile, gpu_name: Option<&str>) -> Option<String> {
    let dir = config_dir()?;
    apply_from(&dir, device, gpu_name)
}

/// [`apply`] with an explicit config directory.
pub(crate) fn apply_from(
    dir: &Path,
    device: &mut DeviceProfile,
    gpu_name: Option<&str>,
) -> Option<String> {
    let (profile, mut notes) = pick(dir, gpu_name);
    let gpu_slug = profile
        .as_ref()
        .map(|p| p.gpu_slug.clone())
        .or_else(|| gpu_name.map(slug));
    if let Some(p) = &profile {
        p.device.apply_to(device);
        let day = p.measured_at.get(..10).unwrap_or(&p.measured_at);
        notes.push(format!(
            "using calibration profile for {} (measured {day})",
            p.gpu_name
        ));
    }
    let cpath = dir.join(CORRECTIONS_FILE);
    match fs::read_to_string(&cpath) {
        Ok(text) => match parse_corrections(&text, gpu_slug.as_deref()) {
            Ok(Some(c)) if c.offset_bytes != 0 => {
                device.offset_bytes = device.offset_bytes.saturating_add(c.offset_bytes);
                let when = if c.observed_at.is_empty() {
                    String::new()
                } else {
                    format!(
                        ", observed {}",
                        c.observed_at.get(..10).unwrap_or(&c.observed_at)
                    )
                };
                notes.push(format!(
                    "adding {} from an out-of-memory run predicted to fit ({}{when})",
                    signed_size(c.offset_bytes),
                    cpath.display()
                ));
            }
            Ok(_) => {}
            Err(e) => notes.push(format!(
                "warning: ignoring unreadable correction file `{}`: {e}",
                cpath.display()
            )),
        },
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => notes.push(format!(
            "warning: ignoring unreadable correction file `{}`: {e}",
            cpath.display()
        )),
    }
    if notes.is_empty() {
        None
    } else {
        Some(notes.join("\n"))
    }
}

/// `+1.50 GiB` / `-200.0 MiB`.
pub(crate) fn signed_size(b: i64) -> String {
    let sign = if b < 0 { "-" } else { "+" };
    format!("{sign}{}", moro_core::units::human(b.unsigned_abs()))
}

/// A time as RFC 3339 in UTC with second precision (`2026-11-29T19:12:14Z`).
pub(crate) use moro_supervise::journal::rfc3339;

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(name: &str, ctx: u64) -> Profile {
        Profile {
            version: PROFILE_VERSION,
            gpu_name: name.to_owned(),
            gpu_slug: slug(name),
            measured_at: "2026-03-04T05:06:07Z".to_owned(),
            device: Overrides {
                cuda_context_bytes: Some(ctx),
                ..Overrides::default()
            },
            stack: BTreeMap::new(),
            fit: FitReport::default(),
        }
    }

    #[test]
    fn slugs() {
        assert_eq!(slug("NVIDIA H200"), "nvidia-h200");
        assert_eq!(
            slug("  NVIDIA GeForce RTX 4090 "),
            "nvidia-geforce-rtx-4090"
        );
        assert_eq!(slug("NVIDIA A100-SXM4-80GB"), "nvidia-a100-sxm4-80gb");
        assert!(same_gpu("nvidia-h200", "nvidia-h200-141gb"));
        assert!(!same_gpu("nvidia-h20", "nvidia-h200"));
        assert!(!same_gpu("nvidia-a100-sxm4-80gb", "nvidia-a100-sxm4-40gb"));
    }

    #[test]
    fn dates() {
        use std::time::UNIX_EPOCH;
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        let t = UNIX_EPOCH + std::time::Duration::from_secs(1_709_528_767);
        assert_eq!(rfc3339(t), "2024-03-04T05:06:07Z");
    }

    #[test]
    fn save_pick_apply() {
        let dir = tempfile::tempdir().unwrap();
        let p = profile("NVIDIA H200", 900 << 20);
        let path = save(dir.path(), &p).unwrap();
        assert!(path.ends_with("profile-nvidia-h200.json"));
        assert_eq!(load(&path).unwrap(), p);
        let mut d = DeviceProfile::default();
        let note = apply_from(dir.path(), &mut d, Some("NVIDIA H200")).unwrap();
        assert_eq!(d.cuda_context_bytes, 900 << 20);
        assert!(note.contains("using calibration profile for NVIDIA H200 (measured 2026-03-04)"));
        // Other GPU: untouched.
        let mut d = DeviceProfile::default();
        assert_eq!(
            apply_from(dir.path(), &mut d, Some("NVIDIA A100-SXM4-80GB")),
            None
        );
        assert_eq!(d, DeviceProfile::default());
        // No name: the only profile.
        let mut d = DeviceProfile::default();
        assert!(apply_from(dir.path(), &mut d, None).is_some());
        assert_eq!(d.cuda_context_bytes, 900 << 20);
        // Two profiles, no name: none.
        save(dir.path(), &profile("NVIDIA A100-SXM4-80GB", 1)).unwrap();
        let mut d = DeviceProfile::default();
        assert_eq!(apply_from(dir.path(), &mut d, None), None);
    }

    #[test]
    fn corrupt_profile_is_a_warning() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("profile-nvidia-h200.json"), "{not json").unwrap();
        let mut d = DeviceProfile::default();
        let note = apply_from(dir.path(), &mut d, Some("NVIDIA H200")).unwrap();
        assert!(note.starts_with("warning: ignoring unreadable calibration profile"));
        assert_eq!(d, DeviceProfile::default());
    }

    #[test]
    fn corrections_keyed_and_flat() {
        let keyed = r#"{"nvidia-h200": {"offset_bytes": 1000, "observed_at": "2026-01-02T00:00:00Z"},
                        "nvidia-a100-sxm4-80gb": {"offset_bytes": 5}}"#;
        let c = parse_corrections(keyed, Some("nvidia-h200"))
            .unwrap()
            .unwrap();
        assert_eq!(c.offset_bytes, 1000);
        assert_eq!(parse_corrections(keyed, Some("nvidia-l4")).unwrap(), None);
        assert_eq!(parse_corrections(keyed, None).unwrap(), None);
        let flat =
            r#"{"version": 1, "max_under_prediction_bytes": 7, "observations": 1, "updated": "x"}"#;
        assert_eq!(
            parse_corrections(flat, Some("nvidia-l4"))
                .unwrap()
                .unwrap()
                .offset_bytes,
            7
        );
        assert!(parse_corrections("[1]", None).is_err());

        let dir = tempfile::tempdir().unwrap();
        save(dir.path(), &profile("NVIDIA H200", 1 << 30)).unwrap();
        fs::write(dir.path().join(CORRECTIONS_FILE), keyed).unwrap();
        let mut d = DeviceProfile::default();
        let note = apply_from(dir.path(), &mut d, Some("NVIDIA H200")).unwrap();
        assert_eq!(d.offset_bytes, 1000);
        assert!(note.contains("out-of-memory run"), "{note}");
        // A correction without a profile still applies.
        let mut d = DeviceProfile::default();
        fs::write(dir.path().join(CORRECTIONS_FILE), flat).unwrap();
        apply_from(dir.path(), &mut d, Some("NVIDIA L4")).unwrap();
        assert_eq!(d.offset_bytes, 7);
    }
}
