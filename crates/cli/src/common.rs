//! What the subcommands share: loading and checking the inputs, the
//! compiler's knobs, compiling, one packet's result, and writing artifacts.
//! The subcommand modules (`compile`, `sim`, `ebpf`, `p4`) import from here
//! and from `input`, never from each other's helpers.

use crate::input::{load, Inputs};
use crate::{ui, InputArgs};
use anyhow::{bail, Context, Result};
use clap::Args;
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;
use subc_bdd::{CompileOptions, CompiledSet};
use subc_lang::spec::{QueryFieldId, Spec};
use subc_lang::{Decision, Diagnostics, Program};

/// Loads and checks the inputs, printing diagnostics to stderr. `Err` with
/// exit code 1 if there are errors, or warnings under `--deny-warnings`.
pub fn load_program(input: &InputArgs) -> Result<Result<(Program, Inputs), ExitCode>> {
    load_program_with(input, None)
}

/// [`load_program`] for a network: `fwd(...)` may name the endpoints of
/// `endpoints` (`docs/network.md`).
pub fn load_program_with(input: &InputArgs, endpoints: Option<&subc_lang::Endpoints>) -> Result<Result<(Program, Inputs), ExitCode>> {
    let inputs = load(input.spec.as_deref(), &input.rules)?;
    let (program, diags) = subc_lang::check_program_with(&inputs.sources, inputs.spec, &inputs.rules, input.limits(), endpoints);
    if !diags.is_empty() {
        eprint!("{}", diags.render_styled(&inputs.sources, ui::diagnostics_style()));
    }
    Ok(match program {
        Some(p) if !denied_warnings(input, &diags) => Ok((p, inputs)),
        _ => Err(ExitCode::from(1)),
    })
}

/// Whether `--deny-warnings` fails a run that has only warnings; if so, says
/// why on stderr (the diagnostics' own summary line counts errors only).
pub fn denied_warnings(input: &InputArgs, diags: &Diagnostics) -> bool {
    let warnings = diags.warning_count();
    if !input.deny_warnings || warnings == 0 || diags.has_errors() {
        return false;
    }
    let s = if warnings == 1 { "" } else { "s" };
    eprintln!("{}: {warnings} warning{s} emitted, and --deny-warnings makes warnings fail the run", ui::error_word("error"));
    true
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
    /// Lower the rules whose diagrams multiply (diverse multi-attribute filters, as Siena's)
    /// to one bit-vector group instead of more pipelines: memory that grows with the sum of
    /// the rules' ranges, not their product. `--target ebpf` and `ir` only.
    #[arg(long)]
    pub bit_vectors: bool,
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
        Ok(CompileOptions {
            order,
            node_budget: self.node_budget,
            split_nodes: self.split_nodes,
            max_pipelines: self.max_pipelines,
            bit_vectors: self.bit_vectors,
        })
    }
}

/// Compiles a checked program, reporting a budget error as the CLI does.
pub fn compile_program(program: &Program, args: &CompilerArgs) -> Result<(CompiledSet, f64)> {
    let opts = args.options(&program.spec)?;
    let t = Instant::now();
    let set = CompiledSet::compile(&program.spec, &program.normal_forms, opts).context("compilation failed")?;
    Ok((set, t.elapsed().as_secs_f64()))
}

/// One packet's result, the same shape for every engine.
pub struct SimResult {
    pub parsed: bool,
    /// Matched subscription ids; only the reference interpreter knows them.
    pub matched: Option<Vec<u64>>,
    pub ports: Vec<u32>,
    pub decision: Decision,
}

/// Writes artifacts into `dir`, or prints them (text ones only, or JSON) to stdout.
pub fn write_outputs(dir: Option<&Path>, files: &[(&str, Vec<u8>)], json: bool) -> Result<()> {
    match dir {
        Some(d) => {
            std::fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
            for (name, bytes) in files {
                write_atomic(&d.join(name), bytes)?;
            }
            if json {
                let files: Vec<_> = files.iter().map(|(name, bytes)| serde_json::json!({"name": name, "bytes": bytes.len()})).collect();
                let manifest = serde_json::json!({"out": d, "files": files});
                writeln!(std::io::stdout().lock(), "{}", serde_json::to_string_pretty(&manifest)?)?;
            } else {
                eprintln!("wrote {} to {}", files.iter().map(|f| f.0).collect::<Vec<_>>().join(", "), d.display());
            }
        }
        None if json => bail!("--json lists the files written with -o DIR: give -o (without it, `--emit stats` prints JSON itself)"),
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

/// Writes through a temporary file and a rename, so a crash never leaves a
/// partial file behind.
pub fn write_atomic(path: &std::path::Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    let tmp = dir.join(format!(".{}.tmp{}", path.file_name().and_then(|n| n.to_str()).unwrap_or("out"), std::process::id()));
    std::fs::write(&tmp, bytes).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}
