//! The loader: everything that makes system calls (libbpf-rs 0.27).
//!
//! [`Dataplane`] loads a generated object, fills its maps, applies updates
//! (see [`crate::encode`] for the protocol: inactive generation, flip,
//! grace period, other generation), runs packets through
//! `BPF_PROG_TEST_RUN`, reads state back and reports what the verifier and
//! the maps cost. [`attach`] hooks a loaded program to an interface: XDP
//! through a link in native or generic mode, TC through a tcx link or, on
//! kernels without tcx, a clsact filter. [`Deployment`] is what `subc
//! attach` leaves behind: pins under bpffs (the data plane outlives the
//! process) and a record under `/run/subc` for `subc status` and `subc
//! detach`.
//!
//! The grace period is an RCU grace period: XDP and TC programs run inside
//! RCU read-side sections, and `membarrier(MEMBARRIER_CMD_GLOBAL)` waits
//! for `synchronize_rcu()`, so when it returns every packet that read the
//! old generation has finished.

use crate::encode::{MapOp, TableImage};
use crate::layout::{read_field, MapRole};
use crate::model::Model;
use crate::target::{config_op, NoMatch, TargetConfig};
use crate::{EbpfError, Hook};
use libbpf_rs::{MapCore, MapFlags, MapHandle, Object, ObjectBuilder, ProgramInput};
use serde::{Deserialize, Serialize};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use subc_lang::interp::{Slot, StateStore};
use subc_lang::spec::{Spec, StateKind};

/// Why `BPF_PROG_TEST_RUN` failed on `packet`: the frame itself if the
/// kernel refuses it for a program that does nothing, else the program.
fn test_run_error(hook: Hook, packet: &[u8], e: libbpf_rs::Error) -> EbpfError {
    if let Ok(true) = crate::frames::refuses(hook, packet) {
        if let Ok(Some(limits)) = crate::frames::frame_limits(hook, packet) {
            return EbpfError::FrameRefused { len: packet.len(), limits };
        }
    }
    EbpfError::bpf("BPF_PROG_TEST_RUN", e)
}

/// A loaded program and its maps.
pub struct Dataplane {
    obj: Object,
    pub model: Model,
    maps: Vec<Option<MapHandle>>,
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
}

/// What an update did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct UpdateReport {
    pub ops: usize,
    pub grace_us: u64,
    pub total_us: u64,
}

fn os_err(context: impl Into<String>) -> EbpfError {
    EbpfError::io(context, std::io::Error::last_os_error())
}

/// Applies map operations in order to `maps` (indexed like `model.maps`).
pub(crate) fn apply_ops(maps: &[Option<MapHandle>], model: &Model, ops: &[MapOp]) -> Result<(), EbpfError> {
    for op in ops {
        let m = maps[op.map].as_ref().ok_or_else(|| EbpfError::Kernel(format!("map {} is not in this build", model.maps[op.map].name)))?;
        let r = match &op.value {
            Some(v) => m.update(&op.key, v, MapFlags::ANY),
            None => match m.delete(&op.key) {
                // Deleting what is not there is what we wanted.
                Err(e) if e.kind() == libbpf_rs::ErrorKind::NotFound => Ok(()),
                r => r,
            },
        };
        r.map_err(|e| EbpfError::bpf(format!("map {}", model.maps[op.map].name), e))?;
    }
    Ok(())
}

