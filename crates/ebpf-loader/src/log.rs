//! libbpf's messages (object parsing, relocation, the verifier's log of a
//! program it refuses) go to stderr by default, past a service's structured
//! logs. [`log_libbpf_through_tracing`] sends them to `tracing` instead, at
//! libbpf's own level, so that they reach the same JSON lines or journald
//! records as everything else, with `target: "libbpf"`.

use libbpf_rs::PrintLevel;

/// Routes libbpf's output to `tracing` for the rest of the process.
pub fn log_libbpf_through_tracing() {
    libbpf_rs::set_print(Some((PrintLevel::Debug, to_tracing)));
}

fn to_tracing(level: PrintLevel, message: String) {
    let message = message.trim_end();
    match level {
        PrintLevel::Warn => tracing::warn!(target: "libbpf", "{message}"),
        PrintLevel::Info => tracing::info!(target: "libbpf", "{message}"),
        PrintLevel::Debug => tracing::debug!(target: "libbpf", "{message}"),
    }
}
