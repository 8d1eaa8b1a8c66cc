//! Byte units. All sizes inside moro are `u64` bytes; GiB appear only when printing.

/// 2^10 bytes.
pub const KIB: u64 = 1 << 10;
/// 2^20 bytes.
pub const MIB: u64 = 1 << 20;
/// 2^30 bytes.
pub const GIB: u64 = 1 << 30;

/// Bytes as GiB for display only.
#[must_use]
#[allow(clippy::cast_precision_loss)]
pub fn gib(bytes: u64) -> f64 {
    bytes as f64 / GIB as f64
}

/// Formats bytes as `12.34 GiB` (or MiB below 1 GiB), for display.
#[must_use]
#[allow(clippy::cast_precision_loss)]
pub fn human(bytes: u64) -> String {
    if bytes >= GIB {
        format!("{:.2} GiB", bytes as f64 / GIB as f64)
    } else if bytes >= MIB {
        format!("{:.1} MiB", bytes as f64 / MIB as f64)
    } else {
        format!("{bytes} B")
    }
}

/// Parses a user-given size such as `24GiB`, `24 GB`, `80G`, `16384MiB` or `512B`. `GB`/`G`
/// are read as GiB, as GPU vendors and nvidia-smi round them. A number without a unit is an
/// error: `24` is far more often 24 GiB meant than 24 bytes.
///
/// # Errors
/// A message naming what could not be read.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    if t.starts_with('-') {
        return Err(format!("size `{text}` is negative; use e.g. `24GiB`"));
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("`{text}` is not a size; use e.g. `24GiB`, `80GB` or `16384MiB`"))?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" => {
            return Err(format!(
                "`{text}` has no unit; say `{num}GiB` (or `{num}B` for bytes)"
            ));
        }
        "b" => 1.0,
        "k" | "kb" | "kib" => KIB as f64,
        "m" | "mb" | "mib" => MIB as f64,
        "g" | "gb" | "gib" => GIB as f64,
        "t" | "tb" | "tib" => (GIB * 1024) as f64,
        other => {
            return Err(format!(
                "unknown size unit `{other}` in `{text}`; use GiB, MiB or GB"
            ));
        }
    };
    let bytes = value * mult;
    if !bytes.is_finite() || bytes <= 0.0 || bytes > 1.0e18 {
        return Err(format!("size `{text}` is out of range"));
    }
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok(bytes.round() as u64)
}

/// Rounds `n` up to a multiple of `m` (`m > 0`).
#[must_use]
pub const fn round_up(n: u64, m: u64) -> u64 {
    n.div_ceil(m) * m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("24GiB").unwrap(), 24 * GIB);
        assert_eq!(parse_size("24 GB").unwrap(), 24 * GIB);
        assert_eq!(parse_size("16384MiB").unwrap(), 16 * GIB);
        assert_eq!(parse_size("1.5G").unwrap(), 3 * GIB / 2);
        assert!(parse_size("lots").is_err());
        assert!(parse_size("-3GiB").unwrap_err().contains("negative"));
        assert!(parse_size("24").unwrap_err().contains("`24GiB`"));
        assert_eq!(parse_size("512B").unwrap(), 512);
        assert!(parse_size("3 parsecs").is_err());
    }
}
