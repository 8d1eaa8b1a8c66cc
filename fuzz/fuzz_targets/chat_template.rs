//! A chat template compiled and rendered as `moro data` renders it (fuel-limited).
#![no_main]

use libfuzzer_sys::fuzz_target;
use moro_data::{ChatTemplate, Date, SpecialTokens};
use serde_json::json;

const DAY: Date = Date {
    year: 2026,
    month: 12,
    day: 2,
};

fuzz_target!(|data: &[u8]| {
    let Ok(source) = std::str::from_utf8(data) else {
        return;
    };
    let special = SpecialTokens {
        bos: Some("<s>".into()),
        eos: Some("</s>".into()),
        ..SpecialTokens::default()
    };
    if let Ok(t) = ChatTemplate::new(source, special, DAY) {
        let messages = [
            json!({"role": "system", "content": "Be brief."}),
            json!({"role": "user", "content": "Hi"}),
            json!({"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]}),
        ];
        let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {}}}]);
        let _ = t.render(&messages, Some(&tools), true);
    }
});
