//! The packets of the example directories' pcaps. `subc gen pcap <example>`
//! writes them; the committed `examples/*/packets.pcap` are their output.

use crate::packets::{moldudp_add_order, udp_packet};
use crate::rng::Rng;
use subc_lang::PcapPacket;

const SRC_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const DST_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];

pub const EXAMPLES: &[&str] = &["itch", "ewma-channels", "topic-broker", "ip-forwarding"];

pub fn example_packets(name: &str) -> Option<Vec<PcapPacket>> {
    Some(match name {
        "itch" => itch(),
        "ewma-channels" => ewma_channels(),
        "topic-broker" => topic_broker(),
        "ip-forwarding" => ip_forwarding(),
        _ => return None,
    })
}

fn itch() -> Vec<PcapPacket> {
    let stocks = ["GOOGL", "AAPL", "MSFT", "NVDA", "AMZN", "TSLA"];
    let mut rng = Rng::new(7);
    (0..40u64)
        .map(|seq| {
            let k = rng.below(stocks.len() as u64) as usize;
            let side = if rng.chance(0.5) { b'B' } else { b'S' };
            let shares = *rng.pick(&[50u32, 100, 101, 500, 1000, 5000]);
            let price = *rng.pick(&[40u32, 50, 51, 1_000_000, 1_499_999, 2_000_000]);
            let payload = moldudp_add_order(seq, k as u16 + 1, side, shares, stocks[k], price);
            PcapPacket::new(
                1_000_000_000 + seq * 10_000,
                udp_packet(SRC_MAC, DST_MAC, [10, 0, 0, 1], [233, 54, 12, 1], 40000, 26400, &payload),
            )
        })
        .collect()
}

fn sample(channel: u8, value: u32) -> Vec<u8> {
    let mut p = vec![channel];
    p.extend_from_slice(&value.to_be_bytes());
    udp_packet(SRC_MAC, DST_MAC, [10, 0, 0, 1], [10, 0, 0, 2], 40000, 9000, &p)
}

fn ewma_channels() -> Vec<PcapPacket> {
    let mut out = vec![];
    let mut t = 2_000_000_000u64;
    let mut rng = Rng::new(9);
    // Steady samples on four channels.
    for _ in 0..12 {
        for ch in [0u8, 1, 2, 7] {
            let v = 1000 + rng.below(40) as u32;
            out.push(PcapPacket::new(t, sample(ch, v)));
            t += 1_000;
        }
    }
    // A burst on channel 7: a spike, then the average settles at the new level.
    for v in [5000u32, 5000, 5100, 4900, 5000, 5000, 5000, 5000, 5000, 5000, 1000] {
        out.push(PcapPacket::new(t, sample(7, v)));
        t += 1_000;
    }
    out
}

fn publish(verb: &str, topic: &str, msg: &str) -> Vec<u8> {
    let mut p = vec![b' '; 16];
    p[..verb.len()].copy_from_slice(verb.as_bytes());
    p[8..8 + topic.len()].copy_from_slice(topic.as_bytes());
    p.extend_from_slice(msg.as_bytes());
    udp_packet(SRC_MAC, DST_MAC, [10, 0, 0, 1], [10, 0, 0, 2], 40000, 5000, &p)
}

fn topic_broker() -> Vec<PcapPacket> {
    let msgs = [
        ("PUBLISH", "sensors", "t=21.5"),
        ("PUBLISH", "metrics", "cpu=0.42"),
        ("PUBLISH", "alerts", "disk full"),
        ("PUBLISH", "logs", "GET /"),
        ("PUBLISH", "unknown", "nobody listens"),
        ("SUBSCRIB", "sensors", ""),
        ("PUBLISH", "sensors", "t=21.6"),
    ];
    msgs.iter().enumerate().map(|(i, (v, t, m))| PcapPacket::new(3_000_000_000 + i as u64 * 1000, publish(v, t, m))).collect()
}

fn ip_forwarding() -> Vec<PcapPacket> {
    let pairs: [([u8; 4], [u8; 4]); 8] = [
        ([1, 2, 3, 4], [192, 168, 0, 1]),
        ([1, 2, 3, 4], [10, 9, 9, 9]),
        ([1, 2, 3, 4], [10, 1, 5, 5]),
        ([1, 2, 3, 4], [10, 1, 2, 7]),
        ([192, 168, 3, 3], [172, 16, 0, 9]),
        ([192, 168, 3, 3], [172, 32, 0, 9]),
        ([8, 8, 8, 8], [9, 9, 9, 9]),
        ([1, 2, 3, 4], [192, 168, 0, 2]),
    ];
    pairs
        .iter()
        .enumerate()
        .map(|(i, (s, d))| PcapPacket::new(4_000_000_000 + i as u64 * 1000, udp_packet(SRC_MAC, DST_MAC, *s, *d, 1234, 80, b"payload")))
        .collect()
}
