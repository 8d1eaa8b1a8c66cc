//! parse never panics: arbitrary text, arbitrary bytes, and mutations of valid recipes. Every
//! error is one line; everything that parses writes back to itself. Random recipes (strings
//! from any Unicode, numbers across their range) survive recipe → YAML → recipe, in our
//! reader and in PyYAML.

use moro_recipe::choices::{Optimizer, Quantization, Stack};
use moro_recipe::{
    Components, DataSection, HardwareSection, ModelSection, PredictionSection, Recipe,
    TargetModules, TrainingSection, parse, parse_bytes, to_yaml,
};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRunner};

use crate::pyyaml::assert_pyyaml_agrees;
use crate::{FULL, PRODUCT};

/// What must hold for any input.
fn check(text: &str) {
    match parse(text) {
        Ok(r) => {
            let again = parse(&to_yaml(&r, "fuzz"));
            assert_eq!(
                again.as_ref(),
                Ok(&r),
                "accepted input does not write back:\n{text}"
            );
        }
        Err(e) => {
            let s = e.to_string();
            assert!(
                !s.contains('\n') && !s.contains('\r'),
                "multi-line error {s:?}"
            );
            assert!(s.starts_with("moro.yaml:"), "{s}");
            assert!(e.line.is_none_or(|l| l >= 1) && e.column.is_none_or(|c| c >= 1));
        }
    }
}

/// Characters that matter to YAML, plus some that matter to nothing.
const ALPHABET: &[char] = &[
    ' ', ' ', '\n', '\t', '\r', ':', '-', '#', '[', ']', '{', '}', ',', '&', '*', '!', '|', '>',
    '\'', '"', '%', '@', '?', '~', '.', '0', '1', '9', 'e', 'a', 'y', 'n', '<', '\\', '\u{0}',
    '\u{85}', '\u{2028}', '\u{feff}', 'é',
];

#[derive(Debug, Clone)]
enum Edit {
    Insert(usize, String),
    Delete(usize, usize),
    Replace(usize, char),
    DuplicateLine(usize),
    SwapLines(usize, usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    let snippet = prop_oneof![
        proptest::sample::select(ALPHABET).prop_map(String::from),
        proptest::sample::select(vec![
            "\n  ",
            ": ",
            "- ",
            "0",
            "-1",
            "2.5",
            "1e3",
            "99999999999999999999999",
            "~",
            "null",
            "yes",
            "[",
            "{",
            "&a ",
            "*a",
            "<<: ",
            "!!str ",
            "bogus: 1\n",
            "\n---\n",
            "\"",
            "'",
            "training:\n",
            "  micro_batch_size: ",
            "model:\n  base: x\n",
            "\t",
        ])
        .prop_map(String::from),
    ];
    prop_oneof![
        (any::<usize>(), snippet).prop_map(|(i, s)| Edit::Insert(i, s)),
        (any::<usize>(), 1usize..12).prop_map(|(i, n)| Edit::Delete(i, n)),
        (any::<usize>(), proptest::sample::select(ALPHABET)).prop_map(|(i, c)| Edit::Replace(i, c)),
        any::<usize>().prop_map(Edit::DuplicateLine),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Edit::SwapLines(a, b)),
    ]
}

fn apply(text: &str, edits: &[Edit]) -> String {
    let mut chars: Vec<char> = text.chars().collect();
    for e in edits {
        let n = chars.len().max(1);
        match e {
            Edit::Insert(i, s) => {
                let at = i % (chars.len() + 1);
                chars.splice(at..at, s.chars());
            }
            Edit::Delete(i, k) => {
                let at = i % n;
                let end = (at + k).min(chars.len());
                if at < end {
                    chars.drain(at..end);
                }
            }
            Edit::Replace(i, c) => {
                if !chars.is_empty() {
                    chars[i % n] = *c;
                }
            }
            Edit::DuplicateLine(i) | Edit::SwapLines(i, _) => {
                let s: String = chars.iter().collect();
                let mut lines: Vec<&str> = s.split('\n').collect();
                let a = i % lines.len();
                if let Edit::SwapLines(_, j) = e {
                    let b = j % lines.len();
                    lines.swap(a, b);
                } else {
                    lines.insert(a, lines[a]);
                }
                chars = lines.join("\n").chars().collect();
            }
        }
    }
    chars.into_iter().collect()
}

proptest! {
    #![proptest_config(Config { cases: 512, ..Config::default() })]

    #[test]
    fn arbitrary_text_never_panics(text in any::<String>()) {
        check(&text);
    }

    #[test]
    fn yaml_like_text_never_panics(text in proptest::collection::vec(proptest::sample::select(ALPHABET), 0..200)) {
        check(&text.into_iter().collect::<String>());
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        if let Err(e) = parse_bytes(&bytes) {
            prop_assert!(!e.to_string().contains('\n'));
        }
    }

    #[test]
    fn mutated_recipes_never_panic(
        full in any::<bool>(),
        edits in proptest::collection::vec(edit(), 1..6),
    ) {
        let base = if full { FULL } else { PRODUCT };
        check(&apply(base, &edits));
    }
}

#[test]
fn deep_nesting_and_large_input_do_not_overflow() {
    for depth in [1_000, 100_000] {
        check(&format!("model:\n  base: {}\n", "[".repeat(depth)));
        check(&format!("model: {}\n", "{a: ".repeat(depth)));
        check(&"- ".repeat(depth));
    }
    let many = "model:\n  base: a\n".to_owned() + &"# c\n".repeat(200_000);
    check(&many);
    // Alias bombs are bounded by the reader's budget.
    let mut bomb = String::from("a: &a [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 0..12 {
        let p = if i == 0 {
            "a".to_owned()
        } else {
            format!("b{}", i - 1)
        };
        bomb.push_str(&format!(
            "b{i}: &b{i} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
        ));
    }
    bomb.push_str("model:\n  base: a\n");
    check(&bomb);
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[ -~]{0,30}",
        proptest::sample::select(crate::write::HAZARDS).prop_map(String::from),
    ]
}

