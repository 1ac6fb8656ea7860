//! The P4Runtime target: a switch running subc's P4 program, driven through
//! `subc-p4runtime`'s client as its primary controller.
//!
//! The program: subc generates it from the spec and the pipelines' field
//! orders (`P4Target`). A registration may carry the P4Info the switch's
//! program was compiled to; it must be subc's for these pipelines (up to
//! table sizes; leaves in a leaf table or folded, whichever matches), or
//! every attempt fails with a message that says where it differs. With a
//! device config (BMv2 JSON), subc pushes the program whenever the switch
//! does not run it (SetForwardingPipelineConfig, which empties the tables);
//! the cookie it sends (`program_cookie`: P4Info shape and device config)
//! tells later reads that it does. Without one, the switch must already
//! run the program, which is checked against the P4Info the switch reports.
//!
//! The architecture is the registration's `arch`: v1model (BMv2) or TNA
//! (Tofino). A TNA program, as `subc compile --arch tna` writes it, leaves
//! out the levels that have no entries (a level costs a stage), so an
//! update that needs one cannot be written to it: nothing is written, and
//! the deployer installs a program that has the level (a registered
//! program that lacks it is an error that says to compile it again). The
//! levels of the program the switch was given are kept with its image.
//! Writes that would overfill a table of the program the switch runs (its
//! P4Info's sizes) are refused before anything is written: subc's own
//! program is pushed again with larger tables, a registered one fails.
//!
//! Install: arbitration, the program if needed, then a Read of everything
//! and the writes that take the switch from what it holds to the full set
//! (`subc_p4runtime::repair`: groups, leaves, entries from the last level,
//! defaults, then deletes from the first level), so that installing over an
//! earlier install writes only what differs, in make-before-break order.
//! Updates: the IR's diffs as ordered P4Runtime batches. Ports go through
//! the registration's port map.
//!
//! The pipelines cannot be decoded back from P4Runtime entries in every
//! mode (folded leaves, port bitmaps), so the image the switch was given is
//! kept in [`SwitchSettings::image_dir`] (a base and a journal of
//! the diffs applied since, [`ImageLog`]). Read back (reconcile): a Read of
//! everything, compared with the image's encoding; equal, the image is what
//! the switch holds and nothing is written; different (an operator's change,
//! a write that failed halfway, a switch that lost entries), the difference
//! is written in the same safe order, logged, and the image is what the
//! switch holds again. A switch that runs no program or another one, or a
//! repair the switch refuses, reads as "nothing known": the deployer
//! installs anew.
//!
//! What a switch sends is bounded (`deploy.p4_read_max_bytes` per Read,
//! `deploy.p4_message_max_bytes` per message): a Read streams into the
//! repair (`Repairing`), and one past the cap fails the attempt, naming it.
//! Port counters are read over a read-only clone of the connection
//! ([`P4Counters`]), so a counter read never holds the driver.
//!
//! Writes are not atomic on P4Runtime: a failed write leaves the image
//! untrusted (`apply` needs an install or a read back again), and the
//! deployer's read back after a failure repairs the switch to the saved
//! image before the next diff.

use crate::{Client, Error as P4Error, ReadLimits, Repair, Repairing, TlsOptions};
use serde_json::{json, Value};
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use subc_backend_p4::difference;
use subc_backend_p4::proto::p4::config::v1::P4Info;
use subc_backend_p4::proto::p4::v1 as p4v1;
use subc_backend_p4::{describe, initial_defaults, program_cookie, Batch, PortMap, Receivers};
use subc_backend_p4::{levels_for, Arch, Error as BackendError, P4Options, P4Target};
use subc_bdd::BitImage;
use subc_bdd::Op;
use subc_bdd::Pipeline;
use subc_bdd::PipelineShape;
use subc_bdd::SetDiff;
use subc_lang::spec::Spec;
use subc_target::{Capabilities, CounterReader, Error as TargetError, ImageLog, PortCount, StateFunction, Target};

/// How long connecting and arbitration may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a Read, or a pipeline config, may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// The pipelines' shape: what the program depends on.
type Orders = Vec<PipelineShape>;

/// The IR's levels a program has, per pipeline (TNA leaves out levels
/// without entries: `P4Options::skip_empty_levels`).
type Levels = Vec<Vec<usize>>;

