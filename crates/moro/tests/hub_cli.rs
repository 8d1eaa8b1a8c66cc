//! `moro estimate` and `moro gguf` through the real binary against a fake Hub on 127.0.0.1
//! (`HF_ENDPOINT`), local safetensors directories and a GGUF file written here. No internet.

mod common;
#[allow(dead_code)]
#[path = "../../moro-hub/tests/support/mod.rs"]
mod support;

use std::path::Path;

use common::Out;
use moro_core::formats::gguf::tiny_llama;
use moro_core::formats::safetensors::{self, encode_header};
use support::{Route, Server, hub_headers};

const SECRET: &str = "hf_cli_test_secret";

/// The binary with a clean Hub environment: `HF_ENDPOINT` = `endpoint`, `HF_HOME` = `home`.
fn moro(endpoint: &str, home: &Path, env: &[(&str, &str)], args: &[&str]) -> Out {
    let mut c = common::isolated();
    c.env_remove("HF_HUB_CACHE").env_remove("HF_HUB_OFFLINE");
    c.env("HF_ENDPOINT", endpoint)
        .env("HF_HOME", home)
        .env("MORO_CONFIG_DIR", home.join("moro-config"))
        .env("HF_HUB_DOWNLOAD_TIMEOUT", "5")
        .env("NO_PROXY", "*")
        .env("NO_COLOR", "1");
    for (k, v) in env {
        c.env(k, v);
    }
    Out::of(c.args(args))
}

/// A llama config: hidden 64, MLP 128, 2 layers, 4 heads, 2 KV heads, vocab 1000, untied.
const CONFIG: &str = r#"{"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "vocab_size": 1000, "tie_word_embeddings": false, "torch_dtype": "bfloat16"}"#;

/// Parameters of [`CONFIG`]: embeddings and lm_head 2·1000·64; per layer q, o 64·64, k, v
/// 64·32, MLP 3·64·128, 2 norms; the final norm.
const PARAMS: u64 = 2 * 1000 * 64 + 2 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128 + 2 * 64) + 64;

