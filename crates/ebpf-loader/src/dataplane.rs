//! A loaded data plane: everything that makes system calls on one
//! program and its maps (libbpf-rs 0.27).
//!
//! [`Dataplane`] loads a generated object, fills its maps, applies updates
//! (see [`subc_backend_ebpf::encode`] for the protocol: inactive
//! generation, flip, grace period, other generation), runs packets through
//! `BPF_PROG_TEST_RUN`, reads state back and reports what the verifier and
//! the maps cost. [`Runner`] runs packets from another thread.
//!
//! After the flip, the updater waits until no packet can still be reading
//! the old generation before it writes that generation: it polls the
//! program's per-CPU run counters (`subc_runs`, microseconds), and falls
//! back to an RCU grace period, for programs without them or counters that
//! do not settle: XDP and TC programs run inside RCU read-side sections,
//! and `membarrier(MEMBARRIER_CMD_GLOBAL)` waits for `synchronize_rcu()`
//! (about 10 ms), so when it returns every packet that read the old
//! generation has finished.

use crate::attach::ifindex;
use crate::sys::{self, MapMemory, SkbContext};
use crate::{LoaderError, NoImage, PortCounter};
use libbpf_rs::{MapCore, MapFlags, MapHandle, Object, ObjectBuilder, ProgramInput};
use serde::Serialize;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};
use subc_backend_ebpf::{audience_ports, read_field, CStruct, EWMA_AVERAGE_BITS};
use subc_backend_ebpf::{config_op, LabelTable, NoMatch, TargetConfig};
use subc_backend_ebpf::{Hook, Model};
use subc_backend_ebpf::{MapOp, MapType, TableImage};
use subc_bdd::PortSet;
use subc_lang::spec::{Spec, StateKind};
use subc_lang::{Slot, StateStore};

/// Why `BPF_PROG_TEST_RUN` failed on `packet`: the frame itself if the
/// kernel refuses it for a program that does nothing, else the program.
fn test_run_error(hook: Hook, packet: &[u8], e: libbpf_rs::Error) -> LoaderError {
    if let Ok(true) = crate::frames::refuses(hook, packet) {
        if let Ok(Some(limits)) = crate::frames::frame_limits(hook, packet) {
            return LoaderError::FrameRefused { len: packet.len(), limits };
        }
    }
    LoaderError::bpf("BPF_PROG_TEST_RUN", e)
}

/// A loaded program and its maps.
pub struct Dataplane {
    obj: Object,
    /// Each program's name and a descriptor of it, so that callers can
    /// borrow one for as long as the data plane lives.
    progs: Vec<(String, OwnedFd)>,
    pub model: Model,
    maps: Vec<Option<MapHandle>>,
    /// The memory of maps created `BPF_F_MMAPABLE`, for partial writes.
    memory: Vec<Option<MapMemory>>,
    image: Option<TableImage>,
    load_time: Duration,
}

/// What one `BPF_PROG_TEST_RUN` gave.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TestRun {
    /// The program's return value (`XDP_*` or `TC_ACT_*`).
    pub verdict: u32,
    /// The packet after the program (rewrites applied).
    pub data: Vec<u8>,
    /// Average nanoseconds per run.
    pub ns: u64,
    /// The decision, from `subc_record` (test builds only).
    pub record: Option<Record>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Record {
    /// 1 forward, 2 drop, 3 no match, 4 did not parse.
    pub decision: u32,
    pub drop: bool,
    pub ports: Vec<u32>,
}

/// Costs of a loaded program.
#[derive(Clone, Debug, Serialize)]
pub struct LoadStats {
    /// Per program: name and instructions the verifier processed.
    pub verified_insns: Vec<(String, u32)>,
    /// Per program: instructions in the object.
    pub insns: Vec<(String, usize)>,
    pub load_ms: f64,
    /// Bytes the kernel charged for all maps (`memlock` in fdinfo).
    pub map_bytes: u64,
    /// Maps created.
    pub maps: usize,
}

/// What an update did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct UpdateReport {
    pub ops: usize,
    /// The wait after the flip for packets that may read the old generation.
    pub grace_us: u64,
    /// That wait was an RCU grace period, not the program's run counters.
    pub grace_period: bool,
    pub total_us: u64,
}