/// The program for one shape of pipelines.
struct Program {
    orders: Orders,
    levels: Levels,
    target: P4Target,
    /// The P4Info the switch runs: the registered one, or subc's.
    info: P4Info,
    initial: Vec<p4v1::Entity>,
}

/// What the switch runs.
enum Running {
    Ours,
    /// No program, or another one: why.
    NotOurs(String),
}

/// Which switch, running what, and where its image is kept.
#[derive(Clone, Debug)]
pub struct SwitchSettings {
    /// `host:port`, or a URL.
    pub address: String,
    pub device_id: u64,
    /// subc's election id (at least 1).
    pub election_id: u64,
    /// The controller's epoch when replicas share the store (0: none): the
    /// high 64 bits of the election id, so that a successor is primary and
    /// the switch itself refuses a deposed writer.
    pub epoch: u64,
    /// The architecture of the switch's program.
    pub arch: Arch,
    /// The P4Info the switch's program was compiled to, if registered.
    pub given: Option<P4Info>,
    /// What subc pushes when the switch does not run its program.
    pub device_config: Vec<u8>,
    pub ports: PortMap,
    /// Past 511 ports: the receivers' device ports and rewrites.
    pub receivers: Receivers,
    /// TLS to the switch (none: plaintext).
    pub tls: Option<TlsOptions>,
    /// What the switch may send.
    pub limits: ReadLimits,
    /// A switch of a fabric: drops the copy whose egress port is the ingress port.
    pub prune_ingress: bool,
    /// A directory of its own for its image ([`ImageLog`]).
    pub image_dir: PathBuf,
}

/// A P4Runtime switch as a target.
pub struct SwitchTarget {
    name: String,
    spec: Arc<Spec>,
    /// `http://host:port`
    addr: String,
    device_id: u64,
    election_id: u128,
    /// The architecture of the switch's program.
    arch: Arch,
    /// The registered P4Info, if any.
    given: Option<P4Info>,
    /// The P4Info of the program the switch runs, as it reported it or as
    /// subc pushed it (`None`: not known): its table sizes bound the writes.
    running_info: Option<P4Info>,
    device_config: Vec<u8>,
    ports: PortMap,
    /// Past 511 ports: the receivers' device ports and rewrites.
    receivers: Receivers,
    /// TLS to the switch (none: plaintext).
    tls: Option<TlsOptions>,
    /// What the switch may send (from `[deploy]`).
    limits: ReadLimits,
    rt: subc_client::Blocking,
    client: Option<Client>,
    program: Option<Arc<Program>>,
    /// The pipelines the switch holds, while that is known.
    image: Option<Vec<Pipeline>>,
    /// The program drops the copy whose egress port is the ingress port.
    prune_ingress: bool,
    files: ImageLog,
}

/// Whether a failed call leaves the connection worth keeping (the switch
/// answered and refused, or sent more than the client takes: that stream
/// is reset, the connection is sound), or it should be made anew.
fn keeps_connection(e: &P4Error) -> bool {
    use tonic::Code as C;
    if matches!(e, P4Error::ReadTooLarge { .. } | P4Error::MessageTooLarge { .. }) {
        return true;
    }
    matches!(
        e.code(),
        Some(
            C::InvalidArgument
                | C::NotFound
                | C::AlreadyExists
                | C::FailedPrecondition
                | C::OutOfRange
                | C::ResourceExhausted
                | C::Unimplemented
                | C::Unknown
        )
    )
}

/// The switch answered a Read or a pipeline query in a way that means it
/// runs no program, or another one.
fn not_our_program(e: &P4Error) -> bool {
    use tonic::Code as C;
    matches!(e.code(), Some(C::NotFound | C::InvalidArgument | C::FailedPrecondition | C::OutOfRange))
}

/// The registration's port map, checked.
impl SwitchTarget {
    /// `prune_ingress`: a switch of a fabric (`docs/network.md`).
    pub fn open(name: &str, settings: SwitchSettings, spec: Arc<Spec>) -> Result<SwitchTarget, TargetError> {
        let SwitchSettings {
            address,
            device_id,
            election_id,
            epoch,
            arch,
            given,
            device_config,
            ports,
            receivers,
            tls,
            limits,
            prune_ingress,
            image_dir,
        } = settings;
        let addr = if address.contains("://") { address } else { format!("http://{address}") };
        Ok(SwitchTarget {
            name: name.to_string(),
            spec,
            addr,
            device_id,
            election_id: ((epoch as u128) << 64) | election_id.max(1) as u128,
            arch,
            given,
            running_info: None,
            device_config,
            ports,
            receivers,
            tls,
            limits,
            rt: subc_client::Blocking::new()
                .map_err(|e| TargetError::transient(format!("cannot start a runtime for the P4Runtime client: {e}")))?,
            client: None,
            program: None,
            image: None,
            prune_ingress,
            files: ImageLog::new(image_dir),
        })
    }