/// The update protocol of [`crate::encode`] on `maps`, which hold `image`:
/// returns the report and the image after the update.
/// `image` becomes the image after it; on any error it stays the one before.
pub(crate) fn update_maps(
    maps: &[Option<MapHandle>],
    model: &Model,
    image: &mut TableImage,
    update: &subc_bdd::Update,
) -> Result<UpdateReport, EbpfError> {
    let t = Instant::now();
    let (plan, undo) = image.plan_in_place(model, update)?;
    let write = || -> Result<u64, EbpfError> {
        apply_ops(maps, model, &plan.prepare)?;
        if let Err(e) = apply_ops(maps, model, &plan.inactive) {
            let _ = apply_ops(maps, model, &plan.undo_inactive);
            return Err(e);
        }
        apply_ops(maps, model, &plan.flip)?;
        let g = Instant::now();
        grace_period();
        let grace_us = g.elapsed().as_micros() as u64;
        apply_ops(maps, model, &plan.live)?;
        Ok(grace_us)
    };
    match write() {
        Ok(grace_us) => Ok(UpdateReport { ops: plan.op_count(), grace_us, total_us: t.elapsed().as_micros() as u64 }),
        Err(e) => {
            image.rollback(undo);
            Err(e)
        }
    }
}

/// Waits until every BPF program run that started before the call has
/// finished (an RCU grace period); see the module doc.
pub fn grace_period() {
    // MEMBARRIER_CMD_GLOBAL = 1.
    let r = unsafe { libc::syscall(libc::SYS_membarrier, 1 as libc::c_int, 0 as libc::c_uint, 0 as libc::c_int) };
    if r != 0 {
        // Kernels with nohz_full refuse it; programs run for microseconds.
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub fn ifindex(name: &str) -> Result<u32, EbpfError> {
    let c = std::ffi::CString::new(name).map_err(|_| EbpfError::Target(format!("bad interface name `{name}`")))?;
    let idx = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if idx == 0 {
        return Err(EbpfError::Target(format!("no interface `{name}`")));
    }
    Ok(idx)
}

/// `memlock` of a BPF fd, from `/proc/self/fdinfo`.
fn memlock(fd: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}"))
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("memlock:").map(|v| v.trim().parse().unwrap_or(0))))
        .unwrap_or(0)
}

impl Dataplane {
    /// Loads an object generated for `model` (maps empty).
    pub fn load(object: &[u8], model: Model) -> Result<Dataplane, EbpfError> {
        let t = Instant::now();
        let open = ObjectBuilder::default().open_memory(object).map_err(|e| EbpfError::bpf("cannot open the BPF object", e))?;
        let obj = open.load().map_err(|e| EbpfError::bpf("the kernel rejected the program", e))?;
        let load_time = t.elapsed();
        let mut maps = vec![];
        for def in &model.maps {
            let h = match obj.maps().find(|m| m.name() == def.name.as_str()) {
                Some(m) => Some(MapHandle::try_from(&m).map_err(|e| EbpfError::bpf(format!("map {}", def.name), e))?),
                None if def.only_if.is_some() => None,
                None => return Err(EbpfError::Kernel(format!("the object has no map {}", def.name))),
            };
            maps.push(h);
        }
        Ok(Dataplane { obj, model, maps, image: None, load_time })
    }

    /// Loads an object and fills its maps with `image` (generation 0 live).
    pub fn load_with_image(object: &[u8], model: Model, image: TableImage) -> Result<Dataplane, EbpfError> {
        let mut dp = Dataplane::load(object, model)?;
        let ops = image.initial_ops(&dp.model);
        dp.apply(&ops)?;
        dp.apply(&[config_op(&dp.model, NoMatch::Pass, 0)])?;
        dp.image = Some(image);
        Ok(dp)
    }

    pub fn image(&self) -> Option<&TableImage> {
        self.image.as_ref()
    }

    fn map(&self, id: usize) -> Result<&MapHandle, EbpfError> {
        self.maps[id].as_ref().ok_or_else(|| EbpfError::Kernel(format!("map {} is not in this build", self.model.maps[id].name)))
    }

    /// Applies operations in order.
    pub fn apply(&self, ops: &[MapOp]) -> Result<(), EbpfError> {
        apply_ops(&self.maps, &self.model, ops)
    }

    /// Applies an IR update atomically (see [`crate::encode`]). On a
    /// capacity error nothing is touched; on a kernel error while writing
    /// the inactive generation, it is restored and the old tables stay live.
    pub fn update(&mut self, update: &subc_bdd::Update) -> Result<UpdateReport, EbpfError> {
        let image = self.image.as_mut().ok_or_else(|| EbpfError::Kernel("this data plane was loaded without a table image".into()))?;
        update_maps(&self.maps, &self.model, image, update)
    }