/// Applies map operations in order to `maps` (indexed like `model.maps`).
/// A run of writes (or of deletes) to one array or hash map goes down in one
/// `BPF_MAP_*_BATCH` call, in the run's order, which saves a system call
/// per entry (a bit-vector group's add writes hundreds of rows). A run the
/// kernel refuses as a batch is applied entry by entry: each operation sets
/// or removes one key, so applying again what the batch did changes
/// nothing, and the entry that fails names the error.
///
/// Partial writes (`MapOp::offset`) go through the map's memory mapping
/// (`memory`, indexed like `maps`), one store per word and no system call;
/// a fence then orders them before the next write the kernel makes.
pub(crate) fn apply_ops(maps: &[Option<MapHandle>], memory: &[Option<MapMemory>], model: &Model, ops: &[MapOp]) -> Result<(), LoaderError> {
    let mut rest = ops;
    let kind = |op: &MapOp| (op.map, op.value.is_some(), op.offset.is_some());
    while let Some(first) = rest.first() {
        let run = rest.iter().take_while(|op| kind(op) == kind(first)).count();
        let (now, later) = rest.split_at(run);
        let m = maps[first.map].as_ref().ok_or_else(|| LoaderError::MapNotBuilt { map: model.maps[first.map].name.clone() })?;
        if first.offset.is_some() {
            write_partial(m, memory.get(first.map).and_then(Option::as_ref), model, now)?;
            std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
            rest = later;
            continue;
        }
        let batchable = now.len() > 1 && matches!(model.maps[first.map].map_type, MapType::Array | MapType::Hash);
        if !(batchable && apply_batch(m, now).is_ok()) {
            for op in now {
                apply_one(m, op).map_err(|source| LoaderError::Map { map: model.maps[op.map].name.clone(), source })?;
            }
        }
        rest = later;
    }
    Ok(())
}

/// Partial writes to one array map: through its memory mapping when there
/// is one, else by reading each element, patching it and writing it back.
fn write_partial(m: &MapHandle, memory: Option<&MapMemory>, model: &Model, ops: &[MapOp]) -> Result<(), LoaderError> {
    let def = &model.maps[ops[0].map];
    let size = def.value.size() as usize;
    let refused = |what: &str| LoaderError::Map {
        map: def.name.clone(),
        source: libbpf_rs::Error::from(std::io::Error::new(std::io::ErrorKind::InvalidInput, what.to_string())),
    };
    for op in ops {
        let (Some(value), Some(at)) = (op.value.as_deref(), op.offset.map(|o| o as usize)) else { continue };
        let index = op.key.get(..4).map(|k| u32::from_ne_bytes(k.try_into().expect("4 bytes")) as usize);
        let (Some(index), true) = (index, def.map_type == MapType::Array && at + value.len() <= size) else {
            return Err(refused("a partial write outside an array element"));
        };
        match memory {
            Some(mem) => {
                mem.write_words(index * size.next_multiple_of(8) + at, value).ok_or_else(|| refused("a partial write outside the map"))?
            }
            None => {
                let mut whole = m
                    .lookup(&op.key, MapFlags::ANY)
                    .map_err(|source| LoaderError::Map { map: def.name.clone(), source })?
                    .ok_or_else(|| refused("a partial write to a missing element"))?;
                whole[at..at + value.len()].copy_from_slice(value);
                m.update(&op.key, &whole, MapFlags::ANY).map_err(|source| LoaderError::Map { map: def.name.clone(), source })?;
            }
        }
    }
    Ok(())
}

/// Maps the values of `model`'s `BPF_F_MMAPABLE` maps into this process.
/// A map the kernel will not map (pinned by an older subc without the
/// flag) gets `None`, and its partial writes are read, patched and written.
pub(crate) fn map_memories(maps: &[Option<MapHandle>], model: &Model) -> Vec<Option<MapMemory>> {
    let mapped = |def: &subc_backend_ebpf::MapDef, m: &MapHandle| {
        let len = def.max_entries as usize * (def.value.size() as usize).next_multiple_of(8);
        MapMemory::map(m.as_fd(), len).ok()
    };
    model.maps.iter().zip(maps).map(|(def, m)| m.as_ref().filter(|_| def.mmapable()).and_then(|m| mapped(def, m))).collect()
}

