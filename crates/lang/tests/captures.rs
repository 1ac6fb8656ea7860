//! The capture reader on files built here byte by byte, independently of
//! the crate that reads them: classic pcap in both byte orders and both
//! resolutions, pcapng with several sections and interfaces, Linux cooked
//! frames, packets cut by the snaplen, link types subc refuses, and
//! damaged files, which must be errors and never panics.

use proptest::prelude::*;
use subc_lang::{read_pcap, write_pcap, write_pcapng, Decision, Interpreter, LinkType, PcapError, PcapPacket};

#[derive(Clone, Copy)]
enum Order {
    Little,
    Big,
}

use Order::{Big, Little};

fn u16_in(o: Order, v: u16) -> [u8; 2] {
    match o {
        Little => v.to_le_bytes(),
        Big => v.to_be_bytes(),
    }
}

fn u32_in(o: Order, v: u32) -> [u8; 4] {
    match o {
        Little => v.to_le_bytes(),
        Big => v.to_be_bytes(),
    }
}

/// A classic pcap record: seconds, fraction, the bytes kept, the original length.
struct Record<'a>(u32, u32, &'a [u8], u32);

fn classic(o: Order, nanos: bool, link: u32, records: &[Record]) -> Vec<u8> {
    let mut f = vec![];
    f.extend(u32_in(o, if nanos { 0xa1b2_3c4d } else { 0xa1b2_c3d4 }));
    f.extend(u16_in(o, 2));
    f.extend(u16_in(o, 4));
    f.extend([0; 8]);
    f.extend(u32_in(o, 65535));
    f.extend(u32_in(o, link));
    for Record(sec, frac, data, orig) in records {
        for v in [*sec, *frac, data.len() as u32, *orig] {
            f.extend(u32_in(o, v));
        }
        f.extend(*data);
    }
    f
}

/// A pcapng block: type, total length, body padded to 4 bytes, total length.
fn block(o: Order, kind: u32, body: &[u8]) -> Vec<u8> {
    let mut body = body.to_vec();
    body.resize(body.len().next_multiple_of(4), 0);
    let total = (body.len() + 12) as u32;
    let mut b = vec![];
    b.extend(u32_in(o, kind));
    b.extend(u32_in(o, total));
    b.extend(body);
    b.extend(u32_in(o, total));
    b
}

fn section(o: Order) -> Vec<u8> {
    let mut body = vec![];
    body.extend(u32_in(o, 0x1a2b_3c4d));
    body.extend(u16_in(o, 1));
    body.extend(u16_in(o, 0));
    body.extend(match o {
        Little => (-1i64).to_le_bytes(),
        Big => (-1i64).to_be_bytes(),
    });
    block(o, 0x0a0d_0d0a, &body)
}

/// An interface: its link type, snaplen, and options (code, value).
fn interface(o: Order, link: u16, snaplen: u32, options: &[(u16, Vec<u8>)]) -> Vec<u8> {
    let mut body = vec![];
    body.extend(u16_in(o, link));
    body.extend(u16_in(o, 0));
    body.extend(u32_in(o, snaplen));
    if !options.is_empty() {
        for (code, value) in options {
            body.extend(u16_in(o, *code));
            body.extend(u16_in(o, value.len() as u16));
            body.extend(value);
            body.resize(body.len().next_multiple_of(4), 0);
        }
        body.extend([0; 4]);
    }
    block(o, 1, &body)
}

const IF_TSRESOL: u16 = 9;
const IF_TSOFFSET: u16 = 14;

fn enhanced(o: Order, interface: u32, units: u64, data: &[u8], orig: u32) -> Vec<u8> {
    let mut body = vec![];
    for v in [interface, (units >> 32) as u32, units as u32, data.len() as u32, orig] {
        body.extend(u32_in(o, v));
    }
    body.extend(data);
    block(o, 6, &body)
}

fn simple(o: Order, data: &[u8], orig: u32) -> Vec<u8> {
    let mut body = u32_in(o, orig).to_vec();
    body.extend(data);
    block(o, 3, &body)
}