    /// What the saved image must have been made for: this switch; and
    /// under TNA, the levels of the program the switch was given.
    fn meta(&self) -> Value {
        let mut meta = json!({ "address": self.addr, "device_id": self.device_id });
        if self.arch == Arch::Tna {
            meta["arch"] = json!(self.arch.name());
            meta["levels"] = json!(self.program.as_ref().map(|p| &p.levels));
        }
        meta
    }

    /// Whether a saved image's meta is this switch's (and architecture's).
    fn same_switch(&self, meta: &Value) -> bool {
        let ours = self.meta();
        ["address", "device_id", "arch"].iter().all(|k| meta.get(k) == ours.get(k))
    }

    /// The levels of the program a saved image was installed with (TNA).
    fn saved_levels(meta: &Value) -> Option<Levels> {
        serde_json::from_value(meta.get("levels")?.clone()).ok()
    }

    /// Runs a client call with a time limit; a failure that may have broken
    /// the connection drops it, so that the next call connects anew.
    fn call<T>(
        &mut self,
        what: &str,
        limit: Duration,
        f: impl for<'c> FnOnce(&'c mut Client) -> std::pin::Pin<Box<dyn Future<Output = Result<T, P4Error>> + 'c>>,
    ) -> Result<T, P4Error> {
        if self.client.is_none() {
            let (addr, device, election, tls) = (self.addr.clone(), self.device_id, self.election_id, self.tls.clone());
            let c = self
                .rt
                .block_on(async { tokio::time::timeout(CONNECT_TIMEOUT, Client::connect(&addr, device, election, tls.as_ref())).await })
                .map_err(|_| P4Error::Rpc(format!("{addr} did not answer within {} s", CONNECT_TIMEOUT.as_secs())))??;
            self.client = Some(c.with_limits(self.limits));
        }
        let client = self.client.as_mut().expect("connected above");
        let r = match self.rt.block_on(async { tokio::time::timeout(limit, f(client)).await }) {
            Ok(r) => r,
            Err(_) => Err(P4Error::Rpc(format!("{what} did not finish within {} s", limit.as_secs()))),
        };
        if let Err(e) = &r {
            if !keeps_connection(e) {
                self.client = None;
            }
        }
        r
    }

    fn transient(&self, e: impl std::fmt::Display) -> TargetError {
        TargetError::transient(format!("P4Runtime target {}: {e}", self.addr))
    }

    /// A failed call as the target's error; a cap the switch went past is
    /// named by its key.
    fn failed(&self, e: P4Error) -> TargetError {
        let key = match e {
            P4Error::ReadTooLarge { .. } => "deploy.p4_read_max_bytes",
            P4Error::MessageTooLarge { .. } => "deploy.p4_message_max_bytes",
            _ => return self.transient(e),
        };
        self.transient(format!("{e}; raise {key} if the switch really holds that much"))
    }

    /// The program for pipelines of this shape (kept while the shape
    /// stays, and while it has the levels `levels` asks for, if any: those
    /// of the program the switch was given).
    fn program_for(&mut self, pipes: &[&Pipeline], levels: Option<Levels>) -> Result<&Program, TargetError> {
        let orders = PipelineShape::of_all(pipes.iter().copied());
        if self.program.as_ref().is_none_or(|p| p.orders != orders || levels.as_ref().is_some_and(|l| *l != p.levels)) {
            self.program = None;
            let (target, info) = self.make_program(pipes, levels)?;
            let initial = initial_defaults(&info);
            self.program = Some(Arc::new(Program { orders, levels: target.levels(), target, info, initial }));
        }
        Ok(self.program.as_deref().expect("made above"))
    }

    /// The options of the program's variants, in the order they are
    /// tried: leaves in a leaf table, then folded.
    fn variants(&self) -> [P4Options; 2] {
        let opts = |fold_leaves: bool| P4Options {
            fold_leaves,
            ports: self.ports.clone(),
            receivers: self.receivers.clone(),
            prune_ingress: self.prune_ingress,
            arch: self.arch,
            // As `subc compile --arch tna` writes it: a level costs a stage.
            skip_empty_levels: self.arch == Arch::Tna,
            ..Default::default()
        };
        [opts(false), opts(true)]
    }

    /// The levels a program for `pipes` may have, in the order they are
    /// tried: `first` (the program the switch was given), if the pipelines
    /// have those levels, then the levels with entries (TNA), then all of
    /// them.
    fn level_choices(&self, pipes: &[&Pipeline], first: Option<Levels>) -> Vec<Levels> {
        let [opts, _] = self.variants();
        let all = P4Options { skip_empty_levels: false, ..opts.clone() };
        let have = |l: &Levels| l.len() == pipes.len() && l.iter().zip(pipes).all(|(levels, p)| levels.iter().all(|&i| i < p.tables.len()));
        let mut out: Vec<Levels> = vec![];
        for l in first.filter(have).into_iter().chain([levels_for(pipes, &opts), levels_for(pipes, &all)]) {
            if !out.contains(&l) {
                out.push(l);
            }
        }
        out
    }

    /// Makes the program: subc's own (the first choice of levels, leaves
    /// in a leaf table) or, with a registered P4Info, the first variant
    /// whose P4Info it is.
    fn make_program(&self, pipes: &[&Pipeline], first: Option<Levels>) -> Result<(P4Target, P4Info), TargetError> {
        let mut why = None;
        for levels in self.level_choices(pipes, first) {
            for opts in self.variants() {
                let target = P4Target::with_levels(&self.spec, pipes, &levels, &opts).map_err(|e| self.transient(e))?;
                let Some(given) = &self.given else {
                    let info = target.p4info();
                    return Ok((target, info));
                };
                match difference(&target.p4info(), given) {
                    None => return Ok((target, given.clone())),
                    Some(d) => {
                        why.get_or_insert(d);
                    }
                }
            }
        }
        Err(TargetError::transient(format!(
            "the registered P4Info is not the program subc generates for these subscriptions ({}); write it with \
             `subc compile --target p4{}` (with the server's field order: --order), compile program.p4 for the switch, \
             and register the target again with that P4Info and device config",
            why.unwrap_or_default(),
            if self.arch == Arch::Tna { " --arch tna" } else { "" },
        )))
    }

    /// Whether the switch runs the program (`Err`: it could not be asked).
    /// Whether the switch runs the program (`Err`: it could not be asked);
    /// records the P4Info it reports (`running_info`).
    fn running(&mut self) -> Result<Running, TargetError> {
        self.running_info = None;
        let ours = self.program.as_ref().expect("a program").info.clone();
        let held = match self.call("GetForwardingPipelineConfig", CALL_TIMEOUT, |c| Box::pin(c.pipeline())) {
            Ok(held) => held,
            // A switch that cannot say: the reads will tell.
            Err(e) if e.code() == Some(tonic::Code::Unimplemented) => return Ok(Running::Ours),
            Err(e) if not_our_program(&e) => None,
            Err(e) => return Err(self.transient(e)),
        };
        let (info, cookie) = held.unwrap_or((None, None));
        let running = if !self.device_config.is_empty() {
            // subc pushed it if the cookie says so.
            if cookie == Some(program_cookie(&ours, &self.device_config)) {
                Running::Ours
            } else {
                Running::NotOurs("the switch does not run subc's program".into())
            }
        } else {
            match info.as_ref().map(|info| difference(&ours, info)) {
                None => Running::NotOurs("the switch runs no program".into()),
                Some(None) => Running::Ours,
                Some(Some(why)) => Running::NotOurs(format!("the switch runs another program ({why})")),
            }
        };
        if let Running::Ours = running {
            self.running_info = info;
        }
        Ok(running)
    }

    /// The error of a switch that does not run the program when subc has
    /// no device config to push.
    fn cannot_push(&self, why: &str) -> TargetError {
        self.transient(format!("{why}, and the target has no device config to push subc's (register it with --device-config)"))
    }

    fn write(&mut self, batches: Vec<Batch>) -> Result<usize, P4Error> {
        let limit = CALL_TIMEOUT + Duration::from_millis(100) * batches.len() as u32;
        self.call("Write", limit, move |c| Box::pin(async move { c.write(&batches).await }))
    }

    /// What the switch must hold for `pipes`.
    fn entities(&self, pipes: &[&Pipeline]) -> Result<Vec<p4v1::Entity>, BackendError> {
        self.program.as_ref().expect("a program").target.entities(pipes)
    }

    /// An install's failure to encode the pipelines: a level the
    /// registered program left out says what to do.
    fn left_out(&self, e: BackendError) -> TargetError {
        match e {
            BackendError::LevelLeftOut { .. } => self.transient(format!(
                "{e}: the registered program has no table for it; write the program again (`subc compile --target p4 --arch tna`, \
                 with the server's field order: --order), compile it for the switch, and register the target again with its \
                 P4Info and device config"
            )),
            e => self.transient(e),
        }
    }

    /// The first table of the program the switch runs (its P4Info: as the
    /// switch reported it, or the registered one) that `pipes` would
    /// overfill: (name, entries, size). A switch would refuse such a write
    /// halfway.
    fn overfilled(&self, pipes: &[&Pipeline]) -> Result<Option<(String, usize, i64)>, TargetError> {
        let Some(info) = self.running_info.as_ref().or(self.given.as_ref()) else { return Ok(None) };
        let program = self.program.as_ref().expect("a program");
        let size = |name: &str| info.tables.iter().find(|t| t.preamble.as_ref().is_some_and(|p| p.name == name)).map(|t| t.size);
        let loads = program.target.table_entries(pipes).map_err(|e| self.transient(e))?;
        Ok(loads.into_iter().find_map(|(name, entries)| {
            let size = size(&name).filter(|s| *s > 0 && entries as i64 > *s)?;
            Some((name, entries, size))
        }))
    }

    /// Pipelines that would overfill a table are refused before anything
    /// is written: subc's own program is installed anew with larger
    /// tables; a registered one has to be compiled again.
    fn check_room(&self, pipes: &[&Pipeline]) -> Result<(), TargetError> {
        let Some((name, entries, size)) = self.overfilled(pipes)? else { return Ok(()) };
        let full = format!("table {name} would hold {entries} entries, more than its size {size}; nothing was written");
        if self.given.is_none() && !self.device_config.is_empty() {
            return Err(TargetError::needs_install(format!("{full}: installing a program with larger tables")));
        }
        Err(self.transient(format!(
            "{full}: compile the program with larger tables (subc compile --p4-headroom, --p4-min-table-size) and register \
             the target again"
        )))
    }

    /// The writes that take the switch from what a Read finds to
    /// `expected`; the Read streams into them, never held as a whole.
    fn repair_to(&mut self, expected: Vec<p4v1::Entity>) -> Result<Repair, P4Error> {
        let program = self.program.clone().expect("a program");
        self.call("Read", CALL_TIMEOUT, move |c| {
            Box::pin(async move {
                let mut r = Repairing::new(&program.target, &expected, &program.initial);
                c.read_all_each(&program.info, |e| r.see(&e)).await?;
                Ok(r.finish())
            })
        })
    }

    /// A few of a repair's updates in the program's names, for the log.
    fn sample(&self, r: &Repair) -> Vec<String> {
        let info = &self.program.as_ref().expect("a program").info;
        r.batches.iter().flat_map(|b| &b.updates).take(5).map(|u| describe(u, info)).collect()
    }
}