/// Writes or deletes `ops` (one map, all of one kind) in one batch.
fn apply_batch(m: &MapHandle, ops: &[MapOp]) -> libbpf_rs::Result<()> {
    let keys: Vec<u8> = ops.iter().flat_map(|op| op.key.iter().copied()).collect();
    let count = ops.len() as u32;
    if ops[0].value.is_none() {
        return m.delete_batch(&keys, count, MapFlags::ANY, MapFlags::ANY);
    }
    let mut values: Vec<u8> = Vec::with_capacity(ops.iter().map(|op| op.value.as_ref().map_or(0, Vec::len)).sum());
    for v in ops.iter().filter_map(|op| op.value.as_deref()) {
        values.extend_from_slice(v);
    }
    m.update_batch(&keys, &values, count, MapFlags::ANY, MapFlags::ANY)
}

fn apply_one(m: &MapHandle, op: &MapOp) -> libbpf_rs::Result<()> {
    match &op.value {
        Some(v) => m.update(&op.key, v, MapFlags::ANY),
        None => match m.delete(&op.key) {
            // Deleting what is not there is what we wanted.
            Err(e) if e.kind() == libbpf_rs::ErrorKind::NotFound => Ok(()),
            r => r,
        },
    }
}

/// The update protocol of [`subc_backend_ebpf::encode`] on `maps`, which hold `image`:
/// returns the report and the image after the update.
/// `image` becomes the image after it; on any error it stays the one before.
pub(crate) fn update_maps(
    maps: &[Option<MapHandle>],
    memory: &[Option<MapMemory>],
    model: &Model,
    image: &mut TableImage,
    update: &subc_bdd::SetDiff,
) -> Result<UpdateReport, LoaderError> {
    let t = Instant::now();
    let (plan, undo) = image.plan_in_place(model, update)?;
    let write = || -> Result<(u64, bool), LoaderError> {
        apply_ops(maps, memory, model, &plan.prepare)?;
        if let Err(e) = apply_ops(maps, memory, model, &plan.inactive) {
            let _ = apply_ops(maps, memory, model, &plan.undo_inactive);
            return Err(e);
        }
        apply_ops(maps, memory, model, &plan.flip)?;
        let g = Instant::now();
        let grace_period = wait_for_old_runs(maps, model);
        let grace_us = g.elapsed().as_micros() as u64;
        apply_ops(maps, memory, model, &plan.live)?;
        Ok((grace_us, grace_period))
    };
    match write() {
        Ok((grace_us, grace_period)) => {
            Ok(UpdateReport { ops: plan.op_count(), grace_us, grace_period, total_us: t.elapsed().as_micros() as u64 })
        }
        Err(e) => {
            image.rollback(undo);
            Err(e)
        }
    }
}

/// How long an updater polls the program's run counters before it falls
/// back to a grace period. A run takes microseconds; counters still apart
/// after this belong to a run that was preempted (kernels that preempt BPF
/// programs), which the grace period waits for at less cost than polling.
const RUNS_POLL_LIMIT: Duration = Duration::from_millis(2);

/// Waits until no run of the program can still be reading the generation
/// the last flip retired: every run counted as entered on some CPU when
/// the flip was done has left. The program counts runs per CPU in
/// `subc_runs` (entered before it reads the generation, left after its
/// last table read, both atomic adds, so each is ordered with those
/// reads); a fence here orders the flip before this read of the counters,
/// so a run that read the old generation was counted as entered. A
/// program without the counters (generated before them), or counters that
/// do not settle within [`RUNS_POLL_LIMIT`], get a grace period instead
/// (and the answer is true).
fn wait_for_old_runs(maps: &[Option<MapHandle>], model: &Model) -> bool {
    let grace = || {
        grace_period();
        true
    };
    let Some(id) = model.ids.runs else { return grace() };
    let Some(m) = maps[id].as_ref() else { return grace() };
    let st = model.maps[id].value_struct();
    let read = || -> Option<Vec<(u64, u64)>> {
        let per_cpu = m.lookup_percpu(&0u32.to_ne_bytes(), MapFlags::ANY).ok()??;
        Some(per_cpu.iter().map(|v| (read_field(st, v, "entered", 0), read_field(st, v, "left", 0))).collect())
    };
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    let Some(at_flip) = read() else { return grace() };
    let deadline = Instant::now() + RUNS_POLL_LIMIT;
    let mut now = at_flip.clone();
    loop {
        if now.iter().zip(&at_flip).all(|((_, left), (entered, _))| left >= entered) {
            return false;
        }
        if Instant::now() >= deadline {
            return grace();
        }
        std::hint::spin_loop();
        match read() {
            Some(r) if r.len() == at_flip.len() => now = r,
            _ => return grace(),
        }
    }
}

