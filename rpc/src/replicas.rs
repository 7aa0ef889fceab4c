//! Do a cluster's members hold the same state? Each member reports a digest of its state at its
//! applied index ([`crate::Client::state_digest`]); members at one index must show one digest.
//! Members asked one after another under writes stand at different indexes, so what is seen is
//! kept per index across several asks: a difference shows wherever two members were seen at one
//! index, and agreement once every member was seen at one index.

use std::collections::{BTreeMap, BTreeSet};

use crate::proto::StateDigestResponse;

/// The members' state digests seen so far: per applied index, per member id.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SeenDigests(BTreeMap<u64, BTreeMap<u64, String>>);

impl SeenDigests {
    /// Records what member `member` answered.
    pub fn record(&mut self, member: u64, answer: &StateDigestResponse) {
        self.0
            .entry(answer.applied_index)
            .or_default()
            .insert(member, answer.digest.clone());
    }

    /// The lowest applied index at which two members were seen with different digests, with
    /// every digest seen there (by member id).
    pub fn disagreement(&self) -> Option<(u64, &BTreeMap<u64, String>)> {
        self.0
            .iter()
            .find(|(_, at)| at.values().collect::<BTreeSet<_>>().len() > 1)
            .map(|(index, at)| (*index, at))
    }

    /// The highest applied index at which every one of `members` was seen, with the digest
    /// there (theirs, unless [`SeenDigests::disagreement`] says they differ).
    pub fn common(&self, members: &[u64]) -> Option<(u64, &str)> {
        if members.is_empty() {
            return None;
        }
        self.0
            .iter()
            .rev()
            .find(|(_, at)| members.iter().all(|id| at.contains_key(id)))
            .and_then(|(index, at)| at.values().next().map(|digest| (*index, digest.as_str())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(answers: &[(u64, u64, &str)]) -> SeenDigests {
        let mut seen = SeenDigests::default();
        for (member, applied_index, digest) in answers {
            let answer = StateDigestResponse {
                applied_index: *applied_index,
                digest: digest.to_string(),
            };
            seen.record(*member, &answer);
        }
        seen
    }

    #[test]
    fn two_digests_at_one_index_disagree_and_members_at_one_index_are_common() {
        let differ = seen(&[(1, 7, "aa"), (2, 7, "aa"), (3, 7, "bb"), (1, 8, "cc")]);
        let (index, at) = differ.disagreement().expect("members 1 and 3 differ at 7");
        assert_eq!(index, 7);
        assert_eq!(at.get(&3).map(String::as_str), Some("bb"));
        let agree = seen(&[(1, 7, "aa"), (2, 8, "bb"), (2, 7, "aa"), (3, 7, "aa")]);
        assert_eq!(agree.disagreement(), None);
        assert_eq!(agree.common(&[1, 2, 3]), Some((7, "aa")));
        // Never all at one index: nothing to compare, nothing common.
        let apart = seen(&[(1, 7, "aa"), (2, 8, "bb"), (3, 9, "cc")]);
        assert_eq!(apart.disagreement(), None);
        assert_eq!(apart.common(&[1, 2, 3]), None);
        assert_eq!(apart.common(&[]), None);
    }
}
