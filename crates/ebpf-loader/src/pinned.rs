//! A deployed data plane reopened from its pins by a process that did not
//! load it: the compiler service after a restart (or a crash).
//!
//! The table maps cannot be decoded back into IR pipelines on their own
//! (the encoding is lossy: a default entry and a range become intervals),
//! so a deployer keeps the image it installed (pipelines, and the slots
//! and update ids of `TableImage::parts`, which updates move) next to the
//! pins, and [`PinnedTables::check`] reads every table map back and
//! compares it, key by key, with what that image encodes to. Only an exact
//! match makes the image trusted; anything else (a crash between writing
//! the maps and the image) is reported, and the deployer installs anew. Updates then follow the same protocol as [`Dataplane::update`].
//!
//! [`replace_programs`] points existing attachments at a new build
//! atomically (`bpf_link_update`; a replacing filter for clsact), so a
//! reinstall never leaves an interface without a program.
//! [`PinnedProgram`] runs packets through a pinned program.
//!
//! The per-port counters ([`PinnedTables::port_counters`]) are read from
//! the pins as the loading process reads them: they are the program's, so
//! a restart of the process that reads them changes nothing.

use crate::attach::{attach_program, AttachMode};
use crate::dataplane::{apply_ops, map_memories, update_maps, Dataplane, UpdateReport};
use crate::deployment::Deployment;
use crate::sys::MapMemory;
use crate::sys::{self, ProgRun};
use crate::{LoaderError, NoImage, PortCounter};
use libbpf_rs::{MapCore, MapFlags, MapHandle};
use std::collections::BTreeMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use subc_backend_ebpf::Model;
use subc_backend_ebpf::{MapOp, TableImage};
use subc_backend_ebpf::{MapRole, MapType};

/// The maps whose contents are the tables (both generations): what a
/// reopened deployment checks.
fn is_table_map(role: MapRole) -> bool {
    matches!(
        role,
        MapRole::Generation
            | MapRole::Roots
            | MapRole::Exact
            | MapRole::Lpm
            | MapRole::Sorted
            | MapRole::Leaves
            | MapRole::Updates
            | MapRole::BitIntervals
            | MapRole::BitRows
            | MapRole::BitOrder
            | MapRole::BitLeaves
    )
}

/// A deployment's pinned maps, and the image they hold once checked.
pub struct PinnedTables {
    pub model: Model,
    maps: Vec<Option<MapHandle>>,
    /// The memory of maps created `BPF_F_MMAPABLE`, for partial writes.
    memory: Vec<Option<MapMemory>>,
    image: Option<TableImage>,
}

impl PinnedTables {
    /// Opens the pinned maps under `pin_dir`; every table map must be there.
    pub fn open(pin_dir: &Path, model: Model) -> Result<PinnedTables, LoaderError> {
        let mut maps = vec![];
        for def in &model.maps {
            let path = pin_dir.join(&def.name);
            match MapHandle::from_pinned_path(&path) {
                Ok(h) => maps.push(Some(h)),
                Err(e) if is_table_map(def.role) && def.only_if.is_none() => return Err(LoaderError::PinnedMap { path, source: e }),
                Err(_) => maps.push(None),
            }
        }
        let memory = map_memories(&maps, &model);
        Ok(PinnedTables { model, maps, memory, image: None })
    }

    /// The generation packets read now.
    pub fn live_generation(&self) -> Result<u32, LoaderError> {
        let m = self.maps[self.model.ids.gen].as_ref().ok_or(LoaderError::GenerationNotPinned)?;
        let v = m.lookup(&0u32.to_ne_bytes(), MapFlags::ANY).map_err(|e| LoaderError::bpf("generation map", e))?.unwrap_or_default();
        Ok(v.get(..4).map(|b| u32::from_ne_bytes(b.try_into().expect("4 bytes"))).unwrap_or(0))
    }

