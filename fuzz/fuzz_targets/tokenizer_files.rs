//! tokenizer.json and tokenizer_config.json as `moro data` loads them, then one encode.
#![no_main]

use libfuzzer_sys::fuzz_target;
use moro_data::{Date, ModelTokenizer};

const DAY: Date = Date {
    year: 2026,
    month: 12,
    day: 2,
};

fuzz_target!(|data: &[u8]| {
    // The first byte splits the input into the two files.
    let Some((&cut, rest)) = data.split_first() else {
        return;
    };
    let at = usize::from(cut).min(rest.len());
    let (config, tokenizer) = rest.split_at(at);
    if let Ok(tok) = ModelTokenizer::from_bytes(tokenizer, Some(config), None, DAY) {
        let _ = tok.encode("Hello world, 日本語 🙂", true);
    }
});
