//! Capture files, read from and written to byte buffers: classic pcap and
//! pcapng, through the `pcap-file` crate.
//!
//! Why a crate: real captures come from tcpdump, dumpcap and Wireshark, in
//! both formats, either byte order, several interfaces per file, and
//! timestamp resolutions a hand-written reader would have to track. The
//! crate splits files into records and blocks; this module decides what
//! each packet is, as `docs/semantics.md` ("Captures") says:
//!
//! - every packet comes out as the Ethernet frame it stands for
//!   ([`LinkType`]: Ethernet as is, Linux cooked frames rebuilt), and a link
//!   type subc does not read is an error naming it;
//! - timestamps come out in nanoseconds, the interpreter's time base;
//! - a packet cut by the capture's snaplen keeps its captured bytes, which
//!   are what the engines decide, and its original length.
//!
//! Only packet blocks are decoded (besides the section and interface
//! blocks the crate tracks), so a statistics or name-resolution block
//! that the crate finds odd does not make a capture unreadable. No input
//! makes the reader panic (tested on mutated files; fuzzed: `fuzz/`).
//!
//! pcap-file 2 gives an Enhanced Packet Block's timestamp as the block's
//! raw count of time units stored in a `Duration`'s nanoseconds; the units
//! are the interface's `if_tsresol`, which [`read_pcap`] applies.

use crate::link::LinkType;
use byteorder_slice::{BigEndian, ByteOrder, LittleEndian};
use pcap_file::pcap::{PcapHeader, PcapParser, PcapWriter};
use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketBlock;
use pcap_file::pcapng::blocks::interface_description::{InterfaceDescriptionBlock, InterfaceDescriptionOption};
use pcap_file::pcapng::blocks::{ENHANCED_PACKET_BLOCK, PACKET_BLOCK, SIMPLE_PACKET_BLOCK};
use pcap_file::pcapng::{Block, PcapNgParser, PcapNgWriter, RawBlock};
use pcap_file::{DataLink, Endianness, TsResolution};
use std::borrow::Cow;
use std::time::Duration;
use thiserror::Error;

/// Why a capture cannot be read. Packets are numbered from 0 in file
/// order, as `subc sim` numbers them.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum PcapError {
    #[error("not a capture file: it starts with {0:#010x}, which is neither a pcap nor a pcapng magic number")]
    BadMagic(u32),
    #[error("the capture is truncated in the {0}")]
    Truncated(&'static str),
    #[error("the capture's link type {0} is not supported ({SUPPORTED})")]
    LinkType(u32),
    #[error("packet {packet} was captured on interface {interface}, whose link type {link_type} is not supported ({SUPPORTED})")]
    InterfaceLinkType { packet: usize, interface: u32, link_type: u32 },
    #[error("packet {packet} names interface {interface}, but its section describes {count} interface(s)")]
    NoInterface { packet: usize, interface: u32, count: usize },
    #[error("the timestamp of packet {packet} does not fit in 64 bits of nanoseconds")]
    Timestamp { packet: usize },
    #[error("malformed pcapng block at byte {offset}: {reason}")]
    Malformed { offset: usize, reason: String },
}

const SUPPORTED: &str = "subc reads Ethernet (1), Linux cooked SLL (113) and SLL2 (276)";

/// One captured packet, as an Ethernet frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PcapPacket {
    /// When it was captured, in nanoseconds since the Unix epoch.
    pub ts_ns: u64,
    /// The captured bytes as an Ethernet frame (a cooked frame rebuilt,
    /// see [`LinkType`]). What every engine decides.
    pub data: Vec<u8>,
    /// The frame's length when it was captured, counted as an Ethernet
    /// frame; more than `data.len()` when the snaplen cut it.
    pub orig_len: u32,
    /// The link type it was captured with.
    pub link: LinkType,
}

impl PcapPacket {
    /// A whole Ethernet frame.
    pub fn new(ts_ns: u64, data: Vec<u8>) -> PcapPacket {
        let orig_len = u32::try_from(data.len()).unwrap_or(u32::MAX);
        PcapPacket { ts_ns, data, orig_len, link: LinkType::Ethernet }
    }

    /// Whether the capture kept fewer bytes than the frame had.
    pub fn is_truncated(&self) -> bool {
        (self.orig_len as usize) > self.data.len()
    }
}

const PCAPNG_MAGIC: u32 = 0x0a0d_0d0a;
const CLASSIC_MAGICS: [u32; 4] = [0xa1b2_c3d4, 0xa1b2_3c4d, 0xd4c3_b2a1, 0x4d3c_b2a1];

