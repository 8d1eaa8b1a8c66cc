//! `moro serve`'s JSON API: the same bytes as the CLI's `--json` for the same job, errors
//! that name the field, limits, and loopback by default.

mod common;

use common::server::Server;
use common::{json_of, moro, stdout_of};

/// The README's job, on the API and on the command line: the very same document.
#[test]
fn estimate_answers_what_the_cli_prints() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    let (status, kind, body) = s.post(
        "/api/estimate",
        r#"{"model": "Qwen/Qwen2.5-7B", "method": "qlora", "seq_len": 2048,
            "micro_batch_size": 1, "hardware": "rtx-4090"}"#,
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(kind, "application/json");
    let cli = stdout_of(
        dir.path(),
        &[
            "estimate",
            "--model",
            "Qwen/Qwen2.5-7B",
            "--method",
            "qlora",
            "--seq-len",
            "2048",
            "--micro-batch-size",
            "1",
            "--hardware",
            "rtx-4090",
            "--json",
        ],
        0,
    );
    assert_eq!(body, String::from_utf8(cli).unwrap());
    // The README's figures (12.95 / 14.25 / 15.15 GiB), from the API.
    let v = json_of(body.as_bytes());
    let gib = |k: &str| {
        format!(
            "{:.2}",
            v[k].as_u64().unwrap() as f64 / f64::from(1u32 << 30)
        )
    };
    assert_eq!(
        [
            gib("peak_allocated_bytes"),
            gib("peak_reserved_bytes"),
            gib("peak_device_bytes")
        ],
        ["12.95", "14.25", "15.15"]
    );
    // A CLI alias (`--batch-size`) is a field too, with the same meaning.
    let (_, _, aliased) = s.post(
        "/api/estimate",
        r#"{"model": "Qwen/Qwen2.5-7B", "method": "qlora", "max_seq_length": 2048,
            "batch_size": 1, "hardware": "rtx-4090"}"#,
    );
    assert_eq!(aliased, body);
}

#[test]
fn fit_recipe_and_pictures_match_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    let job = [
        "--model",
        "Qwen/Qwen2.5-0.5B",
        "--method",
        "lora",
        "--seq-len",
        "1024",
    ];
    let (status, _, fit) = s.post(
        "/api/fit",
        r#"{"model": "Qwen/Qwen2.5-0.5B", "method": "lora", "seq_len": 1024}"#,
    );
    assert_eq!(status, 200, "{fit}");
    let cli = moro(dir.path())
        .arg("fit")
        .args(job)
        .arg("--json")
        .assert()
        .code(0);
    assert_eq!(fit.as_bytes(), cli.get_output().stdout.as_slice());

    let (status, kind, svg) = s.post(
        "/api/fit.svg",
        r#"{"model": "Qwen/Qwen2.5-0.5B", "method": "lora", "seq_len": 1024}"#,
    );
    assert_eq!((status, kind.as_str()), (200, "image/svg+xml"));
    moro(dir.path())
        .arg("fit")
        .args(job)
        .args(["--svg", "fit.svg"])
        .assert()
        .code(0);
    assert_eq!(
        svg,
        std::fs::read_to_string(dir.path().join("fit.svg")).unwrap()
    );

    let est = r#"{"model": "Qwen/Qwen2.5-0.5B", "method": "lora", "seq_len": 1024, "hardware": "rtx-4090"}"#;
    let (_, _, svg) = s.post("/api/estimate.svg", est);
    moro(dir.path())
        .args(["estimate", "--hardware", "rtx-4090", "--svg", "est.svg"])
        .args(job)
        .assert()
        .code(0);
    assert_eq!(
        svg,
        std::fs::read_to_string(dir.path().join("est.svg")).unwrap()
    );

    let (status, kind, yaml) = s.post(
        "/api/recipe.yaml",
        r#"{"model": "Qwen/Qwen2.5-0.5B", "method": "lora", "seq_len": 1024, "hardware": "rtx-4090"}"#,
    );
    assert_eq!((status, kind.as_str()), (200, "application/yaml"), "{yaml}");
    let cli = moro(dir.path())
        .args(["recipe", "generate", "--hardware", "rtx-4090"])
        .args(job)
        .assert()
        .code(0);
    assert_eq!(yaml.as_bytes(), cli.get_output().stdout.as_slice());

    // The recipe exports as `moro recipe export` writes it.
    std::fs::write(dir.path().join("moro.yaml"), &yaml).unwrap();
    let body = serde_json::json!({"recipe": yaml, "to": "axolotl"}).to_string();
    let (status, _, exported) = s.post("/api/export", &body);
    assert_eq!(status, 200, "{exported}");
    let e = json_of(exported.as_bytes());
    moro(dir.path())
        .args([
            "recipe",
            "export",
            "moro.yaml",
            "--to",
            "axolotl",
            "-o",
            "out/",
        ])
        .assert()
        .code(0);
    let name = e["files"][0]["name"].as_str().unwrap();
    assert_eq!(
        e["files"][0]["content"].as_str().unwrap(),
        std::fs::read_to_string(dir.path().join("out").join(name)).unwrap()
    );
}

