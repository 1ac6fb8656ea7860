//! The data plane an agent owns: one eBPF program (a
//! `subc_ebpf_loader::EbpfTarget`), what it holds, and the agent's state
//! on disk. Every call is checked whole before anything reaches the
//! kernel: the fence, the payload's digest and decoding, the pipelines'
//! invariants against the spec, and (for a diff) that it is a diff of what
//! is held and applies to it. Calls block; the service runs them one at a
//! time on a blocking thread.

use crate::proto;
use crate::state::{Fence, Fenced, StateDir};
use crate::wire::{self, Layout, WireError};
use std::path::PathBuf;
use std::sync::Arc;
use subc_bdd::{Pipeline, SetDiff};
use subc_ebpf_loader::{EbpfSettings, EbpfTarget};
use subc_lang::spec::Spec;
use subc_target::{ErrorKind, Target};

/// Why a call was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum PlaneError {
    #[error(transparent)]
    Fenced(#[from] Fenced),
    #[error(transparent)]
    Wire(#[from] WireError),
    #[error("the spec does not check:\n{0}")]
    Spec(String),
    #[error("the pipelines break the IR's invariants: {0}")]
    Invalid(String),
    #[error("the diff is against generation {given}, but the agent holds {held}")]
    Stale { given: String, held: String },
    #[error("the diff does not apply to what the agent holds: {0}")]
    Misfit(String),
    #[error("the agent runs no bit-vector group; the controller lowers the set to diagrams for it")]
    BitGroup,
    #[error("the agent's state directory: {0}")]
    State(std::io::Error),
    #[error("{0}")]
    Target(subc_target::Error),
}

impl PlaneError {
    /// The gRPC status of the refusal, with the kind of target error in
    /// metadata (`subc-error-kind`) for the controller.
    pub fn status(&self) -> tonic::Status {
        use tonic::Code;
        let (code, kind) = match self {
            PlaneError::Fenced(Fenced::Missing) => (Code::InvalidArgument, "invalid"),
            PlaneError::Fenced(_) => (Code::FailedPrecondition, "fenced"),
            PlaneError::Wire(_) | PlaneError::Spec(_) | PlaneError::Invalid(_) | PlaneError::Misfit(_) => {
                (Code::InvalidArgument, "invalid")
            }
            PlaneError::Stale { .. } => (Code::Aborted, "stale"),
            PlaneError::BitGroup => (Code::FailedPrecondition, "unsupported"),
            PlaneError::State(_) => (Code::Internal, "transient"),
            PlaneError::Target(e) => match e.kind {
                ErrorKind::Transient => (Code::Unavailable, "transient"),
                ErrorKind::NeedsInstall => (Code::FailedPrecondition, "needs-install"),
                ErrorKind::Unsupported => (Code::FailedPrecondition, "unsupported"),
            },
        };
        let mut s = tonic::Status::new(code, self.to_string());
        s.metadata_mut().insert(crate::ERROR_KIND, tonic::metadata::MetadataValue::from_static(kind));
        s
    }
}

/// The program the agent runs, and how.
struct Opened {
    layout: proto::Layout,
    spec: Arc<Spec>,
    target: EbpfTarget,
}

/// What a Hello shows without waiting for a call in progress.
#[derive(Clone, Default)]
pub(crate) struct Snapshot {
    pub fence: Fence,
    pub held: Option<proto::Version>,
    pub layout: Option<proto::Layout>,
}

pub(crate) struct Plane {
    /// The deployment's name on the host (`/run/subc/<name>`).
    deployment: String,
    pin_dir: PathBuf,
    files: StateDir,
    fence: Fence,
    generation: u64,
    opened: Option<Opened>,
    /// What the program holds, when known.
    held: Option<Vec<Pipeline>>,
    /// The digest of `held`, once computed.
    digest: Option<Vec<u8>>,
}

impl Plane {
    /// The plane of deployment `deployment`, adopting what its pins hold.
    pub(crate) fn adopt(deployment: String, pin_dir: PathBuf, files: StateDir) -> Result<Plane, PlaneError> {
        let fence = files.fence().map_err(PlaneError::State)?;
        let generation = files.generation().map_err(PlaneError::State)?;
        let mut plane = Plane { deployment, pin_dir, files, fence, generation, opened: None, held: None, digest: None };
        if let Some(layout) = plane.files.layout().map_err(PlaneError::State)? {
            match plane.open(&layout) {
                Ok(mut opened) => {
                    match opened.target.read_back() {
                        Ok(Some(pipes)) => {
                            tracing::info!(generation, pipelines = pipes.len(), "adopted the pinned program");
                            plane.held = Some(pipes);
                        }
                        Ok(None) => tracing::warn!("the pins do not hold the saved image; the controller will install anew"),
                        Err(e) => tracing::warn!(error = %e, "cannot read the pins back"),
                    }
                    plane.opened = Some(opened);
                }
                Err(e) => tracing::warn!(error = %e, "the saved layout does not open; waiting for an install"),
            }
        }
        Ok(plane)
    }

    /// Forgets what is held (after a call panicked part way): the next
    /// install replaces it.
    pub(crate) fn forget(&mut self) {
        self.held = None;
        self.digest = None;
    }

    pub(crate) fn snapshot(&self) -> Snapshot {
        Snapshot { fence: self.fence.clone(), held: self.version(), layout: self.opened.as_ref().map(|o| o.layout.clone()) }
    }

    fn version(&self) -> Option<proto::Version> {
        self.held.as_ref().map(|_| proto::Version { generation: self.generation, digest: self.digest.clone().unwrap_or_default() })
    }

    /// What is held, as a ReadBack answers.
    pub(crate) fn read_back(&mut self) -> proto::ReadBackReply {
        let Some(held) = &self.held else { return proto::ReadBackReply::default() };
        let pipelines = wire::payload(held);
        self.digest = Some(pipelines.sha256.clone());
        proto::ReadBackReply { held: self.version(), pipelines: Some(pipelines), layout: self.opened.as_ref().map(|o| o.layout.clone()) }
    }

    pub(crate) fn install(&mut self, r: &proto::InstallRequest) -> Result<proto::Held, PlaneError> {
        let layout_proto = r.layout.as_ref().ok_or(WireError::Missing("layout"))?;
        let layout = Layout::from_proto(layout_proto)?;
        let spec = check_spec(&layout_proto.spec)?;
        let pipes: Vec<Pipeline> = wire::decode(r.pipelines.as_ref(), "pipelines")?;
        subc_bdd::verify_received(&spec, &pipes).map_err(|v| PlaneError::Invalid(v.to_string()))?;
        self.admit(r.fence.as_ref())?;
        let reopen = self.opened.as_ref().is_none_or(|o| o.layout != *layout_proto);
        if reopen {
            self.detach_if_moved(&layout)?;
            self.opened = Some(self.open_checked(layout_proto, layout, spec)?);
        }
        self.bump()?;
        let opened = self.opened.as_mut().expect("opened above");
        let result = opened.target.install(&pipes.iter().collect::<Vec<_>>(), None);
        self.files.set_layout(Some(layout_proto)).map_err(PlaneError::State)?;
        match result {
            Ok(()) => {
                self.digest = r.pipelines.as_ref().map(|p| p.sha256.clone());
                self.held = Some(pipes);
                tracing::info!(generation = self.generation, epoch = self.fence.epoch, controller = %self.fence.controller, "installed");
                Ok(proto::Held { held: self.version() })
            }
            Err(e) => Err(self.failed(e)),
        }
    }

    pub(crate) fn apply(&mut self, r: &proto::ApplyRequest) -> Result<proto::Held, PlaneError> {
        let diff: SetDiff = wire::decode(r.diff.as_ref(), "diff")?;
        if diff.bits.is_some() {
            return Err(PlaneError::BitGroup);
        }
        self.check_base(r.base.as_ref())?;
        let after = self.applied(&diff)?;
        self.admit(r.fence.as_ref())?;
        self.bump()?;
        let opened = self.opened.as_mut().expect("check_base: something is held");
        match opened.target.apply(&diff) {
            Ok(()) => {
                let held = self.held.as_mut().expect("check_base: something is held");
                for (i, p) in after {
                    held[i] = p;
                }
                self.digest = None;
                tracing::debug!(
                    generation = self.generation,
                    epoch = self.fence.epoch,
                    controller = %self.fence.controller,
                    pipelines = diff.diffs.len(),
                    "applied"
                );
                Ok(proto::Held { held: self.version() })
            }
            Err(e) => Err(self.failed(e)),
        }
    }

    pub(crate) fn uninstall(&mut self, r: &proto::UninstallRequest) -> Result<proto::Held, PlaneError> {
        self.admit(r.fence.as_ref())?;
        self.bump()?;
        if let Some(mut o) = self.opened.take() {
            o.target.uninstall().map_err(PlaneError::Target)?;
        }
        self.held = None;
        self.digest = None;
        self.files.set_layout(None).map_err(PlaneError::State)?;
        tracing::info!(generation = self.generation, epoch = self.fence.epoch, controller = %self.fence.controller, "uninstalled");
        Ok(proto::Held { held: None })
    }

    pub(crate) fn counters(&mut self) -> Result<Vec<proto::PortCounter>, PlaneError> {
        let Some(o) = &mut self.opened else { return Ok(vec![]) };
        let c = o.target.port_counters().map_err(PlaneError::Target)?;
        Ok(c.into_iter().map(|c| proto::PortCounter { port: c.port, packets: c.packets, bytes: c.bytes }).collect())
    }

    /// Claims the agent for the controller of `fence` (a Claim call).
    pub(crate) fn claim(&mut self, fence: Option<&proto::Fence>) -> Result<(), PlaneError> {
        self.admit(fence)
    }

    /// Checks the fence; a higher epoch is kept before anything is written.
    fn admit(&mut self, given: Option<&proto::Fence>) -> Result<(), PlaneError> {
        if self.fence.admits(given)? {
            let g = given.expect("admits: a fence");
            let next = Fence { epoch: g.epoch, controller: g.controller.clone() };
            self.files.set_fence(&next).map_err(PlaneError::State)?;
            tracing::info!(epoch = next.epoch, controller = %next.controller, previous = self.fence.epoch, "a new controller epoch");
            self.fence = next;
        }
        Ok(())
    }

    /// Refuses a diff that is not against what is held.
    fn check_base(&self, base: Option<&proto::Version>) -> Result<(), PlaneError> {
        let held = self.version();
        let show = |v: Option<&proto::Version>| v.map_or("nothing".to_string(), |v| v.generation.to_string());
        let same = match (base, &held) {
            (Some(b), Some(h)) => b.generation == h.generation && (b.digest.is_empty() || h.digest.is_empty() || b.digest == h.digest),
            _ => false,
        };
        if !same || self.opened.is_none() {
            return Err(PlaneError::Stale { given: show(base), held: show(held.as_ref()) });
        }
        Ok(())
    }

    /// The pipelines `diff` changes, as they are after it, checked.
    fn applied(&self, diff: &SetDiff) -> Result<Vec<(usize, Pipeline)>, PlaneError> {
        let held = self.held.as_ref().expect("check_base: something is held");
        let spec = &self.opened.as_ref().expect("check_base: opened").spec;
        let mut after: Vec<(usize, Pipeline)> = vec![];
        for d in &diff.diffs {
            let i = d.pipeline;
            let slot = match after.iter().position(|(j, _)| *j == i) {
                Some(k) => k,
                None => {
                    let p = held.get(i).ok_or_else(|| PlaneError::Misfit(format!("there is no pipeline {i}")))?;
                    after.push((i, p.clone()));
                    after.len() - 1
                }
            };
            after[slot].1.apply(d).map_err(|e| PlaneError::Misfit(format!("pipeline {i}: {e}")))?;
        }
        let changed: Vec<Pipeline> = after.iter().map(|(_, p)| p.clone()).collect();
        subc_bdd::verify_received(spec, &changed).map_err(|v| PlaneError::Invalid(v.to_string()))?;
        Ok(after)
    }

    /// Counts a write before it reaches the kernel.
    fn bump(&mut self) -> Result<(), PlaneError> {
        self.files.set_generation(self.generation + 1).map_err(PlaneError::State)?;
        self.generation += 1;
        Ok(())
    }

    /// After a failed write: what the pins hold is read back (it may be
    /// the old image, or nothing known).
    fn failed(&mut self, e: subc_target::Error) -> PlaneError {
        tracing::warn!(error = %e, "a write failed; reading the pins back");
        self.digest = None;
        self.held = self.opened.as_mut().and_then(|o| o.target.read_back().ok().flatten());
        PlaneError::Target(e)
    }

    /// The program's target for a saved layout.
    fn open(&self, p: &proto::Layout) -> Result<Opened, PlaneError> {
        let layout = Layout::from_proto(p)?;
        let spec = check_spec(&p.spec)?;
        self.open_checked(p, layout, spec)
    }

    fn open_checked(&self, p: &proto::Layout, layout: Layout, spec: Spec) -> Result<Opened, PlaneError> {
        let settings = EbpfSettings {
            hook: layout.hook,
            mode: layout.mode,
            ifaces: layout.interfaces,
            netns: None,
            config: layout.config,
            pin_dir: self.pin_dir.clone(),
            // Agents are refused in label mode (the service's `network.rs`).
            labels: None,
        };
        let spec = Arc::new(spec);
        let target = EbpfTarget::open(&self.deployment, settings, spec.clone()).map_err(PlaneError::Target)?;
        Ok(Opened { layout: p.clone(), spec, target })
    }

    /// A program of another hook or mode is removed before the new one is
    /// attached. Otherwise the install swaps the program under the links it
    /// keeps, attaches it to interfaces the layout gains and detaches it from
    /// those it drops (`Deployment::install`): a device of a fabric that
    /// gains or loses a port never stops forwarding on the others.
    fn detach_if_moved(&mut self, new: &Layout) -> Result<(), PlaneError> {
        let Some(o) = &mut self.opened else { return Ok(()) };
        let old = Layout::from_proto(&o.layout)?;
        if old.hook != new.hook || old.mode != new.mode {
            o.target.uninstall().map_err(PlaneError::Target)?;
            self.held = None;
            self.digest = None;
        }
        Ok(())
    }
}

/// Checks a spec's source text.
fn check_spec(text: &str) -> Result<Spec, PlaneError> {
    let mut sources = subc_lang::SourceMap::new();
    let f = sources.add("spec".to_string(), text.to_string());
    let mut diags = subc_lang::Diagnostics::default();
    match subc_lang::check_spec_file(&sources, f, &mut diags) {
        Some(spec) if !diags.has_errors() => Ok(spec),
        _ => {
            diags.sort();
            Err(PlaneError::Spec(diags.render(&sources)))
        }
    }
}
