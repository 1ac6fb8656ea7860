//! Receiver groups: how a program whose spec declares more than
//! [`BITMAP_MAX_PORTS`] ports (up to 65,536 receivers) names where a packet
//! goes (issue 33; `docs/semantics.md`, "Audiences").
//!
//! Up to 512 ports, a leaf carries its ports as a bitmap that the packet's
//! leaves OR together. Past that a bitmap would cost 8 KB per leaf, so a
//! leaf carries one 32-bit *audience word* instead:
//!
//! - `0`: no port;
//! - `port + 1` (below [`AUD_GROUP`]): one port;
//! - `AUD_GROUP | pipeline << 24 | group`: the IR's receiver group of the
//!   leaf's pipeline (`subc_bdd::Pipeline::groups`), shared by every leaf
//!   with the same ports.
//!
//! A group's members are 64-bit words of its port bitmap in the hash map
//! `subc_members`, keyed `{gen << 31 | pipeline << 24 | group, w}`: word
//! `w < 1024` holds ports `64w..64w+64`; word `SUMMARY + j` has bit `i`
//! set when word `64j + i` is not zero, and word `TOP` bit `j` when summary
//! word `j` is not zero. Only words that are not zero are stored. So the map is a function of the groups' contents: adding a
//! member to a group of 10,000 writes its word, and its summary word if
//! that word was empty, in each generation; nothing else.
//!
//! A packet reads the generation once, and every group word of that
//! generation, so it sees each group as it was before an update or as it
//! is after, never a mix: the updater changes the inactive generation,
//! flips, waits for the runs that read the old one (which, with groups,
//! last until the fan-out is done), then changes the other.
//!
//! A packet has one audience word per pipeline. Members of one pipeline's
//! audience that an earlier pipeline's audience holds are skipped, so each
//! receiver gets one copy. The fan-out visits the summary words, the
//! words that are not zero, and the members: its cost is bounded by the
//! audiences' sizes, not by the spec's port count.

use crate::model::MAX_PIPELINES;
use crate::{EbpfError, UnsupportedError};
use subc_bdd::{GroupId, LeafEntry, Pipeline, PortSet};

/// Most ports a leaf carries as a bitmap; a spec with more uses groups.
pub const BITMAP_MAX_PORTS: u32 = 512;
/// The audience word of a group (its low bits: pipeline << 24 | group).
const AUD_GROUP: u32 = 1 << 31;
/// Group ids fit the 24 low bits of an audience word.
pub(crate) const MAX_GROUP: GroupId = (1 << 24) - 1;
/// The first summary word's index in a group key.
pub(crate) const SUMMARY: u32 = 1024;
/// Ports per summary word (one bit per member word).
const PORTS_PER_SUMMARY: u32 = 64 * 64;
/// Summary words of the largest group.
pub(crate) const SUMMARY_WORDS: u32 = PortSet::MAX_PORTS / PORTS_PER_SUMMARY;
/// The top word's index: bit `j` set when summary word `j` is not zero.
pub(crate) const TOP: u32 = SUMMARY + SUMMARY_WORDS;
/// Most pipelines (audience words per packet) a program with groups has:
/// each is a slot of the packet's result on the stack.
pub const MAX_AUDIENCE_SLOTS: usize = 32;

/// Whether a spec with `ports` ports uses receiver groups.
pub(crate) fn uses_groups(ports: u32) -> bool {
    ports > BITMAP_MAX_PORTS
}

/// What a program with groups cannot hold.
pub(crate) fn check(pipes: &[&Pipeline], has_bits: bool) -> Result<(), EbpfError> {
    const { assert!(MAX_AUDIENCE_SLOTS <= MAX_PIPELINES) };
    if pipes.len() > MAX_AUDIENCE_SLOTS {
        return Err(EbpfError::Unsupported(UnsupportedError::AudiencePipelines { pipelines: pipes.len(), max: MAX_AUDIENCE_SLOTS }));
    }
    if has_bits {
        return Err(EbpfError::Unsupported(UnsupportedError::AudienceBits));
    }
    if let Some(g) = pipes.iter().flat_map(|p| p.groups.keys()).find(|g| **g > MAX_GROUP) {
        return Err(EbpfError::Unsupported(UnsupportedError::AudienceGroups { group: *g }));
    }
    Ok(())
}

