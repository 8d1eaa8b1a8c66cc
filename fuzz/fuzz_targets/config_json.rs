//! HF `config.json` → ModelSpec: any bytes give a spec or an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(spec) = moro_core::arch::parse_config(data) {
        let _ = spec.total_params();
    }
});