impl Target for SwitchTarget {
    /// No bit-vector group (a P4 program has no loop over its words); TNA
    /// has no variables (`subc_backend_p4::Error::Unsupported` says why).
    fn capabilities(&self) -> Capabilities {
        let state_functions = StateFunction::ALL.into_iter().filter(|f| self.arch != Arch::Tna || *f != StateFunction::Var).collect();
        Capabilities { state_functions, bit_vector_groups: false, ports: Some(subc_backend_p4::MAX_PORTS), ..Capabilities::default() }
    }

    /// Over the connection deploys opened (a status request never waits to
    /// dial a switch that is down), but not through this driver: a counter
    /// read never holds it.
    fn counter_reader(&mut self) -> Option<Arc<dyn CounterReader>> {
        let (Some(program), Some(client)) = (&self.program, &self.client) else { return None };
        Some(Arc::new(P4Counters { client: Mutex::new(client.read_only()), program: program.clone(), ports: self.ports.clone() }))
    }

    fn read_back(&mut self) -> Result<Option<Vec<Pipeline>>, TargetError> {
        self.image = None;
        let image = match self.files.load() {
            Ok(Some(i)) if self.same_switch(&i.meta) => i,
            Ok(Some(_)) => {
                tracing::warn!(target_name = %self.name, "the saved image was made for another switch; the target will be installed anew");
                return Ok(None);
            }
            Ok(None) => return Ok(None),
            Err(e) => {
                tracing::warn!(target_name = %self.name, error = %e, "the saved image cannot be read; the target will be installed anew");
                return Ok(None);
            }
        };
        let pipes: Vec<&Pipeline> = image.pipelines.iter().collect();
        self.program_for(&pipes, Self::saved_levels(&image.meta))?;
        match self.running()? {
            Running::Ours => {}
            Running::NotOurs(why) if !self.device_config.is_empty() => {
                tracing::warn!(target_name = %self.name, reason = %why, "the switch will be installed anew");
                return Ok(None);
            }
            Running::NotOurs(why) => return Err(self.cannot_push(&why)),
        }
        let expected = self.entities(&pipes).map_err(|e| self.left_out(e))?;
        let r = match self.repair_to(expected) {
            Ok(r) => r,
            Err(e) if not_our_program(&e) => {
                tracing::warn!(target_name = %self.name, error = %e, "the switch cannot be read as subc's program; it will be installed anew");
                return Ok(None);
            }
            Err(e) => return Err(self.failed(e)),
        };
        if !r.is_empty() {
            let sample = self.sample(&r);
            tracing::warn!(
                target_name = %self.name, inserts = r.inserts, modifies = r.modifies, deletes = r.deletes, first = ?sample,
                "the switch differs from the image subc installed; repairing it"
            );
            let (inserts, modifies, deletes) = (r.inserts, r.modifies, r.deletes);
            match self.write(r.batches) {
                Ok(_) => tracing::info!(target_name = %self.name, inserts, modifies, deletes, "repaired the switch"),
                Err(e) if keeps_connection(&e) => {
                    tracing::warn!(target_name = %self.name, error = %e, "the switch refused the repair; it will be installed anew");
                    return Ok(None);
                }
                Err(e) => return Err(self.transient(e)),
            }
        }
        self.image = Some(image.pipelines.clone());
        Ok(Some(image.pipelines))
    }

