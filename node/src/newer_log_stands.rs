//! A voter that refuses a candidate because its own log is newer stands for election at once.
//!
//! Why: in openraft 0.9 a follower that refuses a vote for the candidate's older log keeps its
//! term and its timer. It stands only when that timer fires (the leader lease plus its own random
//! timeout after it last heard from the leader), and then in the term the refused candidate has
//! already taken: the two self-votes clash, and the next round comes one more random timeout
//! later. After a leader crash under load the survivors' logs often differ by the entries that
//! were in flight, so whenever the survivor with the older log stood first, writes resumed about
//! 1.2 s after the crash instead of about 0.7 s (`baton bench --workload failover`).
//!
//! Raft (§5.1) has a node that sees a higher term adopt it. openraft 0.9 offers no way to adopt a
//! term without voting, so this node votes for itself in the candidate's term — an ordinary vote,
//! checked and persisted by openraft like any other — and then starts an election, which takes the
//! next term. The candidate, whose log is older, grants it.
//!
//! Safety is Raft's own: every step is an ordinary vote or election. The self-vote goes through
//! openraft's checks, so a node that still hears from a leader (its leader lease has not run
//! out) refuses it and does not campaign; a candidate whose term is behind this node's vote
//! changes nothing.

use openraft::raft::{VoteRequest, VoteResponse};
use openraft::{ServerState, Vote};

use crate::node::is_voter;
use crate::pre_vote::Contact;
use crate::types::{NodeId, Raft};

/// Whether a vote node `me` refused tells it to stand: it refused a current candidate whose log
/// is older than its own, and has not voted for another node in the candidate's term (standing
/// would take that vote back, openraft ordering same-term votes by node id, and unseat the
/// leader it just helped elect).
pub fn should_stand(
    me: NodeId,
    request: &VoteRequest<NodeId>,
    response: &VoteResponse<NodeId>,
) -> bool {
    let (held, asked) = (response.vote.leader_id(), request.vote.leader_id());
    !response.vote_granted
        && !request.vote.is_committed()
        && response.last_log_id > request.last_log_id
        && (held.term < asked.term || (held.term == asked.term && held.voted_for() == Some(me)))
}