/// The tensors of [`CONFIG`] in two shards, BF16.
fn shards() -> [Vec<(String, &'static str, Vec<u64>)>; 2] {
    let t = |n: String, shape: &[u64]| (n, "BF16", shape.to_vec());
    let layer = |i: u32| {
        let n = |s: &str| format!("model.layers.{i}.{s}");
        vec![
            t(n("self_attn.q_proj.weight"), &[64, 64]),
            t(n("self_attn.k_proj.weight"), &[32, 64]),
            t(n("self_attn.v_proj.weight"), &[32, 64]),
            t(n("self_attn.o_proj.weight"), &[64, 64]),
            t(n("mlp.gate_proj.weight"), &[128, 64]),
            t(n("mlp.up_proj.weight"), &[128, 64]),
            t(n("mlp.down_proj.weight"), &[64, 128]),
            t(n("input_layernorm.weight"), &[64]),
            t(n("post_attention_layernorm.weight"), &[64]),
        ]
    };
    let mut first = vec![t("model.embed_tokens.weight".into(), &[1000, 64])];
    first.extend(layer(0));
    let mut second = layer(1);
    second.push(t("model.norm.weight".into(), &[64]));
    second.push(t("lm_head.weight".into(), &[1000, 64]));
    [first, second]
}

/// A safetensors file: header, then zeroed data.
fn safetensors_file(tensors: &[(String, &str, Vec<u64>)]) -> Vec<u8> {
    let refs: Vec<(&str, &str, &[u64])> = tensors
        .iter()
        .map(|(n, d, s)| (n.as_str(), *d, s.as_slice()))
        .collect();
    let mut b = encode_header(&refs, &[("format", "pt")]);
    let h = safetensors::parse_header(&b).expect("header");
    let data: u64 = h.tensors.iter().map(|t| t.byte_len).sum();
    b.resize(b.len() + usize::try_from(data).expect("size"), 0);
    b
}

const SHARD_NAMES: [&str; 2] = [
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
];

/// The files of a sharded checkpoint of [`CONFIG`]: (name, bytes).
fn model_files() -> Vec<(String, Vec<u8>)> {
    let shards = shards();
    let mut weight_map = serde_json::Map::new();
    for (i, s) in shards.iter().enumerate() {
        for (n, _, _) in s {
            weight_map.insert(n.clone(), SHARD_NAMES[i].into());
        }
    }
    let index =
        serde_json::json!({"metadata": {"total_size": PARAMS * 2}, "weight_map": weight_map});
    let mut files = vec![
        ("config.json".to_owned(), CONFIG.as_bytes().to_vec()),
        (
            "model.safetensors.index.json".to_owned(),
            index.to_string().into_bytes(),
        ),
    ];
    for (i, s) in shards.iter().enumerate() {
        files.push((SHARD_NAMES[i].to_owned(), safetensors_file(s)));
    }
    files
}

/// Serves the model at `repo` (behind `token` when given).
fn serve(server: &Server, repo: &str, files: &[(String, Vec<u8>)], token: Option<&str>) {
    for (name, body) in files {
        server.route(
            &format!("/{repo}/resolve/main/{name}"),
            Route {
                status: 200,
                headers: hub_headers(body),
                body: body.clone(),
                token: token.map(str::to_owned),
                ..Route::default()
            },
        );
    }
}

fn weights(v: &serde_json::Value) -> u64 {
    v["components"]["weights"].as_u64().expect("weights")
}

#[test]
fn a_model_only_on_the_hub_uses_its_safetensors_headers() {
    let server = Server::start();
    serve(&server, "org/tiny", &model_files(), None);
    let home = tempfile::tempdir().expect("tempdir");
    let args = [
        "estimate",
        "--model",
        "org/tiny",
        "--method",
        "inference",
        "--json",
    ];
    let v = moro(&server.url(), home.path(), &[], &args).answer_json();
    assert!(
        v["model"]["source"]
            .as_str()
            .is_some_and(|s| s.contains("Hub")),
        "{v}"
    );
    assert_eq!(v["model"]["parameters"].as_u64(), Some(PARAMS));
    assert_eq!(
        v["model"]["stored_weights"]["total_bytes"].as_u64(),
        Some(PARAMS * 2)
    );
    assert_eq!(
        v["model"]["stored_weights"]["params_estimate"].as_u64(),
        Some(PARAMS)
    );
    assert_eq!(weights(&v), PARAMS * 2);
    // Shards were read through Range requests only (8 bytes, then the header).
    for l in server.log() {
        if l.path.ends_with(".safetensors") {
            assert!(l.range.is_some(), "{l:?}");
        }
    }
    // The table says where the model came from and what it stores: config.json now comes
    // from the cache, the shard headers again from the Hub.
    let o = moro(
        &server.url(),
        home.path(),
        &[],
        &["estimate", "--model", "org/tiny"],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.contains("from Hugging Face cache"), "{}", o.stdout);
    assert!(
        o.stdout
            .contains("stored  404096 B in the safetensors headers"),
        "{}",
        o.stdout
    );
    // config.json was written to the standard cache: offline works from there.
    let o = moro(
        "http://127.0.0.1:9",
        home.path(),
        &[("HF_HUB_OFFLINE", "1")],
        &args,
    );
    assert_eq!(o.answer_json()["model"]["source"], "Hugging Face cache");
}

#[test]
fn a_pre_quantized_checkpoint_counts_as_stored() {
    // AWQ-style: every decoder Linear stored as int32 `qweight` (8 weights per element) and
    // fp16 `scales`; embeddings, norms and lm_head in BF16.
    let [a, b] = shards();
    let mut tensors: Vec<(String, &'static str, Vec<u64>)> = Vec::new();
    for (n, d, s) in a.into_iter().chain(b) {
        if n.contains("_proj.") {
            let base = n.trim_end_matches(".weight");
            // [out, in] → qweight [in, out/8], scales [in/64, out].
            tensors.push((format!("{base}.qweight"), "I32", vec![s[1], s[0] / 8]));
            tensors.push((format!("{base}.scales"), "F16", vec![s[1] / 64, s[0]]));
        } else {
            tensors.push((n, d, s));
        }
    }
    let file = safetensors_file(&tensors);
    let h = safetensors::parse_header(&file).expect("header");
    let stored: u64 = h.tensors.iter().map(|t| t.byte_len).sum();
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("config.json"), CONFIG).expect("write");
    std::fs::write(dir.path().join("model.safetensors"), &file).expect("write");
    let o = moro(
        "http://127.0.0.1:9",
        dir.path(),
        &[],
        &[
            "estimate",
            "--model",
            dir.path().to_str().expect("utf8"),
            "--method",
            "inference",
            "--json",
        ],
    );
    let v = o.answer_json();
    assert_eq!(v["model"]["stored_weights"]["quantization"], "awq");
    assert_eq!(weights(&v), stored);
    assert!(stored < PARAMS * 2);
    // The three levels moved with the weights.
    let total: u64 = v["phases"]
        .as_array()
        .expect("phases")
        .iter()
        .map(|p| p["allocated_bytes"].as_u64().expect("bytes"))
        .max()
        .expect("a phase");
    assert_eq!(v["peak_allocated_bytes"].as_u64(), Some(total));
}

#[test]
fn a_directory_of_sharded_safetensors() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, body) in model_files() {
        std::fs::write(dir.path().join(name), body).expect("write");
    }
    let path = dir.path().to_str().expect("utf8");
    let v = moro(
        "http://127.0.0.1:9",
        dir.path(),
        &[],
        &[
            "estimate",
            "--model",
            path,
            "--method",
            "inference",
            "--json",
        ],
    )
    .answer_json();
    assert_eq!(v["model"]["source"], "local directory");
    assert_eq!(
        v["model"]["stored_weights"]["total_bytes"].as_u64(),
        Some(PARAMS * 2)
    );
    assert_eq!(
        v["model"]["stored_weights"]["by_dtype"]["BF16"].as_u64(),
        Some(PARAMS * 2)
    );
    assert_eq!(weights(&v), PARAMS * 2);
    // One shard missing: a clear note, the config still counts.
    std::fs::remove_file(dir.path().join(SHARD_NAMES[1])).expect("rm");
    let o = moro(
        "http://127.0.0.1:9",
        dir.path(),
        &[],
        &["estimate", "--model", path, "--json"],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stderr.contains("missing"), "{}", o.stderr);
}

