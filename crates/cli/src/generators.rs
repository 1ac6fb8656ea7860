//! `subc completions SHELL` and `subc man`: shell completions and man pages
//! made by clap's own generators from the command line `main.rs` declares,
//! so they cannot disagree with `--help`.

use crate::Cli;
use anyhow::{Context, Result};
use clap::CommandFactory;
use clap_complete::Shell;
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

/// Writes the completion script for `shell` to `out`.
pub fn completions(shell: Shell, out: &mut dyn Write) {
    clap_complete::generate(shell, &mut Cli::command(), "subc", out);
}

/// The man pages: into `dir` (created if needed) `subc.1` and one page per
/// subcommand (`subc-check.1`, `subc-sub-add.1`, ...); without a directory,
/// `subc.1` to stdout (`subc man | man -l -`).
pub fn man(dir: Option<&Path>) -> Result<ExitCode> {
    match dir {
        Some(dir) => {
            std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
            clap_mangen::generate_to(Cli::command(), dir).with_context(|| format!("cannot write the man pages into {}", dir.display()))?;
            eprintln!("wrote the man pages to {}", dir.display());
        }
        // As `generate_to` does: no page lists clap's `help` subcommand.
        None => clap_mangen::Man::new(Cli::command().disable_help_subcommand(true)).render(&mut std::io::stdout().lock())?,
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::ValueEnum;

    /// Every subcommand's path, as the man pages name them: `check`, `sub-add`.
    fn subcommand_paths() -> Vec<(String, String)> {
        fn walk(cmd: &clap::Command, prefix: &str, out: &mut Vec<(String, String)>) {
            for sub in cmd.get_subcommands() {
                let path = if prefix.is_empty() { sub.get_name().to_string() } else { format!("{prefix}-{}", sub.get_name()) };
                out.push((sub.get_name().to_string(), path.clone()));
                walk(sub, &path, out);
            }
        }
        let mut out = vec![];
        walk(&Cli::command(), "", &mut out);
        out
    }

    /// The generators run (in CI, with the tests) and cover every subcommand.
    #[test]
    fn every_shell_completes_every_subcommand() {
        let paths = subcommand_paths();
        assert!(paths.iter().any(|(name, _)| name == "explain"), "{paths:?}");
        for &shell in Shell::value_variants() {
            let mut script = vec![];
            completions(shell, &mut script);
            let script = String::from_utf8(script).expect("a script is text");
            assert!(!script.is_empty(), "{shell}: empty");
            for (name, _) in &paths {
                assert!(script.contains(name.as_str()), "{shell}: no `{name}` in the completions");
            }
        }
    }

    #[test]
    fn a_man_page_for_every_subcommand() {
        let dir = tempfile::tempdir().unwrap();
        man(Some(dir.path())).unwrap();
        let top = std::fs::read_to_string(dir.path().join("subc.1")).expect("subc.1");
        for (name, path) in subcommand_paths() {
            let page = std::fs::read_to_string(dir.path().join(format!("subc-{path}.1"))).unwrap_or_else(|e| panic!("subc-{path}.1: {e}"));
            assert!(page.contains(&name), "subc-{path}.1 does not name `{name}`");
            if !path.contains('-') {
                assert!(top.contains(&name), "subc.1 does not list `{name}`");
            }
        }
    }
}
