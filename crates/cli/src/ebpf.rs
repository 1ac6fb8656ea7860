//! The eBPF target on the command line: `subc compile --target ebpf`,
//! `subc sim --engine ebpf`, and `subc attach`, `subc detach`, `subc status`.

use crate::common::{compile_program, write_outputs, CompilerArgs, Runs};
use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;
use subc_backend_ebpf::clang::{self, BuildFlags, ClangOptions};
use subc_backend_ebpf::TargetConfig;
use subc_backend_ebpf::{write_set, Capacity, EbpfError, EbpfOptions, Hook, MapOp, Model, RangeLookup};
use subc_bdd::Headroom;
use subc_ebpf_loader::{self as loader, AttachMode, Dataplane, Deployment, LoaderError};
use subc_lang::PcapPacket;
use subc_lang::Program;
use subc_lang::{Decision, Slot, StateStore};

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq, Debug)]
pub enum HookArg {
    /// XDP decides; one egress leaves by devmap redirect, several go to TC.
    Xdp,
    /// TC decides and fans out with bpf_clone_redirect.
    Tc,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq, Debug)]
pub enum RangesArg {
    /// Per state, sorted intervals searched in log2(K) steps (measured faster).
    Sorted,
    /// One LPM trie over prefix-expanded ranges.
    Lpm,
}

/// Options of the eBPF target (shared by `compile` and `sim`).
#[derive(Args, Clone, Debug)]
pub struct EbpfArgs {
    /// eBPF: the hook to generate the program for.
    #[arg(long, value_enum, default_value_t = HookArg::Tc)]
    pub hook: HookArg,
    /// eBPF: how range, prefix and default entries are looked up.
    #[arg(long, value_enum, default_value_t = RangesArg::Sorted)]
    pub ranges: RangesArg,
    /// eBPF: map capacity as a multiple of today's entries (room for updates).
    #[arg(long, default_value_t = Capacity::default().headroom, value_name = "FACTOR")]
    pub headroom: Headroom,
    /// eBPF sim: target config (JSON) giving ports egress interfaces and
    /// rewrites. Test runs really transmit TC's clones on those interfaces.
    #[arg(long, value_name = "FILE")]
    pub target_config: Option<PathBuf>,
    /// eBPF: how many seconds clang may spend compiling the generated C.
    /// When they run out, clang and every process it started are killed and
    /// the command fails naming this limit, instead of hanging. The examples
    /// compile in about a second; sets of tens of thousands of subscriptions
    /// or a spec with thousands of headers can take minutes: raise it for
    /// those.
    #[arg(long, value_name = "SECS", default_value_t = ClangOptions::DEFAULT_TIMEOUT.as_secs(), value_parser = clap::value_parser!(u64).range(1..))]
    pub clang_timeout: u64,
    /// eBPF: the clang to run, a name looked up in PATH or a path (for
    /// another version than the default one, e.g. `clang-19`).
    #[arg(long, value_name = "PATH", env = "SUBC_CLANG", default_value = "clang")]
    pub clang: PathBuf,
}

impl EbpfArgs {
    pub fn options(&self) -> EbpfOptions {
        EbpfOptions {
            hook: match self.hook {
                HookArg::Xdp => Hook::Xdp,
                HookArg::Tc => Hook::Tc,
            },
            ranges: match self.ranges {
                RangesArg::Sorted => RangeLookup::Sorted,
                RangesArg::Lpm => RangeLookup::Lpm,
            },
            capacity: Capacity { headroom: self.headroom, ..Capacity::default() },
        }
    }

    pub fn clang_options(&self) -> ClangOptions {
        ClangOptions { clang: self.clang.clone(), timeout: Duration::from_secs(self.clang_timeout) }
    }

    /// Compiles generated C with this command line's clang and limit.
    fn compile_object(&self, source: &str, flags: BuildFlags) -> Result<Vec<u8>> {
        clang::compile_with(source, flags, &self.clang_options()).map_err(|e| match e {
            EbpfError::ClangTimeout { .. } => {
                anyhow::Error::new(e).context("compiling the generated C (--clang-timeout SECS gives clang longer)")
            }
            e => e.into(),
        })
    }
}

/// `subc compile --target ebpf -o DIR`: `subc.c`, `subc.o`, `maps.json`,
/// `entries.json`.
pub fn compile(program: &Program, compiler: &CompilerArgs, ebpf: &EbpfArgs, out: Option<&Path>, json: bool) -> Result<ExitCode> {
    let Some(out) = out else {
        bail!("--target ebpf writes a C file, an object and JSON: give a directory with -o DIR");
    };
    let (set, _) = compile_program(program, compiler, Runs::Everything)?;
    let a = write_set(&program.spec, &set, &ebpf.options())?;
    let object = ebpf.compile_object(&a.source, BuildFlags::default())?;
    write_outputs(
        Some(out),
        &[
            ("subc.c", a.source.clone().into_bytes()),
            ("subc.o", object),
            ("maps.json", a.maps_json().into_bytes()),
            ("entries.json", a.entries_json().into_bytes()),
        ],
        json,
    )?;
    Ok(ExitCode::SUCCESS)
}

