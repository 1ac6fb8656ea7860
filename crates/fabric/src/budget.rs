//! Resource-aware placement: each device's projection compiled within its
//! table budget ([`Device::budget`](crate::Device::budget)).
//!
//! A device's projected rules forward to two kinds of port: ports with an
//! endpoint attached (the *exact* part) and ports toward links (the
//! *transit* part). Only the transit part may be relaxed (its constraints
//! dropped field by field, the field with the most distinct constants
//! first, as `subc_bdd::compile_within` does): a relaxed transit rule sends
//! a neighbour a superset of what it needs, and the neighbour evaluates its
//! own projection, so the filtering happens nearer the endpoint, and the
//! endpoint's own device, whose port toward it is in its exact part,
//! filters exactly. Endpoints therefore receive exactly what the network
//! program says (for stateless specs; `docs/network.md`).
//!
//! Drops and variable updates belong to the exact part: a relaxed update
//! would change the device's state for packets the rule does not match.
//! The two parts of a rule that has both become two rules of the device's
//! set; the transit half's id has [`TRANSIT_ID`] set, so that ids stay
//! unique and the original id is recoverable.
//!
//! If the exact part alone exceeds the budget, no relaxation can help, and
//! placement fails naming the device and both numbers.

use crate::project::project;
use crate::routing::Routes;
use crate::topology::{DeviceId, Topology};
use crate::FabricError;
use std::collections::BTreeSet;
use subc_bdd::{distinct_constants, extra, relax, CompileOptions, CompiledSet, Extra};
use subc_lang::spec::{QueryFieldId, Spec};
use subc_lang::{Actions, NfSubscription, Program};

/// Set in the id of a rule's relaxed transit half.
pub const TRANSIT_ID: u64 = 1 << 63;

/// One device's rules as compiled within its budget.
pub struct Placed {
    /// The rules the compiled set holds: the projection, or its exact part
    /// and its relaxed transit part.
    pub rules: Vec<NfSubscription>,
    pub set: CompiledSet,
    /// The fields whose constraints the transit part lost, in that order.
    pub dropped: Vec<QueryFieldId>,
    /// The projection compiled exactly, kept when it was relaxed (to
    /// measure the extra traffic).
    pub exact: Option<CompiledSet>,
}

impl Placed {
    /// Table and leaf entries the device holds.
    pub fn entries(&self) -> usize {
        self.set.entry_count()
    }

    /// Deliveries the relaxation adds on `packets` (query values by field
    /// id, e.g. `subc_bdd::sample_values`): none if nothing was relaxed.
    pub fn extra(&self, packets: &[Vec<u64>]) -> Extra {
        let exact = self.exact.as_ref().unwrap_or(&self.set);
        extra(|v| exact.eval_tables(v), |v| self.set.eval_tables(v), packets)
    }
}

/// The network program on `device`, compiled within the device's budget
/// (exactly if it has none).
pub fn place(
    topology: &Topology,
    routes: &Routes,
    network: &Program,
    device: DeviceId,
    opts: &CompileOptions,
) -> Result<Placed, FabricError> {
    let projected = project(topology, routes, network, device)?.normal_forms;
    place_rules(topology, &network.spec, device, projected, opts)
}

/// [`place`] of rules already projected onto `device` (its projection's
/// normal forms, as `project` or `project_rule` give them).
pub fn place_rules(
    topology: &Topology,
    spec: &Spec,
    device: DeviceId,
    projected: Vec<NfSubscription>,
    opts: &CompileOptions,
) -> Result<Placed, FabricError> {
    let on = Budgeted { topology, spec, device, opts };
    let exact = on.compile(&projected)?;
    match topology.devices[device].budget {
        Some(budget) if exact.entry_count() as u64 > budget => on.relaxed(projected, exact, budget),
        _ => Ok(Placed { rules: projected, set: exact, dropped: vec![], exact: None }),
    }
}

