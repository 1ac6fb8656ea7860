//! Label mode in the service (`[routing] mode = "labels"`;
//! `docs/network.md`, "Label mode in the service").
//!
//! Ingress devices (a publisher attached) hold the whole network set and
//! the others none (`network.rs`), so routes never change a device's rules
//! in this mode: a reroute (links or devices marked down, a latency
//! measured with `SetLatency`) changes label tables only. They are data
//! published here beside the committed state (`Committed::publish_labels`)
//! and written by each device's task through `Target::write_labels`, which
//! acknowledges the version it holds.
//!
//! Every device holds two banks of planes. Ingresses push one; a move
//! publishes three steps, each acknowledged by every device up before the
//! next (make before break):
//! 1. the bank no ingress pushes gets the new rows, and each device its own
//!    endpoints and whether it is an ingress;
//! 2. every ingress pushes that bank;
//! 3. after a drain, the other bank gets the new rows too, so that both
//!    banks are equal again and the next move writes only what it changes.
//!
//! A packet's plane keeps it in one bank on its whole path, so every packet
//! meets one routing. Only devices whose rows change are written in steps 1
//! and 3, and only ingresses in step 2. A move does not start while a
//! device up has not acknowledged the last one: it could still push the
//! bank the move would overwrite.

use crate::core::Core;
use crate::network::Fabric;
use std::sync::Arc;
use std::time::Duration;
use subc_bdd::LabelTable;
use subc_fabric::{Damping, Down, FabricError, LabelRoutes, LabelTables, Topology, Traffic};
use tonic::Status;

/// How far a measurement must move a link's weight before routes follow.
pub(crate) const DAMPING: Damping = Damping { threshold: 0.2 };
/// How long a move waits for the devices to acknowledge each step.
const ACK_TIMEOUT: Duration = Duration::from_secs(10);
/// How long packets of the old bank may still be in the fabric after the
/// ingresses moved: a fabric's worth of queueing, generously.
const DRAIN: Duration = Duration::from_millis(20);

/// The routing in force and the tables published for it.
pub(crate) struct LabelPlane {
    state: tokio::sync::Mutex<State>,
}

struct State {
    /// The topology with its planes fixed to the count the program was
    /// shaped for: a failure must not change the number of planes.
    topology: Topology,
    /// The routing ingresses push.
    routes: LabelRoutes,
    /// The bank ingresses push: 0 or 1.
    bank: usize,
    /// Per device (= view: label mode does not change the topology), the
    /// table published last.
    tables: Vec<Arc<LabelTable>>,
}

/// What a move did.
#[derive(Debug, Default)]
pub(crate) struct Moved {
    /// Devices whose rows changed, in topology order.
    pub changed: Vec<String>,
    /// Ingress devices moved to the new bank.
    pub moved: Vec<String>,
    /// Per link, the weight in use after the move, in µs (0: down).
    pub weights_us: Vec<f64>,
}

/// Planes per bank: the topology's `planes`, or what label routing takes
/// with nothing down.
pub(crate) fn planes_of(t: &Topology) -> usize {
    LabelRoutes::new(t, &Traffic::declared(t)).planes()
}

/// What one label program must hold on any device of `t`: two banks of
/// its planes.
pub(crate) fn shape_of(t: &Topology) -> subc_bdd::LabelShape {
    subc_fabric::label_shape(t, planes_of(t), 2)
}

/// The routes around `down` with links weighted by `measured` (µs per
/// link, `None`: as declared), exactly (no damping: at startup, and after
/// a failure, which recomputes everything anyway).
fn routes_for(t: &Topology, down: &Down, measured: &[Option<f64>]) -> Result<LabelRoutes, FabricError> {
    let routes = LabelRoutes::avoiding(t, down, &Traffic::declared(t))?;
    Ok(routes.reroute(t, measured, Damping { threshold: 0.0 }).routes)
}