fn decision_of(code: u32) -> (bool, Decision) {
    match code {
        1 => (true, Decision::Forward),
        2 => (true, Decision::Drop),
        4 => (false, Decision::NoMatch),
        _ => (true, Decision::NoMatch),
    }
}

fn verdict_name(hook: Hook, v: u32) -> String {
    let names: &[&str] = match hook {
        Hook::Xdp => &["XDP_ABORTED", "XDP_DROP", "XDP_PASS", "XDP_TX", "XDP_REDIRECT"],
        Hook::Tc => &[
            "TC_ACT_OK",
            "TC_ACT_RECLASSIFY",
            "TC_ACT_SHOT",
            "TC_ACT_PIPE",
            "TC_ACT_STOLEN",
            "TC_ACT_QUEUED",
            "TC_ACT_REPEAT",
            "TC_ACT_REDIRECT",
        ],
    };
    names.get(v as usize).map(|s| s.to_string()).unwrap_or_else(|| v.to_string())
}

/// What a rewrite changed: Ethernet addresses, IPv4 destination, UDP port.
fn rewritten(before: &[u8], after: &[u8]) -> BTreeMap<&'static str, String> {
    let mut out = BTreeMap::new();
    let field = |b: &[u8], r: std::ops::Range<usize>| b.get(r).map(|x| x.to_vec());
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<Vec<_>>().join(":");
    for (name, r, fmt) in [
        ("dst_mac", 0..6, 0),
        ("src_mac", 6..12, 0),
        ("ipv4_dst", 30..34, 1),
        ("ipv4_checksum", 24..26, 2),
        ("udp_dst_port", 36..38, 2),
        ("udp_checksum", 40..42, 2),
    ] {
        let (a, b) = (field(before, r.clone()), field(after, r));
        if let (Some(a), Some(b)) = (a, b) {
            if a != b {
                out.insert(
                    name,
                    match fmt {
                        0 => hex(&b),
                        1 => format!("{}.{}.{}.{}", b[0], b[1], b[2], b[3]),
                        _ => u16::from_be_bytes([b[0], b[1]]).to_string(),
                    },
                );
            }
        }
    }
    out
}

/// Slots that differ between two state stores: `(state, slot, new value)`.
fn state_changes(program: &Program, before: &StateStore, after: &StateStore) -> Vec<serde_json::Value> {
    let mut out = vec![];
    for (i, (b, a)) in before.vars.iter().zip(&after.vars).enumerate() {
        for (k, (x, y)) in b.iter().zip(a).enumerate() {
            if x != y {
                out.push(serde_json::json!({"state": program.spec.states[i].name, "slot": k, "value": slot_json(y)}));
            }
        }
    }
    out
}

fn slot_json(s: &Slot) -> serde_json::Value {
    serde_json::to_value(s).unwrap_or_default()
}

/// `subc sim --engine ebpf`: every packet through `BPF_PROG_TEST_RUN`.
///
/// A packet the kernel does not run (a frame of a size `BPF_PROG_TEST_RUN`
/// refuses, or any other failure of its test run) gets a line with its
/// error instead of a decision, and the run goes on with the next packet;
/// the exit status is 1 if any packet failed. Errors that are not one
/// packet's (reading the maps back) end the run, naming the packet.
pub fn sim(program: &Program, packets: &[PcapPacket], compiler: &CompilerArgs, ebpf: &EbpfArgs, json: bool) -> Result<ExitCode> {
    if !loader::can_load_bpf() {
        bail!("--engine ebpf loads a BPF program into the kernel: it needs CAP_NET_ADMIN, and CAP_BPF with CAP_PERFMON (or CAP_SYS_ADMIN), as root or as a user given them");
    }
    let (set, _) = compile_program(program, compiler, Runs::Everything)?;
    let a = write_set(&program.spec, &set, &ebpf.options())?;
    let object = ebpf.compile_object(&a.source, BuildFlags::test())?;
    let dp = Dataplane::load_with_image(&object, a.model, a.image)?;
    let cfg = read_target_config(ebpf.target_config.as_deref())?;
    dp.configure(&cfg)?;
    let mut state = dp.read_state(&program.spec)?;
    let mut out = std::io::stdout().lock();
    let mut failed = vec![];
    for (i, p) in packets.iter().enumerate() {
        dp.clear_record().with_context(|| format!("packet {i}"))?;
        let line = match dp.test_run(&p.data, p.ts_ns, cfg.no_match, 1) {
            Ok(run) => {
                let after = dp.read_state(&program.spec).with_context(|| format!("packet {i}"))?;
                let changes = state_changes(program, &state, &after);
                state = after;
                decided_line(i, dp.model.hook, &cfg, &p.data, &run, &changes, json)
            }
            Err(e) => {
                failed.push(i);
                error_line(i, &e, json)
            }
        };
        match writeln!(out, "{line}") {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(ExitCode::SUCCESS),
            Err(e) => return Err(e.into()),
        }
    }
    if failed.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    let shown: Vec<String> = failed.iter().take(10).map(usize::to_string).collect();
    let more = if failed.len() > shown.len() { ", ..." } else { "" };
    eprintln!(
        "error: {} of {} packets did not run in the kernel (packets {}{more}; see their lines)",
        failed.len(),
        packets.len(),
        shown.join(", ")
    );
    Ok(ExitCode::from(1))
}

