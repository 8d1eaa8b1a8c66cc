//! What the tokenizer tests share: where the files the fetch scripts bring lie.

use std::path::PathBuf;

use moro_data::Date;

/// The day the templates' `strftime_now` sees.
pub const DAY: Date = Date {
    year: 2026,
    month: 12,
    day: 2,
};

/// `$MORO_TOKENIZERS_DIR/under` (else `target/tokenizers/under`) when it holds `marker`;
/// `None` with a note on a developer machine; on CI a missing file fails, since `.ci/run`
/// runs `script` first.
pub fn fetched(under: &str, marker: &str, script: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("MORO_TOKENIZERS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/tokenizers")
        })
        .join(under);
    if dir.join(marker).is_file() {
        return Some(dir);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "no {marker} in {}: CI runs crates/moro-data/tests/{script} first",
        dir.display()
    );
    eprintln!(
        "skipped: no {marker} in {} (run crates/moro-data/tests/{script})",
        dir.display()
    );
    None
}
