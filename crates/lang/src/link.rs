//! The link layers a capture may carry, and the Ethernet frame each
//! captured frame stands for.
//!
//! Every spec parses from an Ethernet header, so every frame reaches the
//! engines as Ethernet. `tcpdump -i any` does not capture Ethernet: Linux
//! hands it "cooked" frames (SLL, SLL2) whose first bytes describe the
//! packet instead of repeating its link header. [`LinkType::frame`] puts a
//! 14-byte Ethernet header back in their place, so the same packet is
//! decided the same way from either kind of capture. The rule is written in
//! `docs/semantics.md` ("Captures"); the Ethernet addresses of such a frame
//! are not the wire's.

use crate::pcap::PcapPacket;

/// The link types subc reads, each with its number in the tcpdump.org
/// registry of link-layer header types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LinkType {
    /// `LINKTYPE_ETHERNET` (1): the frame as it was on the wire.
    Ethernet,
    /// `LINKTYPE_LINUX_SLL` (113): Linux cooked capture, version 1.
    LinuxSll,
    /// `LINKTYPE_LINUX_SLL2` (276): Linux cooked capture, version 2.
    LinuxSll2,
}

/// Where a cooked header keeps what the Ethernet header needs.
struct Cooked {
    len: usize,
    protocol_at: usize,
    address_len_at: usize,
    address_len_bytes: usize,
    address_at: usize,
}

/// `sll_header`: packet type, ARPHRD type, address length (2 bytes each),
/// 8 address bytes, protocol.
const SLL: Cooked = Cooked { len: 16, protocol_at: 14, address_len_at: 4, address_len_bytes: 2, address_at: 6 };

/// `sll2_header`: protocol, reserved, interface index (4 bytes), ARPHRD
/// type, packet type (1 byte), address length (1 byte), 8 address bytes.
const SLL2: Cooked = Cooked { len: 20, protocol_at: 0, address_len_at: 11, address_len_bytes: 1, address_at: 12 };

const ETHERNET_HEADER: usize = 14;

impl LinkType {
    /// The link type of a registry number, `None` for one subc does not read.
    pub(crate) fn from_number(number: u32) -> Option<LinkType> {
        match number {
            1 => Some(LinkType::Ethernet),
            113 => Some(LinkType::LinuxSll),
            276 => Some(LinkType::LinuxSll2),
            _ => None,
        }
    }

    /// Its number in the registry (what pcap and pcapng files record).
    pub fn number(self) -> u32 {
        match self {
            LinkType::Ethernet => 1,
            LinkType::LinuxSll => 113,
            LinkType::LinuxSll2 => 276,
        }
    }

    /// Whether frames of this type had their link header replaced.
    pub fn is_cooked(self) -> bool {
        self != LinkType::Ethernet
    }

    /// The packet that a frame captured with this link type stands for:
    /// `captured` are the bytes the capture kept, `orig_len` the length of
    /// the frame it saw (both with the cooked header, if any).
    pub(crate) fn frame(self, ts_ns: u64, captured: &[u8], orig_len: u32) -> PcapPacket {
        let (data, orig_len) = match self {
            LinkType::Ethernet => (captured.to_vec(), orig_len),
            LinkType::LinuxSll => SLL.to_ethernet(captured, orig_len),
            LinkType::LinuxSll2 => SLL2.to_ethernet(captured, orig_len),
        };
        // Some writers record an original length of 0, or one below what
        // they kept: the frame was at least as long as its captured bytes.
        let orig_len = orig_len.max(u32::try_from(data.len()).unwrap_or(u32::MAX));
        PcapPacket { ts_ns, data, orig_len, link: self }
    }
}

impl Cooked {
    /// Destination all zeros (a cooked header does not keep it), source the
    /// cooked header's address when it is 6 bytes long (else all zeros), and
    /// the cooked header's protocol as the EtherType; then the payload. A
    /// frame cut inside its cooked header becomes a packet of no bytes.
    fn to_ethernet(&self, captured: &[u8], orig_len: u32) -> (Vec<u8>, u32) {
        let orig_len = (orig_len as usize).saturating_sub(self.len).saturating_add(ETHERNET_HEADER);
        let orig_len = u32::try_from(orig_len).unwrap_or(u32::MAX);
        let Some((header, payload)) = captured.split_at_checked(self.len) else {
            return (Vec::new(), orig_len);
        };
        let address_len = header[self.address_len_at..self.address_len_at + self.address_len_bytes]
            .iter()
            .fold(0usize, |a, &b| (a << 8) | usize::from(b));
        let mut frame = Vec::with_capacity(ETHERNET_HEADER + payload.len());
        frame.extend_from_slice(&[0; 6]);
        if address_len == 6 {
            frame.extend_from_slice(&header[self.address_at..self.address_at + 6]);
        } else {
            frame.extend_from_slice(&[0; 6]);
        }
        frame.extend_from_slice(&header[self.protocol_at..self.protocol_at + 2]);
        frame.extend_from_slice(payload);
        (frame, orig_len)
    }
}
