//! A Parquet file's page headers, checked before the parquet crate reads its pages.
//!
//! parquet 60.1 reserves the uncompressed size a page header claims before it decompresses
//! the page (`file/serialized_reader.rs`, `decode_page`), so a corrupt header claiming 2³¹
//! bytes costs that much memory. Here every page of every column chunk is walked first: a page
//! may not claim more uncompressed bytes than its chunk's metadata gives the whole chunk, nor
//! more than [`MAX_PAGE_BYTES`], and its compressed bytes must lie inside the chunk. Like the
//! reader, the walk stops once the data pages hold the chunk's values.
//!
//! A header is a Thrift compact-protocol struct (parquet-format `PageHeader`: field 2
//! `uncompressed_page_size: i32`, field 3 `compressed_page_size: i32`, then optional fields,
//! which are skipped whatever they hold).

use parquet::file::metadata::ParquetMetaData;
use parquet::file::reader::ChunkReader;

/// The largest page moro reads, uncompressed. Writers cut pages at about 1 MiB (parquet-rs,
/// pyarrow and Spark by default); a 256 MiB page is far beyond any dataset row.
pub(crate) const MAX_PAGE_BYTES: i64 = 256 << 20;

/// The bytes first read to find a page header; the window grows sixteenfold while a header
/// runs past it.
const HEADER_WINDOW: u64 = 256;

/// Nested structs and lists a header may hold (parquet's own headers nest two deep).
const MAX_DEPTH: u32 = 32;

/// Checks every page header of `file`, whose footer is `metadata`.
///
/// # Errors
/// What is inconsistent, in words.
pub(crate) fn check(file: &impl ChunkReader, metadata: &ParquetMetaData) -> Result<(), String> {
    let file_len = file.len();
    for group in metadata.row_groups() {
        for column in group.columns() {
            let (start, claimed_len) = column.byte_range();
            if start > file_len {
                return Err(format!(
                    "a column chunk starts at byte {start}, past the file's end ({file_len})"
                ));
            }
            let len = claimed_len.min(file_len - start);
            let chunk_uncompressed = column.uncompressed_size().max(0);
            // The reader stops once the chunk's values are read; so does the walk.
            let chunk_values = column.num_values();
            let (mut pos, mut values) = (0u64, 0i64);
            while pos < len && values < chunk_values {
                let header = header_at(file, start + pos, len - pos)?;
                let limit = chunk_uncompressed.min(MAX_PAGE_BYTES);
                if header.uncompressed < 0 || header.uncompressed > limit {
                    return Err(format!(
                        "a page claims {} uncompressed bytes where its column chunk holds {} \
                         (and moro reads pages of at most {} MiB)",
                        header.uncompressed,
                        chunk_uncompressed,
                        MAX_PAGE_BYTES >> 20
                    ));
                }
                let after = pos + header.len as u64;
                if header.compressed < 0 || after + header.compressed as u64 > len {
                    return Err(format!(
                        "a page claims {} compressed bytes, past its column chunk's end",
                        header.compressed
                    ));
                }
                pos = after + header.compressed as u64;
                values = values.saturating_add(header.values.max(0));
            }
        }
    }
    Ok(())
}

/// The page header at `at`, with at most `room` bytes before its chunk ends: read through a
/// window that starts small (headers are tens of bytes) and grows while the header runs on.
fn header_at(file: &impl ChunkReader, at: u64, room: u64) -> Result<Header, String> {
    let mut window = HEADER_WINDOW;
    loop {
        let bytes = file
            .get_bytes(at, window.min(room) as usize)
            .map_err(|e| e.to_string())?;
        if let Some(h) = read_header(&bytes) {
            return Ok(h);
        }
        if window >= room {
            return Err("a page header is unreadable".into());
        }
        window = window.saturating_mul(16);
    }
}

/// What the walk needs of one page header.
#[derive(Debug, PartialEq, Eq)]
struct Header {
    /// Bytes the header itself takes.
    len: usize,
    uncompressed: i64,
    compressed: i64,
    /// A data page's values (0 for a dictionary or index page).
    values: i64,
}

/// Reads the page header at the start of `bytes`; `None` when it is cut short or malformed.
fn read_header(bytes: &[u8]) -> Option<Header> {
    let mut r = Reader { bytes, pos: 0 };
    let (mut uncompressed, mut compressed, mut values) = (None, None, 0);
    let mut field = 0i16;
    while let Some((id, kind)) = r.field(field)? {
        field = id;
        match (id, kind) {
            (2, 5) => uncompressed = Some(zigzag(r.varint()?)),
            (3, 5) => compressed = Some(zigzag(r.varint()?)),
            // data_page_header and data_page_header_v2: their field 1 is num_values.
            (5 | 8, 12) => values = r.struct_i32_field_1()?,
            _ => r.skip(kind, 0)?,
        }
    }
    Some(Header {
        len: r.pos,
        uncompressed: uncompressed?,
        compressed: compressed?,
        values,
    })
}

fn zigzag(n: u64) -> i64 {
    (n >> 1) as i64 ^ -((n & 1) as i64)
}

