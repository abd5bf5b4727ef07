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
//! - Capacity: a worker never gets more tasks than its `tasks.max.per.worker` (sent in its
//!   join metadata). New and moved tasks go to the least loaded worker with room; tasks that
//!   fit nowhere stay unassigned (reported, not dropped) and are handed out at the first
//!   rebalance that finds room (a worker joins, a connector shrinks or goes). Fair shares are
//!   capped the same way, so balancing never asks a full worker to take more.
//!
//! Connectors and tasks are balanced separately, as in Connect: a connector instance is light
//! (it computes task configs), tasks carry the records. Only tasks count against capacity.

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
    /// Tasks no member has room for: they run nowhere until a later round finds room.
    pub unassigned: Allocation,
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
    /// for `generation`, giving no member more tasks than its entry in `max_tasks` (a member
    /// without one has no limit). `last_completed_generation` is the last generation this member
    /// completed (its SyncGroup answered): when it is not the one this assignor computed, this
    /// member was not the leader throughout and its memory is no guide, so it starts afresh.
    pub fn assign(
        &mut self,
        now_ms: u64,
        last_completed_generation: Option<i32>,
        generation: i32,
        running: &BTreeMap<String, Allocation>,
        configured: &Allocation,
        max_tasks: &BTreeMap<String, u64>,
    ) -> GroupAssignment {
        let caps = Caps(max_tasks);
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

        // A member above its capacity (it was lowered, or an earlier leader did not know it)
        // stops the excess; the next round hands it on.
        for (member, allocation) in next.iter_mut() {
            let excess = allocation.tasks.len().saturating_sub(caps.of(member));
            if excess > 0 {
                let stop: BTreeSet<TaskId> = allocation
                    .tasks
                    .iter()
                    .rev()
                    .take(excess)
                    .cloned()
                    .collect();
                allocation.tasks.retain(|t| !stop.contains(t));
                revoked
                    .entry(member.clone())
                    .or_default()
                    .tasks
                    .extend(stop);
            }
        }

        // Balancing only takes back work a member ran before this round.
        let before_new_work = next.clone();
        let (to_hand_out, delay_ms) = self.handle_lost(now_ms, &mut lost, &mut next, &caps);
        let mut new_work = created;
        new_work.add_all(&to_hand_out);
        let unassigned = assign_to_least_loaded(&mut next, &new_work, &caps);

        if delay_ms == 0 {
            let balancing = balancing_revocations(&next, &before_new_work, &caps);
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
        GroupAssignment {
            members,
            delay_ms,
            unassigned,
        }
    }

    /// Decides what to do with `lost` work: hand it out now (returned, or given straight to
    /// candidate workers in `next`), or hold it (left in `lost`) with the delay until the next
    /// decision.
    fn handle_lost(
        &mut self,
        now_ms: u64,
        lost: &mut Allocation,
        next: &mut BTreeMap<String, Allocation>,
        caps: &Caps,
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
                // A task no candidate has room for goes to whoever has.
                let mut overflow = Allocation::default();
                let mut turn = 0;
                for task in &held.tasks {
                    let with_room = (0..candidates.len())
                        .map(|k| &candidates[(turn + k) % candidates.len()])
                        .position(|member| {
                            next.get(member)
                                .is_some_and(|n| n.tasks.len() < caps.of(member))
                        });
                    match with_room {
                        Some(k) => {
                            let member = &candidates[(turn + k) % candidates.len()];
                            if let Some(n) = next.get_mut(member) {
                                n.tasks.insert(task.clone());
                            }
                            turn += k + 1;
                        }
                        None => {
                            overflow.tasks.insert(task.clone());
                        }
                    }
                }
                (overflow, 0)
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

/// Members' task capacities; a member without one has no limit.
struct Caps<'a>(&'a BTreeMap<String, u64>);

impl Caps<'_> {
    fn of(&self, member: &str) -> usize {
        self.0.get(member).map_or(usize::MAX, |cap| {
            usize::try_from(*cap).unwrap_or(usize::MAX)
        })
    }
}