/// Waits until every BPF program run that started before the call has
/// finished (an RCU grace period); see the module doc.
pub fn grace_period() {
    if !sys::membarrier_global() {
        // Kernels with nohz_full refuse it; programs run for microseconds.
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// What the kernel says a loaded program costs, for any program (the
/// benches set hand-written programs beside generated ones).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ProgramCosts {
    /// Instructions the verifier processed.
    pub verified_insns: u32,
    /// Instructions after the kernel's translation: what runs.
    pub translated_insns: u32,
}

pub fn program_costs(prog: BorrowedFd<'_>) -> ProgramCosts {
    ProgramCosts { verified_insns: sys::prog_verified_insns(prog), translated_insns: sys::prog_translated_insns(prog) }
}

/// `memlock` of a BPF object, from `/proc/self/fdinfo`.
pub fn memlock(fd: BorrowedFd<'_>) -> u64 {
    use std::os::fd::AsRawFd;
    std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd()))
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("memlock:").map(|v| v.trim().parse().unwrap_or(0))))
        .unwrap_or(0)
}

impl Dataplane {
    /// Loads an object generated for `model` (maps empty).
    pub fn load(object: &[u8], model: Model) -> Result<Dataplane, LoaderError> {
        let t = Instant::now();
        let open = ObjectBuilder::default().open_memory(object).map_err(|e| LoaderError::bpf("cannot open the BPF object", e))?;
        let obj = open.load().map_err(|e| LoaderError::bpf("the kernel rejected the program", e))?;
        let load_time = t.elapsed();
        let mut maps = vec![];
        for def in &model.maps {
            let h = match obj.maps().find(|m| m.name() == def.name.as_str()) {
                Some(m) => Some(MapHandle::try_from(&m).map_err(|source| LoaderError::Map { map: def.name.clone(), source })?),
                None if def.only_if.is_some() => None,
                None => return Err(LoaderError::MissingMap { map: def.name.clone() }),
            };
            maps.push(h);
        }
        let mut progs = vec![];
        for p in obj.progs() {
            let fd = p.as_fd().try_clone_to_owned().map_err(|e| LoaderError::io("cannot duplicate a BPF fd", e))?;
            progs.push((p.name().to_string_lossy().into_owned(), fd));
        }
        let memory = map_memories(&maps, &model);
        Ok(Dataplane { obj, progs, model, maps, memory, image: None, load_time })
    }

    /// Loads an object and fills its maps with `image` (generation 0 live).
    pub fn load_with_image(object: &[u8], model: Model, image: TableImage) -> Result<Dataplane, LoaderError> {
        let mut dp = Dataplane::load(object, model)?;
        let ops = image.initial_ops(&dp.model);
        dp.apply(&ops)?;
        dp.apply(&[config_op(&dp.model, NoMatch::Pass, false, 0)])?;
        dp.image = Some(image);
        Ok(dp)
    }

    /// The maps whose values are mapped into this process: their partial
    /// writes are plain stores ([`MapOp::offset`]).
    pub fn memory_mapped(&self) -> Vec<&str> {
        self.model.maps.iter().zip(&self.memory).filter(|(_, m)| m.is_some()).map(|(d, _)| d.name.as_str()).collect()
    }

    pub fn image(&self) -> Option<&TableImage> {
        self.image.as_ref()
    }

    fn map(&self, id: usize) -> Result<&MapHandle, LoaderError> {
        self.maps[id].as_ref().ok_or_else(|| LoaderError::MapNotBuilt { map: self.model.maps[id].name.clone() })
    }

