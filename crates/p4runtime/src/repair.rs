//! The writes that take a switch from what it holds to what it should hold.
//!
//! A controller that finds a switch's entries different from what it
//! installed (a write that failed halfway, an operator's change, a switch
//! that restarted) writes only the difference: inserts for what is missing,
//! modifies for what differs, deletes for what should not be there, and
//! resets of default entries nobody should have set. The order is the IR's
//! make-before-break order applied to entries instead of diff ops, so that
//! no moment between two writes has an entry pointing to a state without
//! entries or to a missing multicast group:
//!
//! 1. multicast groups created or changed;
//! 2. leaf entries inserted or modified;
//! 3. field-table entries inserted or modified, from the last level to the
//!    first (an entry points only to states tested at later levels);
//! 4. default entries (the roots, the fan-out) set or reset;
//! 5. field-table entries deleted, from the first level to the last (what
//!    pointed to them is gone or was modified in step 3);
//! 6. leaf entries deleted;
//! 7. multicast groups deleted.
//!
//! Each step is one or more [`Batch`]es of updates that do not depend on
//! each other. Installing on an empty switch is the case where everything
//! is missing, uninstalling the case where nothing is expected.

use crate::client::normalize;
use prost::Message;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use subc_backend_p4::proto::p4::v1 as p4v1;
use subc_backend_p4::{Batch, P4Target, TableRole};

/// The writes of a repair, and what they do.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Repair {
    pub batches: Vec<Batch>,
    pub inserts: usize,
    pub modifies: usize,
    pub deletes: usize,
}

