//! Pipelines and diffs back from the JSON their `Serialize` writes (the IR
//! derives no `Deserialize`): how the simulated target keeps its tables in a
//! file, and how the eBPF target keeps the image it installed and the diffs
//! applied since.

use serde_json::Value;
use std::collections::BTreeMap;
use subc_bdd::diff::{PipelineDiff, TableDiff};
use subc_bdd::pipeline::{LeafEntry, Match, Pipeline, StateId, Table};
use subc_lang::program::{Update as VarUpdate, UpdateOp};
use subc_lang::spec::{MatchKind, QueryFieldId, StateId as VarId};

/// Reads pipelines back from the JSON their `Serialize` writes.
pub fn decode(text: &str) -> Result<Vec<Pipeline>, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    v.as_array().ok_or("expected a list of pipelines")?.iter().map(pipeline).collect()
}

fn u64_of(v: &Value, key: &str) -> Result<u64, String> {
    v.get(key).and_then(Value::as_u64).ok_or_else(|| format!("missing number `{key}`"))
}

fn str_of<'a>(v: &'a Value, key: &str) -> Result<&'a str, String> {
    v.get(key).and_then(Value::as_str).ok_or_else(|| format!("missing string `{key}`"))
}

fn u32s(v: &Value) -> Result<Vec<u32>, String> {
    v.as_array()
        .ok_or("expected a list")?
        .iter()
        .map(|x| x.as_u64().map(|n| n as u32).ok_or_else(|| "expected a number".to_string()))
        .collect()
}

fn match_of(v: &Value) -> Result<Match, String> {
    Ok(match str_of(v, "type")? {
        "exact" => Match::Exact { value: u64_of(v, "value")? },
        "range" => Match::Range { lo: u64_of(v, "lo")?, hi: u64_of(v, "hi")? },
        "prefix" => Match::Prefix { value: u64_of(v, "value")?, len: u64_of(v, "len")? as u32 },
        "ternary" => Match::Ternary { value: u64_of(v, "value")?, mask: u64_of(v, "mask")? },
        "default" => Match::Default,
        t => return Err(format!("unknown match type {t}")),
    })
}

fn kind_of(s: &str) -> Result<MatchKind, String> {
    [MatchKind::Exact, MatchKind::Range, MatchKind::Ternary, MatchKind::Lpm]
        .into_iter()
        .find(|k| k.as_str() == s)
        .ok_or_else(|| format!("unknown match kind {s}"))
}

fn leaf_of(v: &Value) -> Result<LeafEntry, String> {
    let updates = v
        .get("updates")
        .and_then(Value::as_array)
        .ok_or("missing `updates`")?
        .iter()
        .map(|u| {
            Ok(VarUpdate {
                var: VarId(u64_of(u, "var")? as u32),
                op: match str_of(u, "op")? {
                    "set" => UpdateOp::Set,
                    "add" => UpdateOp::Add,
                    o => return Err(format!("unknown update op {o}")),
                },
                value: u64_of(u, "value")?,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(LeafEntry {
        ports: u32s(v.get("ports").ok_or("missing `ports`")?)?,
        drop: v.get("drop").and_then(Value::as_bool).ok_or("missing `drop`")?,
        updates,
        group: v.get("group").and_then(Value::as_u64).map(|g| g as u32),
    })
}

fn pipeline(v: &Value) -> Result<Pipeline, String> {
    let mut tables = vec![];
    for t in v.get("tables").and_then(Value::as_array).ok_or("missing `tables`")? {
        let mut entries = BTreeMap::new();
        for e in t.get("entries").and_then(Value::as_array).ok_or("missing `entries`")? {
            let m = match_of(e.get("match").ok_or("missing `match`")?)?;
            entries.insert((u64_of(e, "state")? as u32, m), u64_of(e, "next")? as u32);
        }
        tables.push(Table {
            name: str_of(t, "name")?.to_string(),
            field: QueryFieldId(u64_of(t, "field")? as u32),
            width: u64_of(t, "width")? as u32,
            kind: kind_of(str_of(t, "kind")?)?,
            entries,
        });
    }
    let mut leaves = BTreeMap::new();
    for (k, l) in v.get("leaves").and_then(Value::as_object).ok_or("missing `leaves`")? {
        leaves.insert(k.parse::<u32>().map_err(|e| e.to_string())?, leaf_of(l)?);
    }
    let mut groups = BTreeMap::new();
    for (k, g) in v.get("groups").and_then(Value::as_object).ok_or("missing `groups`")? {
        groups.insert(k.parse::<u32>().map_err(|e| e.to_string())?, u32s(g)?);
    }
    Ok(Pipeline { tables, leaves, groups, root: u64_of(v, "root")? as u32 })
}

fn array<'a>(v: &'a Value, key: &str) -> Result<&'a Vec<Value>, String> {
    v.get(key).and_then(Value::as_array).ok_or_else(|| format!("missing list `{key}`"))
}

fn state(v: &Value) -> Result<StateId, String> {
    v.as_u64().map(|s| s as StateId).ok_or_else(|| "expected a state id".to_string())
}

/// `[state, match, next]` or `[state, match]`.
fn entry(v: &Value) -> Result<(StateId, Match, Option<StateId>), String> {
    let a = v.as_array().ok_or("expected an entry")?;
    let next = match a.get(2) {
        Some(n) => Some(state(n)?),
        None => None,
    };
    Ok((state(&a[0])?, match_of(a.get(1).ok_or("an entry without a match")?)?, next))
}

fn groups(v: &Value, key: &str) -> Result<Vec<(u32, Vec<u32>)>, String> {
    array(v, key)?.iter().map(|g| Ok((state(&g[0])?, u32s(&g[1])?))).collect()
}

fn leaves(v: &Value, key: &str) -> Result<Vec<(StateId, LeafEntry)>, String> {
    array(v, key)?.iter().map(|l| Ok((state(&l[0])?, leaf_of(&l[1])?))).collect()
}

/// Reads a diff back from the JSON its `Serialize` writes.
pub fn decode_diff(v: &Value) -> Result<PipelineDiff, String> {
    let mut tables = vec![];
    for t in array(v, "tables")? {
        let with_next = |key: &str| -> Result<Vec<(StateId, Match, StateId)>, String> {
            array(t, key)?.iter().map(|e| entry(e).and_then(|(s, m, n)| Ok((s, m, n.ok_or("an entry without a next state")?)))).collect()
        };
        let deletes = array(t, "deletes")?.iter().map(|e| entry(e).map(|(s, m, _)| (s, m))).collect::<Result<_, String>>()?;
        tables.push(TableDiff { inserts: with_next("inserts")?, modifies: with_next("modifies")?, deletes });
    }
    Ok(PipelineDiff {
        pipeline: u64_of(v, "pipeline")? as usize,
        groups_created: groups(v, "groups_created")?,
        groups_changed: groups(v, "groups_changed")?,
        groups_removed: array(v, "groups_removed")?.iter().map(state).collect::<Result<_, _>>()?,
        tables,
        leaf_inserts: leaves(v, "leaf_inserts")?,
        leaf_modifies: leaves(v, "leaf_modifies")?,
        leaf_deletes: array(v, "leaf_deletes")?.iter().map(state).collect::<Result<_, _>>()?,
        root: v.get("root").and_then(Value::as_u64).map(|r| r as StateId),
    })
}