    /// `_bits` is always `None`: [`Target::capabilities`] refuses a group first.
    fn install(&mut self, pipes: &[&Pipeline], _bits: Option<&BitImage>) -> Result<(), TargetError> {
        self.image = None;
        // A program pushed now has tables sized for these pipelines (and
        // under TNA, their levels); a registered program keeps its levels.
        let given_levels = self.program.take().filter(|_| self.given.is_some()).map(|p| p.levels.clone());
        self.program_for(pipes, given_levels)?;
        let push = match self.running()? {
            Running::NotOurs(why) => Some(why),
            // subc's own program, with tables too small for these pipelines.
            Running::Ours if self.given.is_none() && self.overfilled(pipes)?.is_some() => {
                Some("the switch's tables are too small for these subscriptions".into())
            }
            Running::Ours => None,
        };
        if let Some(why) = push {
            if self.device_config.is_empty() {
                return Err(self.cannot_push(&why));
            }
            let (info, config) = (self.program.as_ref().expect("a program").info.clone(), self.device_config.clone());
            tracing::info!(target_name = %self.name, reason = %why, "pushing subc's program to the switch");
            let pushed = info.clone();
            self.call("SetForwardingPipelineConfig", CALL_TIMEOUT, move |c| Box::pin(async move { c.set_pipeline(&info, config).await }))
                .map_err(|e| self.transient(e))?;
            self.running_info = Some(pushed);
        }
        let expected = self.entities(pipes).map_err(|e| self.left_out(e))?;
        self.check_room(pipes)?;
        let r = self.repair_to(expected).map_err(|e| self.failed(e))?;
        let (inserts, modifies, deletes) = (r.inserts, r.modifies, r.deletes);
        self.write(r.batches).map_err(|e| self.transient(e))?;
        tracing::info!(target_name = %self.name, inserts, modifies, deletes, "installed");
        let meta = self.meta();
        self.files.write_base(pipes, &meta)?;
        self.image = Some(pipes.iter().map(|p| (*p).clone()).collect());
        Ok(())
    }