#[test]
fn bad_input_is_a_400_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    let cases = [
        (
            r#"{"model": "Qwen/Qwen2.5-7B", "seq_len": "long"}"#,
            Some("seq_len"),
        ),
        (
            r#"{"model": "Qwen/Qwen2.5-7B", "seq_len": 0}"#,
            Some("seq_len"),
        ),
        (
            r#"{"model": "Qwen/Qwen2.5-7B", "method": "qlroa"}"#,
            Some("method"),
        ),
        (
            r#"{"model": "Qwen/Qwen2.5-7B", "lora_rank": 16.5}"#,
            Some("lora_rank"),
        ),
        (
            r#"{"model": "Qwen/Qwen2.5-7B", "seq_lenght": 4}"#,
            Some("seq_lenght"),
        ),
        (
            r#"{"model": "Qwen/Qwen2.5-7B", "svg": "/tmp/x.svg"}"#,
            Some("svg"),
        ),
        (
            r#"{"model": "Qwen/Qwen2.5-7B", "dora": "yes"}"#,
            Some("dora"),
        ),
        (
            r#"{"model": "Qwen/Qwen2.5-7B", "hardware": "rtx-9999"}"#,
            None,
        ),
        (
            r#"{"model": "Qwen/Qwen2.5-7B", "method": "qlora", "lora_rank": 4294967297}"#,
            None,
        ),
        (r#"[1, 2]"#, None),
        (r#"{"model": "#, None),
    ];
    for (body, field) in cases {
        let (status, kind, text) = s.post("/api/estimate", body);
        assert_eq!(status, 400, "{body}: {text}");
        assert_eq!(kind, "application/json", "{body}");
        let e = json_of(text.as_bytes());
        let message = e["error"]["message"].as_str().unwrap();
        assert!(
            !message.is_empty() && !message.contains('\n'),
            "{body}: {message}"
        );
        if let Some(f) = field {
            assert_eq!(e["error"]["field"], f, "{body}: {text}");
            assert!(message.contains(f), "{body}: {message}");
        }
    }
    let (_, _, text) = s.post("/api/estimate", r#"{"modle": "x"}"#);
    assert!(text.contains("did you mean `model`?"), "{text}");
}

#[test]
fn an_unknown_model_is_a_404_with_the_closest_names() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    let (status, _, text) = s.post("/api/estimate", r#"{"model": "Qwen/Qwen2.5-3B-Instrcut"}"#);
    assert_eq!(status, 404, "{text}");
    let e = json_of(text.as_bytes());
    let closest: Vec<&str> = e["error"]["closest"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(closest.first(), Some(&"Qwen/Qwen2.5-3B-Instruct"), "{text}");
    let (status, _, _) = s.get("/no/such/page");
    assert_eq!(status, 404);
}

#[test]
fn an_oversized_body_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    let big = format!(r#"{{"model": "{}"}}"#, "x".repeat(300 * 1024));
    let (status, _, text) = s.post("/api/estimate", &big);
    assert_eq!(status, 413, "{text}");
    assert!(
        json_of(text.as_bytes())["error"]["message"]
            .as_str()
            .unwrap()
            .contains("larger than")
    );
}

#[test]
fn it_binds_loopback_unless_asked() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    assert!(s.url.starts_with("http://127.0.0.1:"), "{}", s.banner);
    let wide = Server::start(dir.path(), &["--host", "0.0.0.0"]);
    assert!(wide.banner.contains("http://127.0.0.1:"), "{}", wide.banner);
    // Only the explicit --host listens beyond loopback, and it says so.
    let (status, _, _) = wide.get("/api/models");
    assert_eq!(status, 200);
    moro(dir.path())
        .args(["serve", "--host", "not-an-address"])
        .assert()
        .code(2);
}

#[test]
fn the_page_and_its_files_are_embedded() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    let (status, kind, html) = s.get("/");
    assert_eq!((status, kind.as_str()), (200, "text/html; charset=utf-8"));
    for needle in [
        "/app.js",
        "/style.css",
        "id=\"fit-table\"",
        "id=\"out-device\"",
    ] {
        assert!(html.contains(needle), "{needle}");
    }
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "nothing from elsewhere"
    );
    let (status, _, js) = s.get("/app.js");
    assert_eq!(status, 200);
    assert!(!js.contains("http://") && !js.contains("https://"));
    let (_, _, models) = s.get("/api/models");
    let cli = moro(dir.path()).args(["models", "--json"]).assert().code(0);
    assert_eq!(models.as_bytes(), cli.get_output().stdout.as_slice());
}

