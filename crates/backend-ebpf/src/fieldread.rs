//! How the generated parser reads one field out of a header: which loads,
//! which shifts and which mask, as a small plan that is both printed as C
//! and evaluated in Rust (so the C expressions are tested against
//! `subc_lang::read_bits` without a kernel).
//!
//! Packet fields are big-endian with bit offsets from the header's most
//! significant bit. Loads are as wide as possible (one 2/4/8-byte load and
//! a byte swap instead of byte-by-byte assembly) but never past the end of
//! the header, which is all the parser's bounds check proves readable.

use subc_lang::mask;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReadPlan {
    /// `(load_be(at, size) >> shift) & mask(width)`, `size` in {1, 2, 4, 8}.
    Load { at: u32, size: u32, shift: u32, width: u32 },
    /// Bytes `at .. at + n` assembled big-endian, then shifted and masked
    /// (for a field whose bytes no single load covers within the header).
    Bytes { at: u32, n: u32, shift: u32, width: u32 },
    /// A 64-bit load at `at` and the byte after it (a field spanning nine
    /// bytes): `((load_be64(at) << (8 - shift)) | (byte(at + 8) >> shift)) & mask(width)`.
    Nine { at: u32, shift: u32, width: u32 },
}

/// The plan for `width` bits at bit `offset` of a header of `header_bytes`.
pub(crate) fn plan(offset: u32, width: u32, header_bytes: u32) -> ReadPlan {
    assert!((1..=64).contains(&width) && offset + width <= header_bytes * 8);
    let first = offset / 8;
    let last = (offset + width - 1) / 8;
    let n = last - first + 1;
    if n == 9 {
        return ReadPlan::Nine { at: first, shift: 72 - (offset % 8) - width, width };
    }
    let size = n.next_power_of_two();
    let start = if first + size <= header_bytes {
        Some(first)
    } else if last + 1 >= size {
        Some(last + 1 - size)
    } else {
        None
    };
    match start {
        Some(at) => ReadPlan::Load { at, size, shift: 8 * (at + size) - (offset + width), width },
        None => ReadPlan::Bytes { at: first, n, shift: 8 * (first + n) - (offset + width), width },
    }
}

impl ReadPlan {
    /// Runs the plan on a header's bytes (what the C expression computes).
    #[cfg(test)]
    fn eval(&self, h: &[u8]) -> u64 {
        let be = |at: u32, n: u32| -> u64 { h[at as usize..(at + n) as usize].iter().fold(0u64, |v, b| (v << 8) | *b as u64) };
        match *self {
            ReadPlan::Load { at, size, shift, width } => (be(at, size) >> shift) & mask(width),
            ReadPlan::Bytes { at, n, shift, width } => (be(at, n) >> shift) & mask(width),
            ReadPlan::Nine { at, shift, width } => ((be(at, 8) << (8 - shift)) | (h[(at + 8) as usize] as u64 >> shift)) & mask(width),
        }
    }

    /// The C expression, reading through the `const __u8 *` named `base`.
    pub(crate) fn c_expr(&self, base: &str) -> String {
        let load = |at: u32, size: u32| -> String {
            match size {
                1 => format!("(__u64){base}[{at}]"),
                2 => format!("(__u64)bpf_ntohs(*(const __u16 *)({base} + {at}))"),
                4 => format!("(__u64)bpf_ntohl(*(const __u32 *)({base} + {at}))"),
                8 => format!("bpf_be64_to_cpu(*(const __u64 *)({base} + {at}))"),
                _ => unreachable!("load of {size} bytes"),
            }
        };
        let finish = |e: String, shift: u32, width: u32, total: u32| -> String {
            let e = if shift == 0 { e } else { format!("({e} >> {shift})") };
            if width == 64 || shift + width == total {
                e
            } else {
                format!("({e} & {:#x}ULL)", mask(width))
            }
        };
        match *self {
            ReadPlan::Load { at, size, shift, width } => finish(load(at, size), shift, width, size * 8),
            ReadPlan::Bytes { at, n, shift, width } => {
                let parts: Vec<String> = (0..n)
                    .map(|k| {
                        let s = 8 * (n - 1 - k);
                        if s == 0 {
                            format!("(__u64){base}[{}]", at + k)
                        } else {
                            format!("((__u64){base}[{}] << {s})", at + k)
                        }
                    })
                    .collect();
                finish(format!("({})", parts.join(" | ")), shift, width, n * 8)
            }
            ReadPlan::Nine { at, shift, width } => {
                let hi = load(at, 8);
                let lo = format!("(__u64){base}[{}]", at + 8);
                let e = if shift == 0 { format!("(({hi} << 8) | {lo})") } else { format!("(({hi} << {}) | ({lo} >> {shift}))", 8 - shift) };
                if width == 64 {
                    e
                } else {
                    format!("({e} & {:#x}ULL)", mask(width))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use subc_lang::read_bits;

    #[test]
    fn plans_read_what_read_bits_reads() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for hbytes in 1..=12u32 {
            for width in 1..=64u32.min(hbytes * 8) {
                for offset in 0..=(hbytes * 8 - width) {
                    let p = plan(offset, width, hbytes);
                    for _ in 0..4 {
                        let h: Vec<u8> = (0..hbytes).map(|_| next() as u8).collect();
                        assert_eq!(p.eval(&h), read_bits(&h, offset, width), "{p:?} offset {offset} width {width} in {hbytes} bytes");
                    }
                }
            }
        }
    }

    #[test]
    fn c_expressions_are_minimal() {
        assert_eq!(plan(0, 16, 14).c_expr("h"), "(__u64)bpf_ntohs(*(const __u16 *)(h + 0))");
        assert_eq!(plan(4, 4, 20).c_expr("h"), "((__u64)h[0] & 0xfULL)");
        assert_eq!(plan(0, 4, 20).c_expr("h"), "((__u64)h[0] >> 4)");
        assert_eq!(plan(48, 48, 14).c_expr("h"), "(bpf_be64_to_cpu(*(const __u64 *)(h + 6)) >> 16)");
        assert_eq!(plan(4, 64, 9).c_expr("h"), "((bpf_be64_to_cpu(*(const __u64 *)(h + 0)) << 4) | ((__u64)h[8] >> 4))");
        assert!(matches!(plan(0, 24, 3), ReadPlan::Bytes { .. }));
    }
}
