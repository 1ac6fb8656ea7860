//! `subc compile`: run the compiler and write its artifacts.
//!
//! `--target ir` (the default) writes what the IR made: tables (JSON and
//! text), statistics (including the sizes alternative field orders give),
//! and the diagram as Graphviz DOT. The back ends add their own targets.

use crate::common::{compile_program, load_program, write_outputs, CompilerArgs, Runs};
use crate::input::Inputs;
use crate::{ui, InputArgs};
use anyhow::Result;
use clap::{Args, ValueEnum};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;
use subc_bdd::report::{dot, stats, tables_text};
use subc_bdd::CompiledSet;
use subc_lang::Program;

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq, Debug)]
pub enum Target {
    /// The target-neutral pipeline: tables, statistics, diagram.
    Ir,
    /// An XDP or TC program: C source, BPF object, maps.json, initial entries (needs -o).
    Ebpf,
    /// P4_16 for v1model, P4Info, P4Runtime entries and groups, resources.json (needs -o).
    P4,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq, Debug)]
pub enum Emit {
    /// Tables as JSON (`tables.json`) and as text (`tables.txt`).
    Tables,
    /// Sizes as JSON: nodes, entries, TCAM/SRAM, groups, time, and the sizes other field orders give.
    Stats,
    /// The decision diagram as Graphviz DOT (`diagram.dot`).
    Dot,
}

#[derive(Args)]
pub struct CompileArgs {
    #[command(flatten)]
    pub input: InputArgs,
    /// What to compile to.
    #[arg(long, value_enum, default_value_t = Target::Ir)]
    pub target: Target,
    /// For `--target ir`: what to print (or, with -o, write). Repeatable; default: all.
    #[arg(long, value_enum)]
    pub emit: Vec<Emit>,
    /// Write the artifacts into this directory (created if needed) instead of stdout.
    #[arg(short = 'o', long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// With -o: print what was written as JSON on stdout
    /// (`{"out": DIR, "files": [{"name", "bytes"}]}`) instead of a line on stderr.
    #[arg(long, requires = "out")]
    pub json: bool,
    #[command(flatten)]
    pub compiler: CompilerArgs,
    #[command(flatten)]
    pub ebpf: crate::ebpf::EbpfArgs,
    #[command(flatten)]
    pub p4: crate::p4::P4Args,
}

pub fn compile(args: &CompileArgs) -> Result<ExitCode> {
    let (program, inputs) = match load_program(&args.input)? {
        Ok(x) => x,
        Err(code) => return Ok(code),
    };
    let result = match args.target {
        Target::Ir => compile_ir(args, &program, &inputs),
        Target::Ebpf => crate::ebpf::compile(&program, &args.compiler, &args.ebpf, args.out.as_deref(), args.json),
        Target::P4 => crate::p4::compile(&program, &args.compiler, &args.p4, args.out.as_deref(), args.json),
    };
    // The process ends next: its memory goes back whole, so the rules (a
    // million of them are millions of allocations) are not freed one by one.
    std::mem::forget((program, inputs));
    result
}

fn compile_ir(args: &CompileArgs, program: &Program, _inputs: &Inputs) -> Result<ExitCode> {
    let (set, secs) = compile_program(program, &args.compiler, Runs::Everything)?;
    let emits: Vec<Emit> = if args.emit.is_empty() { vec![Emit::Tables, Emit::Stats, Emit::Dot] } else { args.emit.clone() };
    let mut files: Vec<(&str, Vec<u8>)> = vec![];
    for e in &emits {
        match e {
            Emit::Tables => {
                let pipes = set.pipelines();
                files.push(("tables.json", serde_json::to_vec_pretty(&pipes)?));
                files.push(("tables.txt", tables_text(&pipes, &program.spec).into_bytes()));
            }
            Emit::Stats => {
                let mut v = serde_json::to_value(stats(&set, secs))?;
                v["orders"] = serde_json::to_value(order_sizes(program, &args.compiler))?;
                v["state"] = serde_json::to_value(subc_bdd::report::state_slots(&program.spec))?;
                files.push(("stats.json", serde_json::to_vec_pretty(&v)?));
            }
            Emit::Dot => files.push(("diagram.dot", dot(&set, &program.spec).into_bytes())),
        }
    }
    write_outputs(args.out.as_deref(), &files, args.json)?;
    Ok(ExitCode::SUCCESS)
}

/// Sizes that other field orders give: the compiler's own candidates
/// (every permutation of the constrained fields when there are at most four,
/// otherwise each one moved first), each compiled in full. On a large set
/// this is the long part of `--emit stats`, so a terminal shows its progress.
fn order_sizes(program: &Program, args: &CompilerArgs) -> Vec<serde_json::Value> {
    let spec = &program.spec;
    let orders: Vec<_> = subc_bdd::candidate_orders(spec, &program.normal_forms).into_iter().take(24).collect();
    let progress = ui::progress(orders.len() as u64, "compiling other field orders");
    let sizes = orders
        .into_iter()
        .map(|order| {
            let names: Vec<String> = order.iter().map(|f| spec.query_field(*f).name.clone()).collect();
            let mut opts = args.options(spec, Runs::Everything).unwrap_or_default();
            opts.order = Some(order);
            let t = Instant::now();
            let compiled = CompiledSet::compile(spec, &program.normal_forms, opts);
            progress.inc(1);
            match compiled {
                Ok(set) => {
                    let s = stats(&set, t.elapsed().as_secs_f64());
                    serde_json::json!({"order": names, "nodes": s.nodes, "entries_total": s.entries_total, "tcam_entries": s.tcam_entries, "pipelines": s.pipelines, "compile_seconds": s.compile_seconds})
                }
                Err(e) => serde_json::json!({"order": names, "error": e.to_string()}),
            }
        })
        .collect();
    progress.finish_and_clear();
    sizes
}
