//! The board's snapshot judge: does a list of tasks contradict itself?

use std::collections::BTreeMap;

use super::{Task, TaskState};
use crate::time::is_overdue;

/// The machine-readable kind of a board problem. Ordered by its stable code (as handoff's
/// problems are), so every implementation, in any language, sorts a check's output alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BoardProblemCode {
    /// A task has an empty id.
    EmptyId,
    /// Two tasks share an id.
    DuplicateId,
    /// A state outside the vocabulary.
    UnknownState,
    /// Claimed without a lease, or a lease on a task that is not claimed.
    HolderMismatch,
    /// A lease with fence 0 (fences start at 1).
    MissingFence,
    /// A lease whose fence is above the highest fence the task records: fences went backwards.
    FenceRegression,
    /// A claimed task whose lease is past its time and was not freed.
    OverdueLease,
    /// A task claimed or done while one of its dependencies is not done.
    DependencyNotDone,
    /// A task whose dependencies lead round in a cycle (or to one): it can never be claimed.
    DependencyCycle,
    /// A dependency that names no task.
    UnknownDependency,
}

impl Ord for BoardProblemCode {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl PartialOrd for BoardProblemCode {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl BoardProblemCode {
    /// The stable code.
    pub fn as_str(&self) -> &'static str {
        match self {
            BoardProblemCode::EmptyId => "empty_id",
            BoardProblemCode::DuplicateId => "duplicate_id",
            BoardProblemCode::UnknownState => "unknown_state",
            BoardProblemCode::HolderMismatch => "holder_mismatch",
            BoardProblemCode::MissingFence => "missing_fence",
            BoardProblemCode::FenceRegression => "fence_regression",
            BoardProblemCode::OverdueLease => "overdue_lease",
            BoardProblemCode::DependencyNotDone => "dependency_not_done",
            BoardProblemCode::DependencyCycle => "dependency_cycle",
            BoardProblemCode::UnknownDependency => "unknown_dependency",
        }
    }
}

/// One violated board invariant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoardProblem {
    /// The task concerned.
    pub id: String,
    /// What kind of problem.
    pub code: BoardProblemCode,
    /// A human explanation.
    pub text: String,
}

/// Judges a board snapshot at `now_ms`; problems come sorted by `(id, code)`.
///
/// `dependency_not_done` on a done task can follow from the host re-seeding a dependency (the
/// topology is the host's); the judge reports it so the host sees it.
pub fn check(tasks: &[Task], now_ms: u64) -> Vec<BoardProblem> {
    let mut problems = Vec::new();
    let mut report = |id: &str, code: BoardProblemCode, text: String| {
        problems.push(BoardProblem {
            id: id.to_string(),
            code,
            text,
        })
    };
    let mut by_id: BTreeMap<&str, Vec<&Task>> = BTreeMap::new();
    for task in tasks {
        by_id.entry(task.id.as_str()).or_default().push(task);
    }
    for (id, same) in &by_id {
        if same.len() > 1 {
            report(
                id,
                BoardProblemCode::DuplicateId,
                format!("{} tasks share this id", same.len()),
            );
        }
    }
    for task in tasks {
        let id = task.id.as_str();
        if id.is_empty() {
            report(id, BoardProblemCode::EmptyId, "task has an empty id".into());
        }
        if let TaskState::Unrecognized(name) = &task.state {
            report(
                id,
                BoardProblemCode::UnknownState,
                format!("state {name:?} is not in the vocabulary"),
            );
        }
        let claimed = task.state == TaskState::Claimed;
        match (&task.lease, claimed) {
            (None, true) => report(
                id,
                BoardProblemCode::HolderMismatch,
                "claimed task has no lease".into(),
            ),
            (Some(_), false) => report(
                id,
                BoardProblemCode::HolderMismatch,
                format!("{} task still carries a lease", task.state.as_str()),
            ),
            _ => {}
        }
        if let Some(lease) = &task.lease {
            if lease.fence == 0 {
                report(
                    id,
                    BoardProblemCode::MissingFence,
                    "lease has fence 0".into(),
                );
            }
            if lease.fence > task.max_fence {
                report(
                    id,
                    BoardProblemCode::FenceRegression,
                    format!(
                        "lease fence {} is above the highest recorded fence {}",
                        lease.fence, task.max_fence
                    ),
                );
            }
            if claimed && is_overdue(lease.until_ms, now_ms) {
                report(
                    id,
                    BoardProblemCode::OverdueLease,
                    "lease is past its time but the task is still claimed".into(),
                );
            }
        }
        for dep in &task.deps {
            match by_id.get(dep.as_str()).and_then(|same| same.first()) {
                None => report(
                    id,
                    BoardProblemCode::UnknownDependency,
                    format!("dependency {dep:?} names no task"),
                ),
                Some(dep_task) => {
                    let advanced = matches!(task.state, TaskState::Claimed | TaskState::Done);
                    if advanced && dep_task.state != TaskState::Done {
                        report(
                            id,
                            BoardProblemCode::DependencyNotDone,
                            format!(
                                "{} while dependency {dep:?} is {}",
                                task.state.as_str(),
                                dep_task.state.as_str()
                            ),
                        );
                    }
                }
            }
        }
    }
    for id in blocked_for_good(&by_id) {
        report(
            id,
            BoardProblemCode::DependencyCycle,
            "its dependencies lead round in a cycle: it can never be claimed".into(),
        );
    }
    problems.sort_by(|a, b| (&a.id, a.code).cmp(&(&b.id, b.code)));
    problems
}

/// The tasks not done that wait, directly or through others, on a dependency cycle among tasks
/// not done. Seeding refuses a task depending on itself, not a longer cycle (each seed sees only
/// its own tasks and what is stored), and such tasks stay blocked until the host re-seeds one.
/// Found by peeling: a task whose dependencies are all done, peeled or unknown (reported
/// apart) can go ahead; what never peels waits on a cycle.
fn blocked_for_good<'a>(by_id: &BTreeMap<&'a str, Vec<&'a Task>>) -> Vec<&'a str> {
    let first = |id: &str| by_id.get(id).and_then(|same| same.first().copied());
    let mut waiting_on: BTreeMap<&str, usize> = BTreeMap::new();
    let mut dependents: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut free = Vec::new();
    for (&id, same) in by_id {
        let task = same[0];
        let open_deps: std::collections::BTreeSet<&str> = task
            .deps
            .iter()
            .map(String::as_str)
            .filter(|dep| first(dep).is_some_and(|d| d.state != TaskState::Done))
            .collect();
        if task.state == TaskState::Done || open_deps.is_empty() {
            free.push(id);
            continue;
        }
        for dep in &open_deps {
            dependents.entry(dep).or_default().push(id);
        }
        waiting_on.insert(id, open_deps.len());
    }
    while let Some(id) = free.pop() {
        for &dependent in dependents.get(id).into_iter().flatten() {
            if let Some(left) = waiting_on.get_mut(dependent) {
                *left -= 1;
                if *left == 0 {
                    waiting_on.remove(dependent);
                    free.push(dependent);
                }
            }
        }
    }
    waiting_on.into_keys().collect()
}