impl Repair {
    /// Updates written in all.
    pub fn len(&self) -> usize {
        self.inserts + self.modifies + self.deletes
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Where an entity goes in the order of the module doc: (step, level).
fn rank(e: &p4v1::Entity, roles: &HashMap<u32, TableRole>, deleting: bool) -> (u8, usize) {
    match &e.entity {
        Some(p4v1::entity::Entity::PacketReplicationEngineEntry(_)) => (if deleting { 7 } else { 1 }, 0),
        Some(p4v1::entity::Entity::TableEntry(t)) if t.is_default_action => (4, 0),
        Some(p4v1::entity::Entity::TableEntry(t)) => match roles.get(&t.table_id) {
            Some(TableRole::Leaf { .. }) => (if deleting { 6 } else { 2 }, 0),
            Some(TableRole::Field { level, .. }) if deleting => (5, *level),
            // Inserts from the last level: a smaller rank for a deeper level.
            Some(TableRole::Field { level, .. }) => (3, usize::MAX - *level),
            // Tables the program does not have go when the rest is gone.
            _ => (if deleting { 5 } else { 3 }, usize::MAX),
        },
        _ => (8, 0),
    }
}

/// A normalized entity without what an update may change (the action, the
/// replicas): the identity of an entry or group.
fn key_of(e: &p4v1::Entity) -> Vec<u8> {
    normalize(&without_action(e)).encode_to_vec()
}

/// The key alone, as a delete carries it.
fn without_action(e: &p4v1::Entity) -> p4v1::Entity {
    let mut e = e.clone();
    match e.entity.as_mut() {
        Some(p4v1::entity::Entity::TableEntry(t)) => t.action = None,
        Some(p4v1::entity::Entity::PacketReplicationEngineEntry(p)) => {
            if let Some(p4v1::packet_replication_engine_entry::Type::MulticastGroupEntry(g)) = p.r#type.as_mut() {
                g.replicas.clear();
            }
        }
        _ => {}
    }
    e
}

fn is_default(e: &p4v1::Entity) -> Option<u32> {
    match &e.entity {
        Some(p4v1::entity::Entity::TableEntry(t)) if t.is_default_action => Some(t.table_id),
        _ => None,
    }
}

/// The writes that take a switch running `target`'s program from `actual`
/// (what a Read returned) to `expected` (e.g. [`P4Target::entities`]);
/// `initial` are the program's initial default entries
/// (`subc_backend_p4::initial_defaults`), which a Read may return for tables
/// whose default nobody set.
pub fn repair(target: &P4Target, expected: &[p4v1::Entity], actual: &[p4v1::Entity], initial: &[p4v1::Entity]) -> Repair {
    let mut r = Repairing::new(target, expected, initial);
    actual.iter().for_each(|e| r.see(e));
    r.finish()
}

/// A [`repair`] fed what a Read returns one entity at a time
/// ([`crate::Client::read_each`]), so that the Read is never held
/// as a whole: of each entity only whether it matched its expected one, or
/// the key of an entry to delete, is kept.
pub struct Repairing<'a> {
    target: &'a P4Target,
    roles: HashMap<u32, TableRole>,
    initial: BTreeMap<u32, &'a p4v1::Entity>,
    /// Per key, what should be there and whether the switch has it: not
    /// seen, seen equal, seen different (the last one seen counts).
    want: BTreeMap<Vec<u8>, (&'a p4v1::Entity, Option<bool>)>,
    /// The keys of entries and groups the switch should not hold (each the
    /// encoding of the key alone, as a delete carries it).
    unwanted: BTreeSet<Vec<u8>>,
}

fn same(a: &p4v1::Entity, b: &p4v1::Entity) -> bool {
    normalize(a).encode_to_vec() == normalize(b).encode_to_vec()
}

impl<'a> Repairing<'a> {
    pub fn new(target: &'a P4Target, expected: &'a [p4v1::Entity], initial: &'a [p4v1::Entity]) -> Repairing<'a> {
        let roles = target.table_roles();
        let initial: BTreeMap<u32, &p4v1::Entity> = initial.iter().filter_map(|e| Some((is_default(e)?, e))).collect();
        let mut want: BTreeMap<Vec<u8>, (&p4v1::Entity, Option<bool>)> = expected.iter().map(|e| (key_of(e), (e, None))).collect();
        // Default entries nobody asked for are expected to be the initial ones.
        for e in initial.values() {
            want.entry(key_of(e)).or_insert((*e, None));
        }
        Repairing { target, roles, initial, want, unwanted: BTreeSet::new() }
    }

    /// One entity the switch holds.
    pub fn see(&mut self, e: &p4v1::Entity) {
        let k = key_of(e);
        if let Some((w, seen)) = self.want.get_mut(&k) {
            *seen = Some(same(e, w));
        } else if is_default(e).is_none() {
            // Defaults are never deleted; those of tables without an initial
            // default entry are left as they are.
            self.unwanted.insert(k);
        }
    }

    /// The writes, in the order of the module doc.
    pub fn finish(self) -> Repair {
        use p4v1::update::Type as T;
        // (rank, update type) -> updates, in rank order.
        let mut steps: BTreeMap<((u8, usize), i32), Vec<p4v1::Update>> = BTreeMap::new();
        let mut out = Repair::default();
        for (w, seen) in self.want.values() {
            let kind = match (seen, is_default(w)) {
                (Some(true), _) => continue,
                // A default entry a Read leaves out is the initial one.
                (None, Some(t)) if self.initial.get(&t).is_some_and(|i| same(i, w)) => continue,
                (None, None) => {
                    out.inserts += 1;
                    T::Insert
                }
                _ => {
                    out.modifies += 1;
                    T::Modify
                }
            };
            let entity = (*w).clone();
            steps
                .entry((rank(&entity, &self.roles, false), kind as i32))
                .or_default()
                .push(p4v1::Update { r#type: kind as i32, entity: Some(entity) });
        }
        for k in &self.unwanted {
            // The key is an encoded entity (`key_of`): it decodes.
            let Ok(key) = p4v1::Entity::decode(k.as_slice()) else { continue };
            out.deletes += 1;
            steps
                .entry((rank(&key, &self.roles, true), T::Delete as i32))
                .or_default()
                .push(p4v1::Update { r#type: T::Delete as i32, entity: Some(key) });
        }
        out.batches = batches(steps, self.target.options().batch_size.max(1));
        out
    }
}

/// The steps' updates in batches of at most `max`, labelled.
fn batches(steps: BTreeMap<((u8, usize), i32), Vec<p4v1::Update>>, max: usize) -> Vec<Batch> {
    let mut out = vec![];
    for (((step, _), kind), updates) in steps {
        let what = match step {
            1 => "multicast groups",
            2 | 6 => "leaf entries",
            3 | 5 => "table entries",
            4 => "default entries",
            _ => "groups",
        };
        let verb = p4v1::update::Type::try_from(kind).map(|t| t.as_str_name().to_ascii_lowercase()).unwrap_or_default();
        for chunk in updates.chunks(max) {
            out.push(Batch { label: format!("repair: {verb} {what}"), updates: chunk.to_vec() });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::compare;
    use subc_backend_p4::{initial_defaults, P4Options, Switch};
    use subc_bdd::{CompileOptions, CompiledSet};

    fn set(rules: &str) -> (subc_lang::Program, CompiledSet) {
        let spec = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/itch/itch.spec")).unwrap();
        let p = subc_workload::programs::check(&spec, &[rules]).unwrap();
        let c = CompiledSet::compile(&p.spec, &p.normal_forms, CompileOptions::default()).unwrap();
        (p, c)
    }

    /// Applies the repair to `sw` update by update, checking references
    /// after each, and returns what it wrote.
    fn run(target: &P4Target, sw: &mut Switch, expected: &[p4v1::Entity], info: &subc_backend_p4::proto::p4::config::v1::P4Info) -> Repair {
        let r = repair(target, expected, &sw.read(), &initial_defaults(info));
        for b in &r.batches {
            // A server may apply a batch's updates in any order: last to first.
            for u in b.updates.iter().rev() {
                sw.apply(u).unwrap_or_else(|e| panic!("{}: {e}", b.label));
                sw.check_references(target.layout()).unwrap_or_else(|e| panic!("{}: {e}", b.label));
            }
        }
        let left = compare(expected, &sw.read(), &initial_defaults(info));
        assert!(left.is_empty(), "{left:?}");
        r
    }

    #[test]
    fn repairs_go_from_any_set_to_any_other_in_a_safe_order() {
        let a = "stock == GOOGL : fwd(1)\nstock == GOOGL && shares > 100 : fwd(2)\nstock == AAPL : fwd(1,2)\nshares < 10 : fwd(4)";
        let b = "stock == MSFT : fwd(3)\nstock == AAPL && shares > 5 : fwd(1,3)\nshares > 1000 : fwd(2)";
        let (p, mut s) = set(a);
        let target = P4Target::new(&p.spec, &s, &P4Options { batch_size: 3, ..Default::default() }).unwrap();
        let info = target.p4info();
        let mut sw = Switch::new(&info).unwrap();
        let ea = target.entities(&s.pipelines()).unwrap();
        // The other set in the same program: a's subscriptions replaced by b's.
        s.remove(&p.normal_forms.iter().map(|n| n.id).collect::<Vec<_>>()).unwrap();
        s.add(&set(b).0.normal_forms).unwrap();
        let eb = target.entities(&s.pipelines()).unwrap();
        // An empty switch: an install.
        let r = run(&target, &mut sw, &ea, &info);
        assert!(r.inserts > 0 && r.deletes == 0, "{r:?}");
        // Nothing to do.
        assert!(run(&target, &mut sw, &ea, &info).is_empty());
        // From one set to an unrelated one, and back.
        let r = run(&target, &mut sw, &eb, &info);
        assert!(r.inserts > 0 && r.deletes > 0, "{r:?}");
        run(&target, &mut sw, &ea, &info);
        // One entry lost: one insert.
        let victim =
            ea.iter().find(|e| matches!(&e.entity, Some(p4v1::entity::Entity::TableEntry(t)) if !t.is_default_action)).unwrap().clone();
        sw.apply(&p4v1::Update { r#type: p4v1::update::Type::Delete as i32, entity: Some(victim) }).unwrap();
        let r = run(&target, &mut sw, &ea, &info);
        assert_eq!((r.inserts, r.modifies, r.deletes), (1, 0, 0));
        // Uninstall: nothing expected, every default back to its initial action.
        let r = run(&target, &mut sw, &[], &info);
        assert!(r.deletes > 0 && r.modifies == 1, "the root's default is reset: {r:?}");
        assert_eq!(sw.total_entries(), 0);
    }

    /// Past 511 ports: the receivers' entries and the groups of replicas
    /// (with their instances) read back as written, and a group whose
    /// members changed is repaired by one MODIFY.
    #[test]
    fn receivers_and_their_groups_are_repaired() {
        use subc_backend_p4::{Receiver, Receivers};
        let spec = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/topic-broker/broker.spec")).unwrap();
        let spec = spec + "\nports 1000;\n";
        let rules = "topic == news : fwd(1, 600)\ntopic == news : fwd(999)\ntopic == news : fwd(700)";
        let p = subc_workload::programs::check(&spec, &[rules]).unwrap();
        let mut s = CompiledSet::compile(&p.spec, &p.normal_forms[..2], CompileOptions::default()).unwrap();
        let listed = [1, 600, 700, 999].map(|r| (r, Receiver { dst_port: Some(7000 + r as u16), ..Default::default() }));
        let opts = P4Options { batch_size: 3, receivers: Receivers::Listed(listed.into()), ..Default::default() };
        let target = P4Target::new(&p.spec, &s, &opts).unwrap();
        let info = target.p4info();
        let mut sw = Switch::new(&info).unwrap();
        let before = target.entities(&s.pipelines()).unwrap();
        let r = run(&target, &mut sw, &before, &info);
        assert!(r.inserts > 0 && r.deletes == 0, "{r:?}");
        assert!(run(&target, &mut sw, &before, &info).is_empty());
        assert_eq!(sw.groups().values().next().map(Vec::len), Some(3), "receivers 1, 600 and 999");
        // A member more, read back: the group's whole list in one MODIFY.
        s.add(&p.normal_forms[2..]).unwrap();
        let after = target.entities(&s.pipelines()).unwrap();
        let r = run(&target, &mut sw, &after, &info);
        assert!(r.modifies >= 1 && r.deletes + r.inserts <= 2, "{r:?}");
        assert!(run(&target, &mut sw, &after, &info).is_empty());
        assert_eq!(sw.groups().values().next().map(Vec::len), Some(4), "receiver 700 joined");
    }
}
