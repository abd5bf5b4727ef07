//! The leader's assignment: incremental and cooperative, as Kafka Connect's (KIP-415).
//!
//! Pure logic: the leader feeds it what every member reports running, what the config topic
//! says should run, and the time; it answers, per member, what to start and what to stop. It
//! remembers the assignment it made last (while this member stays leader, generation after
//! generation) to tell work that was never assigned from work whose worker vanished.
//!
//! The rules:
//! - A worker keeps what it runs, unless the connector was deleted, the same work runs on two
//!   workers (both stop it; it is handed out again), or balancing takes it away.
//! - New work (new connectors, more tasks) goes to the least loaded workers at once.
//! - Work of a worker that left is *held* for `scheduled.rebalance.max.delay.ms`: a worker that
//!   restarts or comes back within it gets its work back and no task moves twice. Workers
//!   that join empty while work is held are the first candidates for it. When the delay is
//!   over, the held work goes to them, or to everyone when none came.
//! - Balancing is cooperative: a worker above its share is told to stop some tasks and join
//!   again; only the next round hands them to the workers below their share. Nothing else
//!   stops. Balancing waits while work is held, so a worker that is about to come back is not
//!   answered by moving everything around.
//!
//! Connectors and tasks are balanced separately, as in Connect: a connector instance is light
//! (it computes task configs), tasks carry the records.

use std::collections::{BTreeMap, BTreeSet};

use super::protocol::{Allocation, TaskId};

/// What one member is told to start and to stop.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemberAssignment {
    pub assigned: Allocation,
    pub revoked: Allocation,
}

/// The leader's answer for the whole group.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupAssignment {
    /// Every member of the generation, even those given nothing.
    pub members: BTreeMap<String, MemberAssignment>,
    /// Milliseconds until held work is reassigned (0: nothing is held).
    pub delay_ms: u64,
}

/// The incremental cooperative assignor of one leader.
#[derive(Debug, Clone)]
pub struct IncrementalAssignor {
    /// `scheduled.rebalance.max.delay.ms`.
    max_delay_ms: u64,
    /// What this leader assigned last (minus what it revoked), plus held work.
    previous: Allocation,
    /// The generation `previous` was computed for.
    previous_generation: Option<i32>,
    previous_members: BTreeSet<String>,
    /// When held work is to be reassigned (ms on the caller's clock).
    reassign_at: Option<u64>,
    /// Workers that were empty while work was held: they get it first.
    candidates: BTreeSet<String>,
}

impl IncrementalAssignor {
    pub fn new(max_delay_ms: u64) -> IncrementalAssignor {
        IncrementalAssignor {
            max_delay_ms,
            previous: Allocation::default(),
            previous_generation: None,
            previous_members: BTreeSet::new(),
            reassign_at: None,
            candidates: BTreeSet::new(),
        }
    }

    /// Assigns `configured` work to `running` members (member id → what it reports running)
    /// for `generation`. `last_completed_generation` is the last generation this member
    /// completed (its SyncGroup answered): when it is not the one this assignor computed, this
    /// member was not the leader throughout and its memory is no guide, so it starts afresh.
    pub fn assign(
        &mut self,
        now_ms: u64,
        last_completed_generation: Option<i32>,
        generation: i32,
        running: &BTreeMap<String, Allocation>,
        configured: &Allocation,
    ) -> GroupAssignment {
        if self.previous_generation.is_none()
            || self.previous_generation != last_completed_generation
        {
            self.previous = Allocation::default();
            self.previous_members.clear();
            self.reassign_at = None;
            self.candidates.clear();
        }

        let mut active = Allocation::default();
        for allocation in running.values() {
            active.add_all(allocation);
        }
        let mut known = self.previous.clone();
        known.add_all(&active);
        let deleted = known.minus(configured);
        let duplicated = duplicated(running);
        let mut lost = self.previous.minus(&active).minus(&deleted);
        let created = configured.minus(&self.previous).minus(&active);

        // What each member runs after this round, before new work is handed out.
        let mut next: BTreeMap<String, Allocation> = running
            .iter()
            .map(|(member, allocation)| {
                (
                    member.clone(),
                    allocation.minus(&deleted).minus(&duplicated),
                )
            })
            .collect();
        let mut revoked: BTreeMap<String, Allocation> = running
            .iter()
            .map(|(member, allocation)| {
                let mut stop = allocation.intersect(&deleted);
                stop.add_all(&allocation.intersect(&duplicated));
                (member.clone(), stop)
            })
            .collect();

        // Balancing only takes back work a member ran before this round.
        let before_new_work = next.clone();
        let (to_hand_out, delay_ms) = self.handle_lost(now_ms, &mut lost, &mut next);
        let mut new_work = created;
        new_work.add_all(&to_hand_out);
        assign_to_least_loaded(&mut next, &new_work);

        if delay_ms == 0 {
            let balancing = balancing_revocations(&next, &before_new_work);
            for (member, stop) in balancing {
                if let Some(n) = next.get_mut(&member) {
                    n.remove_all(&stop);
                }
                revoked.entry(member).or_default().add_all(&stop);
            }
        }

        let mut members = BTreeMap::new();
        let mut remembered = Allocation::default();
        for (member, allocation) in &next {
            remembered.add_all(allocation);
            let current = &running[member];
            members.insert(
                member.clone(),
                MemberAssignment {
                    assigned: allocation.minus(current),
                    revoked: revoked.remove(member).unwrap_or_default(),
                },
            );
        }
        // Held work stays in memory, so the next round still knows it is missing.
        remembered.add_all(&lost);
        self.previous = remembered;
        self.previous_generation = Some(generation);
        self.previous_members = running.keys().cloned().collect();
        GroupAssignment { members, delay_ms }
    }

