//! Captures made by real tools are decided like the frames they caught
//! (docs/semantics.md, "Captures"). Every example's frames go out on a veth
//! pair between two network namespaces of this test; on the far end
//! `tcpdump -i any` records them as Linux cooked frames (SLL, and SLL2
//! where this tcpdump can) and dumpcap records the veth as pcapng; then
//! `subc sim --json` must print, under every example's rules, the same line
//! for every frame of every capture as for the classic pcap that was sent.
//!
//! Root only: it skips without root or the tools, and fails under
//! `CI=true`. Every command is bounded in time, and the namespaces (with the
//! veth pair) and the capture processes go when the test ends, also when it
//! fails. The last test needs neither root nor tools.

mod common;

use common::{capture_tools_available, in_netns, ok, packet_socket, repo, run_limited, send_frame, subc, tag};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};
use subc_lang::{read_pcap, write_pcap, write_pcapng, LinkType, PcapPacket};

const EXAMPLES: [&str; 4] = ["itch", "ewma-channels", "topic-broker", "ip-forwarding"];

/// The bound on every command and every wait.
const LIMIT: Duration = Duration::from_secs(30);

/// Runs a command that must succeed within `LIMIT`.
#[track_caller]
fn run(program: &str, args: &[&str]) -> Output {
    let what = format!("{program} {}", args.join(" "));
    let out = run_limited(Command::new(program).args(args), LIMIT)
        .unwrap_or_else(|e| panic!("cannot run `{what}`: {e}"))
        .unwrap_or_else(|| panic!("`{what}` ran longer than {LIMIT:?}"));
    assert!(out.status.success(), "`{what}` failed: {}", String::from_utf8_lossy(&out.stderr));
    out
}

/// Network namespaces, deleted on drop (the veth ends in them go too).
#[derive(Default)]
struct Namespaces(Vec<String>);

impl Namespaces {
    fn add(&mut self, name: &str) {
        run("ip", &["netns", "add", name]);
        self.0.push(name.to_string());
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for n in &self.0 {
            let _ = run_limited(Command::new("ip").args(["netns", "del", n]), LIMIT);
        }
    }
}

/// A capture tool running in a namespace; killed on drop if it still runs.
struct Capture {
    name: String,
    link: LinkType,
    file: PathBuf,
    log: PathBuf,
    child: Child,
}