impl LabelPlane {
    /// The plane of a label-mode fabric at startup: routes around `down`,
    /// weighted by the stored measurements, both banks equal, bank 0 pushed.
    pub(crate) fn start(
        declared: &Topology,
        down: &Down,
        measured: &[Option<f64>],
    ) -> Result<(LabelPlane, Vec<Arc<LabelTable>>), FabricError> {
        let mut topology = declared.clone();
        topology.routing.planes = Some(planes_of(declared) as u32);
        let routes = routes_for(&topology, down, measured)?;
        let now = routes.tables(&topology);
        let tables: Vec<Arc<LabelTable>> =
            (0..topology.devices.len()).map(|d| Arc::new(LabelTables::device_table(&[&now, &now], 0, d))).collect();
        let state = State { topology, routes, bank: 0, tables: tables.clone() };
        Ok((LabelPlane { state: tokio::sync::Mutex::new(state) }, tables))
    }

    /// Moves to the latencies in use (`latency[link]`, µs, damped by
    /// [`damp`] as committed), keeping the planes' rankings, so that only
    /// devices whose shortest paths changed get new rows; `down` is what is
    /// down now (its devices are not waited for).
    pub(crate) async fn weighted(&self, core: &Core, down: &Down, latency: &[Option<f64>]) -> Result<Moved, Status> {
        let mut s = self.state.lock().await;
        let next = s.routes.reroute(&s.topology, latency, Damping { threshold: 0.0 }).routes;
        s.move_to(core, down, next).await
    }

    /// Moves around what is `down` now, weighted by `measured`.
    pub(crate) async fn rerouted(&self, core: &Core, down: &Down, measured: &[Option<f64>]) -> Result<Moved, Status> {
        let mut s = self.state.lock().await;
        let next = routes_for(&s.topology, down, measured).map_err(|e| Status::failed_precondition(e.to_string()))?;
        s.move_to(core, down, next).await
    }
}

impl State {
    /// Moves make before break to `next` (the module doc's three steps).
    async fn move_to(&mut self, core: &Core, down: &Down, next: LabelRoutes) -> Result<Moved, Status> {
        let t = &self.topology.clone();
        let names = |ds: &[usize]| ds.iter().map(|&d| t.devices[d].name.clone()).collect::<Vec<_>>();
        let up: Vec<usize> = (0..t.devices.len()).filter(|d| !down.devices.contains(d)).collect();
        self.acknowledged(core, &up, "the last change of routes").await?;
        let (old, new) = (self.routes.tables(t), next.tables(t));
        let free = 1 - self.bank;
        // Step 1: the free bank gets the new rows; own endpoints and ingress follow.
        let both = if self.bank == 0 { [&old, &new] } else { [&new, &old] };
        // Ingresses (a device back up too) keep pushing the bank in force.
        let pushed = (self.bank * self.routes.planes()) as u32;
        let step1: Vec<LabelTable> = (0..t.devices.len())
            .map(|d| {
                let table = LabelTables::device_table(&both, free, d);
                LabelTable { push_base: if table.ingress { pushed } else { 0 }, ..table }
            })
            .collect();
        let changed: Vec<usize> = (0..t.devices.len()).filter(|&d| step1[d].planes != self.tables[d].planes).collect();
        let weights_us = (0..t.links.len()).map(|l| next.weight(l).map_or(0.0, |ns| ns as f64 / 1000.0)).collect();
        if changed.is_empty() {
            // Nothing moves: the weights in use are recorded, no table written.
            let own_changed = (0..t.devices.len()).any(|d| step1[d] != *self.tables[d]);
            self.routes = next;
            if own_changed {
                self.publish(core, step1);
                self.acknowledged(core, &up, "their own endpoints").await?;
            }
            return Ok(Moved { weights_us, ..Default::default() });
        }
        self.publish(core, step1);
        self.acknowledged(core, &up, "the new routes").await?;
        // Step 2: the ingresses push the new bank.
        let ingresses: Vec<usize> = up.iter().copied().filter(|&d| new.ingress[d]).collect();
        let step2: Vec<LabelTable> = (0..t.devices.len())
            .map(|d| match self.tables[d].ingress {
                true => LabelTable { push_base: (free * next.planes()) as u32, ..(*self.tables[d]).clone() },
                false => (*self.tables[d]).clone(),
            })
            .collect();
        self.publish(core, step2);
        self.bank = free;
        self.routes = next;
        self.acknowledged(core, &ingresses, "the new bank").await?;
        // Step 3: once drained, the old bank follows.
        tokio::time::sleep(DRAIN).await;
        let step3: Vec<LabelTable> = (0..t.devices.len()).map(|d| LabelTables::device_table(&[&new, &new], free, d)).collect();
        self.publish(core, step3);
        self.acknowledged(core, &up, "the new routes in both banks").await?;
        tracing::info!(changed = ?names(&changed), ingresses = ?names(&ingresses), "label routes moved");
        Ok(Moved { changed: names(&changed), moved: names(&ingresses), weights_us })
    }

