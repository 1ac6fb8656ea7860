//! The linearizability checker of the fault-injection tests
//! (common/linearizable.rs), on histories made here: random histories of a
//! simulated linearizable server (8 clients, random delays, requests lost
//! before or after they take effect, or applied after the client gave up)
//! pass, and the same histories corrupted on purpose fail, naming the
//! operations that cannot be ordered.

mod common;

use common::linearizable::{check, check_entries, Entry, History, Kind, Op, Outcome, NEVER};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::sync::Arc;
use subc_workload::Rng;

const CLIENTS: usize = 8;

/// The subscription set, as the server keeps it: ids per application,
/// replies by request id.
#[derive(Default)]
struct Server {
    subs: BTreeMap<(String, u64), String>,
    next_id: HashMap<String, u64>,
    requests: HashMap<(String, String), (Vec<String>, Vec<u64>)>,
}

impl Server {
    /// Applies `op` atomically: its outcome.
    fn apply(&mut self, op: &Op) -> Outcome {
        match op {
            Op::Add { app, request_id, lines } => {
                if let Some((first, ids)) = self.requests.get(&(app.clone(), request_id.clone())) {
                    return if first == lines {
                        Outcome::Added { ids: ids.clone(), replayed: true }
                    } else {
                        Outcome::Refused("INVALID_ARGUMENT".into())
                    };
                }
                let next = self.next_id.entry(app.clone()).or_insert(1);
                let ids: Vec<u64> = (0..lines.len() as u64).map(|i| *next + i).collect();
                *next += lines.len() as u64;
                for (id, line) in ids.iter().zip(lines) {
                    self.subs.insert((app.clone(), *id), line.clone());
                }
                if !request_id.is_empty() {
                    self.requests.insert((app.clone(), request_id.clone()), (lines.clone(), ids.clone()));
                }
                Outcome::Added { ids, replayed: false }
            }
            Op::Remove { app, ids } => {
                if !ids.iter().all(|id| self.subs.contains_key(&(app.clone(), *id))) {
                    return Outcome::Refused("NOT_FOUND".into());
                }
                for id in ids {
                    self.subs.remove(&(app.clone(), *id));
                }
                Outcome::Removed
            }
            Op::List { app } => Outcome::Listed(
                self.subs
                    .iter()
                    .filter(|((a, _), _)| app.as_ref().is_none_or(|x| x == a))
                    .map(|((a, id), text)| (a.clone(), *id, text.clone()))
                    .collect(),
            ),
        }
    }
}

/// What a client knows: its application's ids it was given or saw, and its
/// last add (to retry).
struct Client {
    app: String,
    known: Vec<u64>,
    last_add: Option<Op>,
    adds: usize,
    left: usize,
}

impl Client {
    /// The next operation: adds (new, or the last one again with its request
    /// id), removes of ids it knows, lists of its application or of all.
    fn next_op(&mut self, c: usize, rng: &mut Rng) -> Op {
        let roll = rng.below(100);
        if roll < 10 && self.last_add.is_some() {
            return self.last_add.clone().unwrap();
        }
        if roll < 45 || (roll < 70 && self.known.is_empty()) {
            self.adds += 1;
            let n = 1 + rng.below(3) as usize;
            let lines = (0..n).map(|_| format!("stock == S{:02} : fwd({})", rng.below(30), rng.below(8))).collect();
            let request_id = if rng.chance(0.1) { String::new() } else { format!("c{c}-{}", self.adds) };
            let op = Op::Add { app: self.app.clone(), request_id, lines };
            self.last_add = Some(op.clone());
            return op;
        }
        if roll < 70 {
            let id = self.known.swap_remove(rng.below(self.known.len() as u64) as usize);
            let mut ids = vec![id];
            if rng.chance(0.2) && !self.known.is_empty() {
                ids.push(*rng.pick(&self.known));
            }
            return Op::Remove { app: self.app.clone(), ids };
        }
        Op::List { app: if rng.chance(0.5) { None } else { Some(self.app.clone()) } }
    }

    fn learn(&mut self, outcome: &Outcome) {
        match outcome {
            Outcome::Added { ids, .. } => self.known.extend(ids),
            Outcome::Listed(subs) => {
                self.known = subs.iter().filter(|(a, _, _)| *a == self.app).map(|(_, id, _)| *id).collect();
            }
            _ => {}
        }
    }
}

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Invoke(usize),
    /// The request takes effect.
    Apply(usize),
    /// The client has an outcome: the reply, or unknown (`true`).
    Complete(usize, bool),
}