    /// Applies operations in order.
    pub fn apply(&self, ops: &[MapOp]) -> Result<(), LoaderError> {
        apply_ops(&self.maps, &self.memory, &self.model, ops)
    }

    /// Applies an IR update atomically (see [`subc_backend_ebpf::encode`]). On a
    /// capacity error nothing is touched; on a kernel error while writing
    /// the inactive generation, it is restored and the old tables stay live.
    pub fn update(&mut self, update: &subc_bdd::SetDiff) -> Result<UpdateReport, LoaderError> {
        let image = self.image.as_mut().ok_or(LoaderError::NoImage(NoImage::Loaded))?;
        update_maps(&self.maps, &self.memory, &self.model, image, update)
    }

    /// Writes the egress of every port and the no-match action.
    pub fn configure(&self, cfg: &TargetConfig) -> Result<(), LoaderError> {
        let ops = cfg.ops(&self.model, &ifindex)?;
        self.apply(&ops)
    }

    /// Writes a label-mode device's tables (`subc_backend_ebpf::write_labels`):
    /// all of them when `from` is `None`, else only the entries that differ
    /// from `from`, the tables the maps hold now, so that a reroute writes
    /// nothing to a device whose tables did not change. The entries written.
    pub fn write_labels(&self, from: Option<&LabelTable>, to: &LabelTable) -> Result<usize, LoaderError> {
        let ops = match from {
            Some(from) => subc_backend_ebpf::label_diff(from, to, &self.model)?,
            None => subc_backend_ebpf::label_ops(to, &self.model)?,
        };
        self.apply(&ops)?;
        Ok(ops.len())
    }

