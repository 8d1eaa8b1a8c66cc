//! Models on disk: a directory (or a file in it) holding `config.json` with safetensors
//! (single or sharded), or a `.gguf` file. Only header bytes are read.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use moro_core::formats::gguf::{self, GgufError, GgufHeader};
use moro_core::formats::safetensors::{self, SafetensorsHeader};

use crate::HubError;

/// The sharded-index file name (transformers `SAFE_WEIGHTS_INDEX_NAME`).
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// The single-file name (transformers `SAFE_WEIGHTS_NAME`).
pub const SINGLE_FILE: &str = "model.safetensors";

/// First read of a GGUF header; it grows ×4 until the header fits.
pub const GGUF_FIRST_READ: u64 = 1 << 20;

/// Largest GGUF header read (token lists of 256k-vocabulary models take ~10 MB).
pub const GGUF_MAX_HEADER: u64 = 512 << 20;

/// The files of a local model.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LocalModel {
    /// safetensors weights.
    Safetensors {
        /// `config.json` next to the weights, when present.
        config: Option<PathBuf>,
        /// `model.safetensors.index.json`, when sharded.
        index: Option<PathBuf>,
        /// The weight files, sorted.
        shards: Vec<PathBuf>,
    },
    /// A GGUF file.
    Gguf {
        /// The file.
        file: PathBuf,
        /// `config.json` next to it, when present.
        config: Option<PathBuf>,
    },
}

fn io_err(path: &Path, e: &std::io::Error) -> HubError {
    HubError::Io {
        path: path.to_path_buf(),
        detail: e.to_string().to_lowercase(),
    }
}

fn has_ext(p: &Path, ext: &str) -> bool {
    p.extension().is_some_and(|e| e.eq_ignore_ascii_case(ext))
}

fn existing(p: PathBuf) -> Option<PathBuf> {
    p.is_file().then_some(p)
}