    /// Decides what to do with `lost` work: hand it out now (returned, or given straight to
    /// candidate workers in `next`), or hold it (left in `lost`) with the delay until the next
    /// decision.
    fn handle_lost(
        &mut self,
        now_ms: u64,
        lost: &mut Allocation,
        next: &mut BTreeMap<String, Allocation>,
    ) -> (Allocation, u64) {
        if lost.is_empty() {
            self.reassign_at = None;
            self.candidates.clear();
            return (Allocation::default(), 0);
        }
        let everyone_stayed = self
            .previous_members
            .iter()
            .all(|member| next.contains_key(member));
        if (self.reassign_at.is_none() && everyone_stayed) || self.max_delay_ms == 0 {
            // Nobody left (a member missed its last assignment) or holding is switched off:
            // the work is simply handed out again.
            self.reassign_at = None;
            self.candidates.clear();
            return (std::mem::take(lost), 0);
        }
        match self.reassign_at {
            Some(at) if now_ms >= at => {
                let candidates: Vec<String> = self
                    .candidates
                    .iter()
                    .filter(|member| next.contains_key(*member))
                    .cloned()
                    .collect();
                self.reassign_at = None;
                self.candidates.clear();
                let held = std::mem::take(lost);
                if candidates.is_empty() {
                    return (held, 0);
                }
                // Round-robin over the workers that came while the work was held: a worker that
                // restarted gets (about) its own share back.
                for (i, connector) in held.connectors.iter().enumerate() {
                    let member = &candidates[i % candidates.len()];
                    if let Some(n) = next.get_mut(member) {
                        n.connectors.insert(connector.clone());
                    }
                }
                for (i, task) in held.tasks.iter().enumerate() {
                    let member = &candidates[i % candidates.len()];
                    if let Some(n) = next.get_mut(member) {
                        n.tasks.insert(task.clone());
                    }
                }
                (Allocation::default(), 0)
            }
            at => {
                self.candidates.extend(
                    next.iter()
                        .filter(|(_, allocation)| allocation.is_empty())
                        .map(|(member, _)| member.clone()),
                );
                let at = at.unwrap_or(now_ms + self.max_delay_ms);
                self.reassign_at = Some(at);
                (Allocation::default(), at - now_ms)
            }
        }
    }
}

/// Work that more than one member reports running.
fn duplicated(running: &BTreeMap<String, Allocation>) -> Allocation {
    let mut seen = Allocation::default();
    let mut twice = Allocation::default();
    for allocation in running.values() {
        for connector in &allocation.connectors {
            if !seen.connectors.insert(connector.clone()) {
                twice.connectors.insert(connector.clone());
            }
        }
        for task in &allocation.tasks {
            if !seen.tasks.insert(task.clone()) {
                twice.tasks.insert(task.clone());
            }
        }
    }
    twice
}

/// Hands each connector, then each task, to the member that has fewest of its kind (ties: the
/// lowest member id, so the result does not depend on map order).
fn assign_to_least_loaded(next: &mut BTreeMap<String, Allocation>, work: &Allocation) {
    if next.is_empty() {
        return;
    }
    for connector in &work.connectors {
        let member = least(next, |a| a.connectors.len());
        next.get_mut(&member)
            .expect("chosen from next")
            .connectors
            .insert(connector.clone());
    }
    for task in &work.tasks {
        let member = least(next, |a| a.tasks.len());
        next.get_mut(&member)
            .expect("chosen from next")
            .tasks
            .insert(task.clone());
    }
}