/// The obsolete Packet Block: a 16-bit interface and a drop count.
fn obsolete(o: Order, interface: u16, units: u64, data: &[u8]) -> Vec<u8> {
    let mut body = vec![];
    body.extend(u16_in(o, interface));
    body.extend(u16_in(o, 0));
    for v in [(units >> 32) as u32, units as u32, data.len() as u32, data.len() as u32] {
        body.extend(u32_in(o, v));
    }
    body.extend(data);
    block(o, 2, &body)
}

/// An interface statistics block, which the reader skips.
fn statistics(o: Order) -> Vec<u8> {
    let mut body = u32_in(o, 0).to_vec();
    body.extend([0; 8]);
    block(o, 5, &body)
}

const SRC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const DST: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];
const ZEROS: [u8; 6] = [0; 6];

/// An IPv4 payload of `n` bytes (only its first byte says so).
fn payload(n: usize) -> Vec<u8> {
    (0..n).map(|i| if i == 0 { 0x45 } else { i as u8 }).collect()
}

fn ethernet(dst: [u8; 6], src: [u8; 6], ethertype: u16, payload: &[u8]) -> Vec<u8> {
    [&dst[..], &src, &ethertype.to_be_bytes(), payload].concat()
}

/// A Linux cooked v1 header: packet type 0 (to us), ARPHRD_ETHER, the address.
fn sll(address: &[u8], protocol: u16) -> Vec<u8> {
    let mut h = vec![0, 0, 0, 1];
    h.extend((address.len() as u16).to_be_bytes());
    let mut a = address.to_vec();
    a.resize(8, 0);
    h.extend(a);
    h.extend(protocol.to_be_bytes());
    h
}

/// A Linux cooked v2 header on interface index 7.
fn sll2(address: &[u8], protocol: u16) -> Vec<u8> {
    let mut h = protocol.to_be_bytes().to_vec();
    h.extend([0, 0, 0, 0, 0, 7, 0, 1, 0]);
    h.push(address.len() as u8);
    let mut a = address.to_vec();
    a.resize(8, 0);
    h.extend(a);
    h
}

fn packet(ts_ns: u64, data: Vec<u8>, orig_len: u32, link: LinkType) -> PcapPacket {
    PcapPacket { ts_ns, data, orig_len, link }
}

#[track_caller]
fn check(file: &[u8], expect: &[PcapPacket]) {
    assert_eq!(read_pcap(file).as_deref(), Ok(expect));
}

#[track_caller]
fn check_err(file: &[u8], expect: PcapError) {
    assert_eq!(read_pcap(file), Err(expect));
}

#[test]
fn classic_in_both_byte_orders_and_resolutions() {
    let frame = ethernet(DST, SRC, 0x0800, &payload(46));
    for o in [Little, Big] {
        let file = classic(o, false, 1, &[Record(2, 5, &frame, 60), Record(3, 999_999, &frame, 60)]);
        check(
            &file,
            &[packet(2_000_005_000, frame.clone(), 60, LinkType::Ethernet), packet(3_999_999_000, frame.clone(), 60, LinkType::Ethernet)],
        );
        let file = classic(o, true, 1, &[Record(2, 5, &frame, 60)]);
        check(&file, &[packet(2_000_000_005, frame.clone(), 60, LinkType::Ethernet)]);
    }
}

#[test]
fn the_fcs_bits_of_a_classic_link_type_are_not_the_link_type() {
    let frame = ethernet(DST, SRC, 0x0800, &payload(46));
    let file = classic(Little, true, 0x1000_0001, &[Record(1, 0, &frame, 60)]);
    check(&file, &[packet(1_000_000_000, frame, 60, LinkType::Ethernet)]);
}