    /// Writes the egress of every port and the no-match action.
    pub fn configure(&self, cfg: &TargetConfig) -> Result<(), EbpfError> {
        let ops = cfg.ops(&self.model, &ifindex)?;
        self.apply(&ops)
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
    /// is [`EbpfError::FrameRefused`], with the kernel's limits.
    pub fn test_run(&self, packet: &[u8], now_ns: u64, no_match: NoMatch, repeat: u32) -> Result<TestRun, EbpfError> {
        self.apply(&[config_op(&self.model, no_match, now_ns)])?;
        let name = self.main_program_name();
        let prog = self.obj.progs_mut().find(|p| p.name() == name).ok_or_else(|| EbpfError::Kernel(format!("no program {name}")))?;
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
                let v = m.lookup(&0u32.to_ne_bytes(), MapFlags::ANY).map_err(|e| EbpfError::bpf("subc_record", e))?.unwrap_or_default();
                Some(decode_record(self.model.maps[self.model.ids.record].value_struct(), self.model.port_words, &v))
            }
        };
        Ok(TestRun { verdict, data, ns, record })
    }

    /// A handle that runs packets from another thread while this one
    /// updates the maps (for atomicity tests and benchmarks).
    pub fn runner(&self) -> Result<Runner, EbpfError> {
        let dup = |fd: i32| -> Result<OwnedFd, EbpfError> {
            let d = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
            if d < 0 {
                return Err(os_err("cannot duplicate a BPF fd"));
            }
            Ok(unsafe { OwnedFd::from_raw_fd(d) })
        };
        let prog = dup(self.program_fd(self.main_program_name())?)?;
        let record = match self.maps[self.model.ids.record].as_ref() {
            Some(m) => Some(dup(m.as_fd().as_raw_fd())?),
            None => None,
        };
        let s = self.model.maps[self.model.ids.record].value_struct().clone();
        Ok(Runner { prog, record, record_struct: s, port_words: self.model.port_words })
    }

    /// Clears `subc_record` (so a run that records nothing is visible).
    pub fn clear_record(&self) -> Result<(), EbpfError> {
        if let Some(m) = self.maps[self.model.ids.record].as_ref() {
            let size = self.model.maps[self.model.ids.record].value.size() as usize;
            m.update(&0u32.to_ne_bytes(), &vec![0u8; size], MapFlags::ANY).map_err(|e| EbpfError::bpf("subc_record", e))?;
        }
        Ok(())
    }

    /// The stream state and variables, as the reference interpreter keeps them.
    pub fn read_state(&self, spec: &Spec) -> Result<StateStore, EbpfError> {
        let mut store = StateStore::new(spec);
        for (i, s) in spec.states.iter().enumerate() {
            let id = self.model.ids.states[i];
            let m = self.map(id)?;
            let st = self.model.maps[id].value_struct();
            for k in 0..s.slots() {
                let v = m.lookup(&k.to_ne_bytes(), MapFlags::ANY).map_err(|e| EbpfError::bpf("state map", e))?.unwrap_or_default();
                let f = |name: &str, idx: u32| read_field(st, &v, name, idx);
                store.vars[i][k as usize] = match &s.kind {
                    StateKind::Counter { .. } => Slot::Counter { window: f("window", 0), count: f("count", 0) as u32 },
                    StateKind::Avg { samples, .. } => {
                        Slot::Avg { ring: (0..*samples).map(|j| f("ring", j)).collect(), next: f("next", 0) as u32, sum: f("sum", 0) }
                    }
                    StateKind::Ewma { .. } => Slot::Ewma { ewma: f("ewma", 0), count: f("count", 0) as u32 },
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
            verified.push((name.clone(), prog_verified_insns(p.as_fd().as_raw_fd())));
            insns.push((name, p.insn_cnt()));
        }
        let map_bytes = self.maps.iter().flatten().map(|m| memlock(m.as_fd().as_raw_fd())).sum();
        LoadStats { verified_insns: verified, insns, load_ms: self.load_time.as_secs_f64() * 1e3, map_bytes }
    }

    /// Pins every map and program under `dir` (created if needed).
    pub fn pin(&self, dir: &Path) -> Result<(), EbpfError> {
        std::fs::create_dir_all(dir).map_err(|e| EbpfError::io(format!("cannot create {}", dir.display()), e))?;
        for (def, m) in self.model.maps.iter().zip(&self.maps) {
            if let Some(m) = m {
                pin_fd(m.as_fd().as_raw_fd(), &dir.join(&def.name))?;
            }
        }
        for p in self.obj.progs() {
            pin_fd(p.as_fd().as_raw_fd(), &dir.join(format!("prog_{}", p.name().to_string_lossy())))?;
        }
        Ok(())
    }

    /// The fd of a program by name.
    pub fn program_fd(&self, name: &str) -> Result<i32, EbpfError> {
        self.obj
            .progs()
            .find(|p| p.name() == name)
            .map(|p| p.as_fd().as_raw_fd())
            .ok_or_else(|| EbpfError::Kernel(format!("no program {name}")))
    }
}

fn decode_record(s: &crate::layout::CStruct, port_words: u32, v: &[u8]) -> Record {
    let mut ports = vec![];
    for w in 0..port_words {
        let bits = read_field(s, v, "ports", w);
        ports.extend((0..64).filter(|b| bits >> b & 1 == 1).map(|b| w * 64 + b));
    }
    Record { decision: read_field(s, v, "decision", 0) as u32, drop: read_field(s, v, "drop", 0) != 0, ports }
}

/// Runs packets through a loaded program from any thread (owns duplicates
/// of the program's and the record map's fds).
pub struct Runner {
    prog: OwnedFd,
    record: Option<OwnedFd>,
    record_struct: crate::layout::CStruct,
    port_words: u32,
}

impl Runner {
    /// `BPF_PROG_TEST_RUN` with `repeat` repetitions: verdict, average ns,
    /// and the recorded decision (of test builds).
    pub fn run(&self, packet: &[u8], repeat: u32) -> Result<(u32, u64, Option<Record>), EbpfError> {
        let mut out = vec![0u8; packet.len() + 256];
        let mut opts: libbpf_sys::bpf_test_run_opts = unsafe { std::mem::zeroed() };
        opts.sz = std::mem::size_of::<libbpf_sys::bpf_test_run_opts>() as _;
        opts.data_in = packet.as_ptr().cast();
        opts.data_size_in = packet.len() as u32;
        opts.data_out = out.as_mut_ptr().cast();
        opts.data_size_out = out.len() as u32;
        opts.repeat = repeat as i32;
        if unsafe { libbpf_sys::bpf_prog_test_run_opts(self.prog.as_raw_fd(), &mut opts) } != 0 {
            return Err(os_err("BPF_PROG_TEST_RUN"));
        }
        let record = match &self.record {
            None => None,
            Some(fd) => {
                let mut v = vec![0u8; self.record_struct.size as usize];
                let key = 0u32;
                if unsafe { libbpf_sys::bpf_map_lookup_elem(fd.as_raw_fd(), (&key as *const u32).cast(), v.as_mut_ptr().cast()) } != 0 {
                    return Err(os_err("subc_record"));
                }
                Some(decode_record(&self.record_struct, self.port_words, &v))
            }
        };
        Ok((opts.retval, opts.duration as u64, record))
    }
}

fn prog_verified_insns(fd: i32) -> u32 {
    let mut info: libbpf_sys::bpf_prog_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libbpf_sys::bpf_prog_info>() as u32;
    let r = unsafe { libbpf_sys::bpf_prog_get_info_by_fd(fd, &mut info, &mut len) };
    if r != 0 {
        return 0;
    }
    info.verified_insns
}

fn pin_fd(fd: i32, path: &Path) -> Result<(), EbpfError> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| EbpfError::Target("bad pin path".into()))?;
    if path.exists() {
        let _ = std::fs::remove_file(path);
    }
    if unsafe { libbpf_sys::bpf_obj_pin(fd, c.as_ptr()) } != 0 {
        return Err(os_err(format!("cannot pin {}", path.display())));
    }
    Ok(())
}

