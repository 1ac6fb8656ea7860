//! How `subc` talks to a person at a terminal, and stays plain for scripts:
//! whether diagnostics are coloured (`--color`, `NO_COLOR`, whether stderr
//! is a terminal) and the progress bars of long work.
//!
//! The choice is made once, in `main`, from the command line and the
//! environment, and read wherever something is printed to stderr: it is a
//! property of the process, as clap's own colour choice is, not of any one
//! subcommand. Output that is an API never goes through here: `--json`
//! records and the gRPC `rendered` field are always plain text.

use clap::ValueEnum;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::sync::OnceLock;
use std::time::Duration;
use subc_lang::RenderStyle;

/// When to colour what goes to stderr.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum ColorWhen {
    /// On a terminal, unless `NO_COLOR` is set (to anything but the empty string).
    #[default]
    Auto,
    /// Always, also into a pipe or a file (`subc check ... 2>&1 | less -R`).
    Always,
    /// Never.
    Never,
}

/// What `main` decided; read by [`diagnostics_style`] and the progress bars.
static COLOR: OnceLock<bool> = OnceLock::new();

/// Decides, once, whether stderr gets colours. A later call changes nothing.
pub fn init(when: ColorWhen) {
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    let _ = COLOR.set(colour_on(when, no_color, std::io::stderr().is_terminal()));
}

/// The decision itself: `--color always` and `never` win; `auto` colours a
/// terminal unless `NO_COLOR` asks otherwise (<https://no-color.org>).
fn colour_on(when: ColorWhen, no_color: bool, stderr_is_terminal: bool) -> bool {
    match when {
        ColorWhen::Always => true,
        ColorWhen::Never => false,
        ColorWhen::Auto => stderr_is_terminal && !no_color,
    }
}

fn colour() -> bool {
    *COLOR.get().unwrap_or(&false)
}

/// How diagnostics printed to stderr are rendered.
pub fn diagnostics_style() -> RenderStyle {
    if colour() {
        RenderStyle::Ansi
    } else {
        RenderStyle::Plain
    }
}

/// `text` in bold red when stderr is coloured: the `error` of a line the CLI
/// writes itself, as the diagnostics' summary line has it.
pub fn error_word(text: &str) -> String {
    if colour() {
        format!("\x1b[1;31m{text}\x1b[0m")
    } else {
        text.to_string()
    }
}

/// Where progress is drawn: on stderr if a person is watching it, else
/// nowhere, whatever `--color` says (a bar redrawn into a log file is noise).
fn progress_target() -> ProgressDrawTarget {
    if std::io::stderr().is_terminal() {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    }
}

/// A bar counting `len` steps of `what`, on stderr if it is a terminal
/// (hidden otherwise: nothing is printed). Finish it with
/// `finish_and_clear` so that it leaves no line behind.
pub fn progress(len: u64, what: &str) -> ProgressBar {
    let template = if colour() { "{msg} [{bar:30.cyan/blue}] {pos}/{len} ({elapsed})" } else { "{msg} [{bar:30}] {pos}/{len} ({elapsed})" };
    let style = ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()).progress_chars("=> ");
    let bar = ProgressBar::with_draw_target(Some(len), progress_target()).with_style(style).with_message(what.to_string());
    bar.tick();
    bar
}

/// A spinner for a wait of unknown length, ticking on its own (a wait on
/// the server is one call, with nothing to count), under the same rules as
/// [`progress`].
pub fn spinner(what: &str) -> ProgressBar {
    let template = if colour() { "{spinner:.cyan} {msg} ({elapsed})" } else { "{spinner} {msg} ({elapsed})" };
    let style = ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_spinner());
    let bar = ProgressBar::with_draw_target(None, progress_target()).with_style(style).with_message(what.to_string());
    bar.enable_steady_tick(Duration::from_millis(100));
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_follows_the_flag_then_no_color_then_the_terminal() {
        for (when, no_color, tty, on) in [
            (ColorWhen::Always, true, false, true),
            (ColorWhen::Never, false, true, false),
            (ColorWhen::Auto, false, true, true),
            (ColorWhen::Auto, true, true, false),
            (ColorWhen::Auto, false, false, false),
        ] {
            assert_eq!(colour_on(when, no_color, tty), on, "{when:?}, NO_COLOR {no_color}, terminal {tty}");
        }
    }
}