fn finite(lo: f64, hi: f64) -> impl Strategy<Value = f64> {
    prop_oneof![
        lo..hi,
        Just(lo),
        proptest::sample::select(vec![1e-10, 2e-4, 0.05, 0.5, 1.0])
            .prop_map(move |x: f64| x.clamp(lo, hi))
    ]
}

prop_compose! {
    fn recipe()(
        name in proptest::option::of(text()),
        version in proptest::option::of(text()),
        base in "[A-Za-z0-9]{1,8}/[ -~]{0,20}",
        quant in proptest::option::of(proptest::sample::select(&Quantization::ALL[1..])),
        rank in proptest::option::of(1u64..=65_536),
        alpha in proptest::option::of(finite(1e-6, 1e6)),
        dropout in proptest::option::of(0.0f64..0.99),
        targets in proptest::option::of(prop_oneof![
            Just(TargetModules::AllLinear),
            proptest::collection::btree_set(
                prop_oneof![
                    text().prop_filter("a module name", |s| !s.trim().is_empty()),
                    "[a-z_]{1,10}|yes|on|3[.]10",
                ],
                1..5,
            )
                .prop_map(|s| TargetModules::Names(s.into_iter().collect())),
        ]),
        batch in 1u64..=65_536,
        accum in 1u64..=1_048_576,
        seq in 1u64..=16_777_216,
        opt in proptest::sample::select(Optimizer::ALL),
        stack in proptest::sample::select(Stack::ALL),
        flags in any::<(bool, bool, bool)>(),
        lr in proptest::option::of(finite(1e-12, 10.0)),
        dataset in proptest::option::of("[ -~]*[!-~][ -~]*"),
        hw in proptest::option::of((proptest::option::of(text()), proptest::option::of(1u64..u64::MAX), 1u64..=65_536)),
        pred in proptest::option::of((any::<u64>(), any::<i64>(), proptest::collection::vec((prop_oneof!["[a-z_]{1,12}", text()], any::<u64>()), 0..6))),
        dataset_lengths in proptest::option::of((1u64..1_000_000, any::<u64>())),
    ) -> Recipe {
        let mut components: Vec<(String, u64)> = Vec::new();
        for (n, b) in pred.as_ref().map(|p| p.2.clone()).unwrap_or_default() {
            if !components.iter().any(|(m, _)| *m == n) {
                components.push((n, b));
            }
        }
        Recipe {
            name,
            version,
            model: ModelSection {
                base,
                quantization: quant,
                lora_rank: rank,
                lora_alpha: alpha,
                lora_dropout: dropout,
                target_modules: targets,
                ..ModelSection::new("")
            },
            training: TrainingSection {
                micro_batch_size: batch,
                gradient_accumulation_steps: accum,
                max_seq_length: seq,
                optimizer: Some(opt),
                stack,
                gradient_checkpointing: Some(flags.0),
                auto_heal: flags.1,
                packing: flags.2,
                learning_rate: lr,
                dataset,
                ..TrainingSection::default()
            },
            parallel: None,
            hardware: hw.map(|(name, memory_bytes, count)| HardwareSection {
                name,
                memory_bytes,
                count,
                ..HardwareSection::default()
            }),
            prediction: pred.map(|(peak, headroom, _)| PredictionSection {
                peak_allocated_bytes: peak / 2,
                peak_reserved_bytes: peak,
                peak_device_bytes: peak,
                headroom_bytes: Some(headroom),
                components: Components(components),
                ..PredictionSection::default()
            }),
            data: dataset_lengths.map(|(p99, truncated)| DataSection {
                path: "data/train.jsonl".to_owned(),
                shape: Some("messages".to_owned()),
                samples: Some(p99 * 3),
                percentile: 99.5,
                p90_tokens: Some(p99 / 2),
                p95_tokens: None,
                p99_tokens: p99,
                max_tokens: Some(p99 * 2),
                truncated_samples: Some(truncated),
            }),
        }
    }
}

proptest! {
    #![proptest_config(Config { cases: 256, ..Config::default() })]

    #[test]
    fn random_recipes_round_trip(r in recipe(), header in any::<String>()) {
        prop_assert!(r.validate().is_ok(), "{:?}", r.validate());
        let y = to_yaml(&r, &header);
        prop_assert_eq!(parse(&y), Ok(r), "{}", y);
    }
}

#[test]
fn random_recipes_read_the_same_in_pyyaml() {
    let mut runner = TestRunner::new(Config {
        cases: 300,
        ..Config::default()
    });
    let strategy = recipe();
    let recipes: Vec<Recipe> = (0..300)
        .map(|_| strategy.new_tree(&mut runner).expect("generate").current())
        .collect();
    assert_pyyaml_agrees(&recipes);
}

/// libFuzzer's corpus for the `moro_yaml` target (`fuzz/corpus/moro_yaml`, minimized; the
/// target only asks that parsing not panic) holds to the stronger properties above: what
/// parses writes back to itself, and every error is one line with a position.
#[test]
fn the_fuzz_corpus_holds_to_the_same_properties() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fuzz/corpus/moro_yaml");
    let mut seen = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let bytes = std::fs::read(entry.unwrap().path()).unwrap();
        if let Ok(text) = std::str::from_utf8(&bytes) {
            check(text);
            seen += 1;
        }
    }
    assert!(seen > 1000, "{seen} inputs in {dir}");
}
