//! What `subc attach` and the service's eBPF targets leave behind: pins
//! under bpffs (the data plane outlives the process) and a record under
//! `/run/subc/<name>` for `subc status` and `subc detach`; the one install
//! sequence that makes them ([`Deployment::install`]); and the status read
//! back from the pins.

use crate::attach::{attach, detach_clsact, AttachKind, AttachMode, Attachment};
use crate::dataplane::{memlock, Dataplane};
use crate::pinned::replace_programs;
use crate::sys;
use crate::LoaderError;
use libbpf_rs::{MapCore, MapFlags, MapHandle};
use serde::{Deserialize, Serialize};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use subc_backend_ebpf::{Hook, Model, TargetConfig};
use subc_backend_ebpf::{MapRole, MapType};

/// What `subc attach` leaves in `/run/subc/<name>/deployment.json`.
#[derive(Debug, Serialize, Deserialize)]
pub struct Deployment {
    pub name: String,
    pub pin_dir: PathBuf,
    pub attachments: Vec<Attachment>,
}

/// Where `subc` keeps deployment records.
pub fn state_dir(name: &str) -> Result<PathBuf, LoaderError> {
    below("/run/subc", name)
}

pub fn default_pin_dir(name: &str) -> Result<PathBuf, LoaderError> {
    below("/sys/fs/bpf/subc", name)
}

/// `root/name`, for a deployment name that is one plain path component
/// (no separator, not `.` or `..`, no NUL): whatever a caller passes, the
/// path stays inside `root`, so removing a deployment cannot remove more.
fn below(root: &str, name: &str) -> Result<PathBuf, LoaderError> {
    let mut parts = Path::new(name).components();
    match (parts.next(), parts.next()) {
        (Some(std::path::Component::Normal(c)), None) if c == name && !name.contains('\0') => Ok(Path::new(root).join(name)),
        _ => Err(LoaderError::BadName { name: name.chars().take(64).collect() }),
    }
}

impl Deployment {
    /// Installs `dp` (loaded, its tables filled) as the deployment `name`:
    /// writes `cfg` to its maps and pins it; then, if a deployment `name`
    /// exists, points its live attachments at the new programs (under its
    /// pins: the interfaces are never without a program), attaches them
    /// to those of `ifaces` it was not on, and detaches them from
    /// interfaces not in `ifaces` (a device of a fabric that lost a port);
    /// if not, pins it
    /// afresh under `pin_dir` and attaches it to each of `ifaces` with
    /// `mode` (a failed attach removes the pins). Saves the record last.
    pub fn install(
        name: &str,
        dp: &Dataplane,
        cfg: &TargetConfig,
        pin_dir: &Path,
        ifaces: &[String],
        mode: AttachMode,
    ) -> Result<Deployment, LoaderError> {
        dp.configure(cfg)?;
        let deployment = match Deployment::open(name) {
            Ok((mut d, _)) => {
                dp.pin(&d.pin_dir)?;
                replace_programs(&d, dp)?;
                // Interfaces the deployment is not on yet (a device of a
                // fabric that gained a port): attached as a fresh install's.
                let new: Vec<&String> = ifaces.iter().filter(|i| !d.attachments.iter().any(|a| &a.iface == *i)).collect();
                for iface in new {
                    let added = attach(dp, iface, Some(mode), Some(&d.pin_dir))?;
                    d.attachments.extend(added);
                }
                // Interfaces it is on no longer (a port the device lost).
                let (kept, gone): (Vec<Attachment>, Vec<Attachment>) = d.attachments.into_iter().partition(|a| ifaces.contains(&a.iface));
                gone.iter().for_each(detach);
                d.attachments = kept;
                d
            }
            Err(_) => {
                let _ = std::fs::remove_dir_all(pin_dir);
                dp.pin(pin_dir)?;
                let mut attachments = vec![];
                for iface in ifaces {
                    match attach(dp, iface, Some(mode), Some(pin_dir)) {
                        Ok(a) => attachments.extend(a),
                        Err(e) => {
                            let _ = std::fs::remove_dir_all(pin_dir);
                            return Err(e);
                        }
                    }
                }
                Deployment { name: name.to_string(), pin_dir: pin_dir.to_path_buf(), attachments }
            }
        };
        deployment.save(&dp.model)?;
        Ok(deployment)
    }

    pub fn save(&self, model: &Model) -> Result<(), LoaderError> {
        let dir = state_dir(&self.name)?;
        std::fs::create_dir_all(&dir).map_err(|e| LoaderError::io(format!("cannot create {}", dir.display()), e))?;
        let write = |name: &str, text: String| {
            std::fs::write(dir.join(name), text).map_err(|e| LoaderError::io(format!("cannot write {}", dir.join(name).display()), e))
        };
        write("deployment.json", serde_json::to_string_pretty(self).expect("serializes"))?;
        write("maps.json", serde_json::to_string_pretty(&model.maps_json()).expect("serializes"))
    }

    pub fn open(name: &str) -> Result<(Deployment, Model), LoaderError> {
        let dir = state_dir(name)?;
        let read = |f: &str| {
            std::fs::read_to_string(dir.join(f))
                .map_err(|e| LoaderError::io(format!("no deployment `{name}` ({})", dir.join(f).display()), e))
        };
        let d: Deployment = serde_json::from_str(&read("deployment.json")?).map_err(LoaderError::Record)?;
        let m = Model::from_maps_json(&read("maps.json")?)?;
        Ok((d, m))
    }

    /// Detaches every program and removes the pins and the record.
    pub fn remove(self) -> Result<(), LoaderError> {
        self.attachments.iter().for_each(detach);
        let _ = std::fs::remove_dir_all(&self.pin_dir);
        if let Ok(dir) = state_dir(&self.name) {
            let _ = std::fs::remove_dir_all(dir);
        }
        Ok(())
    }
}

/// Detaches one attachment: its pinned link goes (the link with it), or its
/// clsact filter.
fn detach(a: &Attachment) {
    if let Some(p) = &a.link_pin {
        let _ = std::fs::remove_file(p);
    }
    if a.kind == AttachKind::Clsact {
        detach_clsact(a.ifindex);
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
pub fn status(name: &str) -> Result<Status, LoaderError> {
    let (d, model) = Deployment::open(name)?;
    let mut maps = vec![];
    let mut live_generation = 0;
    for def in &model.maps {
        let Ok(h) = MapHandle::from_pinned_path(d.pin_dir.join(&def.name)) else { continue };
        let entries = match def.map_type {
            MapType::Array | MapType::PercpuArray | MapType::Devmap => def.max_entries as usize,
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
        maps.push(MapStatus { name: def.name.clone(), role: def.role, entries, max_entries: def.max_entries, bytes: memlock(h.as_fd()) });
    }
    let mut programs = vec![];
    for prog in ["subc_xdp", "subc_tc", "subc_tc_fanout"] {
        if let Ok(h) = libbpf_rs::ProgramHandle::from_pinned_path(d.pin_dir.join(format!("prog_{prog}"))) {
            programs.push((prog.to_string(), sys::prog_verified_insns(h.as_fd())));
        }
    }
    Ok(Status { name: d.name, hook: model.hook, attachments: d.attachments, live_generation, programs, maps })
}