/// Finds the model files at `path`: a `.gguf` file, a `.safetensors` file, a `config.json`,
/// or a directory with `model.safetensors.index.json`, `*.safetensors` or one `*.gguf`.
///
/// # Errors
/// [`HubError::Io`] when nothing usable is there, or the index names missing or unsafe shards.
pub fn model_dir_files(path: &Path) -> Result<LocalModel, HubError> {
    let meta = std::fs::metadata(path).map_err(|e| io_err(path, &e))?;
    if meta.is_file() {
        let dir = path.parent().unwrap_or_else(|| Path::new("."));
        let config = existing(dir.join("config.json"));
        if has_ext(path, "gguf") {
            return Ok(LocalModel::Gguf {
                file: path.to_path_buf(),
                config,
            });
        }
        if has_ext(path, "safetensors") {
            return Ok(LocalModel::Safetensors {
                config,
                index: None,
                shards: vec![path.to_path_buf()],
            });
        }
        if path
            .file_name()
            .is_some_and(|n| n == "config.json" || n == INDEX_FILE)
        {
            return model_dir_files(dir);
        }
        return Err(HubError::Io {
            path: path.to_path_buf(),
            detail: "not a .safetensors, .gguf or config.json file".into(),
        });
    }
    let config = existing(path.join("config.json"));
    if let Some(index_path) = existing(path.join(INDEX_FILE)) {
        let bytes = read_limited(&index_path, safetensors::MAX_INDEX_LEN as u64)?;
        let index = safetensors::parse_index(&bytes).map_err(|e| HubError::Format {
            file: INDEX_FILE.into(),
            detail: e.to_string(),
        })?;
        let mut shards = Vec::new();
        for f in index.shard_files() {
            let p = path.join(&f);
            if !p.is_file() {
                return Err(HubError::Io {
                    path: p,
                    detail: format!("shard named by {INDEX_FILE} is missing"),
                });
            }
            shards.push(p);
        }
        return Ok(LocalModel::Safetensors {
            config,
            index: Some(index_path),
            shards,
        });
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(|e| io_err(path, &e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    entries.sort();
    let shards: Vec<PathBuf> = entries
        .iter()
        .filter(|p| has_ext(p, "safetensors"))
        .cloned()
        .collect();
    if !shards.is_empty() {
        return Ok(LocalModel::Safetensors {
            config,
            index: None,
            shards,
        });
    }
    let ggufs: Vec<&PathBuf> = entries.iter().filter(|p| has_ext(p, "gguf")).collect();
    match ggufs.as_slice() {
        [one] => Ok(LocalModel::Gguf {
            file: (*one).clone(),
            config,
        }),
        [] => Err(HubError::Io {
            path: path.to_path_buf(),
            detail: "no .safetensors or .gguf files here".into(),
        }),
        many => Err(HubError::Io {
            path: path.to_path_buf(),
            detail: format!(
                "{} .gguf files here; pass one of them: {}",
                many.len(),
                many.iter()
                    .filter_map(|p| p.file_name()?.to_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }),
    }
}

/// Reads a whole small file (config, index), refusing more than `limit` bytes.
///
/// # Errors
/// [`HubError::Io`].
pub fn read_limited(path: &Path, limit: u64) -> Result<Vec<u8>, HubError> {
    let f = File::open(path).map_err(|e| io_err(path, &e))?;
    let mut buf = Vec::new();
    f.take(limit.saturating_add(1))
        .read_to_end(&mut buf)
        .map_err(|e| io_err(path, &e))?;
    if buf.len() as u64 > limit {
        return Err(HubError::Io {
            path: path.to_path_buf(),
            detail: format!("larger than {limit} bytes"),
        });
    }
    Ok(buf)
}

fn file_label(path: &Path) -> String {
    path.file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("file")
        .to_owned()
}

/// Reads only the header of a safetensors file (8 bytes, then the JSON).
///
/// # Errors
/// [`HubError::Io`] or [`HubError::Format`] (truncated, oversized or invalid header).
pub fn read_safetensors_header(path: &Path) -> Result<SafetensorsHeader, HubError> {
    let fmt = |e: safetensors::SafetensorsError| HubError::Format {
        file: file_label(path),
        detail: e.to_string(),
    };
    let mut f = File::open(path).map_err(|e| io_err(path, &e))?;
    let file_len = f.metadata().map_err(|e| io_err(path, &e))?.len();
    let mut first = Vec::with_capacity(8);
    (&mut f)
        .take(8)
        .read_to_end(&mut first)
        .map_err(|e| io_err(path, &e))?;
    let n = safetensors::header_len(&first).map_err(fmt)?;
    if 8 + n > file_len {
        return Err(fmt(safetensors::SafetensorsError::Truncated {
            needed: 8 + n,
            have: file_len,
        }));
    }
    let mut json = Vec::new();
    f.take(n)
        .read_to_end(&mut json)
        .map_err(|e| io_err(path, &e))?;
    safetensors::parse_header_json(&json).map_err(fmt)
}

/// Reads the headers of several safetensors files, in order.
///
/// # Errors
/// The first failure.
pub fn read_safetensors_headers(paths: &[PathBuf]) -> Result<Vec<SafetensorsHeader>, HubError> {
    paths.iter().map(|p| read_safetensors_header(p)).collect()
}

/// Parses a GGUF header from a growing prefix: `first` bytes, then ×4 up to `max` or the
/// end, as long as the parser reports a truncation. `read(len)` returns the first `len`
/// bytes (fewer at the end of the file) and the file size when known. The arrays of the keys
/// in `whole` are kept at every length ([`gguf::parse_header_keeping`]).
pub(crate) fn grow_gguf(
    file: &str,
    first: u64,
    max: u64,
    whole: &[&str],
    mut read: impl FnMut(u64) -> Result<(Vec<u8>, Option<u64>), HubError>,
) -> Result<GgufHeader, HubError> {
    let fmt = |e: &GgufError| HubError::Format {
        file: file.to_owned(),
        detail: e.to_string(),
    };
    let mut len = first;
    loop {
        let (bytes, total) = read(len)?;
        match gguf::parse_header_keeping(&bytes, whole) {
            Ok(h) => return Ok(h),
            Err(e @ GgufError::Truncated { needed, .. }) => {
                let end = total.unwrap_or(u64::MAX);
                let got_all = (bytes.len() as u64) < len || bytes.len() as u64 >= end;
                if got_all || needed > end || len >= max {
                    return Err(fmt(&e));
                }
                len = needed.max(len.saturating_mul(4)).min(max).min(end);
            }
            Err(e) => return Err(fmt(&e)),
        }
    }
}

/// Reads only the header of a GGUF file.
///
/// # Errors
/// [`HubError::Io`] or [`HubError::Format`].
pub fn read_gguf_header(path: &Path) -> Result<GgufHeader, HubError> {
    read_gguf_header_keeping(path, &[])
}

/// [`read_gguf_header`], keeping the arrays of the keys in `whole` at every length (the
/// tokenizer's vocabulary and merges).
///
/// # Errors
/// [`HubError::Io`] or [`HubError::Format`].
pub fn read_gguf_header_keeping(path: &Path, whole: &[&str]) -> Result<GgufHeader, HubError> {
    let mut f = File::open(path).map_err(|e| io_err(path, &e))?;
    let total = f.metadata().map_err(|e| io_err(path, &e))?.len();
    grow_gguf(
        &file_label(path),
        GGUF_FIRST_READ,
        GGUF_MAX_HEADER,
        whole,
        |len| {
            f.seek(SeekFrom::Start(0)).map_err(|e| io_err(path, &e))?;
            let mut buf = Vec::new();
            (&mut f)
                .take(len)
                .read_to_end(&mut buf)
                .map_err(|e| io_err(path, &e))?;
            Ok((buf, Some(total)))
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use moro_core::formats::gguf::{GgmlType, GgufWriter};

    #[test]
    fn finds_files_and_reads_headers() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        assert!(model_dir_files(d).is_err());
        std::fs::write(d.join("config.json"), "{}").unwrap();
        let mut st = safetensors::encode_header(&[("a", "BF16", &[4, 4])], &[]);
        st.extend_from_slice(&[0; 32]);
        std::fs::write(d.join("model.safetensors"), &st).unwrap();
        match model_dir_files(d).unwrap() {
            LocalModel::Safetensors {
                config,
                index,
                shards,
            } => {
                assert!(config.is_some() && index.is_none());
                assert_eq!(shards.len(), 1);
                let h = read_safetensors_header(&shards[0]).unwrap();
                assert_eq!(h.tensors[0].byte_len, 32);
            }
            other => panic!("{other:?}"),
        }
        // Truncated file: the header claims more than the file holds.
        std::fs::write(d.join("cut.safetensors"), &st[..12]).unwrap();
        let err = read_safetensors_header(&d.join("cut.safetensors")).unwrap_err();
        assert!(err.to_string().contains("truncated"), "{err}");

        let g = tempfile::tempdir().unwrap();
        let bytes = GgufWriter::new()
            .string("general.architecture", "llama")
            .tensor("token_embd.weight", GgmlType::F16, &[8, 4])
            .build(true);
        std::fs::write(g.path().join("m.gguf"), &bytes).unwrap();
        let m = model_dir_files(g.path()).unwrap();
        let LocalModel::Gguf { file, .. } = m else {
            panic!("{m:?}")
        };
        assert_eq!(read_gguf_header(&file).unwrap().weight_bytes(), 64);
        // Grows past a small first read.
        let h = grow_gguf("m.gguf", 16, 1 << 20, &[], |len| {
            Ok((
                bytes[..bytes.len().min(len as usize)].to_vec(),
                Some(bytes.len() as u64),
            ))
        })
        .unwrap();
        assert_eq!(h.tensors.len(), 1);
        std::fs::write(g.path().join("n.gguf"), &bytes).unwrap();
        assert!(
            model_dir_files(g.path())
                .unwrap_err()
                .to_string()
                .contains("2 .gguf files")
        );
    }

    #[test]
    fn sharded_dir_uses_the_index() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(
            d.join(INDEX_FILE),
            r#"{"metadata":{"total_size":16},"weight_map":{"a":"m-1.safetensors","b":"m-2.safetensors"}}"#,
        )
        .unwrap();
        std::fs::write(
            d.join("m-1.safetensors"),
            safetensors::encode_header(&[("a", "F32", &[2])], &[]),
        )
        .unwrap();
        assert!(
            model_dir_files(d)
                .unwrap_err()
                .to_string()
                .contains("missing")
        );
        std::fs::write(
            d.join("m-2.safetensors"),
            safetensors::encode_header(&[("b", "F32", &[2])], &[]),
        )
        .unwrap();
        let LocalModel::Safetensors { shards, index, .. } = model_dir_files(d).unwrap() else {
            panic!()
        };
        assert!(index.is_some());
        assert_eq!(read_safetensors_headers(&shards).unwrap().len(), 2);
        let via_file = model_dir_files(&d.join(INDEX_FILE)).unwrap();
        assert!(matches!(via_file, LocalModel::Safetensors { .. }));
    }
}