#[test]
fn a_gated_repo_needs_a_token_that_is_never_printed() {
    let server = Server::start();
    serve(&server, "org/gated", &model_files(), Some(SECRET));
    let home = tempfile::tempdir().expect("tempdir");
    let args = ["estimate", "--model", "org/gated", "--json"];
    let o = moro(&server.url(), home.path(), &[], &args);
    assert_eq!(o.code, 2, "{}", o.stderr);
    // Under --json the error is one JSON object on stdout.
    let v: serde_json::Value = serde_json::from_str(&o.stdout).expect("a JSON error");
    let e = &v["error"];
    let message = e["message"].as_str().unwrap_or_default();
    let hint = e["hint"].as_str().unwrap_or_default();
    assert!(message.contains("gated"), "{e}");
    assert!(
        format!("{message} {hint}").contains("HF_TOKEN")
            && format!("{message} {hint}").contains("huggingface-cli login"),
        "{e}"
    );
    assert!(o.stderr.is_empty(), "{}", o.stderr);

    let o = moro(&server.url(), home.path(), &[("HF_TOKEN", SECRET)], &args);
    let v = o.answer_json();
    assert_eq!(
        v["model"]["stored_weights"]["total_bytes"].as_u64(),
        Some(PARAMS * 2)
    );
    assert!(!o.stdout.contains(SECRET) && !o.stderr.contains(SECRET));

    // The token file works the same (HF_TOKEN_PATH).
    let token_file = home.path().join("my-token");
    std::fs::write(&token_file, format!("{SECRET}\n")).expect("write");
    let fresh = tempfile::tempdir().expect("tempdir");
    let o = moro(
        &server.url(),
        fresh.path(),
        &[("HF_TOKEN_PATH", token_file.to_str().expect("utf8"))],
        &args,
    );
    assert_eq!(o.code, 0, "{}", o.stderr);

    // A wrong token: the message says the token has no access.
    let other = tempfile::tempdir().expect("tempdir");
    let o = moro(
        &server.url(),
        other.path(),
        &[("HF_TOKEN", "hf_wrong")],
        &args,
    );
    assert_eq!(o.code, 2);
    assert!(o.stdout.contains("no access"), "{}", o.stdout);
    assert!(!o.stderr.contains("hf_wrong"), "{}", o.stderr);
}

