//! The reference interpreter: the executable form of `docs/semantics.md`.
//!
//! Slow and obviously correct. It parses a packet by walking the parse graph,
//! updates the stream state (counters, averages, EWMAs), evaluates every
//! subscription's checked condition directly (not its normal form), derives
//! the decision, and applies the matched subscriptions' variable updates.
//! Every compiled engine (the table simulator, the P4 simulator, the eBPF
//! program in the kernel) is tested against this module.
//!
//! The per-packet loop is [`run_packet`], generic over the step engines
//! differ in ([`Decide`]: checked conditions, normal forms, tables), so that
//! other engines share the parts that are not under test. Its pieces are
//! public too: [`parse_packet`], [`StateStore::pre_stage`],
//! [`StateStore::apply_updates`], and [`Decision::of`].
//!
//! Under a target [`Profile`] other than the reference, the stream state
//! follows that target's arithmetic instead (`docs/semantics.md`, "Target
//! profiles").

use crate::ast::CmpOp;
use crate::nf::NfSubscription;
use crate::profile::Profile;
use crate::program::{Actions, Cond, SubId, Subscription, Test, UpdateOp, VarUpdate};
use crate::spec::*;
use crate::value::{domain_of_raw, mask, read_bits};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// Raw field values of the headers a packet's parse extracted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedPacket {
    /// Per header: `Some(raw field values)` if extracted.
    pub headers: Vec<Option<Vec<u64>>>,
}

impl ParsedPacket {
    /// Raw bits of a field; fields of headers not extracted read as 0.
    pub fn raw(&self, f: FieldRef) -> u64 {
        self.headers[f.header.0 as usize].as_ref().map(|v| v[f.field as usize]).unwrap_or(0)
    }
    pub fn valid(&self, h: HeaderId) -> bool {
        self.headers[h.0 as usize].is_some()
    }
}

/// Walks the parse graph. `None` if the packet does not reach `accept`
/// (a `reject`, no matching select case without a default, or too short).
pub fn parse_packet(spec: &Spec, bytes: &[u8]) -> Option<ParsedPacket> {
    let mut out = ParsedPacket { headers: vec![None; spec.headers.len()] };
    let mut cursor = 0usize;
    let mut at = spec.parser.start;
    // The graph is acyclic, so this visits each header at most once.
    loop {
        let h = match at {
            ParseTarget::Accept => return Some(out),
            ParseTarget::Reject => return None,
            ParseTarget::Header(h) => h,
        };
        let header = spec.header(h);
        let end = cursor + header.bytes as usize;
        if end > bytes.len() {
            return None;
        }
        let slice = &bytes[cursor..end];
        let values: Vec<u64> = header.fields.iter().map(|f| if f.width <= 64 { read_bits(slice, f.offset, f.width) } else { 0 }).collect();
        cursor = end;
        let next = spec.parser.next[h.0 as usize].as_ref()?;
        at = match next {
            ParseNext::Goto(t) => *t,
            ParseNext::Select { fields, cases, default } => {
                let key: Vec<u64> = fields.iter().map(|f| values[f.field as usize]).collect();
                cases
                    .iter()
                    .find(|c| c.values.iter().zip(&key).all(|(v, k)| v.is_none_or(|v| v == *k)))
                    .map(|c| c.target)
                    .unwrap_or(*default)
            }
        };
        out.headers[h.0 as usize] = Some(values);
    }
}

/// One slot of one state variable. Under [`Profile::Tna`], a counter's
/// `window` holds the start of its window (the low 32 bits of a time in
/// nanoseconds) rather than the window's number.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Slot {
    Counter { window: u64, count: u32 },
    Avg { ring: Vec<u64>, next: u32, sum: u64 },
    Ewma { ewma: u64, count: u32 },
    Var { value: u64 },
}

/// All state of a subscription set: per variable, its slots, and the
/// target profile whose arithmetic updates them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StateStore {
    pub vars: Vec<Vec<Slot>>,
    profile: Profile,
}

/// The query-field values one packet is evaluated against: packet fields as
/// parsed, state as read after this packet's stream updates.
pub type QueryValues = Vec<u64>;

/// Words of a Tofino stateful ALU: 32 bits.
const TNA_WORD: u32 = 32;

impl StateStore {
    /// State at its start, updated as `docs/semantics.md` says
    /// ([`Profile::Reference`]).
    pub fn new(spec: &Spec) -> StateStore {
        StateStore::with_profile(spec, Profile::Reference)
    }

