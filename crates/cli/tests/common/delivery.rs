//! A data plane and its surroundings, to check what an eBPF target delivers
//! against the reference interpreter: a publisher namespace sending ITCH
//! frames into the ingress interface, and two subscriber namespaces behind
//! the egress interfaces of subscription ports 1 and 2, each receiving on
//! UDP port 7000. The data plane's interfaces are in this namespace
//! (`<t>i`, `<t>o1`, `<t>o2`: a server's target) or in a namespace of their
//! own (`in`, `o1`, `o2`: an agent's host).

use super::*;
use std::collections::BTreeSet;
use std::net::UdpSocket;

pub const STOCKS: [&str; 4] = ["AAAA", "BBBB", "CCCC", "DDDD"];
pub const SHARES: [u32; 3] = [5, 50, 500];

pub struct Plane {
    publisher: String,
    ingress_mac: [u8; 6],
    sockets: Vec<UdpSocket>,
    seq: u64,
    /// The registration of the target on this plane.
    pub program: proto::EbpfTarget,
}

impl Plane {
    /// Builds the namespaces and links (removed with `net`); the data
    /// plane's interfaces in namespace `host`, or in this one.
    pub fn build(net: &mut Cleanup, t: &str, host: Option<&str>) -> Plane {
        let publisher = format!("{t}p");
        net.netns(&publisher);
        // A link from the data plane's interface `here` to `there` in `ns`.
        let link = |net: &mut Cleanup, here: &str, there: &str, ns: &str| match host {
            Some(h) => net.namespaces.veth(here, h, there, ns).unwrap(),
            None => net.veth(here, there, Some(ns)),
        };
        let name = |n: &str| if host.is_some() { n.to_string() } else { format!("{t}{n}") };
        let ingress = if host.is_some() { "in".to_string() } else { format!("{t}i") };
        link(net, &ingress, "pp", &publisher);
        let mut ports = std::collections::HashMap::new();
        let mut sockets = vec![];
        for port in [1u32, 2] {
            let ns = format!("{t}s{port}");
            net.netns(&ns);
            let out = name(&format!("o{port}"));
            link(net, &out, "sub", &ns);
            ip(&["-n", &ns, "addr", "add", &format!("10.0.{port}.2/24"), "dev", "sub"]);
            for k in ["net.ipv4.conf.all.rp_filter", "net.ipv4.conf.default.rp_filter", "net.ipv4.conf.sub.rp_filter"] {
                sysctl(&ns, k, "0");
            }
            let egress = proto::EbpfEgress {
                interface: out,
                dst_mac: mac_of(Some(&ns), "sub"),
                src_mac: String::new(),
                dst_ip: format!("10.0.{port}.2"),
                dst_port: 7000,
            };
            ports.insert(port, egress);
            let sock = in_netns(&ns, || {
                let s = UdpSocket::bind("0.0.0.0:7000").unwrap();
                s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
                s
            })
            .join()
            .unwrap();
            sockets.push(sock);
        }
        let ingress_mac = subc_backend_ebpf::parse_mac(&mac_of(host, &ingress)).unwrap();
        let program = proto::EbpfTarget {
            interface: ingress,
            hook: proto::Hook::Tc as i32,
            ports,
            drop_unmatched: false,
            xdp_mode: proto::XdpMode::Auto as i32,
        };
        Plane { publisher, ingress_mac, sockets, seq: 0, program }
    }

    /// Sends one frame per stock and share count; per frame, the ports
    /// (1, 2) that received it.
    fn deliveries(&mut self) -> (Vec<BTreeSet<u32>>, Vec<Vec<u8>>) {
        let first = self.seq;
        let frames: Vec<Vec<u8>> = STOCKS
            .iter()
            .flat_map(|s| SHARES.iter().map(move |n| (*s, *n)))
            .enumerate()
            .map(|(i, (s, n))| itch_frame(self.ingress_mac, first + i as u64, s, n))
            .collect();
        self.seq += frames.len() as u64;
        let sent = frames.clone();
        in_netns(&self.publisher, move || {
            let fd = packet_socket("pp");
            for f in &sent {
                send_frame(&fd, f);
            }
        })
        .join()
        .unwrap();
        let mut got = vec![BTreeSet::new(); frames.len()];
        let until = Instant::now() + Duration::from_millis(300);
        let mut buf = [0u8; 2048];
        while Instant::now() < until {
            for (k, s) in self.sockets.iter().enumerate() {
                while let Ok(n) = s.recv(&mut buf) {
                    let Some(seq) = seq_of_payload(&buf[..n]) else { continue };
                    // A frame of an earlier round, late: not this round's.
                    let Some(i) = seq.checked_sub(first).filter(|i| (*i as usize) < got.len()) else { continue };
                    let fresh = got[i as usize].insert(k as u32 + 1);
                    assert!(fresh, "frame {seq} reached port {} twice", k + 1);
                }
            }
        }
        (got, frames)
    }

    /// Sends frames and checks that each reached exactly the ports the
    /// interpreter forwards it to under `rules`; the number of deliveries.
    #[track_caller]
    pub fn check(&mut self, rules: &[String], when: &str) -> usize {
        let (got, frames) = self.deliveries();
        let spec = std::fs::read_to_string(itch_spec()).unwrap();
        let p = subc_workload::programs::check(&spec, &[&rules.join("\n")]).unwrap();
        for (i, f) in frames.iter().enumerate() {
            let want: BTreeSet<u32> = subc_lang::Interpreter::new(&p.spec, &p.subscriptions).run(f, 0).ports.into_iter().collect();
            assert_eq!(got[i], want, "{when}: frame {i} ({} rules)", rules.len());
        }
        got.iter().map(|g| g.len()).sum()
    }
}
