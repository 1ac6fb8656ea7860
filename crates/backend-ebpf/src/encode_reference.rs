//! The oracle of the in-place planner, and the one allowed copy of the
//! encoding algorithm: the whole-image plan [`TableImage::plan_in_place`]
//! replaced, kept so that `encode_tests.rs` can check that both give the
//! same plans, images and errors, and `benches/plan.rs` can measure one
//! against the other. It plans on a copy of the whole image and
//! recomputes every descriptor, so its cost follows the size of the
//! image, not the diff. Only unit tests and the `testing` feature build
//! it; nothing else may copy it.

use super::*;

impl TableImage {
    /// The plan as it was made before `plan_in_place`: on a copy of the whole
    /// image, recomputing every descriptor, scanning every entry and leaf.
    /// Not for use outside tests and benchmarks.
    #[doc(hidden)]
    pub fn plan_reference(&self, model: &Model, update: &SetDiff) -> Result<(UpdatePlan, TableImage), EbpfError> {
        let img = self;
        let mut next = img.clone();
        next.slots.recycle();
        let mut touched: BTreeSet<Item> = BTreeSet::new();
        let mut changed_pipes = BTreeSet::new();
        for d in &update.diffs {
            let p = d.pipeline;
            if p >= next.pipes.len() {
                return Err(EbpfError::Diff(DiffError::NoPipeline { pipeline: p, pipelines: next.pipes.len() }));
            }
            changed_pipes.insert(p);
            for op in d.ops() {
                match &op {
                    Op::Insert { table, state, key, .. } | Op::Modify { table, state, key, .. } | Op::Delete { table, state, key } => {
                        let kind = next.pipes[p].tables[*table].kind;
                        touched.insert(TableImage::item_of(model, p, *table, kind, *state, *key));
                    }
                    Op::InsertLeaf { state, .. } | Op::ModifyLeaf { state, .. } | Op::DeleteLeaf { state } => {
                        touched.insert(Item::Leaf { p, state: *state });
                    }
                    _ => {}
                }
                next.pipes[p].apply_op(&op).map_err(|error| EbpfError::Diff(DiffError::Apply { pipeline: p, error }))?;
            }
        }
        // Descriptors of the changed pipelines; the values of states that
        // moved, and the entries pointing to states whose descriptor changed.
        for &p in &changed_pipes {
            let new_descs = next.assign_slots(model, p, &img.descs[p])?;
            let changed: BTreeSet<StateId> = new_descs
                .iter()
                .filter(|(s, d)| img.descs[p].get(s) != Some(d))
                .map(|(s, _)| *s)
                .chain(img.descs[p].keys().filter(|s| !new_descs.contains_key(s)).copied())
                .collect();
            next.descs[p] = new_descs;
            if changed.is_empty() {
                continue;
            }
            for s in &changed {
                let d = next.desc(p, *s);
                match d.pool() {
                    Some(Pool::Leaf) => {
                        touched.insert(Item::Leaf { p, state: *s });
                    }
                    Some(Pool::Sorted(_)) => {
                        touched.insert(Item::Sorted { p, table: d.level as usize, state: *s });
                    }
                    None => {}
                }
            }
            for (t, table) in next.pipes[p].tables.iter().enumerate() {
                for ((state, m), n) in &table.entries {
                    if changed.contains(n) {
                        touched.insert(TableImage::item_of(model, p, t, table.kind, *state, *m));
                    }
                }
            }
        }
        // Update ids: keep those of updates still named, reuse free ones.
        let named = |pipes: &[Pipeline]| -> BTreeSet<VarUpdate> {
            pipes.iter().flat_map(|p| p.leaves.values().flat_map(|l| l.updates.iter().copied())).collect()
        };
        let (now_named, old_named) = (named(&next.pipes), named(&img.pipes));
        next.update_ids.retain(|u, _| now_named.contains(u) || old_named.contains(u));
        let used: BTreeSet<u32> = next.update_ids.values().copied().collect();
        let mut free = (0..model.max_updates).filter(|i| !used.contains(i));
        let mut fresh = vec![];
        for u in &now_named {
            if !next.update_ids.contains_key(u) {
                let Some(id) = free.next() else {
                    return Err(EbpfError::Capacity(CapacityError::UpdateIds { max: model.max_updates }));
                };
                next.update_ids.insert(*u, id);
                fresh.push((*u, id));
            }
        }
        next.update_ids.retain(|u, _| now_named.contains(u));

        next.counts = crate::model::count(&next.pipes.iter().collect::<Vec<_>>(), model.ranges)?;
        img.check_capacity(model, &img.counts, &next.counts)?;
        next.check_states()?;

        let ops_for = |gen: u32| -> (Vec<MapOp>, Vec<MapOp>) {
            let mut old = Encoded::new();
            let mut new = Encoded::new();
            for item in &touched {
                img.encode_item(model, gen, item, &mut old);
                next.encode_item(model, gen, item, &mut new);
            }
            ops_between(model, &old, &new, &img.root_ops(model, gen), &next.root_ops(model, gen))
        };
        let inactive_gen = 1 - img.live_gen;
        let (inactive, undo_inactive) = ops_for(inactive_gen);
        let (live, _) = ops_for(img.live_gen);
        next.live_gen = inactive_gen;
        let plan = UpdatePlan {
            prepare: img.update_table_ops(model, fresh.into_iter()),
            inactive,
            undo_inactive,
            flip: vec![gen_op(model, inactive_gen)],
            live,
            new_gen: inactive_gen,
        };
        Ok((plan, next))
    }
}