fn least(next: &BTreeMap<String, Allocation>, load: impl Fn(&Allocation) -> usize) -> String {
    next.iter()
        .min_by_key(|(member, allocation)| (load(allocation), (*member).clone()))
        .map(|(member, _)| member.clone())
        .expect("next is not empty")
}

/// What members above their fair share stop so that the next round can give it to members
/// below theirs. Only work a member already ran is taken (not what it was just given).
fn balancing_revocations(
    next: &BTreeMap<String, Allocation>,
    before_new_work: &BTreeMap<String, Allocation>,
) -> BTreeMap<String, Allocation> {
    let mut revocations: BTreeMap<String, Allocation> = BTreeMap::new();
    let connector_targets = targets(next, |a| a.connectors.len());
    let task_targets = targets(next, |a| a.tasks.len());
    for (member, allocation) in next {
        let kept_before = &before_new_work[member];
        let extra = allocation
            .connectors
            .len()
            .saturating_sub(connector_targets[member]);
        let connectors: BTreeSet<String> = kept_before
            .connectors
            .iter()
            .rev()
            .take(extra)
            .cloned()
            .collect();
        let extra = allocation.tasks.len().saturating_sub(task_targets[member]);
        let tasks: BTreeSet<TaskId> = kept_before
            .tasks
            .iter()
            .rev()
            .take(extra)
            .cloned()
            .collect();
        if !connectors.is_empty() || !tasks.is_empty() {
            revocations.insert(member.clone(), Allocation { connectors, tasks });
        }
    }
    revocations
}

