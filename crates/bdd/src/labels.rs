//! The shape of a label-mode program (`docs/network.md`, "Routing by
//! labels"), shared by the back ends: the label is a plane byte and a bit
//! string of one bit per endpoint, and a program's tables or maps are sized
//! for so many planes, rows and own endpoints. Nothing here knows how a
//! back end carries or matches it.

use serde::{Deserialize, Serialize};

/// The label's EtherType: IEEE 802's local experimental EtherType 1.
pub const LABEL_ETHERTYPE: u16 = 0x88b5;
/// Most planes (the plane is one byte).
pub const MAX_LABEL_PLANES: u32 = 256;

/// What a label-mode program is sized for. One program serves every device
/// of a fabric when sized for the largest of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabelShape {
    /// Endpoints in the network: the label's width in bits.
    pub endpoints: u32,
    /// Planes a device can hold: twice a routing's for make-before-break
    /// reroutes (two banks).
    pub planes: u32,
    /// Forwarding rows per plane: a device's neighbour ports.
    pub rows: u32,
    /// Endpoint slots: a device's own endpoints.
    pub hosts: u32,
}

impl LabelShape {
    /// The bit string's bytes.
    pub fn bit_bytes(&self) -> u32 {
        self.endpoints.div_ceil(8)
    }

    /// The label header's bytes: the plane byte and the bit string
    /// (`LabelTables::header_bytes` in `subc-fabric`).
    pub fn header_bytes(&self) -> u32 {
        1 + self.bit_bytes()
    }

    /// Bytes a labelled frame carries beyond the publisher's: the
    /// EtherType and the header.
    pub fn push_bytes(&self) -> u32 {
        2 + self.header_bytes()
    }

    /// 64-bit words of the bit string (for a program that reads it by words).
    pub fn words(&self) -> u32 {
        self.endpoints.div_ceil(64)
    }

    /// Whether the planes (1 to [`MAX_LABEL_PLANES`]), rows and own
    /// endpoints (at least one each) make a program.
    pub fn sized(&self) -> bool {
        (1..=MAX_LABEL_PLANES).contains(&self.planes) && self.rows > 0 && self.hosts > 0
    }
}

/// One device's label forwarding, as data: what `subc-fabric`'s
/// `LabelTables` says of one device, and the planes it pushes. Both back
/// ends install it (`subc_backend_ebpf::label_ops`,
/// `subc_backend_p4::P4Target::label_diff`), and targets take it through
/// the target contract (`subc_target::Target::write_labels`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabelTable {
    /// A publisher is attached: the device evaluates and pushes.
    pub ingress: bool,
    /// The first plane an ingress pushes: packet `n` takes plane
    /// `push_base + n % push_count`.
    pub push_base: u32,
    /// How many planes an ingress pushes, from `push_base`: at least one,
    /// all of them in `planes`. `push_base = 0, push_count = planes.len()`
    /// pushes every plane held; fewer leave room for a second bank being
    /// installed (a make-before-break reroute: `docs/network.md`).
    pub push_count: u32,
    /// Per plane, per neighbour port, the F-BM as the header's bit string
    /// (`Label::header` without its plane byte): every plane the device
    /// forwards, pushed here or not.
    pub planes: Vec<Vec<(u32, Vec<u8>)>>,
    /// Its own endpoints: (port, endpoint).
    pub deliver: Vec<(u32, u32)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_bytes_are_the_plane_byte_and_the_bits() {
        let shape = LabelShape { endpoints: 12, planes: 2, rows: 2, hosts: 2 };
        assert_eq!((shape.bit_bytes(), shape.header_bytes(), shape.push_bytes(), shape.words()), (2, 3, 5, 1));
        assert_eq!(LabelShape { endpoints: 128, ..shape }.header_bytes(), 17);
        assert!(shape.sized() && !LabelShape { planes: 257, ..shape }.sized() && !LabelShape { rows: 0, ..shape }.sized());
    }
}
