//! moro-hub against a fake Hub on 127.0.0.1 (no internet).

mod support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use moro_core::formats::gguf::{GgmlType, GgufWriter};
use moro_core::formats::safetensors::{self, encode_header, stored_weights};
use moro_hub::{HubClient, HubError, HubSettings, RepoRef, find_cached};
use support::{Route, Server, hub_headers};

const SECRET: &str = "hf_test_secret_token";

fn settings(endpoint: &str, home: &std::path::Path, extra: &[(&str, &str)]) -> HubSettings {
    let mut env: HashMap<String, String> = HashMap::new();
    env.insert("HF_ENDPOINT".into(), endpoint.into());
    env.insert("HF_HOME".into(), home.to_str().unwrap().into());
    env.insert("HF_HUB_DOWNLOAD_TIMEOUT".into(), "5".into());
    for (k, v) in extra {
        env.insert((*k).into(), (*v).into());
    }
    let mut s = HubSettings::from_env(|k| env.get(k).cloned());
    s.use_env_proxy = false;
    s
}

/// A shard: header plus `weights` bytes of (fake) data.
fn shard(tensors: &[(&str, &str, &[u64])]) -> Vec<u8> {
    let mut b = encode_header(tensors, &[("format", "pt")]);
    let h = safetensors::parse_header(&b).unwrap();
    let data: u64 = h.tensors.iter().map(|t| t.byte_len).sum();
    b.resize(b.len() + data as usize, 7);
    b
}

fn serve_model(server: &Server, repo: &str) -> u64 {
    server.file(
        repo,
        "config.json",
        br#"{"model_type":"llama","hidden_size":64}"#.to_vec(),
    );
    let s1 = shard(&[
        ("embed.weight", "BF16", &[1000, 64]),
        ("l0.weight", "BF16", &[64, 64]),
    ]);
    let s2 = shard(&[
        ("l1.weight", "BF16", &[64, 64]),
        ("norm.weight", "F32", &[64]),
    ]);
    let total = 1000 * 64 * 2 + 2 * 64 * 64 * 2 + 64 * 4;
    let index = format!(
        r#"{{"metadata":{{"total_size":{total}}},"weight_map":{{"embed.weight":"model-00001-of-00002.safetensors","l0.weight":"model-00001-of-00002.safetensors","l1.weight":"model-00002-of-00002.safetensors","norm.weight":"model-00002-of-00002.safetensors"}}}}"#
    );
    server.file(repo, "model.safetensors.index.json", index.into_bytes());
    server.file(repo, "model-00001-of-00002.safetensors", s1);
    server.file(repo, "model-00002-of-00002.safetensors", s2);
    total
}

#[test]
fn config_and_sharded_headers_through_range_requests() {
    let server = Server::start();
    let total = serve_model(&server, "org/model");
    let home = tempfile::tempdir().unwrap();
    let s = settings(&server.url(), home.path(), &[]);
    let events = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let ev = events.clone();
    let client = HubClient::new(s.clone()).with_progress(std::sync::Arc::new(move |e| {
        ev.lock().unwrap().push(format!("{e:?}"));
    }));
    let repo = RepoRef::parse("org/model").unwrap();

    let config = client.fetch_config(&repo).unwrap();
    assert!(config.starts_with(b"{\"model_type\""));
    // Stored in the standard layout, found there next time without a request.
    let cached = find_cached(&s.hub_cache, &repo, "config.json").unwrap();
    assert!(
        cached.starts_with(
            home.path()
                .join("hub/models--org--model/snapshots")
                .join(support::COMMIT)
        )
    );
    let before = server.log().len();
    assert_eq!(client.fetch_config(&repo).unwrap(), config);
    assert_eq!(server.log().len(), before);

    let remote = client.fetch_safetensors_headers(&repo).unwrap();
    assert_eq!(remote.shards.len(), 2);
    assert_eq!(remote.index.as_ref().unwrap().total_size, Some(total));
    let all: Vec<_> = remote.shards.iter().flat_map(|(_, h)| &h.tensors).collect();
    let w = stored_weights(all, None);
    assert_eq!(w.total_bytes, total);
    assert_eq!(w.params_estimate, 1000 * 64 + 2 * 64 * 64 + 64);
    assert_eq!(w.by_dtype["BF16"], total - 256);

    // Shards were only ever read through Range requests, 8 bytes then the header.
    let shard_reqs: Vec<_> = server
        .log()
        .into_iter()
        .filter(|l| l.path.ends_with(".safetensors"))
        .collect();
    assert_eq!(shard_reqs.len(), 4);
    for pair in shard_reqs.chunks(2) {
        assert_eq!(pair[0].range.as_deref(), Some("bytes=0-7"));
        assert!(pair[1].range.as_deref().unwrap().starts_with("bytes=8-"));
    }
    let header_bytes: usize = shard_reqs.iter().map(|l| l.bytes_sent).sum();
    assert!(
        header_bytes < 2000,
        "read {header_bytes} bytes: weights were fetched"
    );
    assert!(events.lock().unwrap().iter().any(|e| e.contains("Cached")));
}