    /// State at its start, updated with `profile`'s arithmetic.
    pub fn with_profile(spec: &Spec, profile: Profile) -> StateStore {
        let vars = spec
            .states
            .iter()
            .map(|s| {
                let slot = match &s.kind {
                    StateKind::Counter { .. } => Slot::Counter { window: 0, count: 0 },
                    StateKind::Avg { samples, .. } => Slot::Avg { ring: vec![0; *samples as usize], next: 0, sum: 0 },
                    StateKind::Ewma { .. } => Slot::Ewma { ewma: 0, count: 0 },
                    StateKind::Var { .. } => Slot::Var { value: 0 },
                };
                vec![slot; s.slots() as usize]
            })
            .collect();
        StateStore { vars, profile }
    }

    /// The target profile this state follows.
    pub fn profile(&self) -> Profile {
        self.profile
    }

    fn slot_index(s: &StateVar, pkt: &ParsedPacket) -> usize {
        match s.key {
            None => 0,
            Some(k) => (pkt.raw(k.field) & (k.slots as u64 - 1)) as usize,
        }
    }

    /// Updates stream state for this packet (in declaration order) and returns
    /// the value of every query field.
    pub fn pre_stage(&mut self, spec: &Spec, pkt: &ParsedPacket, ts_ns: u64) -> QueryValues {
        let mut spikes = vec![false; spec.states.len()];
        for (i, s) in spec.states.iter().enumerate() {
            let idx = Self::slot_index(s, pkt);
            let slot = &mut self.vars[i][idx];
            match (&s.kind, slot) {
                (StateKind::Counter { window_us }, Slot::Counter { window: start, count }) if self.profile == Profile::Tna => {
                    // The window is kept as its start: no division on a switch.
                    let t = ts_ns & mask(TNA_WORD);
                    if t.wrapping_sub(*start) & mask(TNA_WORD) >= window_us * 1000 {
                        *start = t;
                        *count = 1;
                    } else {
                        *count = count.wrapping_add(1);
                    }
                }
                (StateKind::Counter { window_us }, Slot::Counter { window, count }) => {
                    let w = ts_ns / (window_us * 1000);
                    if *window != w {
                        *window = w;
                        *count = 0;
                    }
                    *count = count.wrapping_add(1);
                }
                // A packet without the averaged field's header leaves the slot as it was.
                (StateKind::Avg { field, samples }, Slot::Avg { ring, next, sum }) if pkt.valid(field.header) => {
                    let v = pkt.raw(*field);
                    *sum = match self.profile {
                        Profile::Reference => *sum + v - ring[*next as usize],
                        Profile::Tna => sum.wrapping_add(v).wrapping_sub(ring[*next as usize]) & mask(TNA_WORD),
                    };
                    ring[*next as usize] = v;
                    *next = (*next + 1) % samples;
                }
                (StateKind::Ewma { field, shift, spike_shift, warmup }, Slot::Ewma { ewma, count }) if pkt.valid(field.header) => {
                    let x = match self.profile {
                        Profile::Reference => pkt.raw(*field) << EWMA_FRACTION_BITS,
                        // One 32-bit word: the average then stays below 2^32.
                        Profile::Tna => (pkt.raw(*field) << EWMA_FRACTION_BITS) & mask(TNA_WORD),
                    };
                    let old = *ewma;
                    let new = if *count == 0 {
                        x
                    } else if x >= old {
                        old + ((x - old) >> shift)
                    } else {
                        old - ((old - x) >> shift)
                    };
                    let delta = new.abs_diff(old);
                    spikes[i] = *count >= *warmup && delta > (old >> spike_shift);
                    *ewma = new;
                    *count = (*count + 1).min(255);
                }
                _ => {}
            }
        }
        spec.query_fields
            .iter()
            .map(|q| match q.source {
                QuerySource::Packet(f) => domain_of_raw(q.ty, q.width, pkt.raw(f)),
                QuerySource::State { state, read } => {
                    let s = spec.state(state);
                    let slot = &self.vars[state.0 as usize][Self::slot_index(s, pkt)];
                    match (read, slot) {
                        (StateRead::Spike, _) => spikes[state.0 as usize] as u64,
                        // This packet updated its slot: the count includes it.
                        (_, Slot::Counter { count, .. }) if self.profile == Profile::Tna => *count as u64,
                        (_, Slot::Counter { window, count }) => {
                            let StateKind::Counter { window_us } = s.kind else { unreachable!() };
                            if *window == ts_ns / (window_us * 1000) {
                                *count as u64
                            } else {
                                0
                            }
                        }
                        (_, Slot::Avg { ring, sum, .. }) if self.profile == Profile::Tna => {
                            ((sum & mask(TNA_WORD)) >> ring.len().trailing_zeros()) & mask(q.width)
                        }
                        (_, Slot::Avg { ring, sum, .. }) => sum >> ring.len().trailing_zeros(),
                        (_, Slot::Ewma { ewma, .. }) => (ewma >> EWMA_FRACTION_BITS) & mask(q.width),
                        (_, Slot::Var { value }) => *value,
                    }
                }
            })
            .collect()
    }

