//! The kernel half of the eBPF back end, as `aya` is to `aya-obj`: every
//! system call on the programs and maps that `subc-backend-ebpf` generates
//! and encodes (through libbpf-rs 0.27, and `libbpf-sys` where libbpf-rs
//! has no wrapper).
//!
//! - [`Dataplane`] loads an object, fills its maps, applies updates with
//!   the back end's double-buffered protocol, runs packets through
//!   `BPF_PROG_TEST_RUN`, reads state back and reports costs; [`Runner`]
//!   runs packets from another thread.
//! - [`attach()`] hooks a data plane to an interface (XDP native or
//!   generic, TC through tcx or clsact).
//! - [`Deployment`] is what `subc attach` and the service leave: pins under
//!   bpffs and a record under `/run/subc`, made by [`Deployment::install`]
//!   (configure, pin, attach or swap under live links, save);
//!   [`status()`] reads it back.
//! - [`PinnedTables`] reopens a deployment's maps in another process
//!   (checked against the image that filled them, then updated);
//!   [`replace_programs`] swaps a new build under live attachments.
//! - [`PortCounter`]: packets and bytes per logical port, summed over
//!   CPUs, from [`Dataplane::port_counters`] or
//!   [`PinnedTables::port_counters`].
//! - [`frame_limits`]: which frames `BPF_PROG_TEST_RUN` takes, measured.
//! - [`can_load_bpf`]: whether this process has the privileges.
//! - [`log_libbpf_through_tracing`]: libbpf's messages as `tracing` events.
//! - `testnet` (feature `testing`): network namespaces for the end-to-end
//!   tests and the fan-out benchmark.
//!
//! Every `unsafe` block of the crate but the test network's is in `sys.rs`,
//! one per system call, each with its `// SAFETY:` argument; descriptors are
//! `OwnedFd` and `BorrowedFd` everywhere else.

#![warn(unreachable_pub)]

mod attach;
mod counters;
mod dataplane;
mod deployment;
mod driver;
mod error;
mod frames;
mod log;
mod pinned;
mod privileges;
mod probe;
mod sys;
#[cfg(feature = "testing")]
pub mod testnet;

pub use attach::{attach, attach_program, ifindex, link_tcx_ingress, link_xdp, AttachKind, AttachMode, Attachment, XdpMode};
pub use counters::PortCounter;
pub use dataplane::{grace_period, memlock, program_costs, Dataplane, LoadStats, ProgramCosts, Record, Runner, TestRun, UpdateReport};
pub use deployment::{default_pin_dir, state_dir, status, Deployment, MapStatus, Status};
pub use driver::{saved_image, saved_pipelines, EbpfSettings, EbpfTarget, SavedImageError};
pub use error::{LoaderError, NoImage};
pub use frames::{frame_limits, refuses, FrameLimits, PROBE_CAP};
pub use log::log_libbpf_through_tracing;
pub use pinned::{replace_programs, PinnedProgram, PinnedTables};
pub use privileges::can_load_bpf;
pub use probe::{probe, KernelFeatures};
pub use sys::{in_netns, prog_test_run, prog_test_run_with, ProgRun, SkbContext};
