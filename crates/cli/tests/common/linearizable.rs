//! A linearizability checker for histories of the subscription API, for the
//! fault-injection tests (issue #31): clients record what they sent and
//! what came back ([`History`]), and [`check`] decides whether one order of
//! the operations, each taking effect at one point between its invocation
//! and its completion, explains every reply.
//!
//! The model is the set of subscriptions, `(app, id) → text`, ids assigned
//! by the server. Operations: `Add { request_id, lines }` (a retry with the
//! same request id answers the same ids, `replayed = true`), `Remove { ids }`
//! (all or nothing: an id that is not there refuses the whole request), and
//! `List` (every subscription in its scope at one point: one page).
//!
//! Outcomes: a reply; a refusal (INVALID_ARGUMENT, NOT_FOUND, ...: the
//! request changed nothing); or unknown (a timeout, UNAVAILABLE, a lost
//! connection: it may take effect at any point after its invocation, also
//! after the client gave up on it, or never).
//!
//! How (P-compositionality, as in Horn and Kroening's "Faster
//! linearizability checking via P-compositionality"): each subscription
//! is a register that goes `absent → present → absent` once, and its own
//! history (the add that created it and that add's retries, every remove
//! naming it, and every List whose scope covers it, as a read of
//! "present" or "absent") must be linearizable on its own. Because that
//! register only moves forward, a linearization is two points, `t1` (the
//! add takes effect) and `t2` (the remove does, or never), and the search
//! is over the few places where a read's interval starts, not over orders
//! of operations (Wing and Gong's search, which this replaces, would try
//! every order of the concurrent ones). Before that, the checks that need
//! the whole history: no id is acknowledged to two different adds; one
//! request id is acknowledged with one set of ids, created once; a List
//! shows a subscription with the text its add was given; every
//! subscription a List shows or a Remove removes was created by an add
//! that was acknowledged, or whose outcome is unknown.
//!
//! Intervals are closed, and ties are broken in whichever way explains the
//! history: two operations with the same timestamp may be ordered either
//! way. A List reads every subscription at one point, which the
//! per-subscription check does not see; a cheaper necessary condition
//! does: for each List, the latest point some subscription it shows (or
//! misses) forces it after, and the earliest it forces it before
//! ([`Kind::ListNotAtomic`]). It can still miss an anomaly that only a
//! search over every List's point together would find.
//!
//! A [`Violation`] names the operations that cannot be ordered: for one
//! subscription, a smallest set of its operations that is not linearizable
//! (each one needed: leave any out and the rest can be ordered).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::Mutex;
use std::time::Instant;

/// A subscription: its application and id.
pub type Key = (String, u64);

/// Never: the end of an unknown outcome's window.
pub const NEVER: u64 = u64::MAX;

/// What a client asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// `app` adds `lines` (one subscription each, in order).
    Add { app: String, request_id: String, lines: Vec<String> },
    /// `app` removes `ids`, all or nothing.
    Remove { app: String, ids: Vec<u64> },
    /// Every subscription of `app`, or of every application (`None`: the
    /// admin), in one page.
    List { app: Option<String> },
}

/// What came back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// An Add's ids, in line order.
    Added {
        ids: Vec<u64>,
        replayed: bool,
    },
    Removed,
    /// `(app, id, text)` of every subscription listed.
    Listed(Vec<(String, u64, String)>),
    /// A definite failure: the request changed nothing (the status code).
    Refused(String),
    /// It may or may not have taken effect (why).
    Unknown(String),
    /// Not completed (yet): as unknown.
    Pending,
}

/// One operation: who, what, when (nanoseconds since the history began),
/// and how it ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub client: usize,
    pub op: Op,
    pub invoked: u64,
    /// When the client had the outcome (`NEVER` while pending).
    pub completed: u64,
    pub outcome: Outcome,
}

impl Entry {
    /// Whether it certainly took effect.
    fn ok(&self) -> bool {
        matches!(self.outcome, Outcome::Added { .. } | Outcome::Removed | Outcome::Listed(_))
    }