#[test]
fn gguf_header_and_server_ignoring_range() {
    let server = Server::start();
    let gguf = GgufWriter::new()
        .string("general.architecture", "llama")
        .u32("llama.block_count", 1)
        .tensor("blk.0.attn_q.weight", GgmlType::Q8_0, &[4096, 512])
        .build(true);
    assert!(gguf.len() > 2 << 20);
    server.route(
        "/org/gguf/resolve/main/m.gguf",
        Route {
            status: 200,
            headers: hub_headers(&gguf),
            body: gguf.clone(),
            ignore_range: true,
            ..Route::default()
        },
    );
    let home = tempfile::tempdir().unwrap();
    let client = HubClient::new(settings(&server.url(), home.path(), &[]));
    let h = client
        .fetch_gguf_header(&RepoRef::parse("org/gguf").unwrap(), "m.gguf")
        .unwrap();
    assert_eq!(h.weight_bytes(), 4096 / 32 * 34 * 512);
    // The whole file was offered, but the client stopped reading after its 1 MiB prefix.
    assert_eq!(server.log().len(), 1);
}

#[test]
fn gated_repo_needs_the_token() {
    let server = Server::start();
    let body = br#"{"model_type":"llama"}"#.to_vec();
    server.route(
        "/org/gated/resolve/main/config.json",
        Route {
            status: 200,
            headers: hub_headers(&body),
            body,
            token: Some(SECRET.into()),
            ..Route::default()
        },
    );
    let repo = RepoRef::parse("org/gated").unwrap();
    let home = tempfile::tempdir().unwrap();
    let err = HubClient::new(settings(&server.url(), home.path(), &[]))
        .fetch_config(&repo)
        .unwrap_err();
    assert!(matches!(
        err,
        HubError::Gated {
            token_sent: false,
            ..
        }
    ));
    assert_eq!(
        err.to_string(),
        "`org/gated` is gated or private; set HF_TOKEN or run `huggingface-cli login`"
    );
    let wrong = HubClient::new(settings(
        &server.url(),
        home.path(),
        &[("HF_TOKEN", "hf_wrong")],
    ));
    let err = wrong.fetch_config(&repo).unwrap_err();
    assert!(
        matches!(
            err,
            HubError::Gated {
                token_sent: true,
                ..
            }
        ),
        "{err}"
    );
    assert!(!err.to_string().contains("hf_wrong"));
    // The token file under HF_HOME works too.
    std::fs::write(home.path().join("token"), format!("{SECRET}\n")).unwrap();
    let client = HubClient::new(settings(&server.url(), home.path(), &[]));
    assert!(client.fetch_config(&repo).is_ok());
    assert!(!format!("{client:?}").contains(SECRET));
    assert_eq!(
        server.log().last().unwrap().auth.as_deref(),
        Some(format!("Bearer {SECRET}").as_str())
    );
}