/// What the CLI prints on stderr (a warning about the job) comes back in `moro-notes`, in the
/// CLI's words.
#[test]
fn notes_and_warnings_come_back_in_a_header() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    // Qwen2.5-0.5B has 32,768 positions.
    let (status, _, _, notes) = s.post_with_notes(
        "/api/estimate",
        r#"{"model": "Qwen/Qwen2.5-0.5B", "method": "lora", "seq_len": 65536}"#,
    );
    assert_eq!(status, 200);
    assert_eq!(
        notes,
        "warning: max_seq_length 65536 is beyond the model's 32768 positions: the model was \
         not trained on sequences this long"
    );
    let cli = moro(dir.path())
        .args([
            "estimate",
            "--model",
            "Qwen/Qwen2.5-0.5B",
            "--method",
            "lora",
            "--seq-len",
            "65536",
        ])
        .assert()
        .get_output()
        .stderr
        .clone();
    assert!(String::from_utf8(cli).unwrap().contains(&notes));
    let (_, _, _, none) = s.post_with_notes(
        "/api/estimate",
        r#"{"model": "Qwen/Qwen2.5-0.5B", "method": "lora", "seq_len": 1024}"#,
    );
    assert_eq!(none, "");
}

/// A page elsewhere cannot drive the API through the user's browser: a rebound `Host` is
/// refused on a loopback server, and so is a `POST` that is not JSON (it would need no CORS
/// preflight).
#[test]
fn requests_from_elsewhere_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    let port = s.url.rsplit(':').next().unwrap().to_owned();
    let raw = |request: String| {
        use std::io::{Read, Write};
        let mut c = std::net::TcpStream::connect(format!("127.0.0.1:{port}")).unwrap();
        c.write_all(request.as_bytes()).unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out).unwrap();
        out
    };
    let body = r#"{"model": "Qwen/Qwen2.5-0.5B"}"#;
    let post = |host: &str, kind: &str| {
        raw(format!(
            "POST /api/estimate HTTP/1.1\r\nHost: {host}\r\nContent-Type: {kind}\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ))
    };
    assert!(post("evil.example:80", "application/json").starts_with("HTTP/1.1 403"));
    assert!(post(&format!("localhost:{port}"), "text/plain").starts_with("HTTP/1.1 415"));
    for host in [
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        "[::1]".into(),
    ] {
        let answer = post(&host, "application/json");
        assert!(answer.starts_with("HTTP/1.1 200"), "{host}: {answer}");
    }
}

/// The server keeps its last fit searches: the same settings in another order get the same
/// answer, and other settings their own.
#[test]
fn kept_fit_searches_answer_only_their_own_settings() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    let lora = r#"{"model": "Qwen/Qwen2.5-0.5B", "method": "lora", "seq_len": 1024}"#;
    let again = r#"{"seq_len": 1024, "method": "lora", "model": "Qwen/Qwen2.5-0.5B"}"#;
    let full = r#"{"model": "Qwen/Qwen2.5-0.5B", "method": "full", "seq_len": 1024}"#;
    let (_, _, a) = s.post("/api/fit", lora);
    let (_, _, b) = s.post("/api/fit", again);
    let (_, _, c) = s.post("/api/fit", full);
    assert_eq!(a, b);
    assert_eq!(json_of(c.as_bytes())["method"], "full");
    let cli = stdout_of(
        dir.path(),
        &[
            "fit",
            "--model",
            "Qwen/Qwen2.5-0.5B",
            "--method",
            "full",
            "--seq-len",
            "1024",
            "--json",
        ],
        0,
    );
    assert_eq!(c.as_bytes(), cli.as_slice());
}