    /// Whether it may have taken effect without the client knowing.
    fn unknown(&self) -> bool {
        matches!(self.outcome, Outcome::Unknown(_) | Outcome::Pending)
    }
}

impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let end = if self.completed == NEVER { "…".to_string() } else { format!("{} ns", self.completed) };
        write!(f, "client {} [{} ns, {end}] ", self.client, self.invoked)?;
        match &self.op {
            Op::Add { app, request_id, lines } => write!(f, "Add(app {app}, request {request_id:?}, {lines:?})")?,
            Op::Remove { app, ids } => write!(f, "Remove(app {app}, {ids:?})")?,
            Op::List { app: Some(app) } => write!(f, "List(app {app})")?,
            Op::List { app: None } => write!(f, "List(all)")?,
        }
        match &self.outcome {
            Outcome::Added { ids, replayed } => write!(f, " -> ids {ids:?}{}", if *replayed { " (replayed)" } else { "" }),
            Outcome::Removed => write!(f, " -> removed"),
            Outcome::Listed(subs) => write!(f, " -> {} subscriptions", subs.len()),
            Outcome::Refused(code) => write!(f, " -> refused {code}"),
            Outcome::Unknown(why) => write!(f, " -> unknown ({why})"),
            Outcome::Pending => write!(f, " -> pending"),
        }
    }
}

/// A recorder, shared by the clients of a test (`Arc<History>`): each
/// operation is an entry pushed at its invocation and completed in place.
pub struct History {
    start: Instant,
    entries: Mutex<Vec<Entry>>,
}

/// An invoked operation, to complete.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Call(pub usize);

impl Default for History {
    fn default() -> Self {
        History::new()
    }
}

impl History {
    pub fn new() -> History {
        History { start: Instant::now(), entries: Mutex::new(vec![]) }
    }

    fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// `client` invokes `op` now.
    pub fn invoke(&self, client: usize, op: Op) -> Call {
        let t = self.now();
        self.invoke_at(client, op, t)
    }

    /// `client` has the outcome of `call` now.
    pub fn complete(&self, call: Call, outcome: Outcome) {
        let t = self.now();
        self.complete_at(call, outcome, t)
    }

    /// As `invoke`, at time `t` (a simulation's clock).
    pub fn invoke_at(&self, client: usize, op: Op, t: u64) -> Call {
        let mut e = self.entries.lock().unwrap();
        e.push(Entry { client, op, invoked: t, completed: NEVER, outcome: Outcome::Pending });
        Call(e.len() - 1)
    }

    /// As `complete`, at time `t`.
    pub fn complete_at(&self, call: Call, outcome: Outcome, t: u64) {
        let mut e = self.entries.lock().unwrap();
        e[call.0].completed = t;
        e[call.0].outcome = outcome;
    }

    /// A copy of every entry, in order of invocation.
    pub fn entries(&self) -> Vec<Entry> {
        self.entries.lock().unwrap().clone()
    }

    /// A history of these entries (to check one changed on purpose).
    pub fn from_entries(entries: Vec<Entry>) -> History {
        History { start: Instant::now(), entries: Mutex::new(entries) }
    }
}

/// What is wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// One id acknowledged to two different adds.
    IdTwice,
    /// One request id acknowledged with different ids or lines, created
    /// twice, or replayed with no attempt that could have created it.
    ReplayDiffers,
    /// An add acknowledged with another number of ids than lines.
    WrongCount,
    /// A List shows a subscription with another text than its add's.
    TextDiffers,
    /// A subscription listed or removed that no add could have created.
    Phantom,
    /// One subscription's operations cannot be ordered.
    NotLinearizable,
    /// No one point of a List explains what it shows of two subscriptions.
    ListNotAtomic,
}