/// How to hook a program to an interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AttachMode {
    /// XDP in the driver, else generic XDP.
    XdpAuto,
    XdpNative,
    XdpGeneric,
    /// tcx, else a clsact filter.
    TcAuto,
    Tcx,
    Clsact,
}

/// One program attached to one interface.
#[derive(Debug, Serialize, Deserialize)]
pub struct Attachment {
    pub iface: String,
    pub ifindex: u32,
    pub program: String,
    /// `xdp-native`, `xdp-generic`, `tcx` or `clsact`.
    pub kind: String,
    /// The pinned link (XDP and tcx), if pinned.
    pub link_pin: Option<PathBuf>,
    /// The link's fd while this process holds it; dropping it detaches an
    /// unpinned link.
    #[serde(skip)]
    pub link: Option<OwnedFd>,
    /// A clsact filter this process removes when the attachment is dropped.
    #[serde(skip)]
    owned_clsact: bool,
}

impl Drop for Attachment {
    fn drop(&mut self) {
        // A clsact filter is not a link: it stays until removed. Unpinned
        // attachments belong to this process, so it goes with them.
        if self.owned_clsact {
            detach_clsact(self.ifindex);
        }
    }
}

fn link_create(prog_fd: i32, ifindex: u32, attach: libbpf_sys::bpf_attach_type, flags: u32) -> Result<OwnedFd, std::io::Error> {
    let mut opts: libbpf_sys::bpf_link_create_opts = unsafe { std::mem::zeroed() };
    opts.sz = std::mem::size_of::<libbpf_sys::bpf_link_create_opts>() as _;
    opts.flags = flags;
    let fd = unsafe { libbpf_sys::bpf_link_create(prog_fd, ifindex as i32, attach, &opts) };
    if fd < 0 {
        return Err(std::io::Error::from_raw_os_error(-fd));
    }
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

const CLSACT_HANDLE: u32 = 0x5c;
const CLSACT_PRIORITY: u32 = 0x5c;

fn attach_clsact(prog_fd: i32, ifindex: u32) -> Result<(), EbpfError> {
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(prog_fd) };
    let mut b = libbpf_rs::TcHookBuilder::new(fd);
    b.ifindex(ifindex as i32).replace(true).handle(CLSACT_HANDLE).priority(CLSACT_PRIORITY);
    let mut hook = b.hook(libbpf_rs::TC_INGRESS);
    hook.create().map_err(|e| EbpfError::bpf("cannot create the clsact qdisc", e))?;
    hook.attach().map_err(|e| EbpfError::bpf("cannot attach the clsact filter", e))?;
    Ok(())
}