impl Capture {
    /// Starts `argv` in namespace `ns` and waits until its standard error
    /// says `ready`.
    fn start(name: &str, link: LinkType, ns: &str, argv: &[&str], file: PathBuf, ready: &str) -> Capture {
        let log = file.with_extension("log");
        let child = Command::new("ip")
            .args(["netns", "exec", ns])
            .args(argv)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&log).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut c = Capture { name: name.to_string(), link, file, log, child };
        let until = Instant::now() + LIMIT;
        while !c.log().contains(ready) {
            if let Ok(Some(status)) = c.child.try_wait() {
                panic!("{name} exited ({status}) before it was ready:\n{}", c.log());
            }
            assert!(Instant::now() < until, "{name} was not ready within {LIMIT:?}:\n{}", c.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        c
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits for the tool to stop by itself, which it does after `-c` frames.
    fn finish(&mut self) {
        let until = Instant::now() + LIMIT;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => {
                    assert!(status.success(), "{} failed ({status}):\n{}", self.name, self.log());
                    return;
                }
                Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(20)),
                _ => panic!("{} did not stop within {LIMIT:?} (fewer frames than were sent?):\n{}", self.name, self.log()),
            }
        }
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// `subc sim examples/EX --pcap FILE --json`, one line per frame.
fn decisions(example: &str, file: &Path) -> Vec<String> {
    ok(&subc(&["sim", &format!("examples/{example}"), "--pcap", file.to_str().unwrap(), "--json"])).lines().map(String::from).collect()
}

/// Every example's frames, in order.
fn example_frames() -> Vec<PcapPacket> {
    let mut frames = vec![];
    for ex in EXAMPLES {
        let bytes = std::fs::read(repo().join("examples").join(ex).join("packets.pcap")).unwrap();
        frames.extend(read_pcap(&bytes).unwrap());
    }
    frames
}

#[test]
fn captures_by_tcpdump_and_dumpcap_are_decided_like_the_pcap() {
    let test = "captures_by_tcpdump_and_dumpcap_are_decided_like_the_pcap";
    if !capture_tools_available(test) {
        return;
    }
    let dir = tempfile::Builder::new().prefix("subc-capture").tempdir().unwrap();
    let frames = example_frames();
    let sent = dir.path().join("sent.pcap");
    std::fs::write(&sent, write_pcap(&frames)).unwrap();

    let mut namespaces = Namespaces::default();
    let (ns_tx, ns_rx, veth_tx, veth_rx) = (tag("subctx"), tag("subcrx"), tag("ctx"), tag("crx"));
    namespaces.add(&ns_tx);
    namespaces.add(&ns_rx);
    run("ip", &["link", "add", &veth_tx, "netns", &ns_tx, "type", "veth", "peer", "name", &veth_rx, "netns", &ns_rx]);
    run("ip", &["-n", &ns_tx, "link", "set", &veth_tx, "up"]);
    run("ip", &["-n", &ns_rx, "link", "set", &veth_rx, "up"]);

    // Each tool stops after as many UDP frames as are sent (every example
    // frame is UDP; the filter keeps out anything the kernel might send).
    // tcpdump in immediate mode gives each frame a ring slot of the
    // snaplen: with its default 256 KiB and 2 MiB buffer, a burst of frames
    // is dropped, so the frames' 2 KiB and an 8 MiB buffer.
    let count = frames.len().to_string();
    let file = |name: &str| dir.path().join(name);
    let tcpdump = |link: &str, precision: &str, out: &Path| -> Vec<String> {
        let args = [
            "tcpdump",
            "-Z",
            "root",
            "-i",
            "any",
            "-y",
            link,
            "--time-stamp-precision",
            precision,
            "--immediate-mode",
            "-s",
            "2048",
            "-B",
            "8192",
            "-c",
            count.as_str(),
        ];
        let mut argv: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        argv.extend(["-w".to_string(), out.display().to_string(), "udp".to_string()]);
        argv
    };
    let mut captures = vec![];
    let argv = tcpdump("LINUX_SLL", "micro", &file("sll.pcap"));
    captures.push(Capture::start("tcpdump -y LINUX_SLL", LinkType::LinuxSll, &ns_rx, &strs(&argv), file("sll.pcap"), "listening on"));
    let links = run("ip", &["netns", "exec", &ns_rx, "tcpdump", "-i", "any", "-L"]);
    // tcpdump lists them on standard error.
    if [&links.stdout, &links.stderr].iter().any(|o| String::from_utf8_lossy(o).contains("LINUX_SLL2")) {
        let argv = tcpdump("LINUX_SLL2", "nano", &file("sll2.pcap"));
        captures.push(Capture::start(
            "tcpdump -y LINUX_SLL2",
            LinkType::LinuxSll2,
            &ns_rx,
            &strs(&argv),
            file("sll2.pcap"),
            "listening on",
        ));
    } else {
        eprintln!("{test}: this tcpdump cannot write LINUX_SLL2 on `any`; that capture is left out");
    }
    let ng = file("veth.pcapng");
    let argv = ["dumpcap", "-i", veth_rx.as_str(), "-c", count.as_str(), "-f", "udp", "-w", ng.to_str().unwrap()];
    captures.push(Capture::start("dumpcap", LinkType::Ethernet, &ns_rx, &argv, ng.clone(), "Capturing on"));
    // A moment past the "ready" lines, for the capture sockets to fill.
    std::thread::sleep(Duration::from_millis(500));

    let data: Vec<Vec<u8>> = frames.iter().map(|p| p.data.clone()).collect();
    let dev = veth_tx.clone();
    let sender = in_netns(&ns_tx, move || {
        let socket = packet_socket(&dev);
        for f in &data {
            send_frame(&socket, f);
        }
    });
    let until = Instant::now() + LIMIT;
    while !sender.is_finished() {
        assert!(Instant::now() < until, "sending {} frames took longer than {LIMIT:?}", frames.len());
        std::thread::sleep(Duration::from_millis(20));
    }
    sender.join().expect("the frames were sent");
    for c in &mut captures {
        c.finish();
    }

    // Each capture holds every frame: dumpcap's byte for byte, tcpdump's
    // but for the destination address that a cooked frame does not keep.
    for c in &captures {
        let got = read_pcap(&std::fs::read(&c.file).unwrap()).unwrap_or_else(|e| panic!("{}: {e}", c.name));
        assert_eq!(got.len(), frames.len(), "{}", c.name);
        for (i, (g, f)) in got.iter().zip(&frames).enumerate() {
            assert_eq!(g.link, c.link, "{}: frame {i}", c.name);
            let mut want = f.data.clone();
            if c.link.is_cooked() {
                want[..6].fill(0);
            }
            assert_eq!(g.data, want, "{}: frame {i}", c.name);
        }
    }

    // And every example decides each captured frame as the frame sent.
    for ex in EXAMPLES {
        let want = decisions(ex, &sent);
        assert_eq!(want.len(), frames.len(), "examples/{ex}");
        for c in &captures {
            let got = decisions(ex, &c.file);
            assert_eq!(got.len(), want.len(), "examples/{ex} on {}", c.name);
            for (g, w) in got.iter().zip(&want) {
                assert_eq!(g, w, "examples/{ex} on the capture of {}", c.name);
            }
        }
    }
    // Not vacuous: the examples forward their own frames.
    assert!(decisions("topic-broker", &sent).iter().any(|l| l.contains("\"forward\"")));
}

/// Without root: pcapng is read like the pcap, a link type subc does not
/// read is an error that names it, and a cut frame gets a note.
#[test]
fn sim_reads_pcapng_and_refuses_unknown_link_types() {
    let dir = tempfile::Builder::new().prefix("subc-capture").tempdir().unwrap();
    let frames = subc_workload::example_packets("topic-broker").unwrap();
    let classic = dir.path().join("frames.pcap");
    let ng = dir.path().join("frames.pcapng");
    std::fs::write(&classic, write_pcap(&frames)).unwrap();
    std::fs::write(&ng, write_pcapng(&frames)).unwrap();
    assert_eq!(decisions("topic-broker", &ng), decisions("topic-broker", &classic));

    // A classic pcap of link type 147 (USER0): the header's bytes 20..24.
    let mut user0 = write_pcap(&frames);
    user0[20..24].copy_from_slice(&147u32.to_le_bytes());
    let odd = dir.path().join("user0.pcap");
    std::fs::write(&odd, user0).unwrap();
    let out = subc(&["sim", "examples/topic-broker", "--pcap", odd.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("link type 147") && stderr.contains("user0.pcap") && !stderr.contains("panicked"), "{stderr}");

    let mut cut = frames[0].clone();
    cut.data.truncate(50);
    let cut_file = dir.path().join("cut.pcap");
    std::fs::write(&cut_file, write_pcap(&[cut])).unwrap();
    let out = subc(&["sim", "examples/topic-broker", "--pcap", cut_file.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("snaplen cut 1 of 1 packets"), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(ok(&out).contains("no_match (did not parse)"));
}