/// A history that no linearization explains: the kind, the subscription,
/// the operations (indices into the history) that cannot be ordered.
#[derive(Clone, Debug)]
pub struct Violation {
    pub kind: Kind,
    pub key: Option<Key>,
    pub ops: Vec<usize>,
    pub why: String,
    /// `why`, then each operation.
    pub rendered: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(&self.rendered)
    }
}

fn violation(entries: &[Entry], kind: Kind, key: Option<Key>, mut ops: Vec<usize>, why: String) -> Violation {
    ops.sort_unstable();
    ops.dedup();
    let mut rendered = format!("{kind:?}: {why}");
    if let Some((app, id)) = &key {
        rendered += &format!(" (subscription {id} of {app})");
    }
    for &i in &ops {
        rendered += &format!("\n  #{i} {}", entries[i]);
    }
    Violation { kind, key, ops, why, rendered }
}

/// An add as the server sees it: every attempt with one app, request id
/// and lines (an empty request id: each attempt its own).
struct Logical {
    app: String,
    lines: Vec<String>,
    /// Attempts that were not refused.
    attempts: Vec<usize>,
    /// Attempts acknowledged.
    acked: Vec<usize>,
    ids: Option<Vec<u64>>,
    /// Where it may have taken effect.
    window: (u64, u64),
}

/// One subscription's history, as a register `absent → present → absent`.
#[derive(Clone, Debug, Default)]
struct Register {
    /// The add's window; `mandatory` if acknowledged.
    add: (u64, u64),
    add_mandatory: bool,
    add_ops: Vec<usize>,
    /// Removes naming it: (invoked, completed or NEVER, acknowledged, op).
    removes: Vec<(u64, u64, bool, usize)>,
    /// Reads: (invoked, completed, present, op).
    reads: Vec<(u64, u64, bool, usize)>,
}

impl Register {
    /// Whether points `t1 ≤ t2` exist (the add, the remove or never) that
    /// explain every read.
    fn linearizable(&self) -> bool {
        let acked_removes: Vec<_> = self.removes.iter().filter(|r| r.2).collect();
        if acked_removes.len() > 1 {
            return false;
        }
        let present = self.reads.iter().filter(|r| r.2);
        let absent: Vec<_> = self.reads.iter().filter(|r| !r.2).collect();
        let required = self.add_mandatory || self.reads.iter().any(|r| r.2) || !acked_removes.is_empty();
        if !required {
            // The add never took effect: every read saw it absent, and no
            // remove could find it.
            return true;
        }
        let (a_lo, mut a_hi) = self.add;
        let (r_lo, r_hi) = match (acked_removes.first(), self.removes.iter().map(|r| r.0).min()) {
            (Some(r), _) => (r.0, r.1),
            // An unknown remove, at any point after its invocation, or never.
            (None, Some(inv)) => (inv, NEVER),
            (None, None) => (NEVER, NEVER),
        };
        let mut r_lo = r_lo;
        for r in present {
            a_hi = a_hi.min(r.1);
            r_lo = r_lo.max(r.0);
        }
        if a_lo > a_hi || r_lo > r_hi {
            return false;
        }
        // t1 as late as helps: the reads that start before it see it
        // absent; the others must end after t2 = max(r_lo, t1).
        let candidates = std::iter::once(a_lo).chain(absent.iter().map(|r| r.0).filter(|&t| a_lo <= t && t <= a_hi));
        candidates.filter(|&t1| t1 <= r_hi).any(|t1| {
            let t2 = r_lo.max(t1);
            absent.iter().all(|r| r.0 <= t1 || r.1 >= t2)
        })
    }

    /// A smallest set of its operations that is not linearizable: removes
    /// and reads left out one at a time while the rest still fails.
    fn explain(&self) -> Vec<usize> {
        let mut r = self.clone();
        let mut i = 0;
        while i < r.reads.len() {
            let mut t = r.clone();
            t.reads.remove(i);
            if t.linearizable() {
                i += 1;
            } else {
                r = t;
            }
        }
        let mut i = 0;
        while i < r.removes.len() {
            let mut t = r.clone();
            t.removes.remove(i);
            if t.linearizable() {
                i += 1;
            } else {
                r = t;
            }
        }
        let mut ops = r.add_ops.clone();
        ops.extend(r.removes.iter().map(|x| x.3));
        ops.extend(r.reads.iter().map(|x| x.3));
        ops
    }
}

