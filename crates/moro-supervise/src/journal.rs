//! What moro writes while supervising: the heal journal, the per-machine prediction
//! correction, and atomic file writes.
//!
//! - The journal (`.moro/heal.jsonl`) gets one JSON object per heal, appended.
//! - The correction file keeps the largest under-prediction observed on this machine (an
//!   out-of-memory failure at a configuration the engine predicted to fit), so later
//!   predictions can add it. Read it with [`read_correction`].
//! - New files are written to a temporary file in the same directory and renamed into place.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::classify::OomKind;

/// One heal, as a line of `.moro/heal.jsonl`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalEntry {
    /// When the heal was decided (RFC 3339, UTC).
    pub time: String,
    /// 1-based heal number within the run.
    pub heal: u32,
    /// Highest ladder level used (1–5).
    pub level: u8,
    /// What changed: `micro_batch_size 8→4, gradient_accumulation_steps 1→2 (effective batch 8 kept)`.
    pub change: String,
    /// Predicted peak device bytes of the configuration that ran out of memory.
    pub predicted_before_bytes: Option<u64>,
    /// Predicted peak device bytes of the healed configuration.
    pub predicted_after_bytes: Option<u64>,
    /// The device memory budget the predictions were compared with.
    pub budget_bytes: Option<u64>,
    /// `predicted`, `unknown` or `nothing_fits`.
    pub fit: String,
    /// Which allocator reported the failure.
    pub oom_kind: OomKind,
    /// The out-of-memory line.
    pub oom_text: String,
    /// When the failing configuration was predicted to fit: a lower bound on how far the
    /// prediction was below what the run needed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prediction_miss_bytes: Option<u64>,
    /// The healed recipe written for the next attempt.
    pub recipe: PathBuf,
    /// The checkpoint the next attempt resumes from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_from: Option<PathBuf>,
}

/// Appends one entry to the journal, creating it (and its directory) when needed.
///
/// # Errors
/// The file cannot be created or written.
pub fn append_journal(path: &Path, entry: &JournalEntry) -> io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir)?;
    }
    let mut line = serde_json::to_vec(entry).map_err(io::Error::other)?;
    line.push(b'\n');
    let mut f = OpenOptions::new().create(true).append(true).open(path)?;
    // One write call per line, so concurrent appenders do not interleave within a line.
    f.write_all(&line)
}

/// Reads a journal back.
///
/// # Errors
/// The file cannot be read or a line is not a journal entry.
pub fn read_journal(path: &Path) -> io::Result<Vec<JournalEntry>> {
    fs::read_to_string(path)?
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).map_err(io::Error::other))
        .collect()
}

/// The per-machine prediction correction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Correction {
    /// Format version (1).
    pub version: u32,
    /// The largest observed under-prediction of the raw estimate, in bytes.
    pub max_under_prediction_bytes: u64,
    /// How many under-predictions were observed.
    pub observations: u64,
    /// When it was last updated (RFC 3339, UTC).
    pub updated: String,
}

/// Reads the correction file; `Ok(None)` when it does not exist.
///
/// # Errors
/// It exists but cannot be read or parsed.
pub fn read_correction(path: &Path) -> io::Result<Option<Correction>> {
    match fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(io::Error::other),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Records an under-prediction of `miss` bytes; returns the value now stored.
///
/// An unreadable existing file is replaced (it is moro's own file).
///
/// # Errors
/// The file cannot be written.
pub fn record_under_prediction(path: &Path, miss: u64) -> io::Result<u64> {
    let old = read_correction(path).ok().flatten();
    let (max, n) = old.map_or((0, 0), |c| (c.max_under_prediction_bytes, c.observations));
    let c = Correction {
        version: 1,
        max_under_prediction_bytes: max.max(miss),
        observations: n + 1,
        updated: rfc3339(SystemTime::now()),
    };
    let mut bytes = serde_json::to_vec_pretty(&c).map_err(io::Error::other)?;
    bytes.push(b'\n');
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir)?;
    }
    write_atomic(path, &bytes)?;
    Ok(c.max_under_prediction_bytes)
}

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Writes `bytes` to `path` through a temporary file in the same directory and a rename,
/// so readers see the old content or the new one, never a partial file.
///
/// # Errors
/// Any step fails; the temporary file is removed.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::other("path has no file name"))?;
    let n = TMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".moro-tmp-{}-{n}", std::process::id()));
    let tmp = dir.join(tmp_name);
    let result = (|| {
        let mut f = File::options().write(true).create_new(true).open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Formats a time as RFC 3339 in UTC with second precision (`2026-11-29T19:12:14Z`).
#[must_use]
pub fn rfc3339(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 → (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
#[must_use]
pub const fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn civil_dates_by_hand() {
        // 2026-12-02 is day 20,789 since 1970-01-01; 2000-03-01 is day 11,017.
        assert_eq!(civil_from_days(20_789), (2026, 12, 2));
        assert_eq!(civil_from_days(11_017), (2000, 3, 1));
        assert_eq!(civil_from_days(0), (1970, 1, 1));
    }

    #[test]
    fn rfc3339_known_dates() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::from_secs(951_782_400)),
            "2000-02-29T00:00:00Z"
        );
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::from_secs(1_795_979_534)),
            "2026-11-29T19:12:14Z"
        );
    }

    #[test]
    fn atomic_write_replaces_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let p = dir.path().join("a.yaml");
        write_atomic(&p, b"one").unwrap_or_else(|e| panic!("{e}"));
        write_atomic(&p, b"two").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(fs::read(&p).unwrap_or_default(), b"two");
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap_or_else(|e| panic!("{e}"))
            .filter_map(Result::ok)
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn correction_keeps_the_largest_miss() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let p = dir.path().join("sub/correction.json");
        assert_eq!(read_correction(&p).ok().flatten(), None);
        assert_eq!(record_under_prediction(&p, 100).ok(), Some(100));
        assert_eq!(record_under_prediction(&p, 50).ok(), Some(100));
        assert_eq!(record_under_prediction(&p, 300).ok(), Some(300));
        let c = read_correction(&p)
            .ok()
            .flatten()
            .unwrap_or_else(|| panic!("missing"));
        assert_eq!(c.max_under_prediction_bytes, 300);
        assert_eq!(c.observations, 3);
        fs::write(&p, b"garbage").unwrap_or_else(|e| panic!("{e}"));
        assert!(read_correction(&p).is_err());
        assert_eq!(record_under_prediction(&p, 7).ok(), Some(7));
    }

    #[test]
    fn journal_round_trip() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let p = dir.path().join(".moro/heal.jsonl");
        let e = JournalEntry {
            time: rfc3339(SystemTime::now()),
            heal: 1,
            level: 1,
            change: "micro_batch_size 8→4".to_owned(),
            predicted_before_bytes: Some(10),
            predicted_after_bytes: Some(5),
            budget_bytes: Some(8),
            fit: "predicted".to_owned(),
            oom_kind: OomKind::Cuda,
            oom_text: "CUDA out of memory".to_owned(),
            prediction_miss_bytes: None,
            recipe: PathBuf::from("moro.healed.yaml"),
            resume_from: None,
        };
        append_journal(&p, &e).unwrap_or_else(|e| panic!("{e}"));
        append_journal(&p, &e).unwrap_or_else(|e| panic!("{e}"));
        let back = read_journal(&p).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back, vec![e.clone(), e]);
        let text = fs::read_to_string(&p).unwrap_or_default();
        assert!(!text.contains("prediction_miss_bytes"));
        assert!(text.contains("\"oom_kind\":\"cuda\""));
    }
}
