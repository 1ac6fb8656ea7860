//! The eBPF commands of `subc`: compile artifacts, `sim --engine ebpf`
//! against the reference engine, and attach, status, detach on a veth pair.
//! Kernel parts need root; they skip without it, except under `CI=true`.

mod common;

use common::{kernel_available, ok, subc, subc_with, try_subc_with};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// A fresh directory of an unpredictable name, removed on drop.
fn tempdir(tag: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("subc-cli-{tag}")).tempdir().unwrap()
}

#[test]
fn compile_writes_source_object_layout_and_entries() {
    let dir = tempdir("compile");
    let out = dir.path().join("out");
    ok(&subc(&["compile", "examples/topic-broker", "--target", "ebpf", "--hook", "xdp", "-o", out.to_str().unwrap()]));
    let c = std::fs::read_to_string(out.join("subc.c")).unwrap();
    assert!(c.contains("SEC(\"xdp\")") && c.contains("int subc_tc_fanout"));
    assert_eq!(&std::fs::read(out.join("subc.o")).unwrap()[..4], b"\x7fELF");
    let maps: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("maps.json")).unwrap()).unwrap();
    assert!(maps["maps"].as_array().unwrap().iter().any(|m| m["name"] == "subc_exact" && m["key"]["fields"].is_array()));
    let entries: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("entries.json")).unwrap()).unwrap();
    assert!(entries.as_array().unwrap().iter().any(|e| e["map"] == "subc_leaves"));
    // Without -o there is nowhere to put an object.
    assert!(!subc(&["compile", "examples/topic-broker", "--target", "ebpf"]).status.success());
}

#[test]
fn sim_in_the_kernel_agrees_with_the_reference() {
    if !kernel_available("sim_in_the_kernel_agrees_with_the_reference") {
        return;
    }
    let decisions = |engine: &str| -> Vec<(serde_json::Value, serde_json::Value)> {
        ok(&subc(&["sim", "examples/itch", "--engine", engine, "--json"]))
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                (v["ports"].clone(), v["decision"].clone())
            })
            .collect()
    };
    assert_eq!(decisions("ebpf"), decisions("ref"));
    let text = ok(&subc(&["sim", "examples/ewma-channels", "--engine", "ebpf"]));
    assert!(text.contains("forward to 2") && text.contains("state chan_ewma[7]"), "{text}");
}

/// A "clang" that never finishes: a shell script that records its pid and
/// its child's (a long `sleep`) in `dir`, then waits for the child.
fn slow_clang(dir: &Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("clang");
    let script = format!("#!/bin/sh\necho $$ > {d}/clang.pid\nsleep 300 &\necho $! > {d}/child.pid\nwait\n", d = dir.display());
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// Whether the process recorded in `pid_file` is gone: no such pid, or a
/// zombie nobody reaped (a container's init may not reap orphans). Waits
/// up to five seconds for a killed process to exit.
fn gone(pid_file: &Path) -> bool {
    let pid = std::fs::read_to_string(pid_file).unwrap_or_else(|e| panic!("{}: {e}", pid_file.display()));
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let dead = match std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())) {
            Err(_) => true,
            Ok(stat) => stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X')),
        };
        if dead || Instant::now() > until {
            return dead;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// clang on a spec with 10,000 headers ran for more than 200 s, and `subc
/// compile` waited. With `--clang-timeout` it fails at the limit, names
/// it, and leaves neither clang nor anything it started running.
#[test]
fn compile_kills_a_slow_clang_at_its_time_limit() {
    let dir = tempdir("slow-clang");
    let fake = slow_clang(dir.path());
    let out = dir.path().join("out");
    let t = Instant::now();
    let run = subc_with(
        &["compile", "examples/topic-broker", "--target", "ebpf", "-o", out.to_str().unwrap(), "--clang-timeout", "1"],
        &[("SUBC_CLANG", fake.to_str().unwrap())],
        Duration::from_secs(120),
    );
    let took = t.elapsed();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("time limit of 1 s") && stderr.contains("--clang-timeout"), "{stderr}");
    // The limit plus a margin for a loaded machine; the fake sleeps 300 s.
    assert!(took < Duration::from_secs(1 + 10), "took {took:?}");
    assert!(gone(&dir.path().join("clang.pid")) && gone(&dir.path().join("child.pid")), "clang or its child outlived the limit");
    assert!(!out.exists(), "a failed compile wrote {}", out.display());
    // The option is on every command that compiles eBPF, explained.
    for cmd in ["compile", "sim"] {
        let help = ok(&subc(&[cmd, "--help"]));
        assert!(help.contains("--clang-timeout <SECS>") && help.contains("SUBC_CLANG"), "{cmd}: {help}");
    }
}