/// Called after this node answered `request` with `response`: if it refused a candidate for the
/// candidate's older log, it takes the candidate's term by voting for itself in it and stands in
/// the next term. Does nothing on a leader, a learner, a node that is leaving, or when openraft
/// refuses the self-vote (a leader's lease still runs here, or the vote moved on meanwhile).
pub async fn after_vote(
    raft: &Raft,
    contact: &Contact,
    request: &VoteRequest<NodeId>,
    response: &VoteResponse<NodeId>,
) {
    let (me, voter) = {
        let metrics = raft.metrics();
        let m = metrics.borrow();
        (m.id, is_voter(&m) && m.state != ServerState::Leader)
    };
    if !voter || !should_stand(me, request, response) || contact.is_leaving() {
        return;
    }
    // A vote granted since the answer (this runs a moment later) must not be taken back either.
    // Asked of the Raft core itself, which has handled every vote request that reached it before
    // this one: the published metrics lag it, and a grant they did not show yet would be
    // overridden by the self-vote below (same term, higher node id) and unseat the leader it
    // elected. What still slips between this question and the self-vote is a vote request
    // handled in between: a second candidate in the same term, which three voters rarely meet.
    match raft.with_raft_state(|state| *state.vote_ref()).await {
        Ok(vote) if vote == response.vote => {}
        _ => return,
    }
    let term = request.vote.leader_id().term;
    let own = VoteRequest::new(Vote::new(term, me), response.last_log_id);
    match raft.vote(own).await {
        Ok(own) if own.vote_granted => {}
        Ok(_) => return,
        Err(error) => {
            tracing::warn!(%error, "could not take the candidate's term");
            return;
        }
    }
    tracing::info!(
        candidate = request.vote.leader_id().node_id,
        term,
        "refused a candidate with an older log; standing in the next term"
    );
    if contact.is_leaving() {
        return;
    }
    if let Err(error) = raft.trigger().elect().await {
        tracing::warn!(%error, "could not stand for election");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::LogId;

    /// The node that refused.
    const ME: NodeId = 3;

    fn log(term: u64, index: u64) -> Option<LogId> {
        Some(LogId::new(openraft::CommittedLeaderId::new(term, 1), index))
    }

    fn candidate(term: u64, id: NodeId, last: Option<LogId>) -> VoteRequest<NodeId> {
        VoteRequest::new(Vote::new(term, id), last)
    }

    fn refused(vote: Vote<NodeId>, last: Option<LogId>) -> VoteResponse<NodeId> {
        VoteResponse::new(vote, last, false)
    }

    #[test]
    fn a_refusal_for_an_older_log_makes_this_node_stand() {
        // This node still holds the dead leader's committed vote of term 3 (lease over).
        let held = Vote::new_committed(3, 1);
        assert!(should_stand(
            ME,
            &candidate(4, 2, log(3, 10)),
            &refused(held, log(3, 12))
        ));
        // Equal term: this node is itself a candidate in the term the other one took.
        assert!(should_stand(
            ME,
            &candidate(4, 2, log(3, 10)),
            &refused(Vote::new(4, 3), log(3, 12))
        ));
        // An older last term counts as an older log even with a higher index.
        assert!(should_stand(
            ME,
            &candidate(4, 2, log(2, 50)),
            &refused(held, log(3, 12))
        ));
        // A candidate with no log at all.
        assert!(should_stand(
            ME,
            &candidate(4, 2, None),
            &refused(held, log(1, 1))
        ));
    }

    #[test]
    fn a_grant_never_makes_this_node_stand() {
        let granted = VoteResponse::new(Vote::new(4, 2), log(3, 12), true);
        assert!(!should_stand(ME, &candidate(4, 2, log(3, 10)), &granted));
    }

    #[test]
    fn a_candidate_with_an_equal_or_newer_log_is_not_a_reason() {
        // Refused for another reason (a leader's lease, or another vote in this term): the
        // candidate's log is as new as ours, so it may well win elsewhere.
        let held = Vote::new_committed(3, 1);
        assert!(!should_stand(
            ME,
            &candidate(4, 2, log(3, 12)),
            &refused(held, log(3, 12))
        ));
        assert!(!should_stand(
            ME,
            &candidate(4, 2, log(3, 13)),
            &refused(held, log(3, 12))
        ));
    }

    #[test]
    fn a_candidate_behind_this_nodes_term_is_not_a_reason() {
        // This node already voted in a later term (its own election, or another candidate's).
        assert!(!should_stand(
            ME,
            &candidate(4, 2, log(3, 10)),
            &refused(Vote::new(5, 3), log(3, 12))
        ));
        assert!(!should_stand(
            ME,
            &candidate(4, 2, log(3, 10)),
            &refused(Vote::new_committed(5, 3), log(3, 12))
        ));
    }

    #[test]
    fn a_vote_given_to_another_node_in_the_candidates_term_is_not_taken_back() {
        // This node voted for node 1 in term 4 (which may win with it); node 2's candidacy in
        // the same term, with an older log, must not make it unseat node 1.
        assert!(!should_stand(
            ME,
            &candidate(4, 2, log(3, 10)),
            &refused(Vote::new(4, 1), log(3, 12))
        ));
    }

    #[test]
    fn a_committed_vote_is_not_a_candidate() {
        // Leaders do not send vote requests with committed votes; such a message is not a
        // candidacy and must not start an election.
        assert!(!should_stand(
            ME,
            &VoteRequest::new(Vote::new_committed(4, 2), log(3, 10)),
            &refused(Vote::new_committed(3, 1), log(3, 12))
        ));
    }
}
