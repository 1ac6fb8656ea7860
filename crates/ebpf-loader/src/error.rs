//! The loader's one error type: the pure back end's errors, and what the
//! kernel, libbpf and the system around them refuse.

use crate::attach::AttachMode;
use crate::frames::FrameLimits;
use std::path::PathBuf;
use subc_backend_ebpf::{EbpfError, Hook};

#[derive(Debug, thiserror::Error)]
pub enum LoaderError {
    /// The pure back end refused (a capacity, a diff, an unsupported set,
    /// clang, the target config).
    #[error(transparent)]
    Backend(#[from] EbpfError),
    /// libbpf failed at `context`.
    #[error("{context}: {source}")]
    Bpf {
        context: String,
        #[source]
        source: libbpf_rs::Error,
    },
    /// libbpf failed on a map of the model.
    #[error("map {map}: {source}")]
    Map {
        map: String,
        #[source]
        source: libbpf_rs::Error,
    },
    /// A map the tables need is not pinned where the deployment says.
    #[error("pinned map {}: {source}", .path.display())]
    PinnedMap {
        path: PathBuf,
        #[source]
        source: libbpf_rs::Error,
    },
    /// A system call or a file failed at `context`.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// The model names a map this build left out (`only_if` unset).
    #[error("map {map} is not in this build")]
    MapNotBuilt { map: String },
    /// The object has no map the model names.
    #[error("the object has no map {map}")]
    MissingMap { map: String },
    /// The object has no program of this name.
    #[error("no program {program}")]
    MissingProgram { program: String },
    /// The generation map is not where the deployment pinned it.
    #[error("the generation map is not pinned")]
    GenerationNotPinned,
    /// The program keeps no per-port counters: it was generated before
    /// they existed (its `maps.json` names none), or their map is not
    /// pinned. A reinstall adds them.
    #[error("the program keeps no per-port counters (generated before they existed, or their map is not pinned); reinstall it to count")]
    NoPortCounters,
    /// An update asked of maps whose contents are not known.
    #[error("{0}")]
    NoImage(NoImage),
    /// An interface name with a NUL byte.
    #[error("target config: bad interface name `{name}`")]
    BadInterfaceName { name: String },
    /// No interface of this name in the calling thread's namespace.
    #[error("target config: no interface `{name}`")]
    NoInterface { name: String },
    /// A pin path with a NUL byte.
    #[error("target config: bad pin path {}", .path.display())]
    BadPinPath { path: PathBuf },
    /// An attach mode of the other hook.
    #[error("target config: {} program attaches with {} mode, not {mode:?}", hook_article(.hook), hook_article(.hook))]
    WrongMode { hook: Hook, mode: AttachMode },
    /// A deployment record that does not parse.
    #[error("target config: {0}")]
    Record(#[source] serde_json::Error),
    /// A deployment name that is not one plain path component: it would
    /// name a path outside the deployments' directory.
    #[error("deployment name {name:?} is not a plain file name (no `/`, `.` or `..`)")]
    BadName { name: String },
    /// `BPF_PROG_TEST_RUN` takes no frame of this size for any program of
    /// the hook's type (see [`crate::frame_limits`]): the frame was not run.
    #[error("BPF_PROG_TEST_RUN refuses this {len}-byte frame: {limits}")]
    FrameRefused { len: usize, limits: FrameLimits },
    /// A command of the test network (`ip`) failed; its standard error.
    #[error("{command}: {stderr}")]
    Command { command: String, stderr: String },
    /// `ip -j` printed what is not JSON.
    #[error("ip -j: {0}")]
    IpJson(#[source] serde_json::Error),
    /// An interface without a MAC address.
    #[error("no address for {dev} in {ns}")]
    NoAddress { dev: String, ns: String },
}

/// Why an update cannot be planned: the contents of the maps are unknown.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NoImage {
    #[error("this data plane was loaded without a table image")]
    Loaded,
    #[error("the pinned tables were not checked against an image")]
    Unchecked,
}

/// "an XDP" or "a TC", for messages.
fn hook_article(hook: &Hook) -> &'static str {
    match hook {
        Hook::Xdp => "an XDP",
        Hook::Tc => "a TC",
    }
}

impl LoaderError {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> LoaderError {
        LoaderError::Io { context: context.into(), source }
    }
    pub fn bpf(context: impl Into<String>, source: libbpf_rs::Error) -> LoaderError {
        LoaderError::Bpf { context: context.into(), source }
    }
}