/// A pcap of four frames: two the reference forwards, then a 20-byte
/// frame (TC's `BPF_PROG_TEST_RUN` refuses an IPv4 EtherType without a
/// whole IPv4 header on recent kernels; XDP takes it) and a 200 KB frame
/// (beyond what either hook takes: a page for TC, a page and the most
/// fragments an XDP buffer has), between them.
fn odd_frames_pcap(dir: &Path) -> std::path::PathBuf {
    use subc_lang::{write_pcap, PcapPacket};
    let itch = subc_workload::example_packets("itch").unwrap();
    let (a, b) = (&itch[2], &itch[4]);
    let mut huge = b.data.clone();
    huge.resize(200 * 1024, 0);
    let packets = [
        a.clone(),
        PcapPacket::new(a.ts_ns + 1, a.data[..20].to_vec()),
        PcapPacket::new(a.ts_ns + 2, huge),
        PcapPacket::new(b.ts_ns, b.data.clone()),
    ];
    let path = dir.join("odd.pcap");
    std::fs::write(&path, write_pcap(&packets)).unwrap();
    path
}

/// A frame the kernel will not test-run is that packet's error, not the
/// run's: every packet gets its line, in order, the others are decided as
/// the reference decides them, and the exit status says that some failed.
#[test]
fn sim_in_the_kernel_reports_refused_frames_and_goes_on() {
    if !kernel_available("sim_in_the_kernel_reports_refused_frames_and_goes_on") {
        return;
    }
    let dir = tempdir("frames");
    let pcap = odd_frames_pcap(dir.path());
    let pcap = pcap.to_str().unwrap();
    let json_lines = |s: &str| -> Vec<serde_json::Value> { s.lines().map(|l| serde_json::from_str(l).unwrap()).collect() };
    let reference = json_lines(&ok(&subc(&["sim", "examples/itch", "--pcap", pcap, "--engine", "ref", "--json"])));
    assert_eq!(reference[0]["ports"], serde_json::json!([5]));
    assert_eq!(reference[3]["ports"], serde_json::json!([4]));
    for hook in ["tc", "xdp"] {
        let out = subc(&["sim", "examples/itch", "--pcap", pcap, "--engine", "ebpf", "--hook", hook, "--json"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{hook}: {stderr}");
        let lines = json_lines(&String::from_utf8(out.stdout).unwrap());
        assert_eq!(lines.len(), 4, "{hook}: {lines:?}\n{stderr}");
        for (i, l) in lines.iter().enumerate() {
            assert_eq!(l["packet"], i, "{hook}: {l}");
            let error = l.get("error").and_then(|e| e.as_str());
            match (i, error) {
                (0 | 3, None) => {
                    assert_eq!((&l["ports"], &l["decision"]), (&reference[i]["ports"], &reference[i]["decision"]), "{hook}: {l}")
                }
                // Decided (XDP, older kernels' TC): as the reference, which
                // cannot parse it.
                (1, None) => {
                    assert_eq!((&l["ports"], &l["decision"]), (&reference[1]["ports"], &serde_json::json!("no_match")), "{hook}: {l}")
                }
                (1, Some(e)) => assert!(hook == "tc" && e.contains("20-byte") && e.contains("EtherType 0x0800"), "{hook}: {e}"),
                (2, Some(e)) => assert!(e.contains("204800-byte") && e.contains(" bytes"), "{hook}: {e}"),
                _ => panic!("{hook}: packet {i}: {l}"),
            }
            if error.is_some() {
                assert_eq!(l.as_object().unwrap().len(), 2, "an error line holds the packet and the error: {l}");
            }
        }
    }
    let out = subc(&["sim", "examples/itch", "--pcap", pcap, "--engine", "ebpf"]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8(out.stdout).unwrap();
    let heads: Vec<&str> = text.lines().filter(|l| l.starts_with("packet")).collect();
    assert_eq!(heads.len(), 4, "{text}");
    assert!(heads[0].starts_with("packet    0: forward to 5"), "{text}");
    assert!(heads[2].starts_with("packet    2: error: ") && heads[2].contains("204800-byte"), "{text}");
    assert!(heads[3].starts_with("packet    3: forward to 4"), "{text}");
}

/// An eBPF deployment made by `subc attach --name NAME`: `subc detach NAME`
/// runs on drop unless `detach` already ran it.
struct Attached {
    name: String,
    armed: bool,
}

impl Attached {
    fn new(name: &str) -> Attached {
        Attached { name: name.to_string(), armed: true }
    }

    /// Detaches now and returns what `subc detach --json` printed.
    fn detach_json(mut self) -> std::process::Output {
        self.armed = false;
        subc(&["detach", &self.name, "--json"])
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        if self.armed {
            let _ = try_subc_with(&["detach", &self.name], &[], Duration::from_secs(60));
        }
    }
}

/// A veth pair in the root namespace, deleted on drop.
struct Veth(String);

impl Drop for Veth {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", &self.0]).output();
    }
}

#[test]
fn attach_status_detach() {
    if !kernel_available("attach_status_detach") {
        return;
    }
    if !std::fs::read_to_string("/proc/mounts").unwrap_or_default().contains(" /sys/fs/bpf bpf ") {
        let _ = Command::new("mount").args(["-t", "bpf", "bpf", "/sys/fs/bpf"]).output();
    }
    let dir = tempdir("attach");
    let out = dir.path().join("out");
    ok(&subc(&["compile", "examples/topic-broker", "--target", "ebpf", "--hook", "xdp", "-o", out.to_str().unwrap()]));
    let tag = format!("sct{}", std::process::id() % 100_000);
    let (a, b) = (format!("{tag}a"), format!("{tag}b"));
    let st = Command::new("ip").args(["link", "add", &a, "type", "veth", "peer", "name", &b]).status().unwrap();
    assert!(st.success());
    let _veth = Veth(a.clone());
    for d in [&a, &b] {
        Command::new("ip").args(["link", "set", d, "up"]).status().unwrap();
    }
    let cfg = dir.path().join("target.json");
    std::fs::write(&cfg, format!(r#"{{"no_match": "drop", "ports": {{"1": {{"interface": "{b}", "dst_port": 7000}}}}}}"#)).unwrap();
    let name = tag.clone();
    // From here on the deployment is detached when the test ends, also when
    // an assertion fails, so no pins are left behind.
    let attachment = Attached::new(&name);
    let attached: serde_json::Value = serde_json::from_str(&ok(&subc(&[
        "attach",
        out.to_str().unwrap(),
        "--iface",
        &a,
        "--mode",
        "generic",
        "--target-config",
        cfg.to_str().unwrap(),
        "--name",
        &name,
        "--json",
    ])))
    .unwrap();
    let status: serde_json::Value = serde_json::from_str(&ok(&subc(&["status", &name, "--json"]))).unwrap();
    assert_eq!(attached, status, "attach --json prints the new deployment's status");
    let detached: serde_json::Value = serde_json::from_str(&ok(&attachment.detach_json())).unwrap();
    // What differs between runs, kernels and machines: names, interface
    // indexes, verified instruction counts, the kernel's map memory (per-CPU
    // maps grow with the CPUs).
    let redacted = |v: &serde_json::Value| {
        let text = v.to_string().replace(&name, "[name]").replace(&a, "[iface]");
        let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let mut each = |key: &str, f: &dyn Fn(&mut serde_json::Value)| {
            if let Some(a) = v.get_mut(key).and_then(|x| x.as_array_mut()) {
                a.iter_mut().for_each(f);
            }
        };
        each("attachments", &|at| at["ifindex"] = "[ifindex]".into());
        each("programs", &|p| p[1] = "[instructions]".into());
        each("maps", &|m| m["bytes"] = "[bytes]".into());
        v
    };
    let mut s = insta::Settings::clone_current();
    s.set_snapshot_path("snapshots/json");
    s.set_prepend_module_to_snapshot(false);
    s.bind(|| {
        insta::assert_json_snapshot!("status", redacted(&status));
        insta::assert_json_snapshot!("detach", redacted(&detached));
    });
    assert_eq!(status["live_generation"], 0);
    let kinds: Vec<&str> = status["attachments"].as_array().unwrap().iter().map(|a| a["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["xdp-generic", "tcx"]);
    assert!(status["maps"].as_array().unwrap().iter().any(|m| m["name"] == "subc_leaves" && m["max_entries"].as_u64().unwrap() > 0));
    // Detached: no record, no pins.
    assert!(!subc(&["status", &name]).status.success());
    assert!(!Path::new("/sys/fs/bpf/subc").join(&name).exists());
}

/// `scripts/demo.sh` with the server as a user of its own that holds only
/// CAP_NET_ADMIN, CAP_BPF and CAP_PERFMON (through `setpriv`, as
/// `dist/systemd/subc.service` runs it): it deploys the eBPF target on a
/// veth pair, replays the example's packets and checks that every
/// subscriber received what `subc sim` predicts.
#[test]
fn the_demo_passes_with_the_server_holding_only_three_capabilities() {
    if !kernel_available("the_demo_passes_with_the_server_holding_only_three_capabilities") {
        return;
    }
    let out = Command::new("timeout")
        .args(["300", "bash", "scripts/demo.sh"])
        .current_dir(common::repo())
        .env("SUBC_SKIP_INSTALL", "1")
        .env("SUBC_BIN", env!("CARGO_BIN_EXE_subc"))
        .env("SUBC_DEMO_USER", "subc-demo")
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the demo failed ({}):\n{stdout}\n{stderr}", out.status);
    assert!(stdout.contains("the server runs as subc-demo with capabilities +net_admin,+bpf,+perfmon only"), "{stdout}");
    assert!(stdout.contains("effective capabilities 000000c000001000"), "{stdout}");
    assert!(stdout.contains("every subscriber received what subc sim predicts"), "{stdout}");
}