/// The rules a device placed with `dropped` fields relaxed holds for the
/// projected `rules`: each rule as is when nothing is dropped, else its exact
/// part and its transit part relaxed (id with [`TRANSIT_ID`]), as [`place`]
/// splits them. For adding rules to a placed device incrementally.
pub fn placed_rules(topology: &Topology, device: DeviceId, rules: &[NfSubscription], dropped: &[QueryFieldId]) -> Vec<NfSubscription> {
    if dropped.is_empty() {
        return rules.to_vec();
    }
    let (exact, transit) = split(topology, device, rules);
    exact.into_iter().chain(relax(&transit, dropped)).collect()
}

/// [`place`] on every device, in device order.
pub fn place_all(topology: &Topology, routes: &Routes, network: &Program, opts: &CompileOptions) -> Result<Vec<Placed>, FabricError> {
    (0..topology.devices.len()).map(|d| place(topology, routes, network, d, opts)).collect()
}

/// What compiling for one device needs.
struct Budgeted<'a> {
    topology: &'a Topology,
    spec: &'a Spec,
    device: DeviceId,
    opts: &'a CompileOptions,
}

impl Budgeted<'_> {
    fn name(&self) -> String {
        self.topology.devices[self.device].name.clone()
    }

    fn compile(&self, rules: &[NfSubscription]) -> Result<CompiledSet, FabricError> {
        CompiledSet::compile(self.spec, rules, self.opts.clone()).map_err(|source| FabricError::Compile { device: self.name(), source })
    }

    /// Over budget: keep the exact part, relax the transit part field by
    /// field until the two fit together.
    fn relaxed(&self, projected: Vec<NfSubscription>, exact: CompiledSet, budget: u64) -> Result<Placed, FabricError> {
        let (local, transit) = self.split(&projected);
        let local_entries = self.compile(&local)?.entry_count() as u64;
        if local_entries > budget {
            return Err(FabricError::ExactOverBudget { device: self.name(), budget, exact: local_entries });
        }
        let mut order: Vec<(usize, QueryFieldId)> = distinct_constants(self.spec, &transit).into_iter().map(|(f, n)| (n, f)).collect();
        order.sort_by(|a, b| b.cmp(a));
        let mut dropped = vec![];
        for (_, field) in order {
            dropped.push(field);
            let rules: Vec<NfSubscription> = local.iter().cloned().chain(relax(&transit, &dropped)).collect();
            let set = self.compile(&rules)?;
            if set.entry_count() as u64 <= budget {
                return Ok(Placed { rules, set, dropped, exact: Some(exact) });
            }
        }
        let rules: Vec<NfSubscription> = local.into_iter().chain(relax(&transit, &dropped)).collect();
        let needed = self.compile(&rules)?.entry_count() as u64;
        Err(FabricError::BudgetTooSmall { device: self.name(), budget, needed })
    }

    fn split(&self, projected: &[NfSubscription]) -> (Vec<NfSubscription>, Vec<NfSubscription>) {
        split(self.topology, self.device, projected)
    }
}

/// The exact part (ports with an endpoint attached to `device`, drops and
/// updates, ids unchanged) and the transit part (ports toward links, ids
/// with [`TRANSIT_ID`]) of projected rules, each without rules left with no
/// action.
fn split(topology: &Topology, device: DeviceId, projected: &[NfSubscription]) -> (Vec<NfSubscription>, Vec<NfSubscription>) {
    let local: BTreeSet<u32> = topology.endpoints.iter().filter(|e| e.at.device == device).map(|e| e.at.port).collect();
    let (mut exact, mut transit) = (vec![], vec![]);
    for r in projected {
        let (here, there): (BTreeSet<u32>, BTreeSet<u32>) = r.actions.ports.iter().partition(|p| local.contains(p));
        let a = Actions { ports: here, drop: r.actions.drop, updates: r.actions.updates.clone() };
        if a != Actions::default() {
            exact.push(NfSubscription { id: r.id, cubes: r.cubes.clone(), actions: a });
        }
        if !there.is_empty() {
            let a = Actions { ports: there, ..Actions::default() };
            transit.push(NfSubscription { id: r.id | TRANSIT_ID, cubes: r.cubes.clone(), actions: a });
        }
    }
    (exact, transit)
}
