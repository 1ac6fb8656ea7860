//! `subc check`, `subc sim` and `subc gen`.

use crate::common::{denied_warnings, load_program, write_atomic};
use crate::input::load;
use crate::{ui, InputArgs};
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use subc_lang::{read_pcap, write_pcap, PcapPacket};
use subc_lang::{Decision, Interpreter, Outcome, QueryValues};
use subc_workload::{example_packets, EXAMPLES};
use subc_workload::{itch, siena, siena_selective, siena_spec, ItchParams, SelectiveParams, SienaParams};

/// `subc check`: diagnostics rendered on stderr, or with `--json` one
/// `subc.v1.Diagnostic` per line on stdout, as the server's `Check` returns them.
pub fn check(input: &InputArgs, json: bool) -> Result<ExitCode> {
    let inputs = load(input.spec.as_deref(), &input.rules)?;
    let (_, diags) = subc_lang::check_program(&inputs.sources, inputs.spec, &inputs.rules, input.limits());
    if json {
        let mut out = std::io::stdout().lock();
        for d in &diags.0 {
            let message = subc_client::proto::Diagnostic::from(d.to_record(&inputs.sources));
            writeln!(out, "{}", subc_client::to_json(&message))?;
        }
    } else if !diags.is_empty() {
        eprint!("{}", diags.render_styled(&inputs.sources, ui::diagnostics_style()));
    }
    let failed = diags.has_errors() || denied_warnings(input, &diags);
    Ok(if failed { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq, Debug)]
pub enum Engine {
    /// The reference interpreter: the definition of what subscriptions mean.
    Ref,
    /// The compiled pipeline's tables, looked up as a switch would.
    Tables,
    /// The generated eBPF program in the kernel, through BPF_PROG_TEST_RUN (root).
    Ebpf,
    /// A P4-semantics simulator of the generated program, loaded from its P4Runtime entries.
    P4,
}

#[derive(Args)]
pub struct SimArgs {
    #[command(flatten)]
    input: InputArgs,
    /// Packets to run: a pcap or pcapng capture of Ethernet or Linux cooked
    /// frames (`tcpdump -i any`), as docs/semantics.md ("Captures") reads
    /// them. Defaults to `packets.pcap` in the example directory.
    #[arg(long, value_name = "FILE")]
    pcap: Option<PathBuf>,
    /// Which engine runs the packets.
    #[arg(long, value_enum, default_value_t = Engine::Ref)]
    engine: Engine,
    /// One JSON object per packet: packet, matched, ports, decision. Only the
    /// reference engine knows which subscriptions matched; the others print
    /// `"matched": null`. Diff two engines' outputs on `ports` and `decision`.
    /// A packet the kernel does not run (`--engine ebpf`: a frame shorter or
    /// longer than BPF_PROG_TEST_RUN takes) prints `{"packet": N, "error": "..."}`
    /// instead, the run goes on, and the exit status is 1.
    #[arg(long)]
    json: bool,
    /// Run the packets through a network of devices (docs/network.md): the
    /// rules' `fwd(...)` name the topology's endpoints, and what each
    /// endpoint receives is printed. Reference engine only; needs `--publisher`;
    /// `--down` takes links and devices down.
    #[arg(long, value_name = "FILE")]
    topology: Option<PathBuf>,
    /// With `--topology`: the endpoint the packets are sent from.
    #[arg(long, value_name = "NAME", requires = "topology")]
    publisher: Option<String>,
    /// With `--topology`: mark a device (`spine1`) or the link at a device
    /// port (`leaf2:1`) down; repeat for several. The fabric routes around
    /// them as the service does (`subc topo down`), and endpoints the
    /// publisher can no longer reach receive nothing (noted on stderr).
    /// Example: `subc sim --spec itch.spec net.subs --pcap itch.pcap
    /// --topology fabric.toml --publisher feed --down leaf2:1 --down spine2`.
    #[arg(long, value_name = "DEVICE|DEVICE:PORT", requires = "topology")]
    down: Vec<String>,
    #[command(flatten)]
    compiler: crate::common::CompilerArgs,
    #[command(flatten)]
    ebpf: crate::ebpf::EbpfArgs,
    #[command(flatten)]
    p4: crate::p4::P4Args,
}

pub fn sim(args: &SimArgs) -> Result<ExitCode> {
    if let Some(topology) = &args.topology {
        if args.engine != Engine::Ref {
            bail!("--topology runs the reference engine only");
        }
        let Some(pcap) = &args.pcap else { bail!("--topology needs --pcap FILE") };
        let bytes = std::fs::read(pcap).with_context(|| format!("cannot read {}", pcap.display()))?;
        let packets = read_pcap(&bytes).with_context(|| format!("cannot read {}", pcap.display()))?;
        note_capture(&packets);
        return crate::topo::sim(&args.input, topology, args.publisher.as_deref(), &args.down, &packets, args.json);
    }
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
    note_capture(&packets);
    // `--arch tna`: stream state as a Tofino computes it (docs/semantics.md, "Target profiles").
    let profile = args.p4.arch().profile();
    let results: Vec<Outcome> = match args.engine {
        Engine::Ebpf => return crate::ebpf::sim(&program, &packets, &args.compiler, &args.ebpf, args.json),
        Engine::P4 => crate::p4::sim(&program, &packets, &args.compiler, &args.p4)?,
        Engine::Ref => {
            let mut interp = Interpreter::with_profile(&program.spec, &program.subscriptions, profile);
            packets.iter().map(|p| interp.run(&p.data, p.ts_ns)).collect()
        }
        Engine::Tables => {
            let (set, _) = crate::common::compile_program(&program, &args.compiler, crate::common::Runs::Everything)?;
            let tables = |values: &QueryValues| set.eval_tables(values).to_actions();
            let mut engine = subc_lang::Engine::with_decide(&program.spec, profile, tables);
            packets.iter().map(|p| engine.run(&p.data, p.ts_ns)).collect()
        }
    };
    print_results(&results, args.json)?;
    Ok(ExitCode::SUCCESS)
}

/// Says on stderr where packets differ from the frames on the wire: a
/// cooked frame's Ethernet addresses are rebuilt, and a frame the snaplen
/// cut is decided on the bytes the capture kept.
fn note_capture(packets: &[PcapPacket]) {
    let cooked = packets.iter().filter(|p| p.link.is_cooked()).count();
    if cooked > 0 {
        eprintln!(
            "note: {cooked} of {} packets are Linux cooked frames (`tcpdump -i any`): their Ethernet addresses are not the wire's (docs/semantics.md, \"Captures\")",
            packets.len()
        );
    }
    let cut = packets.iter().filter(|p| p.is_truncated()).count();
    if cut > 0 {
        eprintln!("note: the capture's snaplen cut {cut} of {} packets: they are decided on the bytes it kept", packets.len());
    }
}

/// Prints per-packet results: one JSON object per line, or text.
pub fn print_results(results: &[Outcome], json: bool) -> Result<()> {
    let mut out = std::io::stdout().lock();
    for (i, o) in results.iter().enumerate() {
        let r = if json {
            let v = serde_json::json!({
                "packet": i,
                "matched": o.matched,
                "ports": o.ports,
                "decision": o.decision.as_str(),
            });
            writeln!(out, "{v}")
        } else {
            let ports: Vec<String> = o.ports.iter().map(u32::to_string).collect();
            let what = match o.decision {
                Decision::Forward => format!("forward to {}", ports.join(",")),
                d => d.as_str().to_string(),
            };
            let why = match (&o.matched, o.parsed) {
                (_, false) => " (did not parse)".to_string(),
                (Some(m), true) if !m.is_empty() => {
                    format!("  matched {}", m.iter().map(u64::to_string).collect::<Vec<_>>().join(","))
                }
                _ => String::new(),
            };
            writeln!(out, "packet {i:>4}: {what}{why}")
        };
        match r {
            Ok(()) => {}
            // A closed pipe (`subc sim ... | head`) is not an error.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
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
        /// Selective filters over values in [-HALF_WIDTH, HALF_WIDTH): `==` 50 %, narrow
        /// ranges `a > v && a < v + w` (w up to 1 % of the domain) 30 %, thin tails `<` and
        /// `>` (up to 2 %) 20 %, no `!=`; uniform events from that domain match about 0.04 %
        /// of the filters instead of about 10 %. Overrides --camus. At least 100.
        #[arg(long, value_name = "HALF_WIDTH", value_parser = clap::value_parser!(i64).range(100..=1 << 30))]
        selective: Option<i64>,
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
        GenCommand::Siena { count, attributes, uniform, camus, constraints, selective, seed, spec_out } => {
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
            let text = match selective {
                Some(half_width) => siena_selective(&SelectiveParams { siena: p, half_width: *half_width }),
                None => siena(&p),
            };
            std::io::stdout().lock().write_all(text.as_bytes())?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
