//! Writes the list of `data/models/*.json` configs that `catalog.rs` embeds with
//! `include_str!`, so the binary carries them and moro-core itself never reads files.
//! A file `<org>--<name>.json` becomes the entry with HF id `<org>/<name>`.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::{env, fs};

fn main() {
    let manifest =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let dir = manifest.join("../../data/models");
    println!("cargo::rerun-if-changed={}", dir.display());
    let mut files: Vec<(String, PathBuf)> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .filter_map(|p| {
            let stem = p.file_stem()?.to_str()?.to_owned();
            let id = stem.replacen("--", "/", 1);
            Some((id, p.canonicalize().unwrap_or(p)))
        })
        .collect();
    files.sort();
    let mut out = String::from("&[\n");
    for (id, path) in &files {
        writeln!(
            out,
            "    CatalogEntry {{ id: {id:?}, config_json: include_str!({:?}) }},",
            path.display()
        )
        .expect("writing to a String cannot fail");
    }
    out.push_str("]\n");
    let out_dir = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    fs::write(out_dir.join("catalog_entries.rs"), out).expect("write catalog_entries.rs");
}