#[test]
fn offline_or_failing_hub_falls_back_to_the_catalog() {
    let server = Server::start();
    let home = tempfile::tempdir().expect("tempdir");
    // Offline, exact weights asked for: no request, the catalog, and a note saying so.
    let o = moro(
        &server.url(),
        home.path(),
        &[],
        &[
            "estimate",
            "--model",
            "meta-llama/Llama-3.1-8B",
            "--exact-weights",
            "--offline",
            "--json",
        ],
    );
    assert_eq!(o.answer_json()["model"]["source"], "embedded catalog");
    assert!(o.stderr.contains("offline"), "{}", o.stderr);
    assert!(o.stderr.contains("embedded catalog"), "{}", o.stderr);
    assert!(server.log().is_empty(), "{:?}", server.log());
    // HF_HUB_OFFLINE=1 does the same.
    let o = moro(
        &server.url(),
        home.path(),
        &[("HF_HUB_OFFLINE", "1")],
        &[
            "estimate",
            "--model",
            "meta-llama/Llama-3.1-8B@v2",
            "--json",
        ],
    );
    assert_eq!(o.answer_json()["model"]["source"], "embedded catalog");
    assert!(server.log().is_empty());
    // A pinned revision the Hub does not have: the catalog, with the reason.
    let o = moro(
        &server.url(),
        home.path(),
        &[],
        &[
            "estimate",
            "--model",
            "meta-llama/Llama-3.1-8B",
            "--revision",
            "v9",
            "--json",
        ],
    );
    assert_eq!(o.answer_json()["model"]["source"], "embedded catalog");
    assert!(
        o.stderr.contains("cannot fetch") && o.stderr.contains("embedded catalog"),
        "{}",
        o.stderr
    );
    // Without --exact-weights or a revision, a catalog model never touches the network.
    let before = server.log().len();
    let o = moro(
        &server.url(),
        home.path(),
        &[],
        &["estimate", "--model", "meta-llama/Llama-3.1-8B", "--json"],
    );
    assert_eq!(o.answer_json()["model"]["source"], "embedded catalog");
    assert_eq!(server.log().len(), before);
}

#[test]
fn missing_repos_and_timeouts_are_one_line_errors() {
    let server = Server::start();
    server.route(
        "/org/missing/resolve/main/config.json",
        Route {
            status: 404,
            headers: vec![("X-Error-Code".into(), "RepoNotFound".into())],
            body: b"Repository not found".to_vec(),
            ..Route::default()
        },
    );
    let home = tempfile::tempdir().expect("tempdir");
    let o = moro(
        &server.url(),
        home.path(),
        &[],
        &["estimate", "--model", "org/missing"],
    );
    assert_eq!(o.code, 2, "{}", o.stderr);
    assert!(
        o.stderr.contains("`org/missing` not found on"),
        "{}",
        o.stderr
    );
    assert!(o.stderr.contains("hint:"), "{}", o.stderr);
    // A repo without config.json (plain 404).
    let o = moro(
        &server.url(),
        home.path(),
        &[],
        &["estimate", "--model", "org/nothing"],
    );
    assert_eq!(o.code, 2);
    assert!(o.stderr.contains("`config.json` not found"), "{}", o.stderr);
    assert_eq!(
        o.stderr.lines().filter(|l| l.starts_with("error")).count(),
        1
    );
    // Offline and not cached: says offline.
    let o = moro(
        &server.url(),
        home.path(),
        &[("HF_HUB_OFFLINE", "1")],
        &["estimate", "--model", "org/elsewhere"],
    );
    assert_eq!(o.code, 2);
    assert!(o.stderr.contains("offline"), "{}", o.stderr);
    // A slow Hub: a timeout naming the setting.
    let body = CONFIG.as_bytes().to_vec();
    server.route(
        "/org/slow/resolve/main/config.json",
        Route {
            status: 200,
            headers: hub_headers(&body),
            body,
            delay: Some(std::time::Duration::from_secs(3)),
            ..Route::default()
        },
    );
    let o = moro(
        &server.url(),
        home.path(),
        &[("HF_HUB_DOWNLOAD_TIMEOUT", "0.5")],
        &["estimate", "--model", "org/slow"],
    );
    assert_eq!(o.code, 2);
    assert!(o.stderr.contains("timed out"), "{}", o.stderr);
    // Nothing listens: a network error with a hint toward --offline.
    let o = moro(
        "http://127.0.0.1:9",
        home.path(),
        &[],
        &["estimate", "--model", "org/unreachable"],
    );
    assert_eq!(o.code, 2);
    assert!(o.stderr.contains("--offline"), "{}", o.stderr);
}

// By hand (see moro-core's `estimate_matches_hand_computation`): token_embd 6800 B; a layer
// 26368 B; output_norm + output 256 + 12800 B. ctx 1000 → 1024 cells (flash attention pads
// to 256), K and V f16 rows of 16·2 elements: 128 B per cell per layer. Compute buffer:
// ffn 3·128·512·4 = 786432 + 3·64·512·4 = 393216.
const EMBD: u64 = 6800;
const LAYER: u64 = 26368;
const OUT: u64 = 256 + 12800;
const KV: u64 = 2 * 1024 * 128;
const COMPUTE: u64 = 786_432 + 393_216;