/// A Thrift compact-protocol reader over a byte slice.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn byte(&mut self) -> Option<u8> {
        let b = *self.bytes.get(self.pos)?;
        self.pos += 1;
        Some(b)
    }

    fn varint(&mut self) -> Option<u64> {
        let mut n = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            n |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Some(n);
            }
        }
        None
    }

    fn advance(&mut self, n: u64) -> Option<()> {
        let end = self.pos.checked_add(usize::try_from(n).ok()?)?;
        (end <= self.bytes.len()).then(|| self.pos = end)
    }

    /// The next field of a struct whose previous field was `last`: its id and compact type,
    /// or `None` at the struct's stop (the outer `None`: cut short or malformed).
    fn field(&mut self, last: i16) -> Option<Option<(i16, u8)>> {
        let head = self.byte()?;
        if head == 0 {
            return Some(None);
        }
        let id = match head >> 4 {
            0 => i16::try_from(zigzag(self.varint()?)).ok()?,
            delta => last.checked_add(i16::from(delta))?,
        };
        Some(Some((id, head & 0x0f)))
    }

    /// Reads a struct, returning its field 1 when that is an i32 (0 otherwise).
    fn struct_i32_field_1(&mut self) -> Option<i64> {
        let (mut found, mut field) = (0, 0i16);
        while let Some((id, kind)) = self.field(field)? {
            field = id;
            if (id, kind) == (1, 5) {
                found = zigzag(self.varint()?);
            } else {
                self.skip(kind, 1)?;
            }
        }
        Some(found)
    }

    /// `None` unless `n` elements, a byte each at least, can still follow.
    fn fits(&self, n: u64) -> Option<()> {
        (n <= (self.bytes.len() - self.pos) as u64).then_some(())
    }

    /// Skips one element of a list, set or map: there a boolean takes a byte of its own,
    /// so every element takes one at least.
    fn skip_element(&mut self, kind: u8, depth: u32) -> Option<()> {
        match kind {
            1 | 2 => self.advance(1),
            _ => self.skip(kind, depth),
        }
    }

    /// Skips one value of compact type `kind`.
    fn skip(&mut self, kind: u8, depth: u32) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        match kind {
            1 | 2 => Some(()),
            3 => self.advance(1),
            4..=6 => self.varint().map(drop),
            7 => self.advance(8),
            8 => {
                let n = self.varint()?;
                self.advance(n)
            }
            9 | 10 => {
                let head = self.byte()?;
                let n = match head >> 4 {
                    15 => self.varint()?,
                    n => u64::from(n),
                };
                self.fits(n)?;
                let elem = head & 0x0f;
                for _ in 0..n {
                    self.skip_element(elem, depth + 1)?;
                }
                Some(())
            }
            11 => {
                let n = self.varint()?;
                if n == 0 {
                    return Some(());
                }
                self.fits(n)?;
                let kinds = self.byte()?;
                for _ in 0..n {
                    self.skip_element(kinds >> 4, depth + 1)?;
                    self.skip_element(kinds & 0x0f, depth + 1)?;
                }
                Some(())
            }
            12 => {
                let mut field = 0i16;
                while let Some((id, kind)) = self.field(field)? {
                    field = id;
                    self.skip(kind, depth + 1)?;
                }
                Some(())
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Header, read_header};

    /// A data page header as the Thrift compact protocol writes it, by hand from the
    /// parquet-format definition: type DATA_PAGE (field 1, i32 0), uncompressed 100 (field 2),
    /// compressed 60 (field 3), then field 5 `data_page_header` { num_values 10 (1),
    /// encoding PLAIN 0 (2), definition RLE 3 (3), repetition RLE 3 (4), statistics (5) {
    /// max_value "zz" (5, binary) } }.
    const DATA_PAGE: &[u8] = &[
        0x15, 0x00, // field 1, i32, zigzag(0)
        0x15, 0xc8, 0x01, // field 2, i32, zigzag(100) = 200
        0x15, 0x78, // field 3, i32, zigzag(60) = 120
        0x2c, // field 5 (delta 2), struct
        0x15, 0x14, // num_values 10
        0x15, 0x00, // encoding 0
        0x15, 0x06, // definition_level_encoding 3
        0x15, 0x06, // repetition_level_encoding 3
        0x1c, // field 5, struct: statistics
        0x58, 0x02, b'z', b'z', // field 5 (delta 5), binary, length 2
        0x00, // end of statistics
        0x00, // end of data_page_header
        0x00, // end of PageHeader
    ];

    #[test]
    fn a_hand_written_header_reads_and_its_length_is_exact() {
        assert_eq!(
            read_header(DATA_PAGE),
            Some(Header {
                len: DATA_PAGE.len(),
                uncompressed: 100,
                compressed: 60,
                values: 10,
            })
        );
        // Page bytes after the header are not read.
        let mut with_page = DATA_PAGE.to_vec();
        with_page.extend_from_slice(&[0xff; 60]);
        assert_eq!(
            read_header(&with_page).map(|h| h.len),
            Some(DATA_PAGE.len())
        );
    }

    #[test]
    fn cut_or_garbled_headers_are_unreadable_not_a_panic() {
        for end in 0..DATA_PAGE.len() {
            assert_eq!(read_header(&DATA_PAGE[..end]), None, "{end}");
        }
        assert_eq!(read_header(&[0x1d]), None); // an unknown type
        // A struct nested past the depth limit.
        let deep: Vec<u8> = std::iter::repeat_n(0x1c, 100).collect();
        assert_eq!(read_header(&deep), None);
        // A map claiming 2^63 boolean pairs in a few bytes (a fuzzing find: it spun, its
        // elements taking no bytes) and maps of maps fanning out: refused at once.
        let many_bools = [
            0x1b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0x21,
        ];
        assert_eq!(read_header(&many_bools), None);
        let fan: Vec<u8> = std::iter::once(0x1b)
            .chain(std::iter::repeat_n(0x5b, 2000))
            .collect();
        assert_eq!(read_header(&fan), None);
    }
}