    fn apply(&mut self, update: &SetDiff) -> Result<(), TargetError> {
        // Not trusted again until this write and its record succeed.
        let mut after = self.image.take().ok_or_else(|| TargetError::needs_install("what the switch holds is not known"))?;
        for d in &update.diffs {
            let p = after.get_mut(d.pipeline).ok_or_else(|| TargetError::needs_install(format!("no pipeline {}", d.pipeline)))?;
            p.apply(d).map_err(|e| TargetError::needs_install(format!("the diff does not fit the image: {e}")))?;
        }
        let pipes: Vec<&Pipeline> = after.iter().collect();
        if self.program.as_ref().is_none_or(|p| p.orders != PipelineShape::of_all(pipes.iter().copied())) {
            return Err(TargetError::needs_install("the update is for pipelines of another shape"));
        }
        let batches = match self.program.as_ref().expect("checked").target.apply_pipelines(&pipes, update) {
            Ok(b) => b,
            // Nothing was written: a program with the level replaces this one.
            Err(e @ BackendError::LevelLeftOut { .. }) => {
                return Err(TargetError::needs_install(format!("{e}: installing a program that has it")))
            }
            Err(e) => return Err(self.transient(e)),
        };
        self.check_room(&pipes)?;
        self.write(batches).map_err(|e| self.transient(e))?;
        let meta = self.meta();
        self.files.append(update, &pipes, &meta)?;
        self.image = Some(after);
        Ok(())
    }

