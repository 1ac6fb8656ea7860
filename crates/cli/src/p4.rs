//! The P4 target on the command line: `subc compile --target p4` and
//! `subc sim --engine p4`.

use crate::common::{compile_program, write_outputs, CompilerArgs, Runs};
use anyhow::{bail, Context, Result};
use clap::Args;
use prost::Message;
use std::path::Path;
use std::process::ExitCode;
use subc_backend_p4::proto::p4::config::v1::P4Info;
use subc_backend_p4::proto::p4::v1 as p4v1;
use subc_backend_p4::proto::{to_text, write_request_text};
use subc_backend_p4::Simulator;
use subc_backend_p4::{compile as p4_compile, Arch, P4Options, Receivers};
use subc_backend_p4::{entries_text, write_request, Batch};
use subc_bdd::Headroom;
use subc_lang::PcapPacket;
use subc_lang::Program;
use subc_lang::{Decision, Outcome};

/// Options of the P4 target (shared by `compile` and `sim`).
#[derive(Args, Clone, Debug)]
pub struct P4Args {
    /// P4: smallest `size` of a table in the program.
    #[arg(long, default_value_t = P4Options::default().min_table_size, value_name = "N")]
    pub p4_min_table_size: u64,
    /// P4: tables are sized for this many times today's entries.
    #[arg(long, default_value_t = P4Options::default().headroom, value_name = "FACTOR")]
    pub p4_headroom: Headroom,
    /// P4: no leaf table; each leaf's action rides on the entries that lead to it
    /// (fewer entries, wider action data).
    #[arg(long)]
    pub p4_fold_leaves: bool,
    /// P4: fit the set in at most this many table and leaf entries by over-approximation:
    /// constraints on some fields are dropped (most distinct constants first) until it fits,
    /// so the switch may forward more than the subscriptions ask, never less; filter exactly
    /// on the hosts with `--target ebpf`. resources.json's `approximation` says what was
    /// dropped and how much extra traffic that is on 10,000 sampled packets. With `--arch tna`
    /// the program must also fit one Tofino pipe (12 stages, its TCAM and SRAM), by the
    /// estimate resources.json's `tofino` gives.
    #[arg(long, value_name = "ENTRIES")]
    pub p4_budget: Option<usize>,
    /// P4: never send a copy back out of the port the packet came in on, as a switch in a
    /// fabric must (docs/network.md); without it a lone device sends to every port its
    /// subscriptions name.
    #[arg(long)]
    pub p4_prune_ingress: bool,
    /// P4: the architecture of the program: `v1model` (BMv2's simple_switch) or `tna`
    /// (Tofino, for the open Tofino compiler: `p4c --target tofino --arch tna`). TNA keeps
    /// stream state in Tofino's stateful ALUs, with the differences docs/semantics.md lists
    /// under "Target profiles" (an EWMA runs in two passes), and refuses `var` state. Fields
    /// no subscription tests get no table (each would cost one of Tofino's 12 stages). With
    /// `subc sim`, every engine follows the target: `--engine p4` simulates the TNA program,
    /// `ref` and `tables` compute state as a Tofino does.
    #[arg(long, value_enum, default_value = "v1model")]
    pub arch: ArchArg,
    /// P4, a spec of more than 511 ports: the receivers (JSON), each a port's egress port and
    /// rewrites, as the eBPF target config writes them: `{"600": {"port": 89, "dst_mac":
    /// "02:00:00:00:00:03", "dst_ip": "10.0.0.3", "dst_port": 7000}}`. A copy to a receiver
    /// not listed is dropped. Without it, every receiver `p` leaves unchanged on egress port
    /// `p mod 511` (docs/semantics.md, "Audiences").
    #[arg(long, value_name = "FILE", value_parser = read_receivers)]
    pub p4_receivers: Option<Receivers>,
}

/// `--p4-receivers FILE`, read and checked when the arguments are parsed.
fn read_receivers(path: &str) -> Result<Receivers, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?;
    Receivers::from_json(&text).map_err(|e| e.to_string())
}

/// `--arch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ArchArg {
    V1model,
    Tna,
}

impl P4Args {
    pub fn options(&self) -> P4Options {
        P4Options {
            min_table_size: self.p4_min_table_size,
            headroom: self.p4_headroom,
            fold_leaves: self.p4_fold_leaves,
            prune_ingress: self.p4_prune_ingress,
            arch: self.arch(),
            // Levels of untested fields would only cost stages (the
            // service installs a program with the level when one is needed).
            skip_empty_levels: true,
            receivers: self.p4_receivers.clone().unwrap_or_default(),
            ..P4Options::default()
        }
    }

    /// The architecture `--arch` names.
    pub fn arch(&self) -> Arch {
        match self.arch {
            ArchArg::V1model => Arch::V1Model,
            ArchArg::Tna => Arch::Tna,
        }
    }
}