    /// Applies the union of the matched subscriptions' updates: per variable,
    /// the largest `Set` constant (if any) replaces the value, then every
    /// distinct `Add` constant is added, modulo 2^width.
    pub fn apply_updates(&mut self, spec: &Spec, pkt: &ParsedPacket, updates: &BTreeSet<VarUpdate>) {
        let mut by_var: BTreeMap<StateVarId, Vec<&VarUpdate>> = BTreeMap::new();
        for u in updates {
            by_var.entry(u.var).or_default().push(u);
        }
        for (var, us) in by_var {
            let s = spec.state(var);
            let StateKind::Var { width } = s.kind else { continue };
            let idx = Self::slot_index(s, pkt);
            let Slot::Var { value } = &mut self.vars[var.0 as usize][idx] else { continue };
            let set = us.iter().filter(|u| u.op == UpdateOp::Set).map(|u| u.value).max();
            let add = us.iter().filter(|u| u.op == UpdateOp::Add).fold(0u64, |a, u| a.wrapping_add(u.value));
            *value = set.unwrap_or(*value).wrapping_add(add) & mask(width);
        }
    }
}

/// What happens to a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Hash)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    Forward,
    Drop,
    NoMatch,
}

impl Decision {
    /// Forward if any port, else drop if any matched subscription drops, else no match.
    pub fn of(ports: &BTreeSet<u32>, drop: bool) -> Decision {
        if !ports.is_empty() {
            Decision::Forward
        } else if drop {
            Decision::Drop
        } else {
            Decision::NoMatch
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Forward => "forward",
            Decision::Drop => "drop",
            Decision::NoMatch => "no_match",
        }
    }
}

/// The result of running one packet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Outcome {
    pub parsed: bool,
    /// The ids of the subscriptions that matched, sorted, when the engine's
    /// decide step knows them ([`Decide::names_matches`]).
    pub matched: Option<Vec<SubId>>,
    pub ports: Vec<u32>,
    pub decision: Decision,
}

/// Evaluates a checked condition.
pub fn eval_cond(spec: &Spec, c: &Cond, values: &QueryValues) -> bool {
    match c {
        Cond::True => true,
        Cond::False => false,
        Cond::Not(c) => !eval_cond(spec, c, values),
        Cond::And(cs) => cs.iter().all(|c| eval_cond(spec, c, values)),
        Cond::Or(cs) => cs.iter().any(|c| eval_cond(spec, c, values)),
        Cond::Atom(a) => {
            let x = values[a.field.0 as usize];
            let width = spec.query_field(a.field).width;
            match &a.test {
                Test::Cmp(op, v) => match op {
                    CmpOp::Eq => x == *v,
                    CmpOp::Ne => x != *v,
                    CmpOp::Lt => x < *v,
                    CmpOp::Le => x <= *v,
                    CmpOp::Gt => x > *v,
                    CmpOp::Ge => x >= *v,
                },
                Test::Prefix { value, len } => {
                    let shift = width - len;
                    *len == 0 || (x >> shift) == (value >> shift)
                }
                Test::OneOf(vs) => vs.contains(&x),
            }
        }
    }
}

/// Evaluates a subscription in normal form (used to test normalization).
pub fn eval_nf(nf: &NfSubscription, values: &QueryValues) -> bool {
    nf.cubes.iter().any(|c| c.contains(|f| values[f.0 as usize]))
}

/// The union of the actions of `matched`.
pub fn union_actions<'a>(matched: impl IntoIterator<Item = &'a Actions>) -> Actions {
    let mut out = Actions::default();
    for a in matched {
        out.ports.extend(a.ports.iter().copied());
        out.drop |= a.drop;
        out.updates.extend(a.updates.iter().copied());
    }
    out
}

/// The step of [`run_packet`] in which engines differ: from a packet's
/// query values, the union of the actions of the subscriptions they match.
/// Any `FnMut(&QueryValues) -> Actions` is one (compiled tables, say).
pub trait Decide {
    /// Whether [`Decide::decide`] names the subscriptions that matched, so
    /// that [`Outcome::matched`] is `Some` (the checked conditions do;
    /// tables do not).
    fn names_matches(&self) -> bool {
        true
    }
    /// The actions for `values`, and the ids of the subscriptions that
    /// matched, sorted (empty unless [`Decide::names_matches`]).
    fn decide(&mut self, spec: &Spec, values: &QueryValues) -> (Actions, Vec<SubId>);
}