#[test]
fn token_does_not_follow_a_redirect_to_another_host() {
    let hub = Server::start();
    let cdn = Server::start();
    let body = br#"{"model_type":"qwen2"}"#.to_vec();
    cdn.route(
        "/cdn/blob",
        Route {
            status: 200,
            body: body.clone(),
            ..Route::default()
        },
    );
    // Like the Hub's LFS redirects: commit and linked etag on the 302, the file elsewhere.
    let mut headers = hub_headers(&body);
    headers.push((
        "Location".into(),
        format!("{}/cdn/blob", cdn.localhost_url()),
    ));
    headers.push(("X-Linked-Etag".into(), "\"abcdef0123\"".into()));
    hub.route(
        "/org/redir/resolve/main/config.json",
        Route {
            status: 302,
            headers,
            ..Route::default()
        },
    );
    // A same-host relative redirect (a renamed repo) keeps the token.
    hub.route(
        "/org/old/resolve/main/config.json",
        Route {
            status: 307,
            headers: vec![(
                "Location".into(),
                "/org/new/resolve/main/config.json".into(),
            )],
            ..Route::default()
        },
    );
    hub.route(
        "/org/new/resolve/main/config.json",
        Route {
            status: 200,
            headers: hub_headers(&body),
            body: body.clone(),
            token: Some(SECRET.into()),
            ..Route::default()
        },
    );
    let home = tempfile::tempdir().unwrap();
    let s = settings(&hub.url(), home.path(), &[("HF_TOKEN", SECRET)]);
    let client = HubClient::new(s.clone());
    let repo = RepoRef::parse("org/redir").unwrap();
    assert_eq!(client.fetch_config(&repo).unwrap(), body);
    assert_eq!(
        hub.log()[0].auth.as_deref(),
        Some(format!("Bearer {SECRET}").as_str())
    );
    let at_cdn = cdn.log();
    assert_eq!(at_cdn.len(), 1);
    assert_eq!(at_cdn[0].auth, None, "the token was sent to another host");
    // Cached under the linked etag.
    let p = find_cached(&s.hub_cache, &repo, "config.json").unwrap();
    assert!(
        std::fs::canonicalize(p)
            .unwrap()
            .ends_with("blobs/abcdef0123")
    );

    assert_eq!(
        client
            .fetch_config(&RepoRef::parse("org/old").unwrap())
            .unwrap(),
        body
    );
}

#[test]
fn missing_files_and_repos() {
    let server = Server::start();
    serve_model(&server, "org/model");
    server.route(
        "/org/nope/resolve/main/config.json",
        Route {
            status: 404,
            headers: vec![("X-Error-Code".into(), "RepoNotFound".into())],
            ..Route::default()
        },
    );
    let home = tempfile::tempdir().unwrap();
    let client = HubClient::new(settings(&server.url(), home.path(), &[]));
    let err = client
        .fetch_file(&RepoRef::parse("org/model").unwrap(), "tokenizer.json")
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "`tokenizer.json` not found in `org/model` at revision `main`"
    );
    let err = client
        .fetch_config(&RepoRef::parse("org/nope").unwrap())
        .unwrap_err();
    assert!(matches!(err, HubError::RepoNotFound { .. }), "{err}");
    // Without a token the real Hub answers a misspelled repo with 401 + RepoNotFound: not
    // "gated".
    server.route(
        "/org/typo/resolve/main/config.json",
        Route {
            status: 401,
            headers: vec![("X-Error-Code".into(), "RepoNotFound".into())],
            ..Route::default()
        },
    );
    let err = client
        .fetch_config(&RepoRef::parse("org/typo").unwrap())
        .unwrap_err();
    assert!(matches!(err, HubError::RepoNotFound { .. }), "{err}");
    // A repo without index or model.safetensors.
    server.file("org/bin", "config.json", b"{}".to_vec());
    let err = client
        .fetch_safetensors_headers(&RepoRef::parse("org/bin").unwrap())
        .unwrap_err();
    assert!(err.to_string().contains("model.safetensors"), "{err}");
    // Unsafe shard names in an index are refused before any request.
    server.file(
        "org/evil",
        "model.safetensors.index.json",
        br#"{"weight_map":{"a":"../../x"}}"#.to_vec(),
    );
    let err = client
        .fetch_safetensors_headers(&RepoRef::parse("org/evil").unwrap())
        .unwrap_err();
    assert!(err.to_string().contains("not allowed"), "{err}");
}