#[test]
fn a_cut_packet_keeps_its_bytes_and_its_original_length() {
    let frame = ethernet(DST, SRC, 0x0800, &payload(86));
    let file = classic(Little, true, 1, &[Record(1, 0, &frame[..34], 100)]);
    let p = read_pcap(&file).unwrap();
    assert_eq!(p, [packet(1_000_000_000, frame[..34].to_vec(), 100, LinkType::Ethernet)]);
    assert!(p[0].is_truncated());
    // Both writers keep the original length.
    assert_eq!(read_pcap(&write_pcap(&p)).unwrap(), p);
    assert_eq!(read_pcap(&write_pcapng(&p)).unwrap(), p);
    // An original length below the captured one (some writers put 0) is
    // taken as the captured length.
    let file = classic(Little, true, 1, &[Record(1, 0, &frame, 0)]);
    check(&file, &[packet(1_000_000_000, frame.clone(), 100, LinkType::Ethernet)]);
}

/// docs/semantics.md, "Captures": a cut packet is decided on the bytes the
/// capture kept, as a packet that short would be.
#[test]
fn a_cut_packet_is_decided_on_its_captured_bytes() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/topic-broker");
    let program = subc_workload::programs::load_dir(&dir).unwrap();
    let sensors = subc_workload::example_packets("topic-broker").unwrap().remove(0);
    let whole = sensors.data.len() as u32;
    // Cut inside the broker header (the last 16 bytes before the message), then after it.
    let inside = classic(Little, true, 1, &[Record(1, 0, &sensors.data[..50], whole)]);
    let after = classic(Little, true, 1, &[Record(1, 0, &sensors.data[..58], whole)]);
    let mut interp = Interpreter::new(&program.spec, &program.subscriptions);
    let inside = read_pcap(&inside).unwrap().remove(0);
    let o = interp.run(&inside.data, inside.ts_ns);
    assert!(!o.parsed && o.decision == Decision::NoMatch && inside.is_truncated(), "{o:?}");
    let after = read_pcap(&after).unwrap().remove(0);
    let o = interp.run(&after.data, after.ts_ns);
    assert!(o.parsed && o.ports == [1, 2, 3] && after.is_truncated(), "{o:?}");
}

#[test]
fn cooked_frames_become_the_ethernet_frames_they_stand_for() {
    let ip = payload(46);
    let want = |src: [u8; 6], link| packet(1_000_000_000, ethernet(ZEROS, src, 0x0800, &ip), 60, link);
    for (link, number, header) in
        [(LinkType::LinuxSll, 113, sll as fn(&[u8], u16) -> Vec<u8>), (LinkType::LinuxSll2, 276, sll2 as fn(&[u8], u16) -> Vec<u8>)]
    {
        let cooked = [header(&SRC, 0x0800), ip.clone()].concat();
        let orig = cooked.len() as u32;
        check(&classic(Big, true, number, &[Record(1, 0, &cooked, orig)]), &[want(SRC, link)]);
        // No address (a tunnel), or one that is not 6 bytes long: zeros.
        for address in [&[][..], &[1u8, 2, 3, 4, 5, 6, 7, 8][..]] {
            let cooked = [header(address, 0x0800), ip.clone()].concat();
            check(&classic(Little, true, number, &[Record(1, 0, &cooked, orig)]), &[want(ZEROS, link)]);
        }
        // Cut by the snaplen: the original length counts the Ethernet header.
        let cooked = [header(&SRC, 0x0800), ip.clone()].concat();
        let cut = &cooked[..cooked.len() - 30];
        let expect = packet(1_000_000_000, ethernet(ZEROS, SRC, 0x0800, &ip[..16]), 60, link);
        check(&classic(Little, true, number, &[Record(1, 0, cut, orig)]), &[expect]);
        // Cut inside the cooked header: a packet of no bytes.
        check(&classic(Little, true, number, &[Record(1, 0, &cooked[..10], orig)]), &[packet(1_000_000_000, vec![], 60, link)]);
    }
}