impl<F: FnMut(&QueryValues) -> Actions> Decide for F {
    fn names_matches(&self) -> bool {
        false
    }
    fn decide(&mut self, _: &Spec, values: &QueryValues) -> (Actions, Vec<SubId>) {
        (self(values), vec![])
    }
}

/// The reference decide step: every subscription's checked condition.
#[derive(Clone, Copy, Debug)]
pub struct Checked<'a>(pub &'a [Subscription]);

impl Decide for Checked<'_> {
    fn decide(&mut self, spec: &Spec, values: &QueryValues) -> (Actions, Vec<SubId>) {
        matches_of(self.0.iter().filter(|s| eval_cond(spec, &s.cond, values)).map(|s| (s.id, &s.actions)).collect())
    }
}

/// The decide step of normal forms, cube by cube (rules relaxed under a
/// budget exist only as normal forms).
#[derive(Clone, Copy, Debug)]
pub struct NormalForms<'a>(pub &'a [NfSubscription]);

impl Decide for NormalForms<'_> {
    fn decide(&mut self, _: &Spec, values: &QueryValues) -> (Actions, Vec<SubId>) {
        matches_of(self.0.iter().filter(|r| eval_nf(r, values)).map(|r| (r.id, &r.actions)).collect())
    }
}

/// The union of the matched subscriptions' actions, and their ids, sorted.
fn matches_of(matched: Vec<(SubId, &Actions)>) -> (Actions, Vec<SubId>) {
    let mut ids: Vec<SubId> = matched.iter().map(|(id, _)| *id).collect();
    ids.sort_unstable();
    (union_actions(matched.into_iter().map(|(_, a)| a)), ids)
}

/// Runs one packet that arrived at `ts_ns` through `decide`: parses it,
/// updates the stream `state` and reads the query fields, decides, applies
/// the matched subscriptions' variable updates, and derives the decision.
/// Every engine that keeps its state in a [`StateStore`] runs packets
/// through this, the reference ([`Interpreter`]) included.
pub fn run_packet<D: Decide + ?Sized>(spec: &Spec, state: &mut StateStore, decide: &mut D, bytes: &[u8], ts_ns: u64) -> Outcome {
    let Some(pkt) = parse_packet(spec, bytes) else {
        let matched = decide.names_matches().then(Vec::new);
        return Outcome { parsed: false, matched, ports: vec![], decision: Decision::NoMatch };
    };
    let values = state.pre_stage(spec, &pkt, ts_ns);
    let (actions, ids) = decide.decide(spec, &values);
    state.apply_updates(spec, &pkt, &actions.updates);
    Outcome {
        parsed: true,
        matched: decide.names_matches().then_some(ids),
        decision: Decision::of(&actions.ports, actions.drop),
        ports: actions.ports.into_iter().collect(),
    }
}

/// Runs packets through a decide step, keeping the stream state between
/// packets ([`run_packet`]).
pub struct Engine<'a, D> {
    pub spec: &'a Spec,
    pub state: StateStore,
    pub decide: D,
}

impl<'a, D: Decide> Engine<'a, D> {
    /// An engine whose stream state starts afresh and follows `profile`'s arithmetic.
    pub fn with_decide(spec: &'a Spec, profile: Profile, decide: D) -> Engine<'a, D> {
        Engine { spec, state: StateStore::with_profile(spec, profile), decide }
    }

    pub fn run(&mut self, bytes: &[u8], ts_ns: u64) -> Outcome {
        run_packet(self.spec, &mut self.state, &mut self.decide, bytes, ts_ns)
    }
}

/// The reference interpreter: the checked conditions, run packet by packet.
pub type Interpreter<'a> = Engine<'a, Checked<'a>>;

impl<'a> Engine<'a, Checked<'a>> {
    /// An interpreter that follows `docs/semantics.md` ([`Profile::Reference`]).
    pub fn new(spec: &'a Spec, subscriptions: &'a [Subscription]) -> Interpreter<'a> {
        Interpreter::with_profile(spec, subscriptions, Profile::Reference)
    }

    /// An interpreter whose stream state follows `profile`'s arithmetic.
    pub fn with_profile(spec: &'a Spec, subscriptions: &'a [Subscription], profile: Profile) -> Interpreter<'a> {
        Engine::with_decide(spec, profile, Checked(subscriptions))
    }
}