/// `subc compile --target p4 -o DIR`.
pub fn compile(program: &Program, compiler: &CompilerArgs, p4: &P4Args, out: Option<&Path>, json: bool) -> Result<ExitCode> {
    let Some(out) = out else {
        bail!("--target p4 writes several files (program.p4, program.p4info.txtpb, entries.txtpb, entries.bin, mcast.txtpb, resources.json): pass -o DIR");
    };
    let (set, approximation) = match p4.p4_budget {
        None => (compile_program(program, compiler, Runs::DiagramsOnly)?.0, None),
        Some(budget) => fit_budget(program, compiler, p4, budget)?,
    };
    let (_, art) = p4_compile(&program.spec, &set, &p4.options()).context("P4 back end")?;
    let mut resources = serde_json::to_value(&art.resources)?;
    if let Some(a) = approximation {
        resources["approximation"] = a;
    }
    let groups: Vec<Batch> = art
        .install
        .iter()
        .map(|b| Batch {
            label: b.label.clone(),
            updates: b
                .updates
                .iter()
                .filter(|u| {
                    matches!(u.entity.as_ref().and_then(|e| e.entity.as_ref()), Some(p4v1::entity::Entity::PacketReplicationEngineEntry(_)))
                })
                .cloned()
                .collect(),
        })
        .filter(|b| !b.updates.is_empty())
        .collect();
    let describe = |u: &p4v1::Update| subc_backend_p4::describe(u, &art.p4info);
    let files: Vec<(&str, Vec<u8>)> = vec![
        ("program.p4", art.program.clone().into_bytes()),
        ("program.p4info.txtpb", to_text(&art.p4info).into_bytes()),
        ("entries.txtpb", entries_text(&art.install, &art.p4info).into_bytes()),
        ("entries.bin", write_request(&art.install).encode_to_vec()),
        ("mcast.txtpb", write_request_text(&write_request(&groups), describe).into_bytes()),
        ("resources.json", serde_json::to_vec_pretty(&resources)?),
    ];
    write_outputs(Some(out), &files, json)?;
    let r = &art.resources;
    eprintln!(
        "{} pipeline(s): {} entries ({} TCAM after range expansion, {} SRAM), {} multicast groups",
        r.pipelines, r.entries, r.tcam_entries, r.sram_entries, r.multicast_groups
    );
    Ok(ExitCode::SUCCESS)
}

/// The set relaxed to fit `budget` entries, and the report of what that
/// costs: the fields dropped, and the extra deliveries on sampled packets
/// against the exact set (compiled with bit-vector groups, so that it
/// compiles at any size).
fn fit_budget(
    program: &Program,
    compiler: &CompilerArgs,
    p4: &P4Args,
    budget: usize,
) -> Result<(subc_bdd::CompiledSet, Option<serde_json::Value>)> {
    use subc_bdd::{compile_within_by, extra, sample_values};
    let opts = compiler.options(&program.spec, Runs::DiagramsOnly)?;
    // TNA: the program must also fit one Tofino pipe, by our estimate
    // (stages, TCAM and SRAM: resources.json's `tofino`).
    let p4_opts = p4.options();
    let fits_target = |set: &subc_bdd::CompiledSet| {
        p4_opts.arch != Arch::Tna
            || subc_backend_p4::P4Target::new(&program.spec, set, &p4_opts).is_ok_and(|t| t.tofino_estimate().is_some_and(|e| e.fits))
    };
    let fit = compile_within_by(&program.spec, &program.normal_forms, opts.clone(), budget, fits_target).context("--p4-budget")?;
    let exact = subc_bdd::CompiledSet::compile(
        &program.spec,
        &program.normal_forms,
        subc_bdd::CompileOptions { lowering: subc_bdd::Lowering::Auto, ..opts },
    )
    .context("the exact set, to measure the approximation")?;
    let values = sample_values(&program.spec, &program.normal_forms, 10_000, 1);
    let x = extra(|v| exact.eval_tables(v), |v| fit.set.eval_tables(v), &values);
    if x.missing_deliveries > 0 {
        bail!("internal error: the relaxed set misses {} deliveries the exact set makes", x.missing_deliveries);
    }
    let dropped: Vec<&str> = fit.dropped.iter().map(|f| program.spec.query_fields[f.0 as usize].name.as_str()).collect();
    let report = serde_json::json!({
        "budget": budget,
        "entries": fit.set.entry_count(),
        "dropped_fields": dropped,
        "sampled_packets": x.packets,
        "packets_with_extra_ports": x.packets_with_extra,
        "exact_deliveries": x.deliveries,
        "extra_deliveries": x.extra_deliveries,
        "missing_deliveries": x.missing_deliveries,
    });
    Ok((fit.set, Some(report)))
}

/// `subc sim --engine p4`: the P4-semantics simulator, loaded only from the
/// P4Info and the entries as they go over the wire (encoded, then decoded).
pub fn sim(program: &Program, packets: &[PcapPacket], compiler: &CompilerArgs, p4: &P4Args) -> Result<Vec<Outcome>> {
    let (set, _) = compile_program(program, compiler, Runs::DiagramsOnly)?;
    let (target, art) = p4_compile(&program.spec, &set, &p4.options()).context("P4 back end")?;
    let info = P4Info::decode(art.p4info.encode_to_vec().as_slice())?;
    let entries = p4v1::WriteRequest::decode(write_request(&art.install).encode_to_vec().as_slice())?;
    let layout = target.layout().clone();
    let mut sim = Simulator::new(&program.spec, &layout, &info).map_err(anyhow::Error::msg)?;
    if let Err((i, e)) = sim.switch.write(&entries) {
        bail!("the simulated switch refused update {i}: {e}");
    }
    packets
        .iter()
        .map(|p| {
            let o = sim.run(&p.data, p.ts_ns).map_err(anyhow::Error::msg)?;
            Ok(Outcome { parsed: o.parsed, matched: None, ports: o.ports, decision: if o.parsed { o.decision } else { Decision::NoMatch } })
        })
        .collect()
}
