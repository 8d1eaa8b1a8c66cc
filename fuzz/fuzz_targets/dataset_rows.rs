//! Dataset rows (JSON Lines, a JSON array, CSV, Parquet) and the shape of each row.
#![no_main]

use std::ops::ControlFlow;

use libfuzzer_sys::fuzz_target;
use moro_data::rows::read_rows;
use moro_data::{FileFormat, Shape};

fuzz_target!(|data: &[u8]| {
    for format in [
        FileFormat::Jsonl,
        FileFormat::Json,
        FileFormat::Csv { tab: false },
    ] {
        let mut shape: Option<Shape> = None;
        let _ = read_rows(format, data, |row| {
            if let Ok(row) = row {
                if shape.is_none() {
                    shape = Shape::detect(&row.value, None);
                }
                if let Some(s) = &shape {
                    let _ = s.sample(&row.value);
                }
            }
            ControlFlow::Continue(())
        });
    }
    let _ = FileFormat::sniff(data);
    let _ = moro_data::rows::read_parquet(bytes::Bytes::copy_from_slice(data), |row| {
        if let Ok(row) = row {
            let _ = Shape::detect(&row.value, None);
        }
        ControlFlow::Continue(())
    });
});
