//! The eBPF target: a generated XDP or TC program on a Linux interface,
//! through `subc-backend-ebpf`'s loader.
//!
//! Install: generate the C for the pipelines, compile it with clang, load
//! it with its tables, write the port config, pin maps and programs under
//! `deploy.bpffs_root/<target>`, and attach it (or, when a deployment of
//! that name exists, point its live links at the new program, so the
//! interface is never without one). The image the maps were filled with
//! (pipelines and variable-update ids) is kept next to the deployment
//! record in `/run/subc/<target>/`: a base, and a journal of the diffs
//! applied since ([`ImageFiles`]).
//!
//! Updates go through the pinned maps with the back end's double-buffered
//! protocol: packets see the old tables or the new ones, never a mix.
//!
//! Read back: the pinned table maps are read and compared, key by key,
//! with what the saved image encodes to; only an exact match is trusted.
//! A mismatch (the server died between writing the maps and the image)
//! reads as "nothing known", and the deployer installs anew, which
//! replaces the program atomically.

use super::image::ImageLog;
use super::{Driver, DriverError};
use crate::proto;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use subc_backend_ebpf::encode::TableImage;
use subc_backend_ebpf::loader::{self, AttachMode, Dataplane, Deployment};
use subc_backend_ebpf::pinned::{replace_programs, PinnedTables};
use subc_backend_ebpf::target::{Egress, NoMatch, TargetConfig};
use subc_backend_ebpf::{clang, write_program, EbpfError, EbpfOptions, Hook};
use subc_bdd::pipeline::Pipeline;
use subc_bdd::Update;
use subc_lang::program::{Update as VarUpdate, UpdateOp};
use subc_lang::spec::{Spec, StateId};

pub struct EbpfDriver {
    name: String,
    spec: Arc<Spec>,
    hook: Hook,
    mode: AttachMode,
    iface: String,
    config: TargetConfig,
    pin_dir: PathBuf,
    tables: Option<PinnedTables>,
    files: ImageFiles,
}

fn err(e: EbpfError) -> DriverError {
    match e {
        EbpfError::Capacity(_) | EbpfError::Diff(_) => DriverError::needs_install(e.to_string()),
        e => DriverError::transient(e.to_string()),
    }
}

/// The variable-update ids as `[[var, "set" | "add", value, id], ...]`.
fn ids_json(img: &TableImage) -> Value {
    json!(img.update_ids().iter().map(|(u, id)| (u.var, u.op, u.value, id)).collect::<Vec<_>>())
}

/// [`ids_json`] read back.
fn ids_of(v: &Value) -> Result<BTreeMap<VarUpdate, u32>, String> {
    let ids = Vec::<(StateId, UpdateOp, u64, u32)>::deserialize(v).map_err(|e| format!("update ids: {e}"))?;
    Ok(ids.into_iter().map(|(var, op, value, id)| (VarUpdate { var, op, value }, id)).collect())
}

/// The image a deployment's maps were filled with, kept next to its record
/// in `/run/subc/<target>` as a base and a journal ([`ImageLog`]), with the
/// variable-update ids as the meta.
struct ImageFiles(ImageLog);

impl ImageFiles {
    fn new(name: &str) -> Result<ImageFiles, DriverError> {
        Ok(ImageFiles(ImageLog::new(loader::state_dir(name).map_err(err)?)))
    }

    /// Writes the whole image as the new base and drops the journal.
    fn write_base(&mut self, img: &TableImage) -> Result<(), DriverError> {
        self.0.write_base(&img.pipelines().iter().collect::<Vec<_>>(), &ids_json(img))
    }

    /// Records an applied update (`img` is the image after it).
    fn append(&mut self, update: &Update, img: &TableImage) -> Result<(), DriverError> {
        self.0.append(update, &img.pipelines().iter().collect::<Vec<_>>(), &ids_json(img))
    }

    /// The base with the journal replayed.
    fn load(&mut self) -> Result<(Vec<Pipeline>, BTreeMap<VarUpdate, u32>), String> {
        let image = self.0.load()?.ok_or("no saved image")?;
        Ok((image.pipelines, ids_of(&image.meta)?))
    }
}

fn egress(e: &proto::EbpfEgress) -> Result<Egress, DriverError> {
    let opt = |s: &str| (!s.is_empty()).then(|| s.to_string());
    let dst_ip = match e.dst_ip.as_str() {
        "" => None,
        s => Some(s.parse().map_err(|_| DriverError::transient(format!("{s} is not an IPv4 address")))?),
    };
    let dst_port = match e.dst_port {
        0 => None,
        p => Some(u16::try_from(p).map_err(|_| DriverError::transient(format!("{p} is not a UDP port")))?),
    };
    Ok(Egress { interface: e.interface.clone(), dst_mac: opt(&e.dst_mac), src_mac: opt(&e.src_mac), dst_ip, dst_port })
}

