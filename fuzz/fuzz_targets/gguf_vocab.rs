//! A GGUF header read with its vocabulary kept, turned into a tokenizer, then one encode.
#![no_main]

use libfuzzer_sys::fuzz_target;
use moro_core::formats::gguf::parse_header_keeping;
use moro_data::gguf_vocab::WHOLE_ARRAYS;
use moro_data::{Date, ModelTokenizer};

const DAY: Date = Date {
    year: 2026,
    month: 12,
    day: 3,
};

fuzz_target!(|data: &[u8]| {
    let Ok(header) = parse_header_keeping(data, &WHOLE_ARRAYS) else {
        return;
    };
    if let Ok(tok) = ModelTokenizer::from_gguf(&header, None, DAY) {
        let _ = tok.encode("Hello world, 日本語 🙂 <s>\n\t  x", true);
    }
});