    /// Publishes every device's table and wakes the devices' tasks.
    fn publish(&mut self, core: &Core, tables: Vec<LabelTable>) {
        self.tables = tables.into_iter().map(Arc::new).collect();
        core.publish_labels(self.tables.clone());
    }

    /// Waits until each of `devices` holds the tables published last.
    async fn acknowledged(&self, core: &Core, devices: &[usize], what: &str) -> Result<(), Status> {
        let version = core.committed().labels_version();
        let mut late = vec![];
        let deadline = tokio::time::Instant::now() + ACK_TIMEOUT;
        for &d in devices {
            let name = &self.topology.devices[d].name;
            let Ok(h) = core.target(name) else { continue };
            let mut acked = h.labels_acked();
            if tokio::time::timeout_at(deadline, acked.wait_for(|v| *v >= version)).await.is_err() {
                late.push(name.clone());
            }
        }
        if late.is_empty() {
            return Ok(());
        }
        Err(Status::unavailable(format!(
            "devices {} have not taken {what} within {} s (see their status); packets keep the routes in force, \
             and the move is finished once they do (send the request again)",
            late.join(", "),
            ACK_TIMEOUT.as_secs()
        )))
    }
}

/// The latencies in use after `measured` (link, µs): a link's moves to its
/// measurement only if they differ by more than [`DAMPING`]'s threshold
/// of the one in use (declared, or measured before), so routes do not flap.
pub(crate) fn damp(f: &Fabric, in_use: &[Option<f64>], measured: &[(usize, f64)]) -> Vec<Option<f64>> {
    let mut out = in_use.to_vec();
    for &(link, us) in measured {
        let current = out[link].unwrap_or(f.topology.links[link].weight_ns() as f64 / 1000.0);
        if DAMPING.moves(current, us) {
            out[link] = Some(us);
        }
    }
    out
}

/// A link's end as the store names it: `device:port` of its first end.
fn end_name(f: &Fabric, link: usize) -> String {
    let a = f.topology.links[link].a;
    format!("{}:{}", f.topology.devices[a.device].name, a.port)
}

/// The latencies in use as the store keeps them (meta "latency"): µs by the
/// link's first end, which survives renumbering.
pub(crate) fn latency_json(f: &Fabric, latency: &[Option<f64>]) -> String {
    let by_end: std::collections::BTreeMap<String, f64> =
        latency.iter().enumerate().filter_map(|(l, us)| Some((end_name(f, l), (*us)?))).collect();
    serde_json::to_string(&by_end).expect("names and numbers serialize")
}

/// [`latency_json`] read back, per link of `f`; what names no link, or is
/// not a positive latency, is dropped with a warning.
pub(crate) fn parse_latency(f: &Fabric, text: Option<&str>) -> Vec<Option<f64>> {
    let mut out = vec![None; f.topology.links.len()];
    let Some(text) = text else { return out };
    let stored: std::collections::BTreeMap<String, f64> = serde_json::from_str(text).unwrap_or_else(|e| {
        tracing::warn!(error = %e, "the stored latencies are unreadable; links weigh what the topology declares");
        Default::default()
    });
    for (end, us) in stored {
        match f.link(&end) {
            Ok(l) if valid_latency(us) => out[l] = Some(us),
            _ => tracing::warn!(link = %end, latency_us = us, "a stored latency names no link of the topology, or is not positive"),
        }
    }
    out
}

/// Whether a measured latency can weigh a link: what a topology may
/// declare, a nanosecond to a second.
pub(crate) fn valid_latency(us: f64) -> bool {
    (subc_fabric::LATENCY_US.0..=subc_fabric::LATENCY_US.1).contains(&us)
}