    /// The program that decides packets: `subc_xdp` or `subc_tc`.
    pub fn main_program_name(&self) -> &'static str {
        match self.model.hook {
            Hook::Xdp => "subc_xdp",
            Hook::Tc => "subc_tc",
        }
    }

    /// Runs one packet through the deciding program with `BPF_PROG_TEST_RUN`
    /// (`now_ns` is the clock of builds with `SUBC_CLOCK_MAP`). A frame the
    /// kernel test-runs for no program of this hook (too short, too long)
    /// is [`LoaderError::FrameRefused`], with the kernel's limits.
    pub fn test_run(&self, packet: &[u8], now_ns: u64, no_match: NoMatch, repeat: u32) -> Result<TestRun, LoaderError> {
        self.apply(&[config_op(&self.model, no_match, false, now_ns)])?;
        let name = self.main_program_name();
        let prog = self.obj.progs_mut().find(|p| p.name() == name).ok_or_else(|| LoaderError::MissingProgram { program: name.into() })?;
        let mut out = vec![0u8; packet.len() + 256];
        let input = ProgramInput { data_in: Some(packet), data_out: Some(&mut out), repeat, ..Default::default() };
        let o = match prog.test_run(input) {
            Ok(o) => o,
            Err(e) => return Err(test_run_error(self.model.hook, packet, e)),
        };
        let verdict = o.return_value;
        let ns = o.duration.as_nanos() as u64;
        let data = o.data.map(|d| d.to_vec()).unwrap_or_default();
        let record = match self.maps[self.model.ids.record].as_ref() {
            None => None,
            Some(m) => {
                let v = m.lookup(&0u32.to_ne_bytes(), MapFlags::ANY).map_err(|e| LoaderError::bpf("subc_record", e))?.unwrap_or_default();
                let members = self.model.ids.members.and_then(|i| self.maps[i].as_ref()).map(|m| m.as_fd());
                Some(self.record_decoder().decode(&v, members)?)
            }
        };
        Ok(TestRun { verdict, data, ns, record })
    }

    /// A handle that runs packets from another thread while this one
    /// updates the maps (for atomicity tests and benchmarks).
    pub fn runner(&self) -> Result<Runner, LoaderError> {
        let dup = |fd: BorrowedFd<'_>| fd.try_clone_to_owned().map_err(|e| LoaderError::io("cannot duplicate a BPF fd", e));
        let prog = dup(self.program_fd(self.main_program_name())?)?;
        let record = match self.maps[self.model.ids.record].as_ref() {
            Some(m) => Some(dup(m.as_fd())?),
            None => None,
        };
        let members = match self.model.ids.members.and_then(|i| self.maps[i].as_ref()) {
            Some(m) => Some(dup(m.as_fd())?),
            None => None,
        };
        Ok(Runner { prog, record, members, decoder: self.record_decoder() })
    }

    fn record_decoder(&self) -> RecordDecoder {
        RecordDecoder {
            record: self.model.maps[self.model.ids.record].value_struct().clone(),
            port_words: self.model.port_words,
            audience_slots: self.model.audience_slots,
        }
    }

    /// Clears `subc_record` (so a run that records nothing is visible).
    pub fn clear_record(&self) -> Result<(), LoaderError> {
        if let Some(m) = self.maps[self.model.ids.record].as_ref() {
            let size = self.model.maps[self.model.ids.record].value.size() as usize;
            m.update(&0u32.to_ne_bytes(), &vec![0u8; size], MapFlags::ANY).map_err(|e| LoaderError::bpf("subc_record", e))?;
        }
        Ok(())
    }

    /// Packets and bytes handed to each logical port since the program
    /// was loaded, summed over CPUs: only ports with at least one packet,
    /// in port order. Updates do not reset them; see [`PortCounter`].
    pub fn port_counters(&self) -> Result<Vec<PortCounter>, LoaderError> {
        crate::counters::read(&self.maps, &self.model)
    }

    /// The stream state and variables, as the reference interpreter keeps them.
    pub fn read_state(&self, spec: &Spec) -> Result<StateStore, LoaderError> {
        let mut store = StateStore::new(spec);
        for (i, s) in spec.states.iter().enumerate() {
            let id = self.model.ids.states[i];
            let m = self.map(id)?;
            let st = self.model.maps[id].value_struct();
            for k in 0..s.slots() {
                let v = m.lookup(&k.to_ne_bytes(), MapFlags::ANY).map_err(|e| LoaderError::bpf("state map", e))?.unwrap_or_default();
                let f = |name: &str, idx: u32| read_field(st, &v, name, idx);
                store.vars[i][k as usize] = match &s.kind {
                    StateKind::Counter { .. } => Slot::Counter { window: f("window", 0), count: f("count", 0) as u32 },
                    StateKind::Avg { samples, .. } => {
                        Slot::Avg { ring: (0..*samples).map(|j| f("ring", j)).collect(), next: f("next", 0) as u32, sum: f("sum", 0) }
                    }
                    StateKind::Ewma { .. } => {
                        let word = f("word", 0);
                        Slot::Ewma { ewma: word & ((1 << EWMA_AVERAGE_BITS) - 1), count: (word >> EWMA_AVERAGE_BITS) as u32 }
                    }
                    StateKind::Var { .. } => Slot::Var { value: f("value", 0) },
                };
            }
        }
        Ok(store)
    }

    /// Verifier, load-time and memory costs.
    pub fn stats(&self) -> LoadStats {
        let mut verified = vec![];
        let mut insns = vec![];
        for p in self.obj.progs() {
            let name = p.name().to_string_lossy().to_string();
            verified.push((name.clone(), sys::prog_verified_insns(p.as_fd())));
            insns.push((name, p.insn_cnt()));
        }
        let map_bytes = self.maps.iter().flatten().map(|m| memlock(m.as_fd())).sum();
        let maps = self.maps.iter().flatten().count();
        LoadStats { verified_insns: verified, insns, load_ms: self.load_time.as_secs_f64() * 1e3, map_bytes, maps }
    }

    /// Pins every map and program under `dir` (created if needed).
    pub fn pin(&self, dir: &Path) -> Result<(), LoaderError> {
        std::fs::create_dir_all(dir).map_err(|e| LoaderError::io(format!("cannot create {}", dir.display()), e))?;
        for (def, m) in self.model.maps.iter().zip(&self.maps) {
            if let Some(m) = m {
                pin_fd(m.as_fd(), &dir.join(&def.name))?;
            }
        }
        for p in self.obj.progs() {
            pin_fd(p.as_fd(), &dir.join(format!("prog_{}", p.name().to_string_lossy())))?;
        }
        Ok(())
    }

    /// The fd of a program by name, borrowed from this data plane.
    pub fn program_fd(&self, name: &str) -> Result<BorrowedFd<'_>, LoaderError> {
        self.progs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, fd)| fd.as_fd())
            .ok_or_else(|| LoaderError::MissingProgram { program: name.into() })
    }
}