/// The line of a packet the kernel decided: the JSON object every engine
/// prints (plus verdict, egress, rewrites and state changes), or text.
fn decided_line(
    i: usize,
    hook: Hook,
    cfg: &TargetConfig,
    packet: &[u8],
    run: &loader::TestRun,
    changes: &[serde_json::Value],
    json: bool,
) -> String {
    let rec = run.record.clone().unwrap_or(loader::Record { decision: 0, drop: false, ports: vec![] });
    let (parsed, decision) = decision_of(rec.decision);
    let egress: Vec<serde_json::Value> = rec
        .ports
        .iter()
        .map(|port| match cfg.ports.get(port) {
            Some(e) => serde_json::json!({"port": port, "interface": e.interface}),
            None => serde_json::json!({"port": port, "interface": null}),
        })
        .collect();
    let rw = rewritten(packet, &run.data);
    if json {
        return serde_json::json!({
            "packet": i,
            "matched": null,
            "ports": rec.ports,
            "decision": decision.as_str(),
            "verdict": verdict_name(hook, run.verdict),
            "egress": egress,
            "rewritten": rw,
            "state": changes,
        })
        .to_string();
    }
    let ports: Vec<String> = rec.ports.iter().map(u32::to_string).collect();
    let what = match decision {
        Decision::Forward => format!("forward to {}", ports.join(",")),
        d => d.as_str().to_string(),
    };
    let mut s = format!("packet {i:>4}: {what}{}  [{}]", if parsed { "" } else { " (did not parse)" }, verdict_name(hook, run.verdict));
    for e in &egress {
        if let Some(name) = e["interface"].as_str() {
            s.push_str(&format!("\n              port {} -> {name}", e["port"]));
        }
    }
    if !rw.is_empty() {
        let parts: Vec<String> = rw.iter().map(|(k, v)| format!("{k}={v}")).collect();
        s.push_str(&format!("\n              rewritten {}", parts.join(" ")));
    }
    for c in changes {
        s.push_str(&format!("\n              state {}[{}] = {}", c["state"].as_str().unwrap_or(""), c["slot"], c["value"]));
    }
    s
}

/// The line of a packet the kernel did not run: `{"packet": N, "error": ...}`
/// or `packet N: error: ...`.
fn error_line(i: usize, e: &LoaderError, json: bool) -> String {
    if json {
        serde_json::json!({"packet": i, "error": e.to_string()}).to_string()
    } else {
        format!("packet {i:>4}: error: {e}")
    }
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq, Debug)]
pub enum ModeArg {
    /// XDP: native if the driver has it, else generic. TC: tcx, else clsact.
    Auto,
    /// XDP in the driver.
    Native,
    /// XDP on the socket buffer (any interface).
    Generic,
    /// TC through a tcx link.
    Tcx,
    /// TC through a clsact qdisc filter (kernels before 6.6).
    Clsact,
}

#[derive(Args)]
pub struct AttachArgs {
    /// The directory `subc compile --target ebpf -o DIR` wrote.
    #[arg(value_name = "DIR")]
    pub artifacts: PathBuf,
    /// The interface whose ingress the program decides.
    #[arg(long, value_name = "IFACE")]
    pub iface: String,
    /// How to attach.
    #[arg(long, value_enum, default_value_t = ModeArg::Auto)]
    pub mode: ModeArg,
    /// Target config (JSON): egress interface and rewrites per logical port,
    /// and the no-match action. See `subc_backend_ebpf::target`.
    #[arg(long, value_name = "FILE")]
    pub target_config: Option<PathBuf>,
    /// Name of the deployment (pins under /sys/fs/bpf/subc/NAME): 1 to 64 of
    /// letters, digits, `_` and `-`.
    #[arg(long, default_value = "subc", value_parser = deployment_name)]
    pub name: String,
    /// Print the new deployment's status as JSON on stdout (what `subc status
    /// NAME --json` prints).
    #[arg(long)]
    pub json: bool,
}