impl EbpfDriver {
    pub fn new(name: &str, cfg: &proto::EbpfTarget, spec: Arc<Spec>, bpffs_root: &Path) -> Result<EbpfDriver, DriverError> {
        if !loader::can_load_bpf() {
            return Err(DriverError::transient("eBPF targets need root with CAP_NET_ADMIN, and CAP_SYS_ADMIN or CAP_BPF and CAP_PERFMON"));
        }
        let (hook, mode) = match (proto::Hook::try_from(cfg.hook), proto::XdpMode::try_from(cfg.xdp_mode)) {
            (Ok(proto::Hook::Tc), _) => (Hook::Tc, AttachMode::TcAuto),
            (_, Ok(proto::XdpMode::Native)) => (Hook::Xdp, AttachMode::XdpNative),
            (_, Ok(proto::XdpMode::Generic)) => (Hook::Xdp, AttachMode::XdpGeneric),
            _ => (Hook::Xdp, AttachMode::XdpAuto),
        };
        let mut ports = BTreeMap::new();
        for (p, e) in &cfg.ports {
            ports.insert(*p, egress(e)?);
        }
        let config = TargetConfig { no_match: if cfg.drop_unmatched { NoMatch::Drop } else { NoMatch::Pass }, ports };
        Ok(EbpfDriver {
            name: name.to_string(),
            spec,
            hook,
            mode,
            iface: cfg.interface.clone(),
            config,
            pin_dir: crate::names::child_path(bpffs_root, "target name", name).map_err(|e| DriverError::transient(e.to_string()))?,
            tables: None,
            files: ImageFiles::new(name)?,
        })
    }

    /// Opens the pins as the tables to update, trusting `image`.
    fn open_tables(&mut self, model: subc_backend_ebpf::Model, pin_dir: &Path, image: TableImage) -> Result<(), DriverError> {
        let mut t = PinnedTables::open(pin_dir, model).map_err(err)?;
        t.set_image(image);
        self.tables = Some(t);
        Ok(())
    }
}

impl Driver for EbpfDriver {
    fn read_back(&mut self) -> Result<Option<Vec<Pipeline>>, DriverError> {
        self.tables = None;
        let Ok((d, model)) = Deployment::open(&self.name) else { return Ok(None) };
        let (pipes, ids) = match self.files.load() {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(target_name = %self.name, error = %e, "the deployment has no readable image; it will be installed anew");
                return Ok(None);
            }
        };
        let tables = PinnedTables::open(&d.pin_dir, model.clone()).map_err(err)?;
        let live = tables.live_generation().map_err(err)?;
        let image = match TableImage::from_parts(&model, pipes.clone(), ids, live) {
            Ok(i) => i,
            Err(e) => {
                tracing::warn!(target_name = %self.name, error = %e, "the saved image does not fit the program; it will be installed anew");
                return Ok(None);
            }
        };
        let diffs = tables.check(&image, 5).map_err(err)?;
        if !diffs.is_empty() {
            tracing::warn!(target_name = %self.name, differences = ?diffs, "the pinned maps do not hold the saved image; it will be installed anew");
            return Ok(None);
        }
        self.open_tables(model, &d.pin_dir.clone(), image)?;
        Ok(Some(pipes))
    }

    fn install(&mut self, pipes: &[&Pipeline]) -> Result<(), DriverError> {
        let opts = EbpfOptions { hook: self.hook, ..Default::default() };
        let art = write_program(&self.spec, pipes, &opts).map_err(err)?;
        let obj = clang::compile(&art.source, clang::BuildFlags::default()).map_err(err)?;
        let dp = Dataplane::load_with_image(&obj, art.model.clone(), art.image.clone()).map_err(err)?;
        dp.configure(&self.config).map_err(err)?;
        self.tables = None;
        let deployment = match Deployment::open(&self.name) {
            Ok((d, _)) => {
                // A program is live: swap it under its links.
                dp.pin(&d.pin_dir).map_err(err)?;
                replace_programs(&d, &dp).map_err(err)?;
                d
            }
            Err(_) => {
                let _ = std::fs::remove_dir_all(&self.pin_dir);
                dp.pin(&self.pin_dir).map_err(err)?;
                let attachments = loader::attach(&dp, &self.iface, Some(self.mode), Some(&self.pin_dir)).map_err(|e| {
                    let _ = std::fs::remove_dir_all(&self.pin_dir);
                    err(e)
                })?;
                Deployment { name: self.name.clone(), pin_dir: self.pin_dir.clone(), attachments }
            }
        };
        deployment.save(&art.model).map_err(err)?;
        self.files.write_base(&art.image)?;
        self.open_tables(art.model, &deployment.pin_dir, art.image)
    }

    fn apply(&mut self, update: &Update) -> Result<(), DriverError> {
        let t = self.tables.as_mut().ok_or_else(|| DriverError::needs_install("the pinned tables are not open"))?;
        t.update(update).map_err(err)?;
        self.files.append(update, t.image().expect("an updated image"))
    }

    fn uninstall(&mut self) -> Result<(), DriverError> {
        self.tables = None;
        match Deployment::open(&self.name) {
            Ok((d, _)) => d.remove().map_err(err),
            Err(_) => Ok(()),
        }
    }
}

/// The pipelines the server recorded as installed on eBPF target `name`
/// (base and journal), for checking a target from outside the server.
pub fn saved_pipelines(name: &str) -> Result<Vec<Pipeline>, String> {
    ImageFiles::new(name).map_err(|e| e.to_string())?.load().map(|(p, _)| p)
}
