//! `subc check`, `subc sim` and `subc gen`.

use crate::input::{load, Inputs};
use crate::InputArgs;
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use subc_lang::interp::Interpreter;
use subc_lang::pcap::{read_pcap, write_pcap};
use subc_lang::Program;
use subc_workload::examples::{example_packets, EXAMPLES};
use subc_workload::subscriptions::{itch, siena, siena_spec, ItchParams, SienaParams};

/// Loads and checks the inputs, printing diagnostics to stderr. `Err` with
/// exit code 1 if there are errors.
pub fn load_program(input: &InputArgs) -> Result<Result<(Program, Inputs), ExitCode>> {
    let inputs = load(input.spec.as_deref(), &input.rules)?;
    let (program, diags) = subc_lang::check_program(&inputs.sources, inputs.spec, &inputs.rules, input.limits());
    if !diags.is_empty() {
        eprint!("{}", diags.render(&inputs.sources));
    }
    Ok(match program {
        Some(p) => Ok((p, inputs)),
        None => Err(ExitCode::from(1)),
    })
}

pub fn check(input: &InputArgs, json: bool) -> Result<ExitCode> {
    let inputs = load(input.spec.as_deref(), &input.rules)?;
    let (_, diags) = subc_lang::check_program(&inputs.sources, inputs.spec, &inputs.rules, input.limits());
    if json {
        let mut out = std::io::stdout().lock();
        for d in &diags.0 {
            writeln!(out, "{}", serde_json::to_string(&d.to_record(&inputs.sources))?)?;
        }
    } else if !diags.is_empty() {
        eprint!("{}", diags.render(&inputs.sources));
    }
    Ok(if diags.has_errors() { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq, Debug)]
pub enum Engine {
    /// The reference interpreter: the definition of what subscriptions mean.
    Ref,
}

#[derive(Args)]
pub struct SimArgs {
    #[command(flatten)]
    input: InputArgs,
    /// Packets to run (classic pcap). Defaults to `packets.pcap` in the example directory.
    #[arg(long, value_name = "FILE")]
    pcap: Option<PathBuf>,
    /// Which engine runs the packets.
    #[arg(long, value_enum, default_value_t = Engine::Ref)]
    engine: Engine,
    /// One JSON object per packet: packet, matched, ports, decision.
    #[arg(long)]
    json: bool,
}

pub fn sim(args: &SimArgs) -> Result<ExitCode> {
    let (program, inputs) = match load_program(&args.input)? {
        Ok(x) => x,
        Err(code) => return Ok(code),
    };
    let pcap = match (&args.pcap, &inputs.dir) {
        (Some(p), _) => p.clone(),
        (None, Some(d)) if d.join("packets.pcap").exists() => d.join("packets.pcap"),
        _ => bail!("no packets: pass --pcap FILE"),
    };
    let bytes = std::fs::read(&pcap).with_context(|| format!("cannot read {}", pcap.display()))?;
    let packets = read_pcap(&bytes).with_context(|| format!("cannot read {}", pcap.display()))?;
    let mut out = std::io::stdout().lock();
    match args.engine {
        Engine::Ref => {
            let mut interp = Interpreter::new(&program.spec, &program.subscriptions);
            for (i, p) in packets.iter().enumerate() {
                let o = interp.run(&p.data, p.ts_ns);
                if args.json {
                    let v = serde_json::json!({
                        "packet": i,
                        "matched": o.matched,
                        "ports": o.ports,
                        "decision": o.decision.as_str(),
                    });
                    writeln!(out, "{v}")?;
                } else {
                    let ports: Vec<String> = o.ports.iter().map(u32::to_string).collect();
                    let matched: Vec<String> = o.matched.iter().map(u64::to_string).collect();
                    let what = match o.decision {
                        subc_lang::interp::Decision::Forward => format!("forward to {}", ports.join(",")),
                        d => d.as_str().to_string(),
                    };
                    let why = if !o.parsed { " (did not parse)".to_string() } else if matched.is_empty() { String::new() } else { format!("  matched {}", matched.join(",")) };
                    writeln!(out, "packet {i:>4}: {what}{why}")?;
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Subcommand)]
pub enum GenCommand {
    /// Write the pcap of an example (itch, ewma-channels, topic-broker, ip-forwarding).
    Pcap {
        example: String,
        #[arg(short, long, value_name = "FILE")]
        output: PathBuf,
    },
    /// Camus-style ITCH subscriptions: `stock == S && shares > P : fwd(H)`.
    Itch {
        #[arg(long, default_value_t = 1000)]
        count: usize,
        #[arg(long, default_value_t = 100)]
        symbols: usize,
        #[arg(long, default_value_t = 200)]
        hosts: u32,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Siena/SSBG-style filters over signed attributes a0..aN.
    Siena {
        #[arg(long, default_value_t = 100)]
        count: usize,
        #[arg(long, default_value_t = 20)]
        attributes: usize,
        /// Draw attributes uniformly instead of Zipf.
        #[arg(long)]
        uniform: bool,
        /// Camus's variant: values in [0, 100), no `!=`.
        #[arg(long)]
        camus: bool,
        /// Exactly this many constraints per filter.
        #[arg(long)]
        constraints: Option<usize>,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Write the matching spec to this file.
        #[arg(long, value_name = "FILE")]
        spec_out: Option<PathBuf>,
    },
}

pub fn gen(g: &GenCommand) -> Result<ExitCode> {
    match g {
        GenCommand::Pcap { example, output } => {
            let Some(pkts) = example_packets(example) else {
                bail!("unknown example `{example}`; known: {}", EXAMPLES.join(", "));
            };
            write_atomic(output, &write_pcap(&pkts))?;
            eprintln!("wrote {} packets to {}", pkts.len(), output.display());
        }
        GenCommand::Itch { count, symbols, hosts, seed } => {
            let text = itch(&ItchParams { subscriptions: *count, symbols: *symbols, hosts: *hosts, seed: *seed, ..Default::default() });
            std::io::stdout().lock().write_all(text.as_bytes())?;
        }
        GenCommand::Siena { count, attributes, uniform, camus, constraints, seed, spec_out } => {
            let p = SienaParams {
                filters: *count,
                attributes: *attributes,
                zipf: !uniform,
                camus_variant: *camus,
                constraints: *constraints,
                seed: *seed,
                ..Default::default()
            };
            if let Some(path) = spec_out {
                write_atomic(path, siena_spec(p.attributes, p.ports).as_bytes())?;
            }
            std::io::stdout().lock().write_all(siena(&p).as_bytes())?;
        }
    }
    Ok(ExitCode::SUCCESS)
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