/// Checks `history`: `Ok` if a linearization explains it.
pub fn check(history: &History) -> Result<(), Violation> {
    check_entries(&history.entries())
}

/// [`check`] on entries.
pub fn check_entries(entries: &[Entry]) -> Result<(), Violation> {
    let fail = |kind, key, ops, why: String| Err(violation(entries, kind, key, ops, why));

    // Adds as the server sees them.
    let mut logical: Vec<Logical> = vec![];
    let mut by_request: HashMap<(&str, &str, &[String]), usize> = HashMap::new();
    let mut acked_request: HashMap<(&str, &str), usize> = HashMap::new();
    for (i, e) in entries.iter().enumerate() {
        let Op::Add { app, request_id, lines } = &e.op else { continue };
        if matches!(e.outcome, Outcome::Refused(_)) {
            continue;
        }
        let l = match by_request.get(&(app.as_str(), request_id.as_str(), lines.as_slice())) {
            Some(&l) if !request_id.is_empty() => l,
            _ => {
                logical.push(Logical {
                    app: app.clone(),
                    lines: lines.clone(),
                    attempts: vec![],
                    acked: vec![],
                    ids: None,
                    window: (0, NEVER),
                });
                by_request.insert((app, request_id, lines), logical.len() - 1);
                logical.len() - 1
            }
        };
        logical[l].attempts.push(i);
        let Outcome::Added { ids, .. } = &e.outcome else { continue };
        if ids.len() != lines.len() {
            return fail(Kind::WrongCount, None, vec![i], format!("{} ids acknowledged for {} lines", ids.len(), lines.len()));
        }
        if !request_id.is_empty() {
            if let Some(&first) = acked_request.get(&(app.as_str(), request_id.as_str())) {
                if let Op::Add { lines: first_lines, .. } = &entries[first].op {
                    if first_lines != lines {
                        return fail(
                            Kind::ReplayDiffers,
                            None,
                            vec![first, i],
                            format!("request id {request_id:?} acknowledged for two different requests"),
                        );
                    }
                }
            }
            acked_request.entry((app, request_id)).or_insert(i);
        }
        match &logical[l].ids {
            Some(first) if first != ids => {
                return fail(
                    Kind::ReplayDiffers,
                    None,
                    vec![logical[l].acked[0], i],
                    format!("request id {request_id:?} acknowledged with ids {first:?} and {ids:?}"),
                )
            }
            _ => logical[l].ids = Some(ids.clone()),
        }
        logical[l].acked.push(i);
    }
    for l in &mut logical {
        let created: Vec<usize> =
            l.acked.iter().copied().filter(|&i| matches!(entries[i].outcome, Outcome::Added { replayed: false, .. })).collect();
        if created.len() > 1 {
            return fail(Kind::ReplayDiffers, None, created, "one request created its subscriptions twice (replayed = false twice)".into());
        }
        l.window = if l.acked.is_empty() {
            // Unknown: at any point after an attempt's invocation, or never.
            (l.attempts.iter().map(|&i| entries[i].invoked).min().unwrap_or(NEVER), NEVER)
        } else {
            // Created by the attempt that says so, or else by one that was
            // not acknowledged (only replays were), before the first reply.
            let end = l.acked.iter().map(|&i| entries[i].completed).min().unwrap();
            let start = match created.first() {
                Some(&c) => entries[c].invoked,
                None => l.attempts.iter().filter(|i| !l.acked.contains(i)).map(|&i| entries[i].invoked).min().unwrap_or(NEVER),
            };
            if start > end {
                return fail(
                    Kind::ReplayDiffers,
                    None,
                    l.attempts.clone(),
                    "a reply to a request that no attempt could have made yet (a replay before the add)".into(),
                );
            }
            (start, end)
        };
    }

    // Which add created each acknowledged id, and its text.
    let mut created: BTreeMap<Key, (usize, String)> = BTreeMap::new();
    for (li, l) in logical.iter().enumerate() {
        let Some(ids) = &l.ids else { continue };
        for (id, line) in ids.iter().zip(&l.lines) {
            let key = (l.app.clone(), *id);
            if let Some((other, _)) = created.get(&key) {
                return fail(
                    Kind::IdTwice,
                    Some(key),
                    vec![logical[*other].acked[0], l.acked[0]],
                    "one id acknowledged to two different adds".into(),
                );
            }
            created.insert(key, (li, line.clone()));
        }
    }

    // What each List shows; subscriptions no acknowledged add created are
    // explained by an add of unknown outcome with that text (each line of
    // such an add creates at most one).
    let mut registers: BTreeMap<Key, Register> = BTreeMap::new();
    let mut listed: Vec<(usize, BTreeSet<Key>)> = vec![];
    let mut phantoms: BTreeMap<Key, (String, Vec<usize>)> = BTreeMap::new();
    for (i, e) in entries.iter().enumerate() {
        let Outcome::Listed(subs) = &e.outcome else { continue };
        let mut keys = BTreeSet::new();
        for (app, id, text) in subs {
            let key = (app.clone(), *id);
            match created.get(&key) {
                Some((l, line)) if line != text => {
                    return fail(
                        Kind::TextDiffers,
                        Some(key),
                        vec![logical[*l].acked[0], i],
                        format!("listed as {text:?}, added as {line:?}"),
                    )
                }
                Some(_) => {}
                None => phantoms.entry(key.clone()).or_insert_with(|| (text.clone(), vec![])).1.push(i),
            }
            keys.insert(key);
        }
        listed.push((i, keys));
    }
    for (i, e) in entries.iter().enumerate() {
        let Op::Remove { app, ids } = &e.op else { continue };
        if !e.ok() {
            continue;
        }
        for id in ids {
            let key = (app.clone(), *id);
            if !created.contains_key(&key) && !phantoms.contains_key(&key) {
                phantoms.insert(key, (String::new(), vec![i]));
            }
        }
    }
    // Per application and text, the subscriptions no acknowledged add
    // created, earliest seen first: the adds of unknown outcome invoked
    // before a time are a prefix of those invoked before a later one, so
    // giving each the earliest free line is a matching if one exists.
    let mut phantoms: Vec<(u64, Key, String, Vec<usize>)> = phantoms
        .into_iter()
        .map(|(key, (text, seen))| (seen.iter().map(|&i| entries[i].completed).min().unwrap(), key, text, seen))
        .collect();
    phantoms.sort();
    let mut used: HashMap<(String, String), usize> = HashMap::new();
    for (first_seen, (app, id), text, seen) in phantoms {
        // Adds of unknown outcome that could have created it ("" from a
        // remove alone: any line).
        let candidates: Vec<usize> = (0..logical.len())
            .filter(|&l| {
                let l = &logical[l];
                l.ids.is_none() && l.app == app && l.window.0 <= first_seen && (text.is_empty() || l.lines.contains(&text))
            })
            .collect();
        let capacity: usize = candidates.iter().map(|&l| logical[l].lines.iter().filter(|x| text.is_empty() || **x == text).count()).sum();
        let n = used.entry((app.clone(), text.clone())).or_default();
        *n += 1;
        let key = (app, id);
        if *n > capacity {
            let mut ops = seen.clone();
            ops.extend(candidates.iter().flat_map(|&l| logical[l].attempts.clone()));
            let why = if candidates.is_empty() {
                "no add that was acknowledged, or whose outcome is unknown, could have created it".to_string()
            } else {
                format!("more subscriptions {text:?} than the adds of unknown outcome could have created")
            };
            return fail(Kind::Phantom, Some(key), ops, why);
        }
        let start = candidates.iter().map(|&l| logical[l].window.0).min().unwrap();
        let add_ops = candidates.iter().flat_map(|&l| logical[l].attempts.clone()).collect();
        registers.insert(key, Register { add: (start, NEVER), add_mandatory: false, add_ops, ..Default::default() });
    }
    for (key, (l, _)) in &created {
        let l = &logical[*l];
        let add_ops = if l.acked.is_empty() { l.attempts.clone() } else { l.acked.clone() };
        registers.insert(key.clone(), Register { add: l.window, add_mandatory: true, add_ops, ..Default::default() });
    }
    // Unknown adds that no List or reply tied to an id change nothing anyone saw.

    for (i, e) in entries.iter().enumerate() {
        let Op::Remove { app, ids } = &e.op else { continue };
        if !e.ok() && !e.unknown() {
            continue;
        }
        let end = if e.ok() { e.completed } else { NEVER };
        // The server removes each id once, however often it is named.
        for id in ids.iter().collect::<BTreeSet<_>>() {
            if let Some(r) = registers.get_mut(&(app.clone(), *id)) {
                r.removes.push((e.invoked, end, e.ok(), i));
            }
        }
    }
    for (i, keys) in &listed {
        let e = &entries[*i];
        let Op::List { app: scope } = &e.op else { continue };
        for (key, r) in registers.iter_mut() {
            let present = keys.contains(key);
            // "Absent" is trivially explained in a List that began before the
            // add could have, or after an acknowledged remove ended.
            let removed = r.removes.iter().any(|x| x.2 && x.1 < e.invoked);
            if present || (scope.as_ref().is_none_or(|a| *a == key.0) && e.invoked > r.add.0 && !removed) {
                r.reads.push((e.invoked, e.completed, present, *i));
            }
        }
    }
    for (key, r) in &registers {
        if !r.linearizable() {
            let ops = r.explain();
            return fail(
                Kind::NotLinearizable,
                Some(key.clone()),
                ops,
                "these operations on one subscription cannot be ordered (absent → present → absent, each at one point of its interval)"
                    .into(),
            );
        }
    }
    // Across subscriptions, a necessary condition: one point of each List
    // lies after the add of everything it shows and before its removal,
    // and before the add of what it does not show (unless it may have been
    // removed by then), or after that removal if the add certainly came first.
    for (i, keys) in &listed {
        let e = &entries[*i];
        let Op::List { app: scope } = &e.op else { continue };
        let (mut lo, mut hi) = ((e.invoked, *i), (e.completed, *i));
        for (key, r) in &registers {
            let acked_remove = r.removes.iter().find(|x| x.2);
            if keys.contains(key) {
                if r.add.0 > lo.0 {
                    lo = (r.add.0, r.add_ops[0]);
                }
                if let Some(rm) = acked_remove.filter(|rm| rm.1 < hi.0) {
                    hi = (rm.1, rm.3);
                }
            } else if r.add_mandatory && scope.as_ref().is_none_or(|a| *a == key.0) {
                // The first remove that may have taken effect by the List's end.
                let first_remove = r.removes.iter().filter(|x| x.0 <= e.completed).min_by_key(|x| x.0);
                if let Some(rm) = first_remove {
                    // Added before the List began: it saw it removed.
                    if r.add.1 < e.invoked && rm.0 > lo.0 {
                        lo = (rm.0, rm.3);
                    }
                } else if r.add.1 < hi.0 {
                    // Never removed by then: it saw it before the add.
                    hi = (r.add.1, r.add_ops[0]);
                }
            }
            if lo.0 > hi.0 {
                return fail(
                    Kind::ListNotAtomic,
                    None,
                    vec![*i, lo.1, hi.1],
                    format!(
                        "the List #{i} must take effect after #{} took effect (not before {} ns) and before #{} did (by {} ns)",
                        lo.1, lo.0, hi.1, hi.0
                    ),
                );
            }
        }
    }
    Ok(())
}