fn detach_clsact(ifindex: u32) {
    // bpf_tc_detach needs no program fd, but the builder wants one.
    let devnull = std::fs::File::open("/dev/null");
    if let Ok(f) = devnull {
        let mut b = libbpf_rs::TcHookBuilder::new(f.as_fd());
        b.ifindex(ifindex as i32).handle(CLSACT_HANDLE).priority(CLSACT_PRIORITY);
        let mut hook = b.hook(libbpf_rs::TC_INGRESS);
        let _ = hook.detach();
    }
}

/// Attaches `program` (a program of `dp`) to `iface`. With `pin_dir`, the
/// link is pinned there and outlives the process.
pub fn attach_program(
    dp: &Dataplane,
    program: &str,
    iface: &str,
    mode: AttachMode,
    pin_dir: Option<&Path>,
) -> Result<Attachment, EbpfError> {
    let idx = ifindex(iface)?;
    let fd = dp.program_fd(program)?;
    let (kind, link) = match mode {
        AttachMode::XdpNative | AttachMode::XdpGeneric | AttachMode::XdpAuto => {
            let generic = |e: Option<std::io::Error>| -> Result<OwnedFd, EbpfError> {
                link_create(fd, idx, libbpf_sys::BPF_XDP, libbpf_sys::XDP_FLAGS_SKB_MODE).map_err(|g| {
                    let native = e.map(|e| format!(" (native: {e})")).unwrap_or_default();
                    EbpfError::io(format!("cannot attach generic XDP to {iface}{native}"), g)
                })
            };
            match mode {
                AttachMode::XdpGeneric => ("xdp-generic", Some(generic(None)?)),
                _ => match link_create(fd, idx, libbpf_sys::BPF_XDP, libbpf_sys::XDP_FLAGS_DRV_MODE) {
                    Ok(l) => ("xdp-native", Some(l)),
                    Err(e) if mode == AttachMode::XdpAuto => ("xdp-generic", Some(generic(Some(e))?)),
                    Err(e) => return Err(EbpfError::io(format!("cannot attach native XDP to {iface}"), e)),
                },
            }
        }
        AttachMode::Tcx | AttachMode::TcAuto | AttachMode::Clsact => {
            let tcx = if mode == AttachMode::Clsact { None } else { Some(link_create(fd, idx, libbpf_sys::BPF_TCX_INGRESS, 0)) };
            match tcx {
                Some(Ok(l)) => ("tcx", Some(l)),
                Some(Err(e)) if mode == AttachMode::Tcx => return Err(EbpfError::io(format!("cannot attach tcx to {iface}"), e)),
                _ => {
                    attach_clsact(fd, idx)?;
                    ("clsact", None)
                }
            }
        }
    };
    let mut link_pin = None;
    if let (Some(dir), Some(l)) = (pin_dir, &link) {
        let p = dir.join(format!("link_{kind}_{iface}"));
        pin_fd(l.as_raw_fd(), &p)?;
        link_pin = Some(p);
    }
    let owned_clsact = kind == "clsact" && pin_dir.is_none();
    Ok(Attachment {
        iface: iface.to_string(),
        ifindex: idx,
        program: program.to_string(),
        kind: kind.to_string(),
        link_pin,
        link,
        owned_clsact,
    })
}