#[test]
fn pcapng_with_sections_interfaces_and_every_packet_block() {
    let a = ethernet(DST, SRC, 0x0800, &payload(46));
    let b = ethernet(DST, SRC, 0x0800, &payload(47));
    let cooked = [sll(&SRC, 0x0800), payload(46)].concat();
    let mut file = section(Little);
    // Interface 0: Ethernet, microseconds (no if_tsresol), snaplen 40.
    file.extend(interface(Little, 1, 40, &[]));
    // Interface 1: SLL, nanoseconds.
    file.extend(interface(Little, 113, 0, &[(IF_TSRESOL, vec![9])]));
    // Interface 2: Ethernet, 2^-10 s, 100 s later.
    file.extend(interface(Little, 1, 0, &[(IF_TSRESOL, vec![0x80 | 10]), (IF_TSOFFSET, 100u64.to_le_bytes().to_vec())]));
    file.extend(enhanced(Little, 0, 1_500_000, &a[..40], 60));
    file.extend(enhanced(Little, 1, 2_000_000_123, &cooked, cooked.len() as u32));
    file.extend(statistics(Little));
    file.extend(enhanced(Little, 2, 3 * 1024 + 512, &b, 61));
    // A Simple Packet Block is on interface 0, cut at its snaplen, and
    // takes the time of the packet before it.
    file.extend(simple(Little, &a[..40], 60));
    file.extend(obsolete(Little, 1, 4_000_000_000, &cooked));
    // A second section, big-endian, starts its interfaces again.
    file.extend(section(Big));
    file.extend(interface(Big, 276, 0, &[(IF_TSRESOL, vec![3])]));
    let cooked2 = [sll2(&SRC, 0x0800), payload(47)].concat();
    file.extend(enhanced(Big, 0, 5_000, &cooked2, cooked2.len() as u32));
    file.extend(obsolete(Big, 0, 7_000, &cooked2));
    check(
        &file,
        &[
            packet(1_500_000_000, a[..40].to_vec(), 60, LinkType::Ethernet),
            packet(2_000_000_123, ethernet(ZEROS, SRC, 0x0800, &payload(46)), 60, LinkType::LinuxSll),
            packet(103_500_000_000, b.clone(), 61, LinkType::Ethernet),
            packet(103_500_000_000, a[..40].to_vec(), 60, LinkType::Ethernet),
            packet(4_000_000_000, ethernet(ZEROS, SRC, 0x0800, &payload(46)), 60, LinkType::LinuxSll),
            packet(5_000_000_000, ethernet(ZEROS, SRC, 0x0800, &payload(47)), 61, LinkType::LinuxSll2),
            packet(7_000_000_000, ethernet(ZEROS, SRC, 0x0800, &payload(47)), 61, LinkType::LinuxSll2),
        ],
    );
    // The second section's interface 1 does not exist.
    let mut bad = file.clone();
    bad.extend(enhanced(Big, 1, 0, &a, 60));
    check_err(&bad, PcapError::NoInterface { packet: 7, interface: 1, count: 1 });
}

#[test]
fn unknown_link_types_are_refused_by_number_and_place() {
    let frame = ethernet(DST, SRC, 0x0800, &payload(46));
    check_err(&classic(Little, false, 147, &[]), PcapError::LinkType(147));
    let msg = PcapError::LinkType(147).to_string();
    assert!(msg.contains("147") && msg.contains("Ethernet (1)") && msg.contains("SLL2 (276)"), "{msg}");
    // An interface subc cannot read is fine until a packet comes from it.
    let mut file = section(Little);
    file.extend(interface(Little, 1, 0, &[]));
    file.extend(interface(Little, 147, 0, &[]));
    file.extend(enhanced(Little, 0, 1, &frame, 60));
    check(&file, &[packet(1_000, frame.clone(), 60, LinkType::Ethernet)]);
    file.extend(enhanced(Little, 1, 2, &frame, 60));
    let err = PcapError::InterfaceLinkType { packet: 1, interface: 1, link_type: 147 };
    let msg = err.to_string();
    assert!(msg.contains("packet 1") && msg.contains("interface 1") && msg.contains("link type 147"), "{msg}");
    check_err(&file, err);
}