/// The audience word of a leaf of pipeline `p`.
pub(crate) fn audience_word(p: usize, leaf: &LeafEntry) -> u32 {
    match (leaf.ports.as_slice(), leaf.group) {
        ([], _) => 0,
        ([port], _) => port + 1,
        (_, Some(g)) => AUD_GROUP | (p as u32) << 24 | g,
        (_, None) => unreachable!("the IR gives every leaf of two or more ports a group"),
    }
}

/// The first half of a member key: generation, pipeline and group.
pub(crate) fn group_key(gen: u32, p: usize, g: GroupId) -> u32 {
    gen << 31 | (p as u32) << 24 | g
}

/// The stored words of a group with `ports`: `(w, word)` for every member
/// word and summary word that is not zero.
pub(crate) fn member_words(ports: &[u32]) -> Vec<(u32, u64)> {
    let set = PortSet::from_ports(ports.iter().copied());
    let mut summary = [0u64; SUMMARY_WORDS as usize];
    let mut out: Vec<(u32, u64)> = set.nonzero_words().inspect(|(w, _)| summary[(w / 64) as usize] |= 1 << (w % 64)).collect();
    let mut top = 0u64;
    for (j, s) in summary.iter().enumerate().filter(|(_, s)| **s != 0) {
        out.push((SUMMARY + j as u32, *s));
        top |= 1 << j;
    }
    if top != 0 {
        out.push((TOP, top));
    }
    out
}

/// The ports audience word `aud` names in generation `gen`, reading the
/// group's stored words through `word(group key, w)` (0 where none is
/// stored): top word, then the summary words it marks, then the member
/// words they mark, as the program's fan-out walks them. What a recorded
/// decision is decoded with, from the kernel's own maps.
pub fn audience_ports<E>(aud: u32, gen: u32, mut word: impl FnMut(u32, u32) -> Result<u64, E>) -> Result<PortSet, E> {
    if aud & AUD_GROUP == 0 {
        return Ok(if aud == 0 { PortSet::default() } else { PortSet::from_ports([aud - 1]) });
    }
    let gg = gen << 31 | (aud & !AUD_GROUP);
    let bits = |x: u64| (0..64u32).filter(move |b| x >> b & 1 != 0);
    let mut words = vec![];
    for j in bits(word(gg, TOP)?) {
        for i in bits(word(gg, SUMMARY + j)?) {
            let w = (j * 64 + i) as usize;
            words.resize(words.len().max(w + 1), 0);
            words[w] = word(gg, w as u32)?;
        }
    }
    Ok(PortSet::from_words(&words))
}

/// Member map entries one generation of `pipes` holds.
pub(crate) fn count_member_words(pipes: &[&Pipeline]) -> usize {
    pipes.iter().flat_map(|p| p.groups.values()).map(|ports| member_words(ports).len()).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_words_are_the_bitmap_and_its_summary() {
        let w = member_words(&[0, 1, 64, 4_096, 65_535]);
        let top = 1 | 2 | 1 << 15;
        assert_eq!(w, [(0, 3), (1, 1), (64, 1), (1_023, 1 << 63), (SUMMARY, 3), (SUMMARY + 1, 1), (SUMMARY + 15, 1 << 63), (TOP, top)]);
        assert!(member_words(&[]).is_empty());
        let leaf = |ports: Vec<u32>, group| LeafEntry { ports, drop: false, updates: vec![], group };
        assert_eq!(audience_word(3, &leaf(vec![], None)), 0);
        assert_eq!(audience_word(3, &leaf(vec![700], None)), 701);
        assert_eq!(audience_word(3, &leaf(vec![1, 700], Some(9))), AUD_GROUP | 3 << 24 | 9);
    }

    /// Reading a group's stored words back gives its ports.
    #[test]
    fn audience_ports_walk_the_stored_words() {
        let ports = vec![0, 1, 64, 4_096, 65_535];
        let stored: std::collections::HashMap<(u32, u32), u64> =
            member_words(&ports).into_iter().map(|(w, x)| ((group_key(1, 3, 9), w), x)).collect();
        let read = |gg: u32, w: u32| Ok::<u64, ()>(stored.get(&(gg, w)).copied().unwrap_or(0));
        let aud = AUD_GROUP | 3 << 24 | 9;
        assert_eq!(audience_ports(aud, 1, read).unwrap().iter().collect::<Vec<_>>(), ports);
        assert!(audience_ports(aud, 0, read).unwrap().is_empty(), "the other generation holds nothing");
        assert_eq!(audience_ports(701, 1, read).unwrap().iter().collect::<Vec<_>>(), [700]);
        assert!(audience_ports(0, 1, read).unwrap().is_empty());
    }
}