#[test]
fn gguf_estimate_matches_the_hand_computation() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("tiny-Q4_0.gguf");
    std::fs::write(&file, tiny_llama(false)).expect("write");
    let f = file.to_str().expect("utf8");
    let run = |args: &[&str]| moro("http://127.0.0.1:9", dir.path(), &[], args);

    let v = run(&["gguf", f, "--ctx-size", "1000", "--json"]).answer_json();
    assert_eq!(v["gpu_weights_bytes"].as_u64(), Some(2 * LAYER + OUT));
    assert_eq!(v["host_weights_bytes"].as_u64(), Some(EMBD));
    assert_eq!(v["kv_cache_bytes"].as_u64(), Some(KV));
    assert_eq!(v["compute_buffer_bytes"].as_u64(), Some(COMPUTE));
    assert_eq!(
        v["total_gpu_bytes"].as_u64(),
        Some(2 * LAYER + OUT + KV + COMPUTE)
    );
    assert_eq!(v["architecture"], "llama");

    // The same through `moro estimate --method inference --model x.gguf --seq-len`.
    let e = run(&[
        "estimate",
        "--method",
        "inference",
        "--model",
        f,
        "--seq-len",
        "1000",
        "--json",
    ])
    .answer_json();
    assert_eq!(e["total_gpu_bytes"], v["total_gpu_bytes"]);

    // q8_0 KV cache: one 34-byte block per row.
    let q8 = run(&[
        "gguf",
        f,
        "-c",
        "1000",
        "--cache-type-k",
        "q8_0",
        "--cache-type-v",
        "q8_0",
        "--json",
    ])
    .answer_json();
    assert_eq!(q8["kv_cache_bytes"].as_u64(), Some(2 * 1024 * 68));

    // One layer offloaded: the other and the output on the host.
    let p = run(&["gguf", f, "-c", "1000", "--n-gpu-layers", "1", "--json"]).answer_json();
    assert_eq!(p["gpu_weights_bytes"].as_u64(), Some(LAYER));
    assert_eq!(p["host_weights_bytes"].as_u64(), Some(EMBD + LAYER + OUT));
    assert_eq!(p["kv_cache_host_bytes"].as_u64(), Some(1024 * 128));

    // The table.
    let o = run(&["gguf", f, "--ctx-size", "1000"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let total = (2 * LAYER + OUT + KV + COMPUTE).to_string();
    assert!(
        o.stdout.contains("total GPU") && o.stdout.contains(&total),
        "{}",
        o.stdout
    );
    assert!(o.stdout.contains("CUDA context"), "{}", o.stdout);

    // Bad input: exit 2 with a one-line error.
    let o = run(&["gguf", f, "--cache-type-v", "q8_0", "--flash-attn", "off"]);
    assert_eq!(o.code, 2);
    assert!(o.stderr.contains("flash attention"), "{}", o.stderr);
    let o = run(&["estimate", "--method", "lora", "--model", f]);
    assert_eq!(o.code, 2);
    assert!(o.stderr.contains("moro gguf"), "{}", o.stderr);
    let junk = dir.path().join("junk.gguf");
    std::fs::write(&junk, b"NOPE and more bytes").expect("write");
    let o = run(&["gguf", junk.to_str().expect("utf8")]);
    assert_eq!(o.code, 2);
    assert_eq!(
        o.stderr.lines().filter(|l| l.starts_with("error")).count(),
        1
    );
}

#[test]
fn gguf_header_from_the_hub() {
    let server = Server::start();
    server.file("org/tiny-GGUF", "tiny-Q4_0.gguf", tiny_llama(false));
    let home = tempfile::tempdir().expect("tempdir");
    let v = moro(
        &server.url(),
        home.path(),
        &[],
        &[
            "gguf",
            "org/tiny-GGUF",
            "--file",
            "tiny-Q4_0.gguf",
            "-c",
            "1000",
            "--json",
        ],
    )
    .answer_json();
    assert_eq!(
        v["total_gpu_bytes"].as_u64(),
        Some(2 * LAYER + OUT + KV + COMPUTE)
    );
    assert!(server.log().iter().all(|l| l.range.is_some()));
}