#[test]
fn slow_response_times_out() {
    let server = Server::start();
    server.route(
        "/org/slow/resolve/main/config.json",
        Route {
            status: 200,
            body: b"{}".to_vec(),
            delay: Some(Duration::from_secs(3)),
            ..Route::default()
        },
    );
    let home = tempfile::tempdir().unwrap();
    let client = HubClient::new(settings(
        &server.url(),
        home.path(),
        &[("HF_HUB_DOWNLOAD_TIMEOUT", "0.3")],
    ));
    let start = Instant::now();
    let err = client
        .fetch_config(&RepoRef::parse("org/slow").unwrap())
        .unwrap_err();
    assert!(matches!(err, HubError::Timeout { .. }), "{err}");
    assert!(start.elapsed() < Duration::from_secs(2));
    assert!(
        err.to_string()
            .starts_with("timed out after 300 ms fetching `config.json`"),
        "{err}"
    );
}

#[test]
fn offline_mode_and_no_network() {
    let server = Server::start();
    serve_model(&server, "org/model");
    let home = tempfile::tempdir().unwrap();
    let repo = RepoRef::parse("org/model").unwrap();
    let offline = HubClient::new(settings(
        &server.url(),
        home.path(),
        &[("HF_HUB_OFFLINE", "1")],
    ));
    let err = offline.fetch_config(&repo).unwrap_err();
    assert!(matches!(err, HubError::Offline { .. }), "{err}");
    assert!(offline.fetch_safetensors_headers(&repo).is_err());
    assert!(server.log().is_empty());
    HubClient::new(settings(&server.url(), home.path(), &[]))
        .fetch_config(&repo)
        .unwrap();
    assert!(offline.fetch_config(&repo).is_ok());

    // A port nobody listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://127.0.0.1:{}", closed.local_addr().unwrap().port());
    drop(closed);
    let home = tempfile::tempdir().unwrap();
    let err = HubClient::new(settings(&url, home.path(), &[]))
        .fetch_config(&repo)
        .unwrap_err();
    assert!(matches!(err, HubError::Network { .. }), "{err}");
    assert!(
        err.to_string().starts_with("cannot reach 127.0.0.1"),
        "{err}"
    );
}

#[test]
fn local_directory_like_a_snapshot() {
    // What the CLI does for a path: find the files, read only headers.
    let server = Server::start();
    serve_model(&server, "org/model");
    let home = tempfile::tempdir().unwrap();
    let s = settings(&server.url(), home.path(), &[]);
    let repo = RepoRef::parse("org/model").unwrap();
    let client = HubClient::new(s.clone());
    client.fetch_config(&repo).unwrap();
    let dir = find_cached(&s.hub_cache, &repo, "config.json")
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    for f in [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
    ] {
        let bytes = client.fetch_range(&repo, f, 0, 1 << 30).unwrap().0;
        std::fs::write(dir.join(f), bytes).unwrap();
    }
    let moro_hub::LocalModel::Safetensors {
        shards,
        config,
        index,
    } = moro_hub::model_dir_files(&dir).unwrap()
    else {
        panic!()
    };
    assert!(config.is_some() && index.is_some());
    let headers = moro_hub::local::read_safetensors_headers(&shards).unwrap();
    assert_eq!(headers.iter().map(|h| h.tensors.len()).sum::<usize>(), 4);
    // Now that the shards are in the snapshot, the client reads them from disk.
    let before = server.log().len();
    client.fetch_safetensors_headers(&repo).unwrap();
    assert_eq!(server.log().len(), before);
}
