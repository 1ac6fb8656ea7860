//! The eBPF commands of `subc`: compile artifacts, `sim --engine ebpf`
//! against the reference engine, and attach, status, detach on a veth pair.
//! Kernel parts need root; they skip without it, except under `CI=true`.

mod common;

use common::{kernel_available, ok, subc, try_subc_with};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tempdir(tag: &str) -> TempDir {
    let d = std::env::temp_dir().join(format!("subc-cli-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    TempDir(d)
}

#[test]
fn compile_writes_source_object_layout_and_entries() {
    let dir = tempdir("compile");
    let out = dir.0.join("out");
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

    /// Detaches now and returns what `subc detach` printed.
    fn detach(mut self) -> std::process::Output {
        self.armed = false;
        subc(&["detach", &self.name])
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
    let out = dir.0.join("out");
    ok(&subc(&["compile", "examples/topic-broker", "--target", "ebpf", "--hook", "xdp", "-o", out.to_str().unwrap()]));
    let tag = format!("sct{}", std::process::id() % 100_000);
    let (a, b) = (format!("{tag}a"), format!("{tag}b"));
    let st = Command::new("ip").args(["link", "add", &a, "type", "veth", "peer", "name", &b]).status().unwrap();
    assert!(st.success());
    let _veth = Veth(a.clone());
    for d in [&a, &b] {
        Command::new("ip").args(["link", "set", d, "up"]).status().unwrap();
    }
    let cfg = dir.0.join("target.json");
    std::fs::write(&cfg, format!(r#"{{"no_match": "drop", "ports": {{"1": {{"interface": "{b}", "dst_port": 7000}}}}}}"#)).unwrap();
    let name = tag.clone();
    // From here on the deployment is detached when the test ends, also when
    // an assertion fails, so no pins are left behind.
    let attachment = Attached::new(&name);
    ok(&subc(&[
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
    ]));
    let status: serde_json::Value = serde_json::from_str(&ok(&subc(&["status", &name, "--json"]))).unwrap();
    ok(&attachment.detach());
    assert_eq!(status["live_generation"], 0);
    let kinds: Vec<&str> = status["attachments"].as_array().unwrap().iter().map(|a| a["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["xdp-generic", "tcx"]);
    assert!(status["maps"].as_array().unwrap().iter().any(|m| m["name"] == "subc_leaves" && m["max_entries"].as_u64().unwrap() > 0));
    // Detached: no record, no pins.
    assert!(!subc(&["status", &name]).status.success());
    assert!(!Path::new("/sys/fs/bpf/subc").join(&name).exists());
}