/// Attaches a data plane for its hook: `subc_xdp` (and `subc_tc_fanout` on
/// TC ingress of the same interface), or `subc_tc`.
pub fn attach(dp: &Dataplane, iface: &str, mode: Option<AttachMode>, pin_dir: Option<&Path>) -> Result<Vec<Attachment>, EbpfError> {
    match dp.model.hook {
        Hook::Xdp => {
            let mode = mode.unwrap_or(AttachMode::XdpAuto);
            if !matches!(mode, AttachMode::XdpAuto | AttachMode::XdpNative | AttachMode::XdpGeneric) {
                return Err(EbpfError::Target(format!("an XDP program attaches with an XDP mode, not {mode:?}")));
            }
            let fanout = attach_program(dp, "subc_tc_fanout", iface, AttachMode::TcAuto, pin_dir)?;
            let xdp = attach_program(dp, "subc_xdp", iface, mode, pin_dir)?;
            Ok(vec![xdp, fanout])
        }
        Hook::Tc => {
            let mode = mode.unwrap_or(AttachMode::TcAuto);
            if !matches!(mode, AttachMode::TcAuto | AttachMode::Tcx | AttachMode::Clsact) {
                return Err(EbpfError::Target(format!("a TC program attaches with a TC mode, not {mode:?}")));
            }
            Ok(vec![attach_program(dp, "subc_tc", iface, mode, pin_dir)?])
        }
    }
}

/// What `subc attach` leaves in `/run/subc/<name>/deployment.json`.
#[derive(Debug, Serialize, Deserialize)]
pub struct Deployment {
    pub name: String,
    pub pin_dir: PathBuf,
    pub attachments: Vec<Attachment>,
}