/// Pins a map, program or link at `path` (replacing what is there).
pub(crate) fn pin_fd(fd: BorrowedFd<'_>, path: &Path) -> Result<(), LoaderError> {
    let c = sys::c_path(path).ok_or_else(|| LoaderError::BadPinPath { path: path.to_path_buf() })?;
    if path.exists() {
        let _ = std::fs::remove_file(path);
    }
    sys::obj_pin(fd, &c).map_err(|e| LoaderError::io(format!("cannot pin {}", path.display()), e))
}

/// Reads `subc_record`: a port bitmap, or (receiver groups) audience words
/// resolved through the kernel's own `subc_members` in the generation the
/// packet read.
#[derive(Clone)]
struct RecordDecoder {
    record: CStruct,
    port_words: u32,
    audience_slots: u32,
}

impl RecordDecoder {
    fn decode(&self, v: &[u8], members: Option<BorrowedFd<'_>>) -> Result<Record, LoaderError> {
        let s = &self.record;
        let ports = if self.audience_slots == 0 {
            let words: Vec<u64> = (0..self.port_words).map(|w| read_field(s, v, "ports", w)).collect();
            PortSet::from_words(&words)
        } else {
            let gbit = read_field(s, v, "gbit", 0) as u32;
            let mut set = PortSet::default();
            for slot in 0..self.audience_slots {
                set = set.union(&audience_members(members, read_field(s, v, "aud", slot) as u32, gbit)?);
            }
            set
        };
        Ok(Record {
            decision: read_field(s, v, "decision", 0) as u32,
            drop: read_field(s, v, "drop", 0) != 0,
            ports: ports.iter().collect(),
        })
    }
}

/// The ports of audience word `aud` (generation `gbit`), from the kernel's
/// own `subc_members`.
fn audience_members(members: Option<BorrowedFd<'_>>, aud: u32, gbit: u32) -> Result<PortSet, LoaderError> {
    audience_ports(aud, gbit >> 31, |gg, w| {
        let Some(fd) = members else { return Ok(0) };
        let mut key = gg.to_ne_bytes().to_vec();
        key.extend_from_slice(&w.to_ne_bytes());
        let mut value = [0u8; 8];
        match sys::map_lookup(fd, &key, &mut value) {
            Ok(()) => Ok(u64::from_ne_bytes(value)),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(0),
            Err(e) => Err(LoaderError::io("subc_members", e)),
        }
    })
}

/// Runs packets through a loaded program from any thread (owns duplicates
/// of the program's and the record map's fds).
pub struct Runner {
    prog: OwnedFd,
    record: Option<OwnedFd>,
    members: Option<OwnedFd>,
    decoder: RecordDecoder,
}

impl Runner {
    /// `BPF_PROG_TEST_RUN` with `repeat` repetitions: verdict, average ns,
    /// and the recorded decision (of test builds).
    pub fn run(&self, packet: &[u8], repeat: u32) -> Result<(u32, u64, Option<Record>), LoaderError> {
        self.run_with(packet, repeat, None)
    }

    /// [`Runner::run`] of a TC program with the frame's interfaces: a frame
    /// that came in on `ctx.ingress_ifindex` (a label-mode ingress pushes
    /// only frames from its own endpoints' interfaces).
    pub fn run_with(&self, packet: &[u8], repeat: u32, ctx: Option<SkbContext>) -> Result<(u32, u64, Option<Record>), LoaderError> {
        let run = sys::prog_test_run_with(self.prog.as_fd(), packet, repeat, ctx).map_err(|e| LoaderError::io("BPF_PROG_TEST_RUN", e))?;
        let record = match &self.record {
            None => None,
            Some(fd) => {
                let mut v = vec![0u8; self.decoder.record.size as usize];
                sys::map_lookup(fd.as_fd(), &0u32.to_ne_bytes(), &mut v).map_err(|e| LoaderError::io("subc_record", e))?;
                Some(self.decoder.decode(&v, self.members.as_ref().map(|m| m.as_fd()))?)
            }
        };
        Ok((run.retval, run.ns, record))
    }
}