/// A history of `clients` clients, `per_client` operations each, against a
/// linearizable server: each request takes effect at one point between its
/// invocation and its reply; one in five replies is lost (a timeout after
/// 300 ticks): the request took effect, or never will, or will later.
fn simulate(seed: u64, clients: usize, per_client: usize) -> Vec<Entry> {
    let mut rng = Rng::new(seed);
    let history = History::new();
    let mut server = Server::default();
    let mut cs: Vec<Client> =
        (0..clients).map(|c| Client { app: format!("app{}", c % 3), known: vec![], last_add: None, adds: 0, left: per_client }).collect();
    let mut events = BinaryHeap::new();
    let mut seq = 0u64;
    let mut push = |events: &mut BinaryHeap<_>, t: u64, e: Event| {
        seq += 1;
        events.push(Reverse((t, seq, e)));
    };
    for c in 0..clients {
        push(&mut events, rng.below(50), Event::Invoke(c));
    }
    // Per request: its client, op, call, whether its reply is lost, and
    // its outcome once applied.
    let mut requests: Vec<(usize, Op, common::linearizable::Call, bool, Option<Outcome>)> = vec![];
    while let Some(Reverse((t, _, e))) = events.pop() {
        match e {
            Event::Invoke(c) => {
                let op = cs[c].next_op(c, &mut rng);
                let call = history.invoke_at(c, op.clone(), t);
                let r = requests.len();
                let fate = rng.below(100);
                requests.push((c, op, call, fate >= 80, None));
                let apply = t + 1 + rng.below(100);
                match fate {
                    // Answered.
                    0..80 => push(&mut events, apply, Event::Apply(r)),
                    // Lost before it took effect.
                    80..87 => push(&mut events, t + 300, Event::Complete(r, true)),
                    // Took effect, the reply lost.
                    87..94 => {
                        push(&mut events, apply, Event::Apply(r));
                        push(&mut events, t + 300, Event::Complete(r, true));
                    }
                    // Takes effect after the client gave up.
                    _ => {
                        push(&mut events, t + 301 + rng.below(500), Event::Apply(r));
                        push(&mut events, t + 300, Event::Complete(r, true));
                    }
                }
            }
            Event::Apply(r) => {
                let outcome = server.apply(&requests[r].1);
                if !requests[r].3 {
                    // The reply travels back.
                    push(&mut events, t + 1 + rng.below(100), Event::Complete(r, false));
                }
                requests[r].4 = Some(outcome);
            }
            Event::Complete(r, unknown) => {
                let (c, call) = (requests[r].0, requests[r].2);
                let outcome = if unknown {
                    Outcome::Unknown("deadline exceeded".into())
                } else {
                    let o = requests[r].4.clone().unwrap();
                    cs[c].learn(&o);
                    o
                };
                history.complete_at(call, outcome, t);
                cs[c].left -= 1;
                if cs[c].left > 0 {
                    push(&mut events, t + rng.below(50), Event::Invoke(c));
                }
            }
        }
    }
    history.entries()
}

/// The index of every entry matching `f`.
fn find(entries: &[Entry], f: impl Fn(&Entry) -> bool) -> Vec<usize> {
    (0..entries.len()).filter(|&i| f(&entries[i])).collect()
}

fn listed(e: &Entry) -> Option<&Vec<(String, u64, String)>> {
    match &e.outcome {
        Outcome::Listed(s) => Some(s),
        _ => None,
    }
}

fn acked_ids(e: &Entry) -> Option<&Vec<u64>> {
    match &e.outcome {
        Outcome::Added { ids, .. } => Some(ids),
        _ => None,
    }
}

fn add_app(e: &Entry) -> Option<(&str, &str)> {
    match &e.op {
        Op::Add { app, request_id, .. } => Some((app, request_id)),
        _ => None,
    }
}

/// Whether a request that may have taken effect names `key` for removal,
/// invoked before `t`.
fn removal_before(entries: &[Entry], key: &(String, u64), t: u64) -> bool {
    entries.iter().any(|e| {
        matches!(&e.op, Op::Remove { app, ids } if *app == key.0 && ids.contains(&key.1))
            && !matches!(e.outcome, Outcome::Refused(_))
            && e.invoked < t
    })
}

