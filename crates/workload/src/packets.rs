//! Packet builders: random packets for any spec, and the helpers the example
//! pcaps are made of.
//!
//! [`PacketGen`] walks the spec's parse graph, picks select cases so that the
//! packet parses (or, sometimes, deliberately does not), and fills query
//! fields with values near the constants the subscriptions use, so that
//! random packets exercise every boundary of every interval.

use crate::rng::Rng;
use subc_lang::spec::{FieldRef, ParseNext, ParseTarget, QuerySource, Spec};
use subc_lang::NfSubscription;
use subc_lang::{inet_checksum, mask, raw_of_domain, write_bits};

/// Generates random packets for one spec.
pub struct PacketGen<'a> {
    spec: &'a Spec,
    /// Per packet field: interesting raw values (constants and their neighbours).
    interesting: Vec<Vec<Vec<u64>>>,
}

impl<'a> PacketGen<'a> {
    pub fn new(spec: &'a Spec, subs: &[NfSubscription]) -> PacketGen<'a> {
        let mut interesting: Vec<Vec<Vec<u64>>> = spec.headers.iter().map(|h| vec![vec![]; h.fields.len()]).collect();
        for sub in subs {
            for cube in &sub.cubes {
                for (qf, set) in &cube.0 {
                    let q = spec.query_field(*qf);
                    let QuerySource::Packet(f) = q.source else { continue };
                    let slot = &mut interesting[f.header.0 as usize][f.field as usize];
                    for iv in set.intervals() {
                        for d in [iv.lo.wrapping_sub(1), iv.lo, iv.hi, iv.hi.wrapping_add(1)] {
                            if d <= mask(q.width) {
                                slot.push(raw_of_domain(q.ty, q.width, d));
                            }
                        }
                    }
                }
            }
        }
        for h in &mut interesting {
            for f in h {
                f.sort_unstable();
                f.dedup();
            }
        }
        PacketGen { spec, interesting }
    }

    fn field_value(&self, rng: &mut Rng, f: FieldRef) -> u64 {
        let width = self.spec.field(f).width.min(64);
        let pool = &self.interesting[f.header.0 as usize][f.field as usize];
        if !pool.is_empty() && rng.chance(0.7) {
            *rng.pick(pool)
        } else if rng.chance(0.2) {
            // Small values hit keyed state slots and low thresholds.
            rng.below(16) & mask(width)
        } else {
            rng.next_u64() & mask(width)
        }
    }

    /// A random packet. With probability `bad`, it is truncated or takes a
    /// path that does not parse.
    pub fn packet(&self, rng: &mut Rng, bad: f64) -> Vec<u8> {
        let mut out = vec![];
        let mut at = self.spec.parser.start;
        let break_it = rng.chance(bad);
        while let ParseTarget::Header(h) = at {
            let header = self.spec.header(h);
            let mut buf = vec![0u8; header.bytes as usize];
            for (i, f) in header.fields.iter().enumerate() {
                let r = FieldRef { header: h, field: i as u32 };
                if f.width <= 64 {
                    let v = self.field_value(rng, r);
                    write_bits(&mut buf, f.offset, f.width, v);
                } else {
                    for k in 0..f.width {
                        write_bits(&mut buf, f.offset + k, 1, rng.below(2));
                    }
                }
            }
            at = match &self.spec.parser.next[h.0 as usize] {
                None => ParseTarget::Reject,
                Some(ParseNext::Goto(t)) => *t,
                Some(ParseNext::Select { fields, cases, default }) => {
                    let take_default = cases.is_empty() || (break_it && rng.chance(0.5));
                    if take_default {
                        // Leave the random values; they almost never match a case.
                        *default
                    } else {
                        let case = rng.pick(cases);
                        for (v, f) in case.values.iter().zip(fields) {
                            if let Some(v) = v {
                                let fd = self.spec.field(*f);
                                write_bits(&mut buf, fd.offset, fd.width, *v);
                            }
                        }
                        case.target
                    }
                }
            };
            out.extend_from_slice(&buf);
        }
        if break_it && !out.is_empty() && rng.chance(0.5) {
            let keep = rng.below(out.len() as u64) as usize;
            out.truncate(keep);
        } else {
            // Some payload after the headers, as real packets have.
            for _ in 0..rng.below(8) {
                out.push(rng.below(256) as u8);
            }
        }
        out
    }
}

/// A topic broker's frame (`examples/topic-broker`): Ethernet, IPv4 from
/// 10.0.0.1 to 10.0.0.2, UDP from port 4000 to the broker's 5000, then the
/// verb and the topic in two 8-byte fields, padded with spaces; MACs and
/// checksums zero.
pub fn broker_frame(verb: &str, topic: &str) -> Vec<u8> {
    let mut f = vec![0u8; 14 + 20 + 8 + 16];
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    f[14] = 0x45;
    let ip_len = (f.len() - 14) as u16;
    f[16..18].copy_from_slice(&ip_len.to_be_bytes());
    f[22] = 64;
    f[23] = 17;
    f[26..30].copy_from_slice(&[10, 0, 0, 1]);
    f[30..34].copy_from_slice(&[10, 0, 0, 2]);
    f[34..36].copy_from_slice(&4000u16.to_be_bytes());
    f[36..38].copy_from_slice(&5000u16.to_be_bytes());
    f[38..40].copy_from_slice(&24u16.to_be_bytes());
    let field = |s: &str| format!("{s:<8}").into_bytes();
    f[42..50].copy_from_slice(&field(verb));
    f[50..58].copy_from_slice(&field(topic));
    f
}

/// Ethernet + IPv4 + UDP around `payload`, with correct IPv4 and UDP checksums.
pub fn udp_packet(src_mac: [u8; 6], dst_mac: [u8; 6], src_ip: [u8; 4], dst_ip: [u8; 4], sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(42 + payload.len());
    p.extend_from_slice(&dst_mac);
    p.extend_from_slice(&src_mac);
    p.extend_from_slice(&0x0800u16.to_be_bytes());
    let total = 20 + 8 + payload.len();
    let mut ip = [0u8; 20];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    ip[6] = 0x40; // don't fragment
    ip[8] = 64;
    ip[9] = 17;
    ip[12..16].copy_from_slice(&src_ip);
    ip[16..20].copy_from_slice(&dst_ip);
    let c = inet_checksum(&ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    p.extend_from_slice(&ip);
    let ulen = (8 + payload.len()) as u16;
    let mut udp = vec![];
    udp.extend_from_slice(&sport.to_be_bytes());
    udp.extend_from_slice(&dport.to_be_bytes());
    udp.extend_from_slice(&ulen.to_be_bytes());
    udp.extend_from_slice(&[0, 0]);
    udp.extend_from_slice(payload);
    let mut pseudo = vec![];
    pseudo.extend_from_slice(&src_ip);
    pseudo.extend_from_slice(&dst_ip);
    pseudo.extend_from_slice(&[0, 17]);
    pseudo.extend_from_slice(&ulen.to_be_bytes());
    pseudo.extend_from_slice(&udp);
    let mut c = inet_checksum(&pseudo);
    if c == 0 {
        c = 0xffff;
    }
    udp[6..8].copy_from_slice(&c.to_be_bytes());
    p.extend_from_slice(&udp);
    p
}

/// An ITCH add-order message (36 bytes) in a MoldUDP64 payload.
pub fn moldudp_add_order(seq: u64, locate: u16, side: u8, shares: u32, stock: &str, price: u32) -> Vec<u8> {
    let mut m = vec![];
    m.extend_from_slice(b"SUBCTEST01"); // session, 10 bytes
    m.extend_from_slice(&seq.to_be_bytes());
    m.extend_from_slice(&1u16.to_be_bytes()); // message count
    m.extend_from_slice(&36u16.to_be_bytes()); // message length
    m.push(b'A');
    m.extend_from_slice(&locate.to_be_bytes());
    m.extend_from_slice(&0u16.to_be_bytes()); // tracking
    m.extend_from_slice(&(seq * 1000).to_be_bytes()[2..]); // 48-bit timestamp
    m.extend_from_slice(&(seq + 1_000_000).to_be_bytes()); // order reference
    m.push(side);
    m.extend_from_slice(&shares.to_be_bytes());
    let mut sym = [b' '; 8];
    sym[..stock.len().min(8)].copy_from_slice(&stock.as_bytes()[..stock.len().min(8)]);
    m.extend_from_slice(&sym);
    m.extend_from_slice(&price.to_be_bytes());
    m
}

/// `n` ITCH add-order packets (MoldUDP64 over UDP) for the default ITCH
/// set's symbols and two symbols no subscription names, with random share
/// counts and prices: what the lookup benchmarks send.
pub fn itch_add_orders(n: usize, seed: u64) -> Vec<Vec<u8>> {
    use crate::subscriptions::{itch_symbols, ItchParams};
    let params = ItchParams::default();
    let mut symbols = itch_symbols(params.symbols, params.seed);
    symbols.extend(["ZZZZ", "QQQ"].map(String::from));
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|i| {
            let s = rng.pick(&symbols).clone();
            let side = if rng.chance(0.5) { b'B' } else { b'S' };
            let payload = moldudp_add_order(
                i as u64,
                1 + rng.below(1000) as u16,
                side,
                rng.range(1, 1200) as u32,
                &s,
                rng.range(1, 2_000_000) as u32,
            );
            udp_packet([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2], [10, 0, 0, 1], [233, 54, 12, 1], 40000, 26400, &payload)
        })
        .collect()
}

/// A Siena attribute message for `subscriptions::siena_spec`: Ethernet
/// (EtherType 0x88b5), then each attribute as a signed 32-bit big-endian
/// integer.
pub fn siena_event(values: &[i32]) -> Vec<u8> {
    let mut p = Vec::with_capacity(14 + 4 * values.len());
    p.extend_from_slice(&[2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x88, 0xb5]);
    for v in values {
        p.extend_from_slice(&v.to_be_bytes());
    }
    p
}