/// Where `subc` keeps deployment records.
pub fn state_dir(name: &str) -> Result<PathBuf, EbpfError> {
    below("/run/subc", name)
}

pub fn default_pin_dir(name: &str) -> Result<PathBuf, EbpfError> {
    below("/sys/fs/bpf/subc", name)
}

/// `root/name`, for a deployment name that is one plain path component
/// (no separator, not `.` or `..`, no NUL): whatever a caller passes, the
/// path stays inside `root`, so removing a deployment cannot remove more.
fn below(root: &str, name: &str) -> Result<PathBuf, EbpfError> {
    let mut parts = Path::new(name).components();
    match (parts.next(), parts.next()) {
        (Some(std::path::Component::Normal(c)), None) if c == name && !name.contains('\0') => Ok(Path::new(root).join(name)),
        _ => Err(EbpfError::BadName { name: name.chars().take(64).collect() }),
    }
}

impl Deployment {
    pub fn save(&self, model: &Model) -> Result<(), EbpfError> {
        let dir = state_dir(&self.name)?;
        std::fs::create_dir_all(&dir).map_err(|e| EbpfError::io(format!("cannot create {}", dir.display()), e))?;
        let write = |name: &str, text: String| {
            std::fs::write(dir.join(name), text).map_err(|e| EbpfError::io(format!("cannot write {}", dir.join(name).display()), e))
        };
        write("deployment.json", serde_json::to_string_pretty(self).expect("serializes"))?;
        write("maps.json", serde_json::to_string_pretty(&model.maps_json()).expect("serializes"))
    }

    pub fn open(name: &str) -> Result<(Deployment, Model), EbpfError> {
        let dir = state_dir(name)?;
        let read = |f: &str| {
            std::fs::read_to_string(dir.join(f))
                .map_err(|e| EbpfError::io(format!("no deployment `{name}` ({})", dir.join(f).display()), e))
        };
        let d: Deployment = serde_json::from_str(&read("deployment.json")?).map_err(|e| EbpfError::Target(e.to_string()))?;
        let m = Model::from_maps_json(&read("maps.json")?)?;
        Ok((d, m))
    }

    /// Detaches every program and removes the pins and the record.
    pub fn remove(mut self) -> Result<(), EbpfError> {
        for a in &mut self.attachments {
            if let Some(p) = &a.link_pin {
                let _ = std::fs::remove_file(p);
            }
            if a.kind == "clsact" {
                detach_clsact(a.ifindex);
            }
        }
        let _ = std::fs::remove_dir_all(&self.pin_dir);
        if let Ok(dir) = state_dir(&self.name) {
            let _ = std::fs::remove_dir_all(dir);
        }
        Ok(())
    }
}

/// One map as `subc status` shows it.
#[derive(Debug, Serialize)]
pub struct MapStatus {
    pub name: String,
    pub role: MapRole,
    pub entries: usize,
    pub max_entries: u32,
    pub bytes: u64,
}

#[derive(Debug, Serialize)]
pub struct Status {
    pub name: String,
    pub hook: Hook,
    pub attachments: Vec<Attachment>,
    pub live_generation: u32,
    pub programs: Vec<(String, u32)>,
    pub maps: Vec<MapStatus>,
}

