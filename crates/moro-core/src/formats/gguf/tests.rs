//! Tests of the GGUF reader, architecture and estimate, against hand counts and files
//! written by `gguf-py`.

use super::*;

// Hand computation for `tiny_llama`:
// token_embd q8_0 [64,100]: 64/32·34 = 68 B/row · 100 = 6800
// per layer: norms 2·256 = 512; q 64/32·18 = 36 B/row · 64 = 2304; k 36·32 = 1152;
//   v 68·32 = 2176; o 2304; gate 36·128 = 4608; up 4608; down 128/32·34 = 136 · 64 = 8704
//   = 512 + 2304 + 1152 + 2176 + 2304 + 4608 + 4608 + 8704 = 26368
// output_norm 256; output f16 [64,100] = 12800
const EMBD: u64 = 6800;
const LAYER: u64 = 26368;
const OUT: u64 = 256 + 12800;

#[test]
fn reads_the_header() {
    let bytes = tiny_llama(false);
    let h = parse_header(&bytes).unwrap();
    assert_eq!(h.version, 3);
    assert_eq!(h.tensors.len(), 1 + 2 * 9 + 2);
    assert_eq!(h.weight_bytes(), EMBD + 2 * LAYER + OUT);
    assert_eq!(h.tensor("blk.1.ffn_down.weight").unwrap().layer(), Some(1));
    assert_eq!(h.tensor("blk.0.attn_q.weight").unwrap().n_bytes, 2304);
    assert_eq!(h.bytes_by_type()[0].0, "q4_0");
    assert!(h.data_offset.is_multiple_of(32) && h.data_offset > 0);
    let a = arch(&h).unwrap();
    assert_eq!(
        (a.block_count, a.embedding_length, a.vocab_size),
        (2, 64, 100)
    );
    assert_eq!(
        (a.head_count.clone(), a.head_count_kv.clone()),
        (vec![4, 4], vec![2, 2])
    );
    assert_eq!((a.key_length, a.value_length), (16, 16));
    assert_eq!(a.context_length, Some(1024));
    assert_eq!(a.rope_freq_base, Some(10000.0));
    assert!(a.swa_layers.iter().all(|s| !s));
    match h.get("tokenizer.ggml.tokens") {
        Some(GgufValue::Array(arr)) => assert_eq!((arr.len, arr.values.len()), (100, 100)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn estimate_matches_hand_computation() {
    let h = parse_header(&tiny_llama(false)).unwrap();
    // ctx 1000 → padded to 1024 (flash attention: 256). n_embd_k_gqa = 16·2 = 32.
    // f16: K row 64 B + V row 64 B = 128 B per cell per layer.
    let p = GgufInferenceParams {
        ctx_size: 1000,
        ..GgufInferenceParams::default()
    };
    let e = gguf_inference_estimate(&h, &p).unwrap();
    assert_eq!(e.kv_size, 1024);
    assert!(e.output_on_gpu);
    assert_eq!(e.gpu_weights_bytes, 2 * LAYER + OUT);
    assert_eq!(e.host_weights_bytes, EMBD);
    assert_eq!(e.kv_cache_bytes, 2 * 1024 * 128);
    // t = 512. attn (FA): (4·16 + 2·2·16 + 4·16)·512·4 = 192·2048 = 393216;
    // ffn: 3·128·512·4 = 786432; out: 100·512·4 = 204800 → max 786432;
    // + 3·64·512·4 = 393216 → 1179648. Host weights (token_embd) are input: not copied.
    assert_eq!(e.compute_buffer_bytes, 786_432 + 393_216);
    assert_eq!(
        e.total_gpu_bytes,
        2 * LAYER + OUT + 2 * 1024 * 128 + 1_179_648
    );

    // q8_0 K and V: rows of 32 elements = one 34-byte block each.
    let q8 = GgufInferenceParams {
        ctx_size: 1000,
        type_k: GgmlType::Q8_0,
        type_v: GgmlType::Q8_0,
        ..GgufInferenceParams::default()
    };
    let e = gguf_inference_estimate(&h, &q8).unwrap();
    assert_eq!(e.kv_cache_bytes, 2 * 1024 * (34 + 34));

    // -ngl 1: layer 1 on the GPU, layer 0 and the output on the host.
    let p1 = GgufInferenceParams {
        ctx_size: 1000,
        n_gpu_layers: 1,
        ..GgufInferenceParams::default()
    };
    let e = gguf_inference_estimate(&h, &p1).unwrap();
    assert!(!e.output_on_gpu);
    assert_eq!(e.gpu_weights_bytes, LAYER);
    assert_eq!(e.host_weights_bytes, EMBD + LAYER + OUT);
    assert_eq!(
        (e.kv_cache_bytes, e.kv_cache_host_bytes),
        (1024 * 128, 1024 * 128)
    );
    // No logits on the GPU; the largest host weight (output.weight, 12800) is copied.
    assert_eq!(e.compute_buffer_bytes, 786_432 + 393_216 + 12_800);

    // -ngl 2 = n_layer: the output stays on the host (llama.cpp needs ngl > n_layer).
    let p2 = GgufInferenceParams {
        n_gpu_layers: 2,
        ..p1
    };
    assert!(!gguf_inference_estimate(&h, &p2).unwrap().output_on_gpu);

    // Without flash attention: pad 32, KQ + softmax 2·4·1024·512·4 = 16 MiB.
    let nofa = GgufInferenceParams {
        ctx_size: 1000,
        flash_attn: false,
        ..GgufInferenceParams::default()
    };
    let e = gguf_inference_estimate(&h, &nofa).unwrap();
    assert_eq!(e.kv_size, 1024);
    assert_eq!(e.compute_buffer_bytes, 393_216 + 16_777_216 + 393_216);
    let bad = GgufInferenceParams {
        type_v: GgmlType::Q8_0,
        ..nofa
    };
    assert!(gguf_inference_estimate(&h, &bad).is_err());
    // q4_0 needs rows that are multiples of 32: 32 is fine; a [16]-wide row would not be.
    assert_eq!(GgmlType::Q4_0.row_size(16), None);
}

#[test]
fn tied_output_is_loaded_twice() {
    let h = parse_header(&tiny_llama(true)).unwrap();
    let e = gguf_inference_estimate(&h, &GgufInferenceParams::default()).unwrap();
    assert_eq!(e.gpu_weights_bytes, 2 * LAYER + 256 + EMBD);
    assert_eq!(e.host_weights_bytes, EMBD);
    // ctx 4096 default.
    assert_eq!(e.kv_size, 4096);
}

#[test]
fn sliding_window_layers() {
    let bytes = GgufWriter::new()
        .string("general.architecture", "gemma3")
        .u32("gemma3.block_count", 12)
        .u32("gemma3.embedding_length", 64)
        .u32("gemma3.attention.head_count", 4)
        .u32("gemma3.attention.head_count_kv", 1)
        .u32("gemma3.attention.key_length", 32)
        .u32("gemma3.attention.value_length", 32)
        .u32("gemma3.attention.sliding_window", 512)
        .build(false);
    let h = parse_header(&bytes).unwrap();
    let a = arch(&h).unwrap();
    // Pattern 6: layers 5 and 11 are global.
    let global: Vec<usize> = (0..12).filter(|&i| !a.swa_layers[i]).collect();
    assert_eq!(global, [5, 11]);
    let p = GgufInferenceParams {
        ctx_size: 8192,
        ..GgufInferenceParams::default()
    };
    let e = gguf_inference_estimate(&h, &p).unwrap();
    // SWA cells: pad(512 + 512, 256) = 1024. Row: 32·1 f16 = 64 B for K and for V.
    assert_eq!(e.kv_size_swa, 1024);
    assert_eq!(e.kv_cache_bytes, (2 * 8192 + 10 * 1024) * 128);
    let full = GgufInferenceParams {
        swa_full: true,
        ..p
    };
    assert_eq!(
        gguf_inference_estimate(&h, &full).unwrap().kv_cache_bytes,
        12 * 8192 * 128
    );
    // An explicit per-layer pattern wins; an unknown arch with a window is flagged.
    let bytes = GgufWriter::new()
        .string("general.architecture", "newarch")
        .u32("newarch.block_count", 2)
        .u32("newarch.embedding_length", 64)
        .u32("newarch.attention.head_count", 4)
        .u32("newarch.attention.sliding_window", 128)
        .build(false);
    assert!(
        arch(&parse_header(&bytes).unwrap())
            .unwrap()
            .swa_pattern_unknown
    );
}

#[test]
fn type_table() {
    let t = |n: &str| GgmlType::from_name(n).unwrap();
    assert_eq!((t("q4_K").block_size, t("Q4_K").type_size), (256, 144));
    assert_eq!(t("q6_k").type_size, 210);
    assert_eq!(t("q2_K").type_size, 84);
    assert_eq!(t("q3_K").type_size, 110);
    assert_eq!(t("q5_K").type_size, 176);
    assert_eq!(t("q8_K").type_size, 292);
    assert_eq!(t("iq4_xs").type_size, 136);
    assert_eq!(t("iq2_xxs").type_size, 66);
    assert_eq!(t("iq1_m").type_size, 56);
    assert_eq!(t("tq1_0").type_size, 54);
    assert_eq!(t("mxfp4").type_size, 17);
    assert_eq!(t("bf16").type_size, 2);
    assert!(GgmlType::from_id(4).is_none() && GgmlType::from_id(31).is_none());
    assert_eq!(GgmlType::from_id(8), Some(GgmlType::Q8_0));
    assert_eq!(GgmlType::from_name("f16"), Some(GgmlType::F16));
    assert_eq!(GgmlType::from_name("q4_0"), Some(GgmlType::Q4_0));
    assert_eq!(GgmlType::from_name("f32"), Some(GgmlType::F32));
}

fn prefix() -> Vec<u8> {
    let mut b = MAGIC.to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b
}

#[test]
fn hostile_headers_are_errors() {
    assert!(matches!(
        parse_header(b"GGML\x03\0\0\0"),
        Err(GgufError::BadMagic(_))
    ));
    assert!(matches!(
        parse_header(b"GG"),
        Err(GgufError::Truncated { .. })
    ));
    let mut v1 = MAGIC.to_vec();
    v1.extend_from_slice(&1u32.to_le_bytes());
    assert_eq!(parse_header(&v1), Err(GgufError::Version(1)));
    let mut be = MAGIC.to_vec();
    be.extend_from_slice(&3u32.to_be_bytes());
    assert!(
        parse_header(&be)
            .unwrap_err()
            .to_string()
            .contains("big-endian")
    );
    // 2^60 tensors.
    let mut b = prefix();
    b.extend_from_slice(&(1u64 << 60).to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    let err = parse_header(&b).unwrap_err();
    assert!(matches!(err, GgufError::Truncated { .. }), "{err}");
    // An array of 2^60 u8.
    let mut arr = 0u32.to_le_bytes().to_vec();
    arr.extend_from_slice(&(1u64 << 60).to_le_bytes());
    let b = GgufWriter::new().raw("big", 9, &arr).build(false);
    let err = parse_header(&b).unwrap_err();
    assert!(err.to_string().contains("array `big`"), "{err}");
    // Arrays nested 1000 deep.
    let mut nested = Vec::new();
    for _ in 0..1000 {
        nested.extend_from_slice(&9u32.to_le_bytes());
        nested.extend_from_slice(&1u64.to_le_bytes());
    }
    let b = GgufWriter::new().raw("deep", 9, &nested).build(false);
    assert!(parse_header(&b).unwrap_err().to_string().contains("nested"));
    // A string of 2^63 bytes.
    let b = GgufWriter::new()
        .raw("s", 8, &(1u64 << 63).to_le_bytes())
        .build(false);
    assert!(matches!(parse_header(&b), Err(GgufError::Truncated { .. })));
    // Unknown type, bad bool, bad alignment, duplicate key, too many dims, bad block.
    assert!(parse_header(&GgufWriter::new().raw("x", 99, &[0]).build(false)).is_err());
    assert!(parse_header(&GgufWriter::new().raw("x", 7, &[2]).build(false)).is_err());
    assert!(parse_header(&GgufWriter::new().u32("general.alignment", 3).build(false)).is_err());
    assert!(parse_header(&GgufWriter::new().u32("a", 1).u32("a", 2).build(false)).is_err());
    let five = GgufWriter::new()
        .tensor("t", GgmlType::F32, &[1, 1, 1, 1, 1])
        .build(false);
    assert!(
        parse_header(&five)
            .unwrap_err()
            .to_string()
            .contains("dimensions")
    );
    let odd = GgufWriter::new()
        .tensor("t", GgmlType::Q4_0, &[33])
        .build(false);
    assert!(
        parse_header(&odd)
            .unwrap_err()
            .to_string()
            .contains("blocks")
    );
    let huge = GgufWriter::new()
        .tensor("t", GgmlType::F32, &[u64::MAX, 2])
        .build(false);
    assert!(parse_header(&huge).is_err());
    // Every strict prefix of a valid file is a clean Truncated error.
    let full = tiny_llama(false);
    let h = parse_header(&full).unwrap();
    let header_len = usize::try_from(h.data_offset).unwrap();
    for cut in (0..header_len.min(3000)).step_by(7) {
        match parse_header(&full[..cut]) {
            Err(GgufError::Truncated { needed, have, .. }) => {
                assert!(needed > have && have == cut as u64);
            }
            Ok(_) => assert!(cut >= header_len - 32),
            Err(e) => panic!("cut {cut}: {e}"),
        }
    }
}

/// A file written by llama.cpp's own writer (`gguf-py` 0.19.0 `GGUFWriter`): one f16, one
/// q8_0 and one q4_K tensor, nested and bool arrays, an f64.
#[test]
fn reads_a_gguf_py_file() {
    let bytes = include_bytes!("../testdata/gguf-py-0.19.0.gguf");
    let h = parse_header(bytes).unwrap();
    assert_eq!(h.architecture(), Some("llama"));
    let bytes_of = |n: &str| h.tensor(n).unwrap().n_bytes;
    assert_eq!(bytes_of("token_embd.weight"), 3 * 32 * 2);
    assert_eq!(bytes_of("blk.0.attn_q.weight"), 32 * 34);
    assert_eq!(bytes_of("blk.0.ffn_up.weight"), 64 * 144);
    assert_eq!(h.tensor("blk.0.ffn_up.weight").unwrap().dims, [256, 64]);
    let end = h
        .tensors
        .iter()
        .map(|t| t.offset + t.n_bytes)
        .max()
        .unwrap();
    assert!(h.data_offset + end <= bytes.len() as u64);
    assert_eq!(h.get("test.f64"), Some(&GgufValue::F64(1.5)));
    match h.get("test.nested") {
        Some(GgufValue::Array(a)) => {
            assert_eq!((a.elem_type, a.len), (9, 2));
            assert!(matches!(&a.values[1], GgufValue::Array(inner) if inner.len == 1));
        }
        other => panic!("{other:?}"),
    }
    let a = arch(&h).unwrap();
    assert_eq!(
        (a.block_count, a.embedding_length, a.vocab_size),
        (1, 32, 3)
    );
    assert_eq!(a.head_count_kv, [1]);
}

#[test]
fn large_arrays_keep_only_their_length() {
    let many: Vec<u32> = (0..5000).collect();
    let b = GgufWriter::new().u32_array("a", &many).build(false);
    match parse_header(&b).unwrap().get("a") {
        Some(GgufValue::Array(arr)) => assert_eq!((arr.len, arr.values.len()), (5000, 0)),
        other => panic!("{other:?}"),
    }
}
