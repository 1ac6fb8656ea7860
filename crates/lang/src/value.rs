//! Bit-vector encoding of typed values.
//!
//! This is the one place that knows how a typed constant (`"GOOGL"`,
//! `10.0.0.1`, `-5`) becomes the unsigned integer that the decision diagram,
//! the tables and both back ends compare against, and how a raw packet field
//! becomes the same kind of integer. Keeping both directions here is what
//! makes "the same value" mean the same thing in every engine.

use crate::spec::FieldType;

/// All ones in the low `width` bits.
pub fn mask(width: u32) -> u64 {
    if width >= 64 {
        u64::MAX
    } else {
        (1u64 << width) - 1
    }
}

/// The domain value of raw field bits: identity, except that signed fields
/// have their sign bit flipped so that unsigned order equals signed order.
pub fn domain_of_raw(ty: FieldType, width: u32, raw: u64) -> u64 {
    match ty {
        FieldType::Signed => (raw ^ (1u64 << (width - 1))) & mask(width),
        _ => raw & mask(width),
    }
}

/// The raw field bits of a domain value (inverse of [`domain_of_raw`]).
pub fn raw_of_domain(ty: FieldType, width: u32, v: u64) -> u64 {
    domain_of_raw(ty, width, v)
}

/// The domain value of a signed constant, if it fits in `width` bits.
pub fn signed_domain(width: u32, v: i128) -> Option<u64> {
    let min = -(1i128 << (width - 1));
    let max = (1i128 << (width - 1)) - 1;
    if v < min || v > max {
        return None;
    }
    let raw = (v as i64 as u64) & mask(width);
    Some(domain_of_raw(FieldType::Signed, width, raw))
}

/// Encodes an ASCII symbol as ITCH does: left-aligned, padded with spaces to
/// `width / 8` bytes, big-endian. `None` if it is too long.
pub fn ascii_domain(width: u32, s: &str) -> Option<u64> {
    let n = (width / 8) as usize;
    if s.len() > n {
        return None;
    }
    let mut v = 0u64;
    for k in 0..n {
        let b = s.as_bytes().get(k).copied().unwrap_or(b' ');
        v = (v << 8) | b as u64;
    }
    Some(v)
}

/// Formats a domain value the way a user would write it for this field type.
pub fn format_value(ty: FieldType, width: u32, v: u64) -> String {
    match ty {
        FieldType::Uint => v.to_string(),
        FieldType::Signed => {
            let raw = raw_of_domain(ty, width, v);
            let shift = 64 - width;
            (((raw << shift) as i64) >> shift).to_string()
        }
        FieldType::Ipv4 if width == 32 => {
            format!("{}.{}.{}.{}", v >> 24, (v >> 16) & 255, (v >> 8) & 255, v & 255)
        }
        FieldType::Mac if width == 48 => (0..6).map(|k| format!("{:02x}", (v >> (40 - 8 * k)) & 255)).collect::<Vec<_>>().join(":"),
        FieldType::Ascii => {
            let n = width / 8;
            let bytes: Vec<u8> = (0..n).map(|k| ((v >> (8 * (n - 1 - k))) & 255) as u8).collect();
            if bytes.iter().all(|b| (0x20..0x7f).contains(b) && *b != b'"') {
                format!("\"{}\"", String::from_utf8_lossy(&bytes).trim_end_matches(' '))
            } else {
                format!("0x{v:x}")
            }
        }
        _ => v.to_string(),
    }
}

/// Reads `width` bits at bit `offset` (MSB first) of `bytes`. The caller has
/// checked that the bits are in range.
pub fn read_bits(bytes: &[u8], offset: u32, width: u32) -> u64 {
    let mut v: u128 = 0;
    let first = (offset / 8) as usize;
    let last = ((offset + width - 1) / 8) as usize;
    for b in &bytes[first..=last] {
        v = (v << 8) | *b as u128;
    }
    let total = ((last - first + 1) * 8) as u32;
    let shift = total - (offset % 8) - width;
    ((v >> shift) & ((1u128 << width) - 1)) as u64
}

/// Writes the low `width` bits of `value` at bit `offset` (MSB first) of
/// `bytes`: the inverse of [`read_bits`].
pub fn write_bits(bytes: &mut [u8], offset: u32, width: u32, value: u64) {
    for k in 0..width {
        let bit = (value >> (width - 1 - k)) & 1;
        let pos = offset + k;
        let byte = &mut bytes[(pos / 8) as usize];
        let shift = 7 - (pos % 8);
        *byte = (*byte & !(1 << shift)) | ((bit as u8) << shift);
    }
}

/// The Internet checksum of `data` (RFC 1071): the ones' complement of the
/// ones' complement sum of its 16-bit words, an odd last byte padded.
pub fn inet_checksum(data: &[u8]) -> u16 {
    let mut sum = 0u32;
    for chunk in data.chunks(2) {
        sum += u16::from_be_bytes([chunk[0], *chunk.get(1).unwrap_or(&0)]) as u32;
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// `02:00:00:00:00:0a` as bytes: six hex groups joined by `:`.
pub fn parse_mac(text: &str) -> Option<[u8; 6]> {
    let parts: Vec<&str> = text.split(':').collect();
    if parts.len() != 6 {
        return None;
    }
    let mut out = [0u8; 6];
    for (o, p) in out.iter_mut().zip(parts) {
        *o = u8::from_str_radix(p, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signed_order_is_preserved() {
        let a = signed_domain(8, -100).unwrap();
        let b = signed_domain(8, -1).unwrap();
        let c = signed_domain(8, 0).unwrap();
        let d = signed_domain(8, 99).unwrap();
        assert!(a < b && b < c && c < d);
        assert_eq!(format_value(FieldType::Signed, 8, a), "-100");
        assert_eq!(signed_domain(8, 128), None);
        assert_eq!(signed_domain(8, -129), None);
    }

    #[test]
    fn ascii_is_space_padded_big_endian() {
        assert_eq!(ascii_domain(64, "GOOGL").unwrap(), u64::from_be_bytes(*b"GOOGL   "));
        assert_eq!(format_value(FieldType::Ascii, 64, ascii_domain(64, "GOOGL").unwrap()), "\"GOOGL\"");
        assert_eq!(ascii_domain(16, "ABC"), None);
    }

    #[test]
    fn bits_are_read_msb_first() {
        let bytes = [0b1010_1100, 0b0101_0011];
        assert_eq!(read_bits(&bytes, 0, 4), 0b1010);
        assert_eq!(read_bits(&bytes, 4, 8), 0b1100_0101);
        assert_eq!(read_bits(&bytes, 0, 16), 0xac53);
        assert_eq!(read_bits(&bytes, 15, 1), 1);
    }
}