    /// Reads every table map and compares it with what `image` encodes to.
    /// Returns the differences (at most `limit`), none when the maps hold
    /// exactly `image`.
    pub fn check(&self, image: &TableImage, limit: usize) -> Result<Vec<String>, LoaderError> {
        let mut want: BTreeMap<usize, BTreeMap<Vec<u8>, Vec<u8>>> = BTreeMap::new();
        for op in image.initial_ops(&self.model) {
            if let Some(v) = op.value {
                want.entry(op.map).or_default().insert(op.key, v);
            }
        }
        let mut diffs = vec![];
        for (id, def) in self.model.maps.iter().enumerate() {
            if !is_table_map(def.role) {
                continue;
            }
            let Some(m) = self.maps[id].as_ref() else { continue };
            let empty = BTreeMap::new();
            let expect = want.get(&id).unwrap_or(&empty);
            let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
            match def.map_type {
                // Array slots always exist; slots the image does not name are unused.
                MapType::Array => {
                    for (k, v) in expect {
                        let got = m.lookup(k, MapFlags::ANY).map_err(|source| LoaderError::Map { map: def.name.clone(), source })?;
                        if got.as_deref() != Some(v.as_slice()) {
                            diffs.push(format!("{}[{}] differs", def.name, hex(k)));
                        }
                    }
                }
                _ => {
                    let mut seen = 0;
                    for k in m.keys() {
                        match expect.get(&k) {
                            None => diffs.push(format!("{}[{}] is not in the image", def.name, hex(&k))),
                            Some(v) => {
                                seen += 1;
                                let got =
                                    m.lookup(&k, MapFlags::ANY).map_err(|source| LoaderError::Map { map: def.name.clone(), source })?;
                                if got.as_deref() != Some(v.as_slice()) {
                                    diffs.push(format!("{}[{}] differs", def.name, hex(&k)));
                                }
                            }
                        }
                        if diffs.len() >= limit {
                            return Ok(diffs);
                        }
                    }
                    if seen < expect.len() {
                        diffs.push(format!("{}: {} entries of the image are missing", def.name, expect.len() - seen));
                    }
                }
            }
            if diffs.len() >= limit {
                break;
            }
        }
        diffs.truncate(limit);
        Ok(diffs)
    }

    /// Trusts `image` as what the maps hold (after [`PinnedTables::check`]).
    pub fn set_image(&mut self, image: TableImage) {
        self.image = Some(image);
    }

    pub fn image(&self) -> Option<&TableImage> {
        self.image.as_ref()
    }

    /// Applies an IR update atomically, as [`Dataplane::update`] does.
    pub fn update(&mut self, update: &subc_bdd::SetDiff) -> Result<UpdateReport, LoaderError> {
        let image = self.image.as_mut().ok_or(LoaderError::NoImage(NoImage::Unchecked))?;
        update_maps(&self.maps, &self.memory, &self.model, image, update)
    }

    /// Packets and bytes the pinned program handed to each logical port
    /// since it was loaded, summed over CPUs: only ports with at least one
    /// packet, in port order. Neither updates nor reopening the pins reset
    /// them; a full reinstall does (see [`PortCounter`]). A deployment
    /// whose program predates the counters is
    /// [`LoaderError::NoPortCounters`].
    pub fn port_counters(&self) -> Result<Vec<PortCounter>, LoaderError> {
        crate::counters::read(&self.maps, &self.model)
    }

    /// Applies map operations (e.g. a changed target config).
    pub fn apply(&self, ops: &[MapOp]) -> Result<(), LoaderError> {
        apply_ops(&self.maps, &self.memory, &self.model, ops)
    }
}

/// Points every attachment of `d` at the same-named program of `dp`,
/// atomically per attachment.
pub fn replace_programs(d: &Deployment, dp: &Dataplane) -> Result<(), LoaderError> {
    for a in &d.attachments {
        let prog = dp.program_fd(&a.program)?;
        match &a.link_pin {
            Some(pin) => {
                let link = open_pinned(pin, "link")?;
                sys::link_update(link.as_fd(), prog)
                    .map_err(|e| LoaderError::io(format!("cannot point the link {} at the new program", pin.display()), e))?;
            }
            // A clsact filter is replaced in place (same handle and priority).
            None => {
                attach_program(dp, &a.program, &a.iface, AttachMode::Clsact, Some(&d.pin_dir))?;
            }
        }
    }
    Ok(())
}

/// Opens a pinned BPF object (`what`: a link, a program).
fn open_pinned(pin: &Path, what: &str) -> Result<OwnedFd, LoaderError> {
    let c = sys::c_path(pin).ok_or_else(|| LoaderError::BadPinPath { path: pin.to_path_buf() })?;
    sys::obj_get(&c).map_err(|e| LoaderError::io(format!("cannot open the pinned {what} {}", pin.display()), e))
}

/// A program a deployment pinned, opened by a process that did not load
/// it, to run packets through it with `BPF_PROG_TEST_RUN`.
pub struct PinnedProgram(OwnedFd);

impl PinnedProgram {
    /// Opens the program pinned at `pin` (`<pin dir>/prog_<name>`).
    pub fn open(pin: &Path) -> Result<PinnedProgram, LoaderError> {
        open_pinned(pin, "program").map(PinnedProgram)
    }

    /// Runs `packet` through the program `repeat` times: its return value,
    /// average time and the packet after it.
    pub fn test_run(&self, packet: &[u8], repeat: u32) -> Result<ProgRun, LoaderError> {
        sys::prog_test_run(self.0.as_fd(), packet, repeat).map_err(|e| LoaderError::io("BPF_PROG_TEST_RUN", e))
    }
}