/// Reads a capture, classic pcap or pcapng (told apart by their first
/// bytes), into its packets in file order.
pub fn read_pcap(bytes: &[u8]) -> Result<Vec<PcapPacket>, PcapError> {
    let Some(magic) = bytes.first_chunk::<4>().map(|m| u32::from_be_bytes(*m)) else {
        return Err(PcapError::Truncated("file header"));
    };
    if magic == PCAPNG_MAGIC {
        read_pcapng(bytes)
    } else if CLASSIC_MAGICS.contains(&magic) {
        read_classic(bytes)
    } else {
        Err(PcapError::BadMagic(magic))
    }
}

fn read_classic(bytes: &[u8]) -> Result<Vec<PcapPacket>, PcapError> {
    let (mut rest, parser) = PcapParser::new(bytes).map_err(|_| PcapError::Truncated("file header"))?;
    let header = parser.header();
    // The link type is the lower 16 bits; the upper ones may describe an FCS.
    let number = u32::from(header.datalink) & 0xffff;
    let link = LinkType::from_number(number).ok_or(PcapError::LinkType(number))?;
    let frac_ns = if header.ts_resolution == TsResolution::NanoSecond { 1 } else { 1000 };
    let mut out = vec![];
    while !rest.is_empty() {
        if rest.len() < 16 {
            return Err(PcapError::Truncated("record header"));
        }
        // The raw record: the crate's checked one refuses an original length
        // beyond the snaplen, which is what a cut packet has.
        let (next, record) = parser.next_raw_packet(rest).map_err(|_| PcapError::Truncated("packet data"))?;
        rest = next;
        let ts_ns = u64::from(record.ts_sec) * 1_000_000_000 + u64::from(record.ts_frac) * frac_ns;
        out.push(link.frame(ts_ns, &record.data, record.orig_len));
    }
    Ok(out)
}

/// A packet block's contents, whichever of the three kinds it is.
struct PacketBlock<'a> {
    interface: u32,
    /// Time units since the epoch; a Simple Packet Block has none.
    units: Option<u64>,
    orig_len: u32,
    data: Cow<'a, [u8]>,
}

fn read_pcapng(bytes: &[u8]) -> Result<Vec<PcapPacket>, PcapError> {
    let (mut rest, mut parser) = PcapNgParser::new(bytes).map_err(|e| block_error(e, 0))?;
    let mut out: Vec<PcapPacket> = vec![];
    while !rest.is_empty() {
        let offset = bytes.len() - rest.len();
        let (next, raw) = parser.next_raw_block(rest).map_err(|e| block_error(e, offset))?;
        rest = next;
        let block = match parser.section().endianness {
            Endianness::Big => packet_block::<BigEndian>(raw),
            Endianness::Little => packet_block::<LittleEndian>(raw),
        };
        let Some(block) = block.map_err(|e| block_error(e, offset))? else { continue };
        let packet = out.len();
        let interfaces = parser.interfaces();
        let Some(interface) = interfaces.get(block.interface as usize) else {
            return Err(PcapError::NoInterface { packet, interface: block.interface, count: interfaces.len() });
        };
        let number = u32::from(interface.linktype);
        let Some(link) = LinkType::from_number(number) else {
            return Err(PcapError::InterfaceLinkType { packet, interface: block.interface, link_type: number });
        };
        let (ts_ns, data) = match block.units {
            Some(units) => (timestamp_ns(interface, units).ok_or(PcapError::Timestamp { packet })?, &block.data[..]),
            // A Simple Packet Block has no timestamp: it takes the one of the
            // packet before it, so time never runs backwards for windows. Its
            // data is padded; the packet is its first min(original length,
            // snaplen) bytes.
            None => {
                let kept = match interface.snaplen {
                    0 => block.orig_len,
                    snaplen => block.orig_len.min(snaplen),
                };
                let Some(data) = block.data.get(..kept as usize) else {
                    return Err(PcapError::Malformed { offset, reason: "a simple packet block is shorter than its packet".into() });
                };
                (out.last().map_or(0, |p| p.ts_ns), data)
            }
        };
        out.push(link.frame(ts_ns, data, block.orig_len));
    }
    Ok(out)
}