    fn uninstall(&mut self) -> Result<(), TargetError> {
        self.image = None;
        let (pipes, levels) = match self.files.load() {
            Ok(Some(i)) => (i.pipelines, Self::saved_levels(&i.meta)),
            // Nothing recorded: nothing of subc's is known to be there.
            _ => return self.files.remove(),
        };
        self.program_for(&pipes.iter().collect::<Vec<_>>(), levels)?;
        // A switch that runs another program holds nothing of subc's.
        if let Running::Ours = self.running()? {
            let r = self.repair_to(vec![]).map_err(|e| self.failed(e))?;
            let deletes = r.deletes;
            self.write(r.batches).map_err(|e| self.transient(e))?;
            tracing::info!(target_name = %self.name, deletes, "removed subc's entries and groups");
        }
        self.files.remove()
    }

    fn describe_ops(&mut self, after: &[&Pipeline], ops: &[(usize, Op)]) -> Vec<Option<String>> {
        let Ok(program) = self.program_for(after, None) else { return vec![] };
        let enc = program.target.encoder();
        ops.iter()
            .map(|(p, op)| match after.get(*p).map(|pipe| enc.op(*p, op, pipe)) {
                Some(Ok(us)) if !us.is_empty() => Some(us.iter().map(|u| describe(u, &program.info)).collect::<Vec<_>>().join("; ")),
                Some(Ok(_)) | None => None,
                Some(Err(e)) => Some(format!("cannot be encoded: {e}")),
            })
            .collect()
    }
}

/// Reads a switch's port counters over a read-only clone of the driver's
/// connection: another stream of the same HTTP/2 connection, so neither
/// waits for the other.
struct P4Counters {
    /// Cloned for each read (the clone is a handle on the same connection).
    client: Mutex<Client>,
    program: Arc<Program>,
    ports: subc_backend_p4::PortMap,
}

impl CounterReader for P4Counters {
    fn read(&self) -> subc_target::CounterRead {
        let mut client = self.client.lock().unwrap_or_else(|p| p.into_inner()).read_only();
        let (program, ports) = (self.program.clone(), self.ports.clone());
        Box::pin(async move {
            let counters = match client.read_port_counters(&program.info).await {
                Ok(c) => c,
                // A program of an older subc, with no counter.
                Err(P4Error::NoCounter(_)) => return Ok(vec![]),
                Err(e) => return Err(TargetError::transient(format!("reading the port counters: {e}"))),
            };
            let mut out: Vec<PortCount> = counters
                .into_iter()
                .filter_map(|c| Some(PortCount { port: ports.subscription(c.port)?, packets: c.packets, bytes: c.bytes }))
                .collect();
            out.sort_by_key(|c| c.port);
            Ok(out)
        })
    }
}
