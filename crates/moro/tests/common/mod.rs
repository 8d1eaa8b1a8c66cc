//! Helpers shared by the CLI tests that run the real binary in a scratch directory.

use std::path::Path;

use assert_cmd::Command;

/// `moro` in `dir`, offline, with an empty Hugging Face cache, its own config dir and no
/// colour.
pub fn moro(dir: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_moro"));
    c.current_dir(dir)
        .env("HF_HUB_CACHE", "/nonexistent-moro-test-cache")
        .env("HF_HUB_OFFLINE", "1")
        .env("MORO_CONFIG_DIR", dir.join(".moro-config"))
        .env("NO_COLOR", "1");
    c
}

/// Parses stdout as JSON, showing it when it is not.
pub fn json_of(out: &[u8]) -> serde_json::Value {
    serde_json::from_slice(out)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(out)))
}