/// Hands each connector, then each task, to the member that has fewest of its kind (ties: the
/// lowest member id, so the result does not depend on map order); a task only to a member
/// below its capacity. Returns the tasks no member had room for.
fn assign_to_least_loaded(
    next: &mut BTreeMap<String, Allocation>,
    work: &Allocation,
    caps: &Caps,
) -> Allocation {
    let mut unassigned = Allocation::default();
    if next.is_empty() {
        unassigned.tasks = work.tasks.clone();
        return unassigned;
    }
    for connector in &work.connectors {
        if let Some(member) = least(next, |a| a.connectors.len(), |_, _| true) {
            next.get_mut(&member)
                .expect("chosen from next")
                .connectors
                .insert(connector.clone());
        }
    }
    for task in &work.tasks {
        let room = |member: &str, a: &Allocation| a.tasks.len() < caps.of(member);
        match least(next, |a| a.tasks.len(), room) {
            Some(member) => {
                next.get_mut(&member)
                    .expect("chosen from next")
                    .tasks
                    .insert(task.clone());
            }
            None => {
                unassigned.tasks.insert(task.clone());
            }
        }
    }
    unassigned
}

fn least(
    next: &BTreeMap<String, Allocation>,
    load: impl Fn(&Allocation) -> usize,
    eligible: impl Fn(&str, &Allocation) -> bool,
) -> Option<String> {
    next.iter()
        .filter(|(member, allocation)| eligible(member, allocation))
        .min_by_key(|(member, allocation)| (load(allocation), (*member).clone()))
        .map(|(member, _)| member.clone())
}