#[test]
fn damaged_files_are_errors() {
    let frame = ethernet(DST, SRC, 0x0800, &payload(46));
    check_err(b"", PcapError::Truncated("file header"));
    check_err(b"GET / HTTP/1.1\r\n", PcapError::BadMagic(0x4745_5420));
    check_err(&[0xd4, 0xc3, 0xb2, 0xa1, 2, 0], PcapError::Truncated("file header"));
    let file = classic(Little, true, 1, &[Record(1, 0, &frame, 60)]);
    check_err(&file[..file.len() - 1], PcapError::Truncated("packet data"));
    check_err(&file[..24 + 15], PcapError::Truncated("record header"));
    let mut ng = section(Little);
    ng.extend(interface(Little, 1, 0, &[]));
    ng.extend(enhanced(Little, 0, 1, &frame, 60));
    check_err(&ng[..ng.len() - 4], PcapError::Truncated("pcapng block"));
    // A packet block before any interface.
    let mut early = section(Little);
    early.extend(enhanced(Little, 0, 1, &frame, 60));
    check_err(&early, PcapError::NoInterface { packet: 0, interface: 0, count: 0 });
    // An interface block whose reserved field is not zero.
    let mut odd = section(Little);
    let at = odd.len();
    let mut idb = interface(Little, 1, 0, &[]);
    idb[10] = 1;
    odd.extend(idb);
    assert!(matches!(read_pcap(&odd), Err(PcapError::Malformed { offset, .. }) if offset == at));
    // Seconds (if_tsresol 0) beyond what 64 bits of nanoseconds hold.
    let mut late = section(Little);
    late.extend(interface(Little, 1, 0, &[(IF_TSRESOL, vec![0])]));
    late.extend(enhanced(Little, 0, u64::MAX, &frame, 60));
    check_err(&late, PcapError::Timestamp { packet: 0 });
}

#[test]
fn both_writers_round_trip() {
    let packets = subc_workload::example_packets("itch").unwrap();
    assert_eq!(read_pcap(&write_pcap(&packets)).unwrap(), packets);
    assert_eq!(read_pcap(&write_pcapng(&packets)).unwrap(), packets);
    let odd = vec![PcapPacket::new(u64::from(u32::MAX) * 1_000_000_000 + 999_999_999, vec![]), PcapPacket::new(7, vec![1, 2, 3])];
    assert_eq!(read_pcap(&write_pcap(&odd)).unwrap(), odd);
    assert_eq!(read_pcap(&write_pcapng(&odd)).unwrap(), odd);
    // The example pcaps in the repository are the classic writer's output.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/itch/packets.pcap");
    assert_eq!(std::fs::read(dir).unwrap(), write_pcap(&packets));
}

/// A valid file of each format, for the damage below.
fn samples() -> Vec<Vec<u8>> {
    let frame = ethernet(DST, SRC, 0x0800, &payload(46));
    let cooked = [sll2(&SRC, 0x0800), payload(20)].concat();
    let mut ng = section(Big);
    ng.extend(interface(Big, 1, 0, &[(IF_TSRESOL, vec![9])]));
    ng.extend(interface(Big, 276, 64, &[]));
    ng.extend(enhanced(Big, 0, 5, &frame, 60));
    ng.extend(enhanced(Big, 1, 6, &cooked, 100));
    ng.extend(simple(Big, &frame, 60));
    ng.extend(statistics(Big));
    vec![classic(Little, false, 113, &[Record(1, 2, &[sll(&SRC, 0x0800), payload(30)].concat(), 46)]), ng]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Damage anywhere in a valid file: an error or packets, never a panic.
    #[test]
    fn damaged_captures_never_panic(which in 0usize..2, edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6), cut in any::<prop::sample::Index>()) {
        let mut file = samples().swap_remove(which);
        for (at, byte) in edits {
            let i = at.index(file.len());
            file[i] = byte;
        }
        let keep = file.len() - cut.index(file.len() / 4 + 1);
        let _ = read_pcap(&file[..keep]);
    }

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256), magic in 0usize..5) {
        let mut file = [0x0a0d_0d0au32, 0xa1b2_c3d4, 0xd4c3_b2a1, 0xa1b2_3c4d, 0x4d3c_b2a1][magic].to_be_bytes().to_vec();
        file.extend(bytes);
        let _ = read_pcap(&file);
    }
}