/// Each member's fair share: total / members, one more for the `total % members` most loaded
/// (so that those already at the higher share keep it and nothing moves without need).
fn targets(
    next: &BTreeMap<String, Allocation>,
    load: impl Fn(&Allocation) -> usize,
) -> BTreeMap<String, usize> {
    let total: usize = next.values().map(&load).sum();
    let members = next.len().max(1);
    let floor = total / members;
    let mut extra = total % members;
    let mut by_load: Vec<(&String, usize)> = next.iter().map(|(m, a)| (m, load(a))).collect();
    by_load.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    by_load
        .into_iter()
        .map(|(member, _)| {
            let target = if extra > 0 {
                extra -= 1;
                floor + 1
            } else {
                floor
            };
            (member.clone(), target)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const DELAY: u64 = 10_000;

    /// `n` connectors `c0..` with `tasks` tasks each.
    fn configured(connectors: usize, tasks: u32) -> Allocation {
        let mut a = Allocation::default();
        for c in 0..connectors {
            let name = format!("c{c}");
            for t in 0..tasks {
                a.tasks.insert(TaskId::new(name.clone(), t));
            }
            a.connectors.insert(name);
        }
        a
    }

    /// A simulated group: members run exactly what they were told, as workers do.
    struct Group {
        assignor: IncrementalAssignor,
        running: BTreeMap<String, Allocation>,
        generation: i32,
        last_completed: Option<i32>,
    }

    impl Group {
        fn new(members: &[&str]) -> Group {
            Group {
                assignor: IncrementalAssignor::new(DELAY),
                running: members
                    .iter()
                    .map(|m| (m.to_string(), Allocation::default()))
                    .collect(),
                generation: 0,
                last_completed: None,
            }
        }

        /// One rebalance at `now`: every member applies its assignment.
        fn round(&mut self, now: u64, configured: &Allocation) -> GroupAssignment {
            self.generation += 1;
            let result = self.assignor.assign(
                now,
                self.last_completed,
                self.generation,
                &self.running,
                configured,
            );
            for (member, assignment) in &result.members {
                let running = self.running.get_mut(member).unwrap();
                running.remove_all(&assignment.revoked);
                running.add_all(&assignment.assigned);
            }
            self.last_completed = Some(self.generation);
            result
        }

        /// Rounds until nobody is told to stop anything (members that revoked rejoin at once).
        fn settle(&mut self, now: u64, configured: &Allocation) -> GroupAssignment {
            for _ in 0..10 {
                let result = self.round(now, configured);
                if result.members.values().all(|m| m.revoked.is_empty()) {
                    return result;
                }
            }
            panic!("no stable assignment after 10 rounds");
        }

        fn tasks_of(&self, member: &str) -> usize {
            self.running[member].tasks.len()
        }

        fn everything(&self) -> Allocation {
            let mut all = Allocation::default();
            let mut count = 0;
            for a in self.running.values() {
                count += a.len();
                all.add_all(a);
            }
            assert_eq!(count, all.len(), "work runs twice: {:?}", self.running);
            all
        }
    }

    #[test]
    fn the_first_assignment_spreads_connectors_and_tasks_evenly() {
        let mut group = Group::new(&["w1", "w2", "w3"]);
        let work = configured(2, 3);
        let result = group.round(0, &work);
        assert_eq!(result.delay_ms, 0);
        assert_eq!(group.everything(), work);
        for member in ["w1", "w2", "w3"] {
            assert_eq!(group.tasks_of(member), 2, "{:?}", group.running);
            assert!(result.members[member].revoked.is_empty());
        }
        let connectors: usize = group.running.values().map(|a| a.connectors.len()).sum();
        assert_eq!(connectors, 2);
        assert!(group.running.values().all(|a| a.connectors.len() <= 1));
    }

    #[test]
    fn a_worker_keeps_its_running_tasks_when_work_is_added() {
        let mut group = Group::new(&["w1", "w2"]);
        group.round(0, &configured(1, 4));
        let before = group.running.clone();
        let result = group.round(10, &configured(2, 4));
        for (member, assignment) in &result.members {
            assert!(assignment.revoked.is_empty(), "{member} lost work");
            assert!(group.running[member]
                .tasks
                .is_superset(&before[member].tasks));
        }
        assert_eq!(group.everything(), configured(2, 4));
        assert_eq!(group.tasks_of("w1"), 4);
        assert_eq!(group.tasks_of("w2"), 4);
    }

    #[test]
    fn a_new_worker_takes_a_share_without_the_others_stopping_the_rest() {
        let mut group = Group::new(&["w1", "w2"]);
        let work = configured(1, 6);
        group.round(0, &work);
        let before = group.running.clone();
        group.running.insert("w3".into(), Allocation::default());
        // Round one: the loaded workers give up one task each; nothing else stops.
        let first = group.round(10, &work);
        for member in ["w1", "w2"] {
            assert_eq!(first.members[member].revoked.tasks.len(), 1, "{first:?}");
            assert!(first.members[member].assigned.is_empty());
        }
        // Round two: the freed tasks go to the newcomer.
        let second = group.settle(20, &work);
        assert_eq!(second.members["w3"].assigned.tasks.len(), 2);
        for member in ["w1", "w2", "w3"] {
            assert_eq!(group.tasks_of(member), 2, "{:?}", group.running);
        }
        for member in ["w1", "w2"] {
            assert!(before[member]
                .tasks
                .is_superset(&group.running[member].tasks));
        }
        assert_eq!(group.everything(), work);
    }

    #[test]
    fn a_departed_workers_work_is_held_for_the_delay_then_reassigned() {
        let mut group = Group::new(&["w1", "w2", "w3"]);
        let work = configured(3, 3);
        group.round(0, &work);
        let gone = group.running.remove("w3").unwrap();
        assert!(!gone.is_empty());
        let held = group.round(1_000, &work);
        assert_eq!(held.delay_ms, DELAY);
        assert!(held
            .members
            .values()
            .all(|m| m.assigned.is_empty() && m.revoked.is_empty()));
        // A rebalance within the delay (the held work's delay counts down, nothing moves).
        let still = group.round(6_000, &work);
        assert_eq!(still.delay_ms, 5_000);
        assert!(still.members.values().all(|m| m.assigned.is_empty()));
        // At the deadline the survivors take it, evenly.
        let moved = group.round(11_000, &work);
        assert_eq!(moved.delay_ms, 0);
        assert_eq!(group.everything(), work);
        let moved_tasks: usize = moved.members.values().map(|m| m.assigned.tasks.len()).sum();
        assert_eq!(moved_tasks, gone.tasks.len());
        let spread = group.tasks_of("w1").abs_diff(group.tasks_of("w2"));
        assert!(spread <= 1, "{:?}", group.running);
    }

    #[test]
    fn a_worker_that_restarts_within_the_delay_gets_its_work_back() {
        let mut group = Group::new(&["w1", "w2", "w3"]);
        let work = configured(3, 3);
        group.round(0, &work);
        let before = group.running.clone();
        let gone = group.running.remove("w3").unwrap();
        group.round(1_000, &work);
        // It comes back as a new, empty member (a restart gets a new member id).
        group
            .running
            .insert("w3-restarted".into(), Allocation::default());
        let back = group.round(3_000, &work);
        assert_eq!(back.delay_ms, 8_000, "the delay keeps its deadline");
        assert!(back.members["w3-restarted"].assigned.is_empty());
        let given = group.round(11_000, &work);
        assert_eq!(given.members["w3-restarted"].assigned, gone);
        for member in ["w1", "w2"] {
            assert_eq!(
                group.running[member], before[member],
                "{member} was disturbed"
            );
        }
        assert_eq!(group.everything(), work);
    }

    #[test]
    fn a_worker_that_comes_back_still_running_its_work_ends_the_hold() {
        let mut group = Group::new(&["w1", "w2", "w3"]);
        let work = configured(2, 3);
        group.round(0, &work);
        let w3 = group.running.remove("w3").unwrap();
        assert_eq!(group.round(1_000, &work).delay_ms, DELAY);
        // Its session expired but it kept running; it rejoins reporting its work.
        group.running.insert("w3".into(), w3.clone());
        let back = group.round(2_000, &work);
        assert_eq!(back.delay_ms, 0);
        assert!(back
            .members
            .values()
            .all(|m| m.assigned.is_empty() && m.revoked.is_empty()));
        assert_eq!(group.running["w3"], w3);
    }

    #[test]
    fn without_a_delay_lost_work_is_reassigned_at_once() {
        let mut group = Group::new(&["w1", "w2"]);
        group.assignor = IncrementalAssignor::new(0);
        let work = configured(1, 4);
        group.round(0, &work);
        group.running.remove("w2");
        let result = group.round(1, &work);
        assert_eq!(result.delay_ms, 0);
        assert_eq!(group.tasks_of("w1"), 4);
        assert_eq!(group.everything(), work);
    }

    #[test]
    fn a_deleted_connector_is_stopped_where_it_runs_and_nothing_else_moves() {
        let mut group = Group::new(&["w1", "w2"]);
        group.round(0, &configured(2, 2));
        let before = group.running.clone();
        let remaining = configured(1, 2);
        let result = group.round(1, &remaining);
        let stopped: Allocation =
            result
                .members
                .values()
                .fold(Allocation::default(), |mut a, m| {
                    a.add_all(&m.revoked);
                    a
                });
        assert_eq!(stopped, configured(2, 2).minus(&remaining));
        for member in ["w1", "w2"] {
            assert_eq!(group.running[member], before[member].intersect(&remaining));
        }
        assert_eq!(group.everything(), remaining);
    }

    #[test]
    fn work_running_on_two_workers_is_stopped_on_both_and_handed_out_once() {
        let mut group = Group::new(&["w1", "w2"]);
        let work = configured(1, 2);
        group.round(0, &work);
        let task = TaskId::new("c0", 0);
        for a in group.running.values_mut() {
            a.tasks.insert(task.clone());
        }
        let result = group.round(1, &work);
        assert!(result
            .members
            .values()
            .all(|m| m.revoked.tasks.contains(&task)));
        group.settle(2, &work);
        assert_eq!(group.everything(), work);
    }

    #[test]
    fn a_new_leader_without_memory_hands_out_missing_work_at_once() {
        let mut group = Group::new(&["w1", "w2", "w3"]);
        let work = configured(1, 3);
        group.round(0, &work);
        group.running.remove("w3");
        // Another member leads now: a fresh assignor whose memory is of no generation.
        group.assignor = IncrementalAssignor::new(DELAY);
        let result = group.round(1, &work);
        assert_eq!(result.delay_ms, 0);
        assert_eq!(group.everything(), work);
    }

    #[test]
    fn a_leader_that_missed_a_generation_forgets_what_it_assigned() {
        let mut assignor = IncrementalAssignor::new(DELAY);
        let work = configured(1, 2);
        let running: BTreeMap<String, Allocation> =
            [("w1".to_string(), Allocation::default())].into();
        assignor.assign(0, None, 1, &running, &work);
        // Generation 2 was led by someone else; w1 reports nothing now. Were the memory of
        // generation 1 trusted, the work would be held as lost.
        let result = assignor.assign(5, Some(2), 3, &running, &work);
        assert_eq!(result.delay_ms, 0);
        assert_eq!(result.members["w1"].assigned, work);
    }
}