/// What members above their fair share stop so that the next round can give it to members
/// below theirs. Only work a member already ran is taken (not what it was just given).
fn balancing_revocations(
    next: &BTreeMap<String, Allocation>,
    before_new_work: &BTreeMap<String, Allocation>,
    caps: &Caps,
) -> BTreeMap<String, Allocation> {
    let mut revocations: BTreeMap<String, Allocation> = BTreeMap::new();
    let connector_targets = targets(next, |a| a.connectors.len(), |_| usize::MAX);
    let task_targets = targets(next, |a| a.tasks.len(), |member| caps.of(member));
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
/// (so that those already at the higher share keep it and nothing moves without need). A
/// member whose capacity is below that share gets its capacity, and the others share the rest.
fn targets(
    next: &BTreeMap<String, Allocation>,
    load: impl Fn(&Allocation) -> usize,
    cap: impl Fn(&str) -> usize,
) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    let mut remaining: usize = next.values().map(&load).sum();
    let mut by_cap: Vec<(&String, usize)> = next.keys().map(|m| (m, cap(m))).collect();
    by_cap.sort_by(|a, b| a.1.cmp(&b.1).then(a.0.cmp(b.0)));
    let mut open: Vec<&String> = Vec::new();
    let mut members = by_cap.len();
    for (member, cap) in by_cap {
        // Sorted by capacity: once one member can take an even share, all after it can.
        if open.is_empty() && cap.saturating_mul(members) <= remaining {
            out.insert(member.clone(), cap);
            remaining -= cap;
            members -= 1;
        } else {
            open.push(member);
        }
    }
    if open.is_empty() {
        return out;
    }
    let floor = remaining / open.len();
    let mut extra = remaining % open.len();
    let mut by_load: Vec<(&String, usize)> =
        open.into_iter().map(|m| (m, load(&next[m]))).collect();
    by_load.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    for (member, _) in by_load {
        let target = if extra > 0 {
            extra -= 1;
            floor + 1
        } else {
            floor
        };
        out.insert(member.clone(), target);
    }
    out
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
        /// `tasks.max.per.worker` of the members that have one.
        caps: BTreeMap<String, u64>,
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
                caps: BTreeMap::new(),
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
                &self.caps,
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
        assignor.assign(0, None, 1, &running, &work, &BTreeMap::new());
        // Generation 2 was led by someone else; w1 reports nothing now. Were the memory of
        // generation 1 trusted, the work would be held as lost.
        let result = assignor.assign(5, Some(2), 3, &running, &work, &BTreeMap::new());
        assert_eq!(result.delay_ms, 0);
        assert_eq!(result.members["w1"].assigned, work);
    }

    fn capped(members: &[&str], cap: u64) -> Group {
        let mut group = Group::new(members);
        group.caps = members.iter().map(|m| (m.to_string(), cap)).collect();
        group
    }

    fn assert_within_caps(group: &Group) {
        for (member, allocation) in &group.running {
            if let Some(cap) = group.caps.get(member) {
                assert!(
                    allocation.tasks.len() as u64 <= *cap,
                    "{member} runs {} tasks, cap {cap}: {:?}",
                    allocation.tasks.len(),
                    group.running
                );
            }
        }
    }

    #[test]
    fn no_worker_gets_more_tasks_than_its_cap_and_the_rest_is_reported_unassigned() {
        let mut group = capped(&["w1", "w2"], 2);
        let three = configured(1, 3);
        let result = group.settle(0, &three);
        assert!(result.unassigned.is_empty(), "{result:?}");
        assert_eq!(group.everything(), three);
        assert_within_caps(&group);
        // Five tasks on a capacity of four: one is left out, and said to be.
        let five = configured(1, 5);
        let result = group.settle(10, &five);
        assert_within_caps(&group);
        assert_eq!(result.unassigned.tasks.len(), 1, "{result:?}");
        assert!(result.unassigned.connectors.is_empty());
        let mut placed = group.everything();
        placed.add_all(&result.unassigned);
        assert_eq!(placed, five, "every task is placed or reported");
        // The next round tries again (still no room), and reports it again.
        let again = group.round(20, &five);
        assert_eq!(again.unassigned, result.unassigned);
        assert_within_caps(&group);
    }

    #[test]
    fn tasks_that_fit_nowhere_after_a_worker_died_wait_for_capacity_to_return() {
        let mut group = capped(&["w1", "w2"], 2);
        let work = configured(1, 3);
        group.settle(0, &work);
        let gone = group.running.remove("w1").unwrap();
        assert!(!gone.tasks.is_empty());
        assert_eq!(group.round(1_000, &work).delay_ms, DELAY);
        // At the deadline the survivor fills up to its cap; the rest is reported.
        let moved = group.round(11_000, &work);
        assert_within_caps(&group);
        assert_eq!(group.tasks_of("w2"), 2);
        assert_eq!(moved.unassigned.tasks.len(), 1, "{moved:?}");
        // A worker joins: the left-out task runs there, nothing else moves.
        group.running.insert("w3".into(), Allocation::default());
        group.caps.insert("w3".into(), 2);
        let before = group.running["w2"].clone();
        let joined = group.settle(12_000, &work);
        assert!(joined.unassigned.is_empty(), "{joined:?}");
        assert_eq!(group.everything(), work);
        assert_within_caps(&group);
        assert!(moved.unassigned.tasks.is_subset(&group.running["w3"].tasks));
        assert_eq!(group.running["w2"], before);
    }

    #[test]
    fn held_work_given_to_a_returning_worker_respects_its_cap() {
        let mut group = capped(&["w1", "w2"], 3);
        let work = configured(1, 4);
        group.settle(0, &work);
        group.running.remove("w2");
        group.round(1_000, &work);
        // It comes back within the delay with a smaller cap: the first candidate for its
        // work, but what does not fit goes to w1, which has room.
        group
            .running
            .insert("w2-back".into(), Allocation::default());
        group.caps.insert("w2-back".into(), 1);
        group.round(3_000, &work);
        let given = group.round(11_000, &work);
        assert!(given.unassigned.is_empty(), "{given:?}");
        assert_within_caps(&group);
        assert_eq!(group.everything(), work);
        assert_eq!(group.tasks_of("w2-back"), 1);
    }

    #[test]
    fn balancing_with_unequal_caps_settles_without_overfilling_the_small_worker() {
        let mut group = Group::new(&["small", "big"]);
        group.caps = [("small".to_string(), 1), ("big".to_string(), 10)].into();
        let work = configured(2, 3);
        group.settle(0, &work);
        assert_within_caps(&group);
        assert_eq!(group.tasks_of("small"), 1);
        assert_eq!(group.tasks_of("big"), 5);
        // A newcomer with room: the big one gives up tasks until the shares are even.
        group.running.insert("new".into(), Allocation::default());
        group.caps.insert("new".into(), 10);
        group.settle(10, &work);
        assert_within_caps(&group);
        assert_eq!(group.everything(), work);
        assert_eq!(group.tasks_of("small"), 1);
        assert!(group.tasks_of("big").abs_diff(group.tasks_of("new")) <= 1);
    }

    #[test]
    fn a_member_running_more_than_its_cap_stops_the_excess() {
        let mut group = Group::new(&["w1", "w2"]);
        let work = configured(1, 4);
        group.running.get_mut("w1").unwrap().tasks = work.tasks.clone();
        group.running.get_mut("w1").unwrap().connectors = work.connectors.clone();
        group.caps.insert("w1".into(), 1);
        let first = group.round(0, &work);
        assert_eq!(first.members["w1"].revoked.tasks.len(), 3, "{first:?}");
        group.settle(10, &work);
        assert_within_caps(&group);
        assert_eq!(group.everything(), work);
        assert_eq!(group.tasks_of("w2"), 3);
    }
}