/// Reads a deployment's pinned maps and programs.
pub fn status(name: &str) -> Result<Status, EbpfError> {
    let (d, model) = Deployment::open(name)?;
    let mut maps = vec![];
    let mut live_generation = 0;
    for def in &model.maps {
        let Ok(h) = MapHandle::from_pinned_path(d.pin_dir.join(&def.name)) else { continue };
        let entries = match def.map_type {
            crate::layout::MapType::Array | crate::layout::MapType::Devmap => def.max_entries as usize,
            _ => h.keys().count(),
        };
        if def.role == MapRole::Generation {
            live_generation = h
                .lookup(&0u32.to_ne_bytes(), MapFlags::ANY)
                .ok()
                .flatten()
                .map(|v| u32::from_ne_bytes(v[..4].try_into().unwrap()))
                .unwrap_or(0);
        }
        maps.push(MapStatus {
            name: def.name.clone(),
            role: def.role,
            entries,
            max_entries: def.max_entries,
            bytes: memlock(h.as_fd().as_raw_fd()),
        });
    }
    let mut programs = vec![];
    for prog in ["subc_xdp", "subc_tc", "subc_tc_fanout"] {
        if let Ok(h) = libbpf_rs::ProgramHandle::from_pinned_path(d.pin_dir.join(format!("prog_{prog}"))) {
            programs.push((prog.to_string(), prog_verified_insns(h.as_fd().as_raw_fd())));
        }
    }
    Ok(Status { name: d.name, hook: model.hook, attachments: d.attachments, live_generation, programs, maps })
}

/// Whether this process may load, run and attach the programs: it is root
/// (callers also pin under bpffs, owned by root, and run `ip`), and its
/// effective capabilities hold what `caps_suffice` asks. So root in a
/// container without them (Docker's default set) is turned away here, not
/// by the kernel at load, and a process with the capabilities but another
/// uid is turned away too, although the kernel would load its programs.
/// Without a readable `/proc/self/status`, root alone decides. Tests skip
/// kernel work when this is false, unless `CI=true`.
pub fn can_load_bpf() -> bool {
    let root = unsafe { libc::geteuid() == 0 };
    root && effective_caps().is_none_or(caps_suffice)
}

/// The `CapEff` bits of this process.
fn effective_caps() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

/// Whether effective capabilities `cap_eff` (bit `n` is capability `n`)
/// let a process load and attach the programs: CAP_NET_ADMIN, for XDP and
/// TC programs and for attaching them through netlink (CAP_SYS_ADMIN
/// stands in for it at load, not at attach); and CAP_SYS_ADMIN, or
/// CAP_BPF with CAP_PERFMON. Without CAP_PERFMON the verifier rejects the
/// programs' variable offsets into map values ("pointer arithmetic of map
/// value goes out of range, prohibited for !root"), so CAP_BPF and
/// CAP_NET_ADMIN alone are not enough. The kernel asks for these in the
/// initial user namespace, so inside another one `CapEff` overstates them.
fn caps_suffice(cap_eff: u64) -> bool {
    const CAP_NET_ADMIN: u32 = 12;
    const CAP_SYS_ADMIN: u32 = 21;
    const CAP_PERFMON: u32 = 38;
    const CAP_BPF: u32 = 39;
    let has = |c: u32| cap_eff & (1 << c) != 0;
    has(CAP_NET_ADMIN) && (has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)))
}

#[cfg(test)]
mod tests {
    use super::caps_suffice;

    fn caps(bits: &[u32]) -> u64 {
        bits.iter().fold(0, |m, b| m | 1 << b)
    }

    /// The sets tried with `setpriv --bounding-set` as root on Linux 6.18:
    /// the kernel tests pass with the first three, and the kernel refuses
    /// the program (EACCES, "prohibited for !root") with the fourth.
    #[test]
    fn capability_sets() {
        assert!(caps_suffice(0x0000_01ff_feff_ffff), "root's full set, less CAP_SYS_RESOURCE");
        assert!(caps_suffice(caps(&[12, 38, 39])), "CAP_NET_ADMIN, CAP_PERFMON, CAP_BPF");
        assert!(caps_suffice(caps(&[12, 21])), "CAP_NET_ADMIN, CAP_SYS_ADMIN");
        assert!(!caps_suffice(caps(&[12, 39])), "CAP_NET_ADMIN, CAP_BPF: the verifier refuses");
        assert!(!caps_suffice(caps(&[38, 39])), "no CAP_NET_ADMIN");
        assert!(!caps_suffice(caps(&[21])), "CAP_SYS_ADMIN alone loads, but cannot attach");
        assert!(!caps_suffice(0));
    }
}
