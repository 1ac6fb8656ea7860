//! `subc`: the command-line front end. Each subcommand lives in its own
//! module; this file only declares the command line.

mod agent;
mod client;
mod common;
mod compile;
mod ebpf;
mod explain;
mod generators;
mod input;
mod p4;
mod serve;
mod sim;
mod topo;
mod ui;

use anyhow::Result;
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use subc_lang::NfLimits;

#[derive(Parser)]
#[command(
    name = "subc",
    version,
    about = "Compile packet subscriptions to P4 tables and eBPF programs",
    long_about = "subc compiles stateful condition-action packet subscriptions \
                  (`stock == GOOGL && shares > 100 : fwd(3)`) written against a message-format spec \
                  into match-action tables for P4 switches or into eBPF programs for XDP and TC.\n\n\
                  Inputs are a format spec (*.spec) and subscription files (*.subs), given either as \
                  `--spec SPEC RULES...` or as an example directory holding one spec and its rules.",
    after_help = "Examples:\n  subc check examples/itch\n  subc check --spec examples/itch/itch.spec examples/itch/rules.subs\n  subc sim examples/itch --pcap examples/itch/packets.pcap --json\n  subc compile examples/itch --emit stats\n  subc compile examples/itch --emit tables -o out/itch\n  subc explain E0302\n  subc completions bash > ~/.local/share/bash-completion/completions/subc"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// When to colour diagnostics: `auto` colours a terminal unless `NO_COLOR`
    /// is set. Output that is an API (`--json`, the server's replies) is always
    /// plain. Example: `subc --color always check examples/itch 2>&1 | less -R`.
    #[arg(long, global = true, value_enum, default_value_t = ui::ColorWhen::Auto, value_name = "WHEN")]
    color: ui::ColorWhen,
}

/// The spec and rule files shared by most commands.
#[derive(clap::Args, Clone)]
pub struct InputArgs {
    /// The message-format spec. Without it, the first argument is an example
    /// directory holding exactly one *.spec and its *.subs files.
    #[arg(long, value_name = "SPEC")]
    spec: Option<PathBuf>,
    /// Subscription files (one `condition : action` per line), or an example directory.
    /// `-` reads rules from stdin, named `<stdin>` in diagnostics:
    /// `echo 'shares > 100 : fwd(1)' | subc check --spec examples/itch/itch.spec -`.
    #[arg(value_name = "RULES", required = true)]
    rules: Vec<PathBuf>,
    /// Largest number of conjunctions one subscription's normal form may have.
    #[arg(long, default_value_t = 4096, value_name = "N")]
    max_cubes: usize,
    /// Fail (exit 1, as for errors) if there are warnings, such as W0301 (a
    /// condition no packet can satisfy). Example, in CI:
    /// `subc check --deny-warnings examples/itch`.
    #[arg(long)]
    deny_warnings: bool,
}

impl InputArgs {
    fn limits(&self) -> NfLimits {
        NfLimits { max_cubes: self.max_cubes }
    }
}