/// An encoder-decoder's target length means the same from flags, from moro.yaml and from
/// the API: one estimate, and the tokens line says which sequence is which.
#[test]
fn a_target_length_is_one_setting_everywhere() {
    let dir = tempfile::tempdir().unwrap();
    let config = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../validation/seq2seq-configs/flan-t5-base.json"
    );
    let flags = [
        "estimate",
        "--model",
        config,
        "--method",
        "lora",
        "--seq-len",
        "512",
        "--target-len",
        "128",
        "--micro-batch-size",
        "8",
        "--hardware",
        "24GiB",
    ];
    let text = String::from_utf8(stdout_of(dir.path(), &flags, 0)).unwrap();
    assert!(
        text.contains("tokens  512 into the encoder, 128 target tokens into the decoder"),
        "{text}"
    );
    let cli = json_of(&stdout_of(
        dir.path(),
        &[&flags[..], &["--json"]].concat(),
        0,
    ));
    assert_eq!(cli["job"]["target_len"], 128);
    let recipe = dir.path().join("moro.yaml");
    std::fs::write(
        &recipe,
        format!(
            "model:\n  base: {config}\n  method: lora\ntraining:\n  max_seq_length: 512\n  \
             target_len: 128\n  micro_batch_size: 8\n"
        ),
    )
    .unwrap();
    let from_recipe = json_of(&stdout_of(
        dir.path(),
        &[
            "estimate",
            recipe.to_str().unwrap(),
            "--hardware",
            "24GiB",
            "--json",
        ],
        0,
    ));
    assert_eq!(
        from_recipe["peak_device_bytes"], cli["peak_device_bytes"],
        "moro.yaml and flags"
    );
    let s = Server::start(dir.path(), &[]);
    let (status, _, body) = s.post(
        "/api/estimate",
        &format!(
            r#"{{"model": "{config}", "method": "lora", "seq_len": 512, "target_len": 128,
                "micro_batch_size": 8, "hardware": "24GiB"}}"#
        ),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        json_of(body.as_bytes())["peak_device_bytes"],
        cli["peak_device_bytes"]
    );
    // On a model with one sequence it is refused by name.
    let (status, _, body) = s.post(
        "/api/estimate",
        r#"{"model": "Qwen/Qwen2.5-0.5B", "target_len": 128}"#,
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("training.target_len"), "{body}");
}

/// The generated tokens of an inference job are one setting on the command line and the
/// API: the same estimate, the idle cache included; a training job refuses them by name.
#[test]
fn generated_tokens_are_one_setting_everywhere() {
    let dir = tempfile::tempdir().unwrap();
    let flags = [
        "estimate",
        "--model",
        "meta-llama/Llama-3.1-8B",
        "--method",
        "inference",
        "--seq-len",
        "2304",
        "--max-new-tokens",
        "2048",
        "--micro-batch-size",
        "16",
        "--hardware",
        "80GiB",
        "--json",
    ];
    let cli = json_of(&stdout_of(dir.path(), &flags, 0));
    assert_eq!(cli["job"]["new_tokens"], 2048);
    let s = Server::start(dir.path(), &[]);
    let (status, _, body) = s.post(
        "/api/estimate",
        r#"{"model": "meta-llama/Llama-3.1-8B", "method": "inference", "seq_len": 2304,
            "max_new_tokens": 2048, "micro_batch_size": 16, "hardware": "80GiB"}"#,
    );
    assert_eq!(status, 200, "{body}");
    let api = json_of(body.as_bytes());
    for field in ["peak_device_bytes", "idle_cache_bytes"] {
        assert_eq!(api[field], cli[field], "{field}");
    }
    // The page says what the idle blocks are when the API reports them.
    let page = include_str!("../src/serve/page/app.js");
    assert!(page.contains("d.idle_cache_bytes"));
    let (status, _, body) = s.post(
        "/api/estimate",
        r#"{"model": "Qwen/Qwen2.5-0.5B", "method": "lora", "max_new_tokens": 128}"#,
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("training.max_new_tokens"), "{body}");
}

/// An MPS job on the API is the CLI's, `backend` included, and the page names the counters
/// MPS has (the page switches its labels on `backend`).
#[test]
fn an_mps_estimate_is_the_clis_and_the_page_can_say_so() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    let (status, _, body) = s.post(
        "/api/estimate",
        r#"{"model": "Qwen/Qwen2.5-0.5B", "method": "lora", "seq_len": 1024,
            "device": "mps", "memory": "16GiB"}"#,
    );
    assert_eq!(status, 200, "{body}");
    let cli = stdout_of(
        dir.path(),
        &[
            "estimate",
            "--model",
            "Qwen/Qwen2.5-0.5B",
            "--method",
            "lora",
            "--seq-len",
            "1024",
            "--device",
            "mps",
            "--memory",
            "16GiB",
            "--json",
        ],
        0,
    );
    assert_eq!(body, String::from_utf8(cli).unwrap());
    assert_eq!(json_of(body.as_bytes())["backend"], "mps");
    let page = include_str!("../src/serve/page/app.js");
    assert!(page.contains("torch.accelerator.max_memory_allocated()"));
    assert!(page.contains("d.backend === \"mps\""));
}