const SEEDS: u64 = 24;

fn seeds() -> impl Iterator<Item = u64> {
    (1..=SEEDS).map(|s| s.wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

#[test]
fn random_histories_of_a_linearizable_server_pass() {
    let mut unknown = 0;
    let mut late = 0;
    for seed in seeds() {
        let entries = simulate(seed, CLIENTS, 150);
        unknown += entries.iter().filter(|e| matches!(e.outcome, Outcome::Unknown(_))).count();
        late += entries.iter().filter(|e| matches!(e.outcome, Outcome::Added { replayed: true, .. })).count();
        if let Err(v) = check_entries(&entries) {
            panic!("seed {seed:x}: a linearizable history fails:\n{v}");
        }
    }
    assert!(unknown > 100 && late > 10, "the histories lack unknown outcomes ({unknown}) or replays ({late})");
}

#[test]
fn a_list_that_misses_an_add_acknowledged_before_it_fails() {
    let mut corrupted = 0;
    for seed in seeds() {
        let mut entries = simulate(seed, CLIENTS, 150);
        // An add acknowledged, a List invoked after, showing it, with no
        // removal of it that could have come first.
        let found = find(&entries, |e| acked_ids(e).is_some()).into_iter().find_map(|a| {
            let app = add_app(&entries[a]).unwrap().0.to_string();
            let key = (app, acked_ids(&entries[a]).unwrap()[0]);
            let l = find(&entries, |e| {
                e.invoked > entries[a].completed && listed(e).is_some_and(|s| s.iter().any(|(x, id, _)| (x, *id) == (&key.0, key.1)))
            })
            .into_iter()
            .find(|&l| !removal_before(&entries, &key, entries[l].completed))?;
            Some((a, key, l))
        });
        let Some((a, key, l)) = found else { continue };
        let Outcome::Listed(subs) = &mut entries[l].outcome else { unreachable!() };
        subs.retain(|(x, id, _)| (x, *id) != (&key.0, key.1));
        let v = check_entries(&entries).expect_err("a List missing an acknowledged add passes");
        assert_eq!(v.kind, Kind::NotLinearizable, "{v}");
        assert_eq!(v.key.as_ref(), Some(&key), "{v}");
        assert!(v.ops.contains(&l), "the violation names the List #{l}:\n{v}");
        assert!(v.ops.iter().any(|&o| acked_ids(&entries[o]) == acked_ids(&entries[a])), "the violation names the add #{a}:\n{v}");
        // Nothing but the add and the List is needed to see it.
        assert!(v.ops.iter().all(|&o| o == l || acked_ids(&entries[o]).is_some()), "{v}");
        corrupted += 1;
    }
    assert!(corrupted >= SEEDS as usize / 2, "only {corrupted} histories could be corrupted");
}

#[test]
fn an_id_acknowledged_to_two_adds_fails() {
    let mut corrupted = 0;
    for seed in seeds() {
        let mut entries = simulate(seed, CLIENTS, 150);
        // Two adds of one application, different requests, both acknowledged.
        let adds = find(&entries, |e| acked_ids(e).is_some());
        let Some((a, b)) = adds.iter().find_map(|&a| {
            let (app, req) = add_app(&entries[a]).unwrap();
            let b = adds.iter().copied().find(|&b| {
                let (app_b, req_b) = add_app(&entries[b]).unwrap();
                app_b == app && req_b != req && !req.is_empty() && !req_b.is_empty()
            })?;
            Some((a, b))
        }) else {
            continue;
        };
        let id = acked_ids(&entries[a]).unwrap()[0];
        let (app_b, req_b) = {
            let (x, y) = add_app(&entries[b]).unwrap();
            (x.to_string(), y.to_string())
        };
        // Every reply to b's request says so.
        for e in entries.iter_mut() {
            if add_app(e) == Some((&app_b, &req_b)) {
                if let Outcome::Added { ids, .. } = &mut e.outcome {
                    ids[0] = id;
                }
            }
        }
        let v = check_entries(&entries).expect_err("one id for two adds passes");
        assert_eq!(v.kind, Kind::IdTwice, "{v}");
        let reqs: Vec<_> = v.ops.iter().map(|&o| add_app(&entries[o]).unwrap().1.to_string()).collect();
        assert!(reqs.contains(&req_b) && reqs.contains(&add_app(&entries[a]).unwrap().1.to_string()), "{v}");
        corrupted += 1;
    }
    assert_eq!(corrupted, SEEDS as usize);
}

#[test]
fn a_removed_subscription_seen_by_a_later_list_fails() {
    let mut corrupted = 0;
    for seed in seeds() {
        let mut entries = simulate(seed, CLIENTS, 150);
        // A remove acknowledged, a List invoked after it that covers the
        // subscription's application.
        let removes = find(&entries, |e| matches!(e.op, Op::Remove { .. }) && e.outcome == Outcome::Removed);
        let found = removes.into_iter().find_map(|r| {
            let Op::Remove { app, ids } = &entries[r].op else { unreachable!() };
            let key = (app.clone(), ids[0]);
            // Its text, from its add.
            let text = entries.iter().find_map(|e| match (&e.op, &e.outcome) {
                (Op::Add { app, lines, .. }, Outcome::Added { ids, .. }) if *app == key.0 => {
                    ids.iter().position(|id| *id == key.1).map(|p| lines[p].clone())
                }
                _ => None,
            })?;
            let l = find(&entries, |e| {
                e.invoked > entries[r].completed
                    && listed(e).is_some()
                    && matches!(&e.op, Op::List { app } if app.as_ref().is_none_or(|a| *a == key.0))
            })
            .into_iter()
            .next()?;
            Some((r, key, text, l))
        });
        let Some((r, key, text, l)) = found else { continue };
        let Outcome::Listed(subs) = &mut entries[l].outcome else { unreachable!() };
        subs.push((key.0.clone(), key.1, text));
        let v = check_entries(&entries).expect_err("a List showing a removed subscription passes");
        assert_eq!(v.kind, Kind::NotLinearizable, "{v}");
        assert_eq!(v.key.as_ref(), Some(&key), "{v}");
        assert!(v.ops.contains(&r) && v.ops.contains(&l), "the violation names the remove #{r} and the List #{l}:\n{v}");
        corrupted += 1;
    }
    assert!(corrupted >= SEEDS as usize / 2, "only {corrupted} histories could be corrupted");
}

#[test]
fn a_request_id_acknowledged_with_other_ids_fails() {
    let mut corrupted = 0;
    for seed in seeds() {
        let mut entries = simulate(seed, CLIENTS, 150);
        // A request acknowledged twice (a retry): the second reply's ids changed.
        let adds = find(&entries, |e| acked_ids(e).is_some() && !add_app(e).unwrap().1.is_empty());
        let Some((a, b)) = adds.iter().enumerate().find_map(|(n, &a)| {
            let b = adds[n + 1..].iter().copied().find(|&b| add_app(&entries[b]) == add_app(&entries[a]))?;
            Some((a, b))
        }) else {
            continue;
        };
        if let Outcome::Added { ids, .. } = &mut entries[b].outcome {
            ids[0] += 1_000_000;
        }
        let v = check_entries(&entries).expect_err("one request id with two sets of ids passes");
        assert_eq!(v.kind, Kind::ReplayDiffers, "{v}");
        assert_eq!(v.ops, vec![a, b], "{v}");
        corrupted += 1;
    }
    assert!(corrupted >= SEEDS as usize / 2, "only {corrupted} histories could be corrupted");
}

fn add(request_id: &str, line: &str) -> Op {
    Op::Add { app: "app0".into(), request_id: request_id.into(), lines: vec![line.into()] }
}

fn all() -> Op {
    Op::List { app: None }
}

fn entry(client: usize, op: Op, invoked: u64, completed: u64, outcome: Outcome) -> Entry {
    Entry { client, op, invoked, completed, outcome }
}

fn sub(id: u64, text: &str) -> (String, u64, String) {
    ("app0".into(), id, text.into())
}

/// An unknown outcome may take effect at any point after its invocation,
/// also after the client gave up, or never; but once seen, it stays.
#[test]
fn an_unknown_outcome_takes_effect_at_most_once_at_any_later_point() {
    let t = "stock == A : fwd(1)";
    let lost = entry(0, add("r1", t), 0, 10, Outcome::Unknown("deadline".into()));
    // Not seen, then seen, long after the client gave up: fine.
    let h =
        vec![lost.clone(), entry(1, all(), 20, 30, Outcome::Listed(vec![])), entry(1, all(), 100, 110, Outcome::Listed(vec![sub(1, t)]))];
    check_entries(&h).unwrap();
    // Never seen: fine.
    check_entries(&h[..2]).unwrap();
    // Seen, then gone with no remove: a violation naming the two Lists and the add.
    let mut gone = h.clone();
    gone.push(entry(2, all(), 200, 210, Outcome::Listed(vec![])));
    let v = check_entries(&gone).unwrap_err();
    assert_eq!((v.kind, v.ops.clone()), (Kind::NotLinearizable, vec![0, 2, 3]), "{v}");
    // Gone after a remove whose reply was lost: fine.
    let mut removed = gone.clone();
    removed.insert(3, entry(2, Op::Remove { app: "app0".into(), ids: vec![1] }, 150, 160, Outcome::Unknown("unavailable".into())));
    check_entries(&removed).unwrap();
    // Seen with no add that could have made it: a phantom.
    let later = entry(0, add("r2", t), 10, 20, Outcome::Unknown("deadline".into()));
    let phantom = vec![entry(1, all(), 0, 5, Outcome::Listed(vec![sub(7, t)])), later];
    let v = check_entries(&phantom).unwrap_err();
    assert_eq!((v.kind, v.ops.clone()), (Kind::Phantom, vec![0]), "{v}");
    // Two subscriptions from one lost line: one too many.
    let twice = vec![lost, entry(1, all(), 20, 30, Outcome::Listed(vec![sub(1, t), sub(2, t)]))];
    let v = check_entries(&twice).unwrap_err();
    assert_eq!(v.kind, Kind::Phantom, "{v}");
}

/// Intervals are closed; concurrent operations may be ordered either way.
#[test]
fn concurrent_operations_may_be_ordered_either_way() {
    let t = "stock == A : fwd(1)";
    let added = |inv, comp| entry(0, add("r1", t), inv, comp, Outcome::Added { ids: vec![1], replayed: false });
    // A List concurrent with the add may miss it, or see it.
    check_entries(&[added(10, 20), entry(1, all(), 15, 25, Outcome::Listed(vec![]))]).unwrap();
    check_entries(&[added(10, 20), entry(1, all(), 15, 25, Outcome::Listed(vec![sub(1, t)]))]).unwrap();
    // Invoked when the add's reply arrived: either order.
    check_entries(&[added(10, 20), entry(1, all(), 20, 25, Outcome::Listed(vec![]))]).unwrap();
    // Invoked after: it must see it.
    let v = check_entries(&[added(10, 20), entry(1, all(), 21, 25, Outcome::Listed(vec![]))]).unwrap_err();
    assert_eq!(v.ops, vec![0, 1], "{v}");
    // A List that ended before the add began cannot see it.
    let v = check_entries(&[entry(1, all(), 0, 5, Outcome::Listed(vec![sub(1, t)])), added(10, 20)]).unwrap_err();
    assert_eq!((v.kind, v.ops.clone()), (Kind::NotLinearizable, vec![0, 1]), "{v}");
    // An application's List covers only its own.
    check_entries(&[added(10, 20), entry(1, Op::List { app: Some("app1".into()) }, 30, 40, Outcome::Listed(vec![]))]).unwrap();
    // Two acknowledged removes of one subscription: one must have failed.
    let rm = |inv, comp| entry(2, Op::Remove { app: "app0".into(), ids: vec![1] }, inv, comp, Outcome::Removed);
    let v = check_entries(&[added(10, 20), rm(30, 40), rm(35, 45)]).unwrap_err();
    assert_eq!(v.ops, vec![0, 1, 2], "{v}");
    // A List shows the text the add was given.
    let v = check_entries(&[added(10, 20), entry(1, all(), 30, 40, Outcome::Listed(vec![sub(1, "stock == B : fwd(1)")]))]).unwrap_err();
    assert_eq!((v.kind, v.ops.clone()), (Kind::TextDiffers, vec![0, 1]), "{v}");
    // A replay before any attempt could have added.
    let v = check_entries(&[
        entry(0, add("r1", t), 0, 5, Outcome::Added { ids: vec![1], replayed: true }),
        entry(1, add("r1", t), 10, 20, Outcome::Added { ids: vec![1], replayed: false }),
    ])
    .unwrap_err();
    assert_eq!(v.kind, Kind::ReplayDiffers, "{v}");
    let _ = NEVER;
}

/// A List is one point for all it shows: it cannot show an add and miss
/// one that was acknowledged before that add began, though each alone
/// could be ordered.
#[test]
fn a_list_is_one_point_for_every_subscription() {
    let (a, b) = ("stock == A : fwd(1)", "stock == B : fwd(2)");
    let h = vec![
        entry(0, add("ra", a), 0, 10, Outcome::Added { ids: vec![1], replayed: false }),
        entry(1, all(), 5, 40, Outcome::Listed(vec![sub(2, b)])),
        entry(0, add("rb", b), 20, 30, Outcome::Added { ids: vec![2], replayed: false }),
    ];
    let v = check_entries(&h).unwrap_err();
    assert_eq!((v.kind, v.ops.clone()), (Kind::ListNotAtomic, vec![0, 1, 2]), "{v}");
    // Both, or neither, or only the first: fine.
    for shown in [vec![sub(1, a), sub(2, b)], vec![], vec![sub(1, a)]] {
        let mut ok = h.clone();
        ok[1].outcome = Outcome::Listed(shown);
        check_entries(&ok).unwrap_or_else(|v| panic!("{v}"));
    }
    // Missing the first is fine if a remove of it may have come first.
    let mut removed = h.clone();
    removed.push(entry(2, Op::Remove { app: "app0".into(), ids: vec![1] }, 15, 25, Outcome::Removed));
    check_entries(&removed).unwrap_or_else(|v| panic!("{v}"));
}

/// The recorder under real threads: 8 clients against a server behind a
/// mutex (each request applied while it holds the lock, between its
/// invocation and its completion), with real clocks; and a lost update.
#[test]
fn the_recorder_records_real_threads() {
    let history = Arc::new(History::new());
    let server = Arc::new(std::sync::Mutex::new(Server::default()));
    let threads: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (history, server) = (history.clone(), server.clone());
            std::thread::spawn(move || {
                let mut rng = Rng::new(c as u64 + 1);
                let mut client = Client { app: format!("app{}", c % 3), known: vec![], last_add: None, adds: 0, left: 0 };
                for _ in 0..300 {
                    let op = client.next_op(c, &mut rng);
                    let call = history.invoke(c, op.clone());
                    let outcome = server.lock().unwrap().apply(&op);
                    client.learn(&outcome);
                    history.complete(call, outcome);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let t0 = std::time::Instant::now();
    check(&history).unwrap_or_else(|v| panic!("{v}"));
    eprintln!("{} operations checked in {:?}", history.entries().len(), t0.elapsed());
    // The server loses one acknowledged add: a List after it misses it.
    let entries = history.entries();
    let a = find(&entries, |e| acked_ids(e).is_some()).into_iter().find(|&a| {
        let key = (add_app(&entries[a]).unwrap().0.to_string(), acked_ids(&entries[a]).unwrap()[0]);
        !removal_before(&entries, &key, NEVER)
            && entries.iter().any(|e| e.invoked > entries[a].completed && matches!(e.op, Op::List { app: None }))
    });
    let a = a.expect("an add never removed, and a List of all after it");
    let key = (add_app(&entries[a]).unwrap().0.to_string(), acked_ids(&entries[a]).unwrap()[0]);
    let mut lost = entries.clone();
    for e in lost.iter_mut().filter(|e| e.invoked > entries[a].completed) {
        if let Outcome::Listed(subs) = &mut e.outcome {
            subs.retain(|(x, id, _)| (x, *id) != (&key.0, key.1));
        }
    }
    let v = check(&History::from_entries(lost)).expect_err("a lost add passes");
    assert_eq!((v.kind, v.key.clone()), (Kind::NotLinearizable, Some(key)), "{v}");
}

/// 8 clients, 4,000 operations: checked in well under a second (release)
/// or a few (debug).
#[test]
fn a_long_history_checks_quickly() {
    let entries = simulate(7, CLIENTS, 500);
    let t = std::time::Instant::now();
    check_entries(&entries).unwrap_or_else(|v| panic!("{v}"));
    let took = t.elapsed();
    eprintln!("{} operations checked in {took:?}", entries.len());
    assert!(took < std::time::Duration::from_secs(20), "{took:?}");
}