#[derive(Subcommand)]
enum Command {
    /// Check a spec and subscriptions; print every diagnostic. Exit 1 on errors
    /// (and on warnings with `--deny-warnings`).
    Check {
        #[command(flatten)]
        input: InputArgs,
        /// Print diagnostics as JSON, one object per line.
        #[arg(long)]
        json: bool,
    },
    /// Compile subscriptions to tables (IR), a P4 program and entries, or an eBPF program.
    Compile(compile::CompileArgs),
    /// Run packets from a pcap through the subscriptions and print each decision.
    Sim(sim::SimArgs),
    /// Check and show a topology file; change a running server's (docs/network.md).
    #[command(subcommand)]
    Topo(topo::TopoCommand),
    /// Generate workloads: example pcaps and synthetic subscription sets.
    #[command(subcommand)]
    Gen(sim::GenCommand),
    /// Load a compiled eBPF program, fill its maps, pin it and attach it to an interface (root).
    Attach(ebpf::AttachArgs),
    /// Detach an attached eBPF deployment and remove its pins.
    Detach {
        /// The deployment's name, as given to `subc attach --name` (default `subc`).
        #[arg(value_parser = ebpf::deployment_name)]
        name: String,
        /// Print what was removed as JSON on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Show an attached eBPF deployment: attachments, programs, maps.
    Status {
        /// The deployment's name, as given to `subc attach --name` (default `subc`).
        #[arg(value_parser = ebpf::deployment_name)]
        name: String,
        /// Print the status as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Run the compiler service: gRPC API, durable store, deployment to targets.
    Serve(serve::ServeArgs),
    /// Run the host agent: this host's eBPF data plane, for a controller elsewhere (docs/agent.md).
    Agent(agent::AgentArgs),
    /// Back up, restore or migrate a service's store (SQLite or etcd).
    #[command(subcommand)]
    Store(serve::StoreCommand),
    /// Add, remove and list subscriptions on a running service.
    #[command(subcommand)]
    Sub(client::SubCommand),
    /// Register, deploy and inspect a running service's targets (admin).
    #[command(subcommand)]
    Target(client::TargetCommand),
    /// Stream a running service's events as JSON lines.
    Watch(client::WatchArgs),
    /// Explain a diagnostic code: what triggers it, an example and its fix.
    #[command(after_help = "Examples:\n  subc explain E0302\n  subc explain            # every code with its one-line summary")]
    Explain {
        /// The code, as printed in `error[E0302]` (`e0302` and `0302` work too).
        /// Without it, every code is listed.
        #[arg(value_name = "CODE")]
        code: Option<String>,
    },
    /// Print a shell completion script to stdout.
    #[command(after_help = "Examples:\n  subc completions bash > ~/.local/share/bash-completion/completions/subc\n  \
                            subc completions zsh > ~/.zfunc/_subc\n  subc completions fish > ~/.config/fish/completions/subc.fish")]
    Completions {
        /// The shell to complete for.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write man pages: `subc.1` and one page per subcommand (`subc-check.1`, `subc-sub-add.1`, ...).
    #[command(after_help = "Examples:\n  subc man --out /usr/local/share/man/man1\n  subc man | man -l -      # just subc.1, to stdout")]
    Man {
        /// The directory to write every page into (created if needed). Without
        /// it, only `subc.1` is printed to stdout.
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    ui::init(cli.color);
    let result: Result<ExitCode> = match cli.command {
        Command::Check { input, json } => sim::check(&input, json),
        Command::Compile(args) => compile::compile(&args),
        Command::Sim(args) => sim::sim(&args),
        Command::Gen(g) => sim::gen(&g),
        Command::Topo(c) => topo::topo(&c),
        Command::Attach(args) => ebpf::attach(&args),
        Command::Detach { name, json } => ebpf::detach(&name, json),
        Command::Status { name, json } => ebpf::status(&name, json),
        Command::Serve(args) => serve::serve(&args),
        Command::Store(c) => serve::store(&c),
        Command::Agent(args) => agent::agent(&args),
        Command::Sub(c) => client::sub(&c),
        Command::Target(c) => client::target(&c),
        Command::Watch(args) => client::watch(&args),
        Command::Explain { code } => explain::explain(code.as_deref()),
        Command::Completions { shell } => {
            generators::completions(shell, &mut std::io::stdout().lock());
            Ok(ExitCode::SUCCESS)
        }
        Command::Man { out } => generators::man(out.as_deref()),
    };
    match result {
        Ok(code) => code,
        // A reader that stopped reading (`subc sim ... --json | head -1`) is not
        // an error of ours: stop quietly, as the other tools of a pipeline do.
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{}: {e:#}", ui::error_word("error"));
            ExitCode::from(2)
        }
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe))
}
