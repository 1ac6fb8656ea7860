//! `subc compile`: run the compiler and write its artifacts.
//!
//! `--target ir` (the default) writes what the IR made: tables (JSON and
//! text), statistics (including the sizes alternative field orders give),
//! and the diagram as Graphviz DOT. The back ends add their own targets.

use crate::input::Inputs;
use crate::sim::{load_program, write_atomic};
use crate::InputArgs;
use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;
use subc_bdd::report::{dot, stats, tables_text};
use subc_bdd::{CompileOptions, CompiledSet};
use subc_lang::spec::{QueryFieldId, Spec};
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

/// Compiler knobs shared by every target.
#[derive(Args, Clone, Debug)]
pub struct CompilerArgs {
    /// Field order, as comma-separated query fields (e.g. `add_order.stock,add_order.shares`);
    /// the rest follow the heuristic. Overrides the spec's `order`.
    #[arg(long, value_delimiter = ',', value_name = "FIELDS")]
    pub order: Vec<String>,
    /// Most diagram nodes one pipeline may have.
    #[arg(long, default_value_t = CompileOptions::default().node_budget, value_name = "N")]
    pub node_budget: usize,
    /// When the set must be split over several pipelines, their size in nodes.
    #[arg(long, default_value_t = CompileOptions::default().split_nodes, value_name = "N")]
    pub split_nodes: usize,
    /// Most pipelines the set may be spread over.
    #[arg(long, default_value_t = CompileOptions::default().max_pipelines, value_name = "N")]
    pub max_pipelines: usize,
}

impl CompilerArgs {
    pub fn options(&self, spec: &Spec) -> Result<CompileOptions> {
        let order = if self.order.is_empty() {
            None
        } else {
            let mut ids = vec![];
            for name in &self.order {
                let Some(id) = spec.query_field_by_name(name).or_else(|| {
                    let hits: Vec<usize> = spec
                        .query_fields
                        .iter()
                        .enumerate()
                        .filter(|(_, q)| q.name.rsplit('.').next() == Some(name.as_str()))
                        .map(|(i, _)| i)
                        .collect();
                    (hits.len() == 1).then(|| QueryFieldId(hits[0] as u32))
                }) else {
                    let known: Vec<&str> = spec.query_fields.iter().map(|q| q.name.as_str()).collect();
                    bail!("--order: `{name}` is not a query field; query fields are {}", known.join(", "));
                };
                ids.push(id);
            }
            Some(ids)
        };
        Ok(CompileOptions { order, node_budget: self.node_budget, split_nodes: self.split_nodes, max_pipelines: self.max_pipelines })
    }
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
    #[command(flatten)]
    pub compiler: CompilerArgs,
    #[command(flatten)]
    pub ebpf: crate::ebpf::EbpfArgs,
    #[command(flatten)]
    pub p4: crate::p4::P4Args,
}

/// Compiles a checked program, reporting a budget error as the CLI does.
pub fn compile_program(program: &Program, args: &CompilerArgs) -> Result<(CompiledSet, f64)> {
    let opts = args.options(&program.spec)?;
    let t = Instant::now();
    let set = CompiledSet::compile(&program.spec, &program.normal_forms, opts).context("compilation failed")?;
    Ok((set, t.elapsed().as_secs_f64()))
}

pub fn compile(args: &CompileArgs) -> Result<ExitCode> {
    let (program, inputs) = match load_program(&args.input)? {
        Ok(x) => x,
        Err(code) => return Ok(code),
    };
    match args.target {
        Target::Ir => compile_ir(args, &program, &inputs),
        Target::Ebpf => crate::ebpf::compile(&program, &args.compiler, &args.ebpf, args.out.as_deref()),
        Target::P4 => crate::p4::compile(&program, &args.compiler, &args.p4, args.out.as_deref()),
    }
}

fn compile_ir(args: &CompileArgs, program: &Program, _inputs: &Inputs) -> Result<ExitCode> {
    let (set, secs) = compile_program(program, &args.compiler)?;
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
    write_outputs(args.out.as_deref(), &files)?;
    Ok(ExitCode::SUCCESS)
}

/// Writes artifacts into `dir`, or prints them (text ones only, or JSON) to stdout.
pub fn write_outputs(dir: Option<&Path>, files: &[(&str, Vec<u8>)]) -> Result<()> {
    match dir {
        Some(d) => {
            std::fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
            for (name, bytes) in files {
                write_atomic(&d.join(name), bytes)?;
            }
            eprintln!("wrote {} to {}", files.iter().map(|f| f.0).collect::<Vec<_>>().join(", "), d.display());
        }
        None => {
            let mut out = std::io::stdout().lock();
            let printable: Vec<&(&str, Vec<u8>)> = files
                .iter()
                .filter(|f| !f.0.ends_with(".json") || files.len() == 1 || !files.iter().any(|g| g.0 == f.0.replace(".json", ".txt")))
                .collect();
            for (name, bytes) in printable {
                if files.len() > 1 {
                    writeln!(out, "==> {name} <==")?;
                }
                out.write_all(bytes)?;
                if !bytes.ends_with(b"\n") {
                    writeln!(out)?;
                }
            }
        }
    }
    Ok(())
}

/// Sizes that other field orders give: the compiler's own candidates
/// (every permutation of the constrained fields when there are at most four,
/// otherwise each one moved first), each compiled in full.
fn order_sizes(program: &Program, args: &CompilerArgs) -> Vec<serde_json::Value> {
    let spec = &program.spec;
    subc_bdd::candidate_orders(spec, &program.normal_forms)
        .into_iter()
        .take(24)
        .map(|order| {
            let names: Vec<String> = order.iter().map(|f| spec.query_field(*f).name.clone()).collect();
            let mut opts = args.options(spec).unwrap_or_default();
            opts.order = Some(order);
            let t = Instant::now();
            match CompiledSet::compile(spec, &program.normal_forms, opts) {
                Ok(set) => {
                    let s = stats(&set, t.elapsed().as_secs_f64());
                    serde_json::json!({"order": names, "nodes": s.nodes, "entries_total": s.entries_total, "tcam_entries": s.tcam_entries, "pipelines": s.pipelines, "compile_seconds": s.compile_seconds})
                }
                Err(e) => serde_json::json!({"order": names, "error": e.to_string()}),
            }
        })
        .collect()
}
