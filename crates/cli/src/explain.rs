//! `subc explain [CODE]`: the long explanation of a diagnostic code, as
//! `rustc --explain` gives one, or every code with its one-line summary.
//!
//! The texts live beside the codes in `subc-lang` (`Code::explanation`),
//! where a test checks every example against the checker; this module only
//! finds the code and prints.

use anyhow::{bail, Result};
use std::io::Write;
use std::process::ExitCode;
use subc_lang::Code;

pub fn explain(code: Option<&str>) -> Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    let Some(given) = code else {
        for c in Code::ALL {
            writeln!(out, "{}  {}", c.as_str(), c.summary())?;
        }
        return Ok(ExitCode::SUCCESS);
    };
    match given.parse::<Code>() {
        Ok(c) => out.write_all(c.explanation().as_bytes())?,
        Err(e) => bail!("{e}\n`subc explain` lists every code"),
    }
    Ok(ExitCode::SUCCESS)
}