/// Decodes a packet block, in the section's byte order; `None` for the
/// other kinds of blocks, which are skipped.
fn packet_block<B: ByteOrder>(raw: RawBlock<'_>) -> Result<Option<PacketBlock<'_>>, pcap_file::PcapError> {
    if ![ENHANCED_PACKET_BLOCK, PACKET_BLOCK, SIMPLE_PACKET_BLOCK].contains(&raw.type_) {
        return Ok(None);
    }
    Ok(match raw.try_into_block::<B>()? {
        Block::EnhancedPacket(b) => {
            // A `Duration` made from a `u64` of nanoseconds gives it back.
            let units = u64::try_from(b.timestamp.as_nanos()).unwrap_or(u64::MAX);
            Some(PacketBlock { interface: b.interface_id, units: Some(units), orig_len: b.original_len, data: b.data })
        }
        Block::Packet(b) => {
            // The block holds the high 32 bits, then the low ones; pcap-file 2
            // reads them as one 64-bit number, which in a little-endian
            // section swaps the halves.
            let little = B::read_u16(&[1, 0]) == 1;
            let units = if little { b.timestamp.rotate_left(32) } else { b.timestamp };
            Some(PacketBlock { interface: b.interface_id.into(), units: Some(units), orig_len: b.original_len, data: b.data })
        }
        Block::SimplePacket(b) => Some(PacketBlock { interface: 0, units: None, orig_len: b.original_len, data: b.data }),
        _ => None,
    })
}

/// A packet's time in nanoseconds from its interface's `if_tsresol` (a
/// power of ten, or of two when the top bit is set; microseconds when
/// absent) and `if_tsoffset` (seconds to add). Finer units are truncated.
fn timestamp_ns(interface: &InterfaceDescriptionBlock<'_>, units: u64) -> Option<u64> {
    let mut resolution = 6u8;
    let mut offset_s = 0u64;
    for option in &interface.options {
        match option {
            InterfaceDescriptionOption::IfTsResol(r) => resolution = *r,
            InterfaceDescriptionOption::IfTsOffset(o) => offset_s = *o,
            _ => {}
        }
    }
    let units = u128::from(units);
    let exponent = u32::from(resolution & 0x7f);
    let ns = if resolution & 0x80 != 0 {
        // At most 2^64 * 10^9 < 2^94, and the shift is below 128.
        (units * 1_000_000_000) >> exponent
    } else if exponent <= 9 {
        units * 10u128.pow(9 - exponent)
    } else {
        10u128.checked_pow(exponent - 9).map_or(0, |unit| units / unit)
    };
    u64::try_from(ns + u128::from(offset_s) * 1_000_000_000).ok()
}

fn block_error(e: pcap_file::PcapError, offset: usize) -> PcapError {
    match e {
        pcap_file::PcapError::IncompleteBuffer => PcapError::Truncated("pcapng block"),
        e => PcapError::Malformed { offset, reason: e.to_string() },
    }
}

/// The packet's length fields as the formats hold them.
fn lengths(p: &PcapPacket) -> u32 {
    let captured = u32::try_from(p.data.len()).expect("a packet shorter than 4 GiB");
    p.orig_len.max(captured)
}

/// Writes a little-endian, nanosecond-resolution classic pcap of Ethernet
/// frames. Seconds are written modulo 2^32, the width of the format's field
/// (they wrap in the year 2106).
///
/// # Panics
/// If a packet is 4 GiB or longer, which no pcap can hold.
pub fn write_pcap(packets: &[PcapPacket]) -> Vec<u8> {
    let longest = packets.iter().map(|p| p.data.len()).max().unwrap_or(0);
    let header = PcapHeader {
        snaplen: u32::try_from(longest).expect("a packet shorter than 4 GiB").max(65535),
        datalink: DataLink::ETHERNET,
        ts_resolution: TsResolution::NanoSecond,
        endianness: Endianness::Little,
        ..PcapHeader::default()
    };
    // Writing to a `Vec` cannot fail, and every length and timestamp was
    // made to fit the fields above.
    let mut w = PcapWriter::with_header(Vec::new(), header).expect("a Vec takes the header");
    for p in packets {
        let ts = Duration::new(u64::from((p.ts_ns / 1_000_000_000) as u32), (p.ts_ns % 1_000_000_000) as u32);
        w.write_packet(&pcap_file::pcap::PcapPacket::new(ts, lengths(p), &p.data)).expect("the record fits the header");
    }
    w.into_writer()
}

/// Writes a little-endian pcapng of Ethernet frames: one section, one
/// interface with nanosecond timestamps (`if_tsresol` 9), one Enhanced
/// Packet Block per packet.
///
/// # Panics
/// If a packet is 4 GiB or longer, which no pcapng block can hold.
pub fn write_pcapng(packets: &[PcapPacket]) -> Vec<u8> {
    let mut w = PcapNgWriter::with_endianness(Vec::new(), Endianness::Little).expect("a Vec takes the section header");
    let interface =
        InterfaceDescriptionBlock { linktype: DataLink::ETHERNET, snaplen: 0, options: vec![InterfaceDescriptionOption::IfTsResol(9)] };
    w.write_block(&Block::InterfaceDescription(interface)).expect("a Vec takes the interface");
    for p in packets {
        let block = EnhancedPacketBlock {
            interface_id: 0,
            timestamp: Duration::from_nanos(p.ts_ns),
            original_len: lengths(p),
            data: Cow::Borrowed(&p.data[..]),
            options: vec![],
        };
        w.write_block(&Block::EnhancedPacket(block)).expect("interface 0 exists");
    }
    w.into_inner()
}
