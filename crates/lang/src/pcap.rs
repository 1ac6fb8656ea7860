//! Classic pcap files (not pcapng), read from and written to byte buffers.
//!
//! Both byte orders and both timestamp resolutions (microseconds, magic
//! `a1b2c3d4`; nanoseconds, `a1b23c4d`) are read. Timestamps come out in
//! nanoseconds, which is what the semantics' windows use.

use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum PcapError {
    #[error("not a pcap file (magic number {0:#010x}); only classic pcap is supported, not pcapng")]
    BadMagic(u32),
    #[error("the pcap file is truncated in the {0}")]
    Truncated(&'static str),
    #[error("link type {0} is not Ethernet (1)")]
    LinkType(u32),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PcapPacket {
    pub ts_ns: u64,
    pub data: Vec<u8>,
}

pub fn read_pcap(bytes: &[u8]) -> Result<Vec<PcapPacket>, PcapError> {
    if bytes.len() < 24 {
        return Err(PcapError::Truncated("file header"));
    }
    let magic_le = u32::from_le_bytes(bytes[0..4].try_into().unwrap());
    let (big, nanos) = match magic_le {
        0xa1b2c3d4 => (false, false),
        0xa1b23c4d => (false, true),
        0xd4c3b2a1 => (true, false),
        0x4d3cb2a1 => (true, true),
        other => return Err(PcapError::BadMagic(other)),
    };
    let u32_at = |b: &[u8], o: usize| -> u32 {
        let a: [u8; 4] = b[o..o + 4].try_into().unwrap();
        if big {
            u32::from_be_bytes(a)
        } else {
            u32::from_le_bytes(a)
        }
    };
    let link = u32_at(bytes, 20) & 0x0fff_ffff;
    if link != 1 {
        return Err(PcapError::LinkType(link));
    }
    let mut out = vec![];
    let mut at = 24;
    while at < bytes.len() {
        if at + 16 > bytes.len() {
            return Err(PcapError::Truncated("record header"));
        }
        let sec = u32_at(bytes, at) as u64;
        let frac = u32_at(bytes, at + 4) as u64;
        let incl = u32_at(bytes, at + 8) as usize;
        at += 16;
        if at + incl > bytes.len() {
            return Err(PcapError::Truncated("packet data"));
        }
        let ts_ns = sec * 1_000_000_000 + if nanos { frac } else { frac * 1000 };
        out.push(PcapPacket { ts_ns, data: bytes[at..at + incl].to_vec() });
        at += incl;
    }
    Ok(out)
}

/// Writes a little-endian, nanosecond-resolution classic pcap.
pub fn write_pcap(packets: &[PcapPacket]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&0xa1b23c4du32.to_le_bytes());
    out.extend_from_slice(&2u16.to_le_bytes());
    out.extend_from_slice(&4u16.to_le_bytes());
    out.extend_from_slice(&0i32.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&65535u32.to_le_bytes());
    out.extend_from_slice(&1u32.to_le_bytes());
    for p in packets {
        out.extend_from_slice(&((p.ts_ns / 1_000_000_000) as u32).to_le_bytes());
        out.extend_from_slice(&((p.ts_ns % 1_000_000_000) as u32).to_le_bytes());
        out.extend_from_slice(&(p.data.len() as u32).to_le_bytes());
        out.extend_from_slice(&(p.data.len() as u32).to_le_bytes());
        out.extend_from_slice(&p.data);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let pkts = vec![PcapPacket { ts_ns: 1_500_000_123, data: vec![1, 2, 3] }, PcapPacket { ts_ns: 7, data: vec![] }];
        assert_eq!(read_pcap(&write_pcap(&pkts)).unwrap(), pkts);
        assert_eq!(read_pcap(b"short"), Err(PcapError::Truncated("file header")));
        // The last packet is empty, so one byte less cuts its record header;
        // seventeen bytes less also cut the first packet's data.
        let mut bad = write_pcap(&pkts);
        bad.truncate(bad.len() - 1);
        assert_eq!(read_pcap(&bad), Err(PcapError::Truncated("record header")));
        let mut bad = write_pcap(&pkts);
        bad.truncate(bad.len() - 17);
        assert_eq!(read_pcap(&bad), Err(PcapError::Truncated("packet data")));
    }
}
