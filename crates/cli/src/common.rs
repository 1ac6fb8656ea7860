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
use subc_bdd::{CompileError, CompileOptions, CompiledSet, Lowering};
use subc_lang::spec::{QueryFieldId, Spec};
use subc_lang::{Diagnostics, Program};

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
    /// How rules are lowered. `auto` lets the cost model choose per key group: a decision
    /// diagram while it stays small and holds rules enough to be worth a walk per packet
    /// (2,048), else a bit-vector group (Linear Bit Vector Search:
    /// memory that grows with the sum of the rules' ranges, not their product, as diverse
    /// filters like Siena's need). `diagrams` never uses a group; `bit-vectors` puts every
    /// rule that updates no variable in the group. `--target p4` runs diagrams only: a
    /// switch's match-action tables cannot run a group.
    #[arg(long, default_value = "auto", value_name = "HOW", value_parser = parse_lowering)]
    pub lowering: Lowering,
    /// The cost model's choice, which `--lowering auto` now makes by default.
    #[arg(long, hide = true)]
    pub bit_vectors: bool,
}

fn parse_lowering(s: &str) -> std::result::Result<Lowering, String> {
    s.parse()
}

/// What a target can run of the IR's lowerings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Runs {
    /// Diagrams and bit-vector groups (eBPF, the IR itself).
    Everything,
    /// Decision diagrams only (P4).
    DiagramsOnly,
}

impl CompilerArgs {
    /// The compiler options for a target that runs `runs`: `--lowering
    /// auto` becomes diagrams where groups cannot run (`bit-vectors` stays,
    /// for the back end to refuse the group it makes).
    pub fn options(&self, spec: &Spec, runs: Runs) -> Result<CompileOptions> {
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
        let lowering = match (runs, self.lowering, self.bit_vectors) {
            (Runs::DiagramsOnly, Lowering::BitVectors, _) => Lowering::BitVectors,
            (Runs::DiagramsOnly, _, _) => Lowering::Diagrams,
            (Runs::Everything, l, false) => l,
            (Runs::Everything, _, true) => Lowering::Auto,
        };
        Ok(CompileOptions {
            order,
            node_budget: self.node_budget,
            split_nodes: self.split_nodes,
            max_pipelines: self.max_pipelines,
            lowering,
            ..Default::default()
        })
    }

    /// Every option that could make a set fit that the compiler refused
    /// with these options, for a target that runs `runs`.
    pub fn ways_to_fit(&self, runs: Runs) -> Vec<String> {
        let mut ways = vec![];
        match runs {
            Runs::Everything if self.lowering == Lowering::Diagrams && !self.bit_vectors => {
                ways.push("--lowering auto, to put the rules whose diagrams multiply in a bit-vector group".to_string())
            }
            Runs::Everything => {}
            Runs::DiagramsOnly => {
                ways.push("--p4-budget N, to deploy a relaxed superset that fits N entries (hosts then filter exactly)".into());
                ways.push("--target ebpf, whose programs run bit-vector groups (--lowering auto)".into());
            }
        }
        ways.push(format!("--split-nodes N above {}, for bigger pipelines", self.split_nodes));
        ways.push(format!("--max-pipelines N above {}, for more of them", self.max_pipelines));
        ways.push(format!("--node-budget N above {}, for a rule that alone needs more nodes", self.node_budget));
        ways
    }
}

/// Compiles a checked program for a target that runs `runs`; a set that
/// does not fit is refused with every option that could make it fit.
pub fn compile_program(program: &Program, args: &CompilerArgs, runs: Runs) -> Result<(CompiledSet, f64)> {
    let opts = args.options(&program.spec, runs)?;
    let t = Instant::now();
    let set = match CompiledSet::compile(&program.spec, &program.normal_forms, opts) {
        Ok(set) => set,
        Err(e @ (CompileError::TooManyPipelines { .. } | CompileError::SubscriptionTooLarge { .. })) => {
            let ways: Vec<String> = args.ways_to_fit(runs).into_iter().map(|w| format!("\n  - {w}")).collect();
            bail!("compilation failed: {e}\nany of these may make the set fit:{}", ways.concat())
        }
        Err(e) => return Err(anyhow::Error::new(e).context("compilation failed")),
    };
    Ok((set, t.elapsed().as_secs_f64()))
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