/// A deployment name, checked as the service checks target names.
pub fn deployment_name(s: &str) -> Result<String, subc_client::NameError> {
    subc_client::check_name("deployment name", s).map(|_| s.to_string())
}

fn read_target_config(path: Option<&Path>) -> Result<TargetConfig> {
    Ok(match path {
        Some(p) => TargetConfig::from_json(&std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))?)?,
        None => TargetConfig::default(),
    })
}

fn load_artifacts(dir: &Path) -> Result<(Vec<u8>, Model, Vec<MapOp>)> {
    let read = |f: &str| std::fs::read(dir.join(f)).with_context(|| format!("cannot read {}", dir.join(f).display()));
    let object = read("subc.o")?;
    let model = Model::from_maps_json(&String::from_utf8_lossy(&read("maps.json")?))?;
    let entries: Vec<serde_json::Value> = serde_json::from_slice(&read("entries.json")?).context("entries.json")?;
    let unhex = |s: &str| -> Result<Vec<u8>> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).context("entries.json: bad hex")).collect()
    };
    let mut ops = vec![];
    for e in entries {
        let name = e["map"].as_str().context("entries.json: an entry without a map")?;
        let map = model.map_by_name(name).with_context(|| format!("entries.json names map {name}, which maps.json does not have"))?;
        let key = unhex(e["key"].as_str().context("entries.json: an entry without a key")?)?;
        let value = match e["value"].as_str() {
            Some(v) => Some(unhex(v)?),
            None => None,
        };
        ops.push(MapOp { map, key, value, offset: None });
    }
    Ok((object, model, ops))
}

pub fn attach(args: &AttachArgs) -> Result<ExitCode> {
    if Deployment::open(&args.name).is_ok() {
        bail!("a deployment named `{}` exists; `subc detach {}` first", args.name, args.name);
    }
    let (object, model, ops) = load_artifacts(&args.artifacts)?;
    let cfg = read_target_config(args.target_config.as_deref())?;
    let dp = Dataplane::load(&object, model)?;
    dp.apply(&ops)?;
    let mode = match (args.mode, dp.model.hook) {
        (ModeArg::Auto, Hook::Xdp) => AttachMode::XdpAuto,
        (ModeArg::Auto, Hook::Tc) => AttachMode::TcAuto,
        (ModeArg::Native, _) => AttachMode::XdpNative,
        (ModeArg::Generic, _) => AttachMode::XdpGeneric,
        (ModeArg::Tcx, _) => AttachMode::Tcx,
        (ModeArg::Clsact, _) => AttachMode::Clsact,
    };
    let pin_dir = loader::default_pin_dir(&args.name)?;
    let d = Deployment::install(&args.name, &dp, &cfg, &pin_dir, std::slice::from_ref(&args.iface), mode)?;
    for a in &d.attachments {
        eprintln!("attached {} to {} ({})", a.program, a.iface, a.kind);
    }
    if args.json {
        // What `subc status NAME --json` prints of the new deployment.
        return status(&args.name, true);
    }
    Ok(ExitCode::SUCCESS)
}

pub fn detach(name: &str, json: bool) -> Result<ExitCode> {
    let (d, _) = Deployment::open(name)?;
    let n = d.attachments.len();
    d.remove()?;
    if json {
        writeln!(std::io::stdout().lock(), "{}", serde_json::json!({"name": name, "detached_attachments": n, "pins_removed": true}))?;
    } else {
        eprintln!("detached `{name}` ({n} attachments) and removed its pins");
    }
    Ok(ExitCode::SUCCESS)
}

pub fn status(name: &str, json: bool) -> Result<ExitCode> {
    let s = loader::status(name)?;
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{}", serde_json::to_string_pretty(&s)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    writeln!(out, "{}: {:?} hook, live generation {}", s.name, s.hook, s.live_generation)?;
    for a in &s.attachments {
        writeln!(
            out,
            "  {} on {} ({}){}",
            a.program,
            a.iface,
            a.kind,
            a.link_pin.as_ref().map(|p| format!(", link {}", p.display())).unwrap_or_default()
        )?;
    }
    for (p, n) in &s.programs {
        writeln!(out, "  program {p}: {n} instructions verified")?;
    }
    for m in &s.maps {
        writeln!(out, "  map {:<16} {:>8} / {:<8} entries {:>10} bytes", m.name, m.entries, m.max_entries, m.bytes)?;
    }
    Ok(ExitCode::SUCCESS)
}
