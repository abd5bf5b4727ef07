//! The per-partition state of the [`super::ack::Ledger`], kept per acquired range rather than
//! per offset (issue 18): a broker acquires records in contiguous ranges and the application
//! settles them mostly in order, so the held records of a partition are a few runs of slots,
//! one slot per offset, and the acknowledgements are a list sorted by offset, appended to.
//! A record costs a slot write and a list push instead of hash-map and B-tree nodes.

/// Where a held record's settlement stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settlement {
    /// Delivered (or buffered) and not acknowledged yet.
    Unsettled,
    /// Acknowledged by the application (or as GAP); the ack is pending or in flight to the
    /// broker through ShareFetch/ShareAcknowledge.
    Acked,
    /// Acknowledged for a producer transaction (KIP-1289); waiting to be taken by
    /// `Ledger::take_for_transaction`. Never sent through ShareFetch/ShareAcknowledge.
    Staged,
    /// Taken into a producer transaction; settled by the transaction's outcome, which
    /// `Ledger::finish_transaction` reports.
    InTransaction,
}

/// One held record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Held {
    pub delivery_count: i16,
    pub settlement: Settlement,
}

impl Held {
    pub fn is_settled(&self) -> bool {
        self.settlement != Settlement::Unsettled
    }
}

/// Most offsets one run spans: a record never settled (the application kept it) keeps at
/// most this many slots alive, not every offset acquired after it.
const RUN_SPAN: usize = 4096;
/// Widest hole a run bridges with empty slots (offsets the broker did not give us, such as
/// those another member acquired); past it a new run starts.
const MAX_HOLE: i64 = 64;

/// Contiguous offsets from `first`, each held or not.
#[derive(Debug, Clone)]
struct Run {
    first: i64,
    slots: Vec<Option<Held>>,
    /// Slots holding a record.
    live: u32,
    unsettled: u32,
    acked: u32,
}

impl Run {
    fn end(&self) -> i64 {
        self.first + self.slots.len() as i64
    }

    fn count(&mut self, held: Held, add: bool) {
        let step = |n: &mut u32| {
            if add {
                *n += 1
            } else {
                *n -= 1
            }
        };
        step(&mut self.live);
        match held.settlement {
            Settlement::Unsettled => step(&mut self.unsettled),
            Settlement::Acked => step(&mut self.acked),
            Settlement::Staged | Settlement::InTransaction => {}
        }
    }
}

/// The records a partition holds: runs sorted by offset, disjoint.
#[derive(Debug, Clone, Default)]
pub(crate) struct HeldRecords {
    runs: Vec<Run>,
}

impl HeldRecords {
    /// The run that starts at or before `offset`.
    fn run_before(&self, offset: i64) -> Option<usize> {
        // Most lookups hit the newest run.
        match self.runs.last() {
            Some(last) if last.first <= offset => Some(self.runs.len() - 1),
            _ => self
                .runs
                .partition_point(|r| r.first <= offset)
                .checked_sub(1),
        }
    }

    /// (run, slot) of `offset` when a run covers it.
    fn locate(&self, offset: i64) -> Option<(usize, usize)> {
        let i = self.run_before(offset)?;
        let run = &self.runs[i];
        (offset < run.end()).then(|| (i, (offset - run.first) as usize))
    }

    pub fn get(&self, offset: i64) -> Option<Held> {
        let (i, at) = self.locate(offset)?;
        self.runs[i].slots[at]
    }

    pub fn contains(&self, offset: i64) -> bool {
        self.get(offset).is_some()
    }

    /// Holds `offset` as `held`, replacing what was held there.
    pub fn insert(&mut self, offset: i64, held: Held) {
        let (i, at) = match self.run_before(offset) {
            Some(i) if offset < self.runs[i].end() => (i, (offset - self.runs[i].first) as usize),
            Some(i) if self.can_extend(i, offset) => {
                let run = &mut self.runs[i];
                let at = (offset - run.first) as usize;
                run.slots.resize(at + 1, None);
                (i, at)
            }
            before => {
                let i = before.map_or(0, |i| i + 1);
                let mut slots = Vec::with_capacity(64);
                slots.push(None);
                self.runs.insert(
                    i,
                    Run {
                        first: offset,
                        slots,
                        live: 0,
                        unsettled: 0,
                        acked: 0,
                    },
                );
                (i, 0)
            }
        };
        let run = &mut self.runs[i];
        if let Some(old) = run.slots[at].replace(held) {
            run.count(old, false);
        }
        run.count(held, true);
    }

    /// Whether run `i` may grow to cover `offset`, just past its end.
    fn can_extend(&self, i: usize, offset: i64) -> bool {
        let run = &self.runs[i];
        let next_first = self.runs.get(i + 1).map_or(i64::MAX, |r| r.first);
        offset - run.end() < MAX_HOLE
            && ((offset - run.first) as usize) < RUN_SPAN
            && offset < next_first
    }

    /// Changes the settlement of a held `offset`; false when it is not held.
    pub fn settle(&mut self, offset: i64, settlement: Settlement) -> bool {
        let Some((i, at)) = self.locate(offset) else {
            return false;
        };
        let run = &mut self.runs[i];
        let Some(old) = run.slots[at] else {
            return false;
        };
        let new = Held { settlement, ..old };
        run.count(old, false);
        run.count(new, true);
        run.slots[at] = Some(new);
        true
    }

    /// Stops holding `offset`.
    pub fn remove(&mut self, offset: i64) -> Option<Held> {
        let (i, at) = self.locate(offset)?;
        let run = &mut self.runs[i];
        let old = run.slots[at].take()?;
        run.count(old, false);
        if run.live == 0 {
            self.runs.remove(i);
        }
        Some(old)
    }

    pub fn clear(&mut self) {
        self.runs.clear();
    }

    /// Every held record, by offset.
    pub fn iter(&self) -> impl Iterator<Item = (i64, Held)> + '_ {
        self.runs.iter().flat_map(|run| {
            run.slots
                .iter()
                .enumerate()
                .filter_map(move |(at, h)| h.map(|h| (run.first + at as i64, h)))
        })
    }

    /// Records the application has not settled yet.
    pub fn unsettled(&self) -> usize {
        self.runs.iter().map(|r| r.unsettled as usize).sum()
    }

    /// Whether some record is acknowledged the normal way and its ack not yet confirmed.
    pub fn any_acked(&self) -> bool {
        self.runs.iter().any(|r| r.acked > 0)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.runs.iter().map(|r| r.live as usize).sum()
    }
}

/// Acknowledgements of one partition, one per offset, sorted by offset: (offset, wire type).
/// Acks made in offset order are appended; one out of order is put in its place.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct AckList(Vec<(i64, i8)>);

impl AckList {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn clear(&mut self) {
        self.0.clear();
    }

    fn find(&self, offset: i64) -> Result<usize, usize> {
        match self.0.last() {
            None => Err(0),
            Some(&(last, _)) if last < offset => Err(self.0.len()),
            _ => self.0.binary_search_by_key(&offset, |e| e.0),
        }
    }

    /// `offset` acknowledged as `kind`, replacing an earlier ack of it.
    pub fn insert(&mut self, offset: i64, kind: i8) {
        match self.find(offset) {
            Ok(i) => self.0[i].1 = kind,
            Err(i) => self.0.insert(i, (offset, kind)),
        }
    }

    /// `offset` acknowledged as `kind` unless it is acknowledged already.
    pub fn insert_if_absent(&mut self, offset: i64, kind: i8) {
        if let Err(i) = self.find(offset) {
            self.0.insert(i, (offset, kind));
        }
    }

    pub fn remove(&mut self, offset: i64) -> Option<i8> {
        self.find(offset).ok().map(|i| self.0.remove(i).1)
    }

    pub fn iter(&self) -> impl Iterator<Item = (i64, i8)> + '_ {
        self.0.iter().copied()
    }

    pub fn offsets(&self) -> impl Iterator<Item = i64> + '_ {
        self.0.iter().map(|e| e.0)
    }
}

impl FromIterator<(i64, i8)> for AckList {
    fn from_iter<I: IntoIterator<Item = (i64, i8)>>(iter: I) -> Self {
        let mut list = AckList::default();
        for (offset, kind) in iter {
            list.insert(offset, kind);
        }
        list
    }
}

impl IntoIterator for AckList {
    type Item = (i64, i8);
    type IntoIter = std::vec::IntoIter<(i64, i8)>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unsettled(dc: i16) -> Held {
        Held {
            delivery_count: dc,
            settlement: Settlement::Unsettled,
        }
    }

    fn acquire(held: &mut HeldRecords, offsets: impl IntoIterator<Item = i64>, dc: i16) {
        for offset in offsets {
            held.insert(offset, unsettled(dc));
        }
    }

    #[test]
    fn an_acquired_range_is_one_run() {
        let mut held = HeldRecords::default();
        acquire(&mut held, 100..600, 1);
        assert_eq!(held.runs.len(), 1);
        assert_eq!(held.unsettled(), 500);
        assert_eq!(held.get(100), Some(unsettled(1)));
        assert_eq!(held.get(599), Some(unsettled(1)));
        assert_eq!(held.get(99), None);
        assert_eq!(held.get(600), None);
    }

    #[test]
    fn partial_settlements_inside_a_range_are_per_offset() {
        let mut held = HeldRecords::default();
        acquire(&mut held, 0..10, 1);
        assert!(held.settle(3, Settlement::Acked));
        assert!(held.settle(4, Settlement::Staged));
        assert!(held.settle(5, Settlement::InTransaction));
        assert_eq!(held.unsettled(), 7);
        assert!(held.any_acked());
        assert_eq!(held.get(3).map(|h| h.settlement), Some(Settlement::Acked));
        assert_eq!(
            held.get(2).map(|h| h.settlement),
            Some(Settlement::Unsettled)
        );
        // Accepted, released or rejected alike: the ack's confirmation removes it.
        assert_eq!(
            held.remove(3).map(|h| h.settlement),
            Some(Settlement::Acked)
        );
        assert!(!held.any_acked());
        assert!(!held.contains(3));
        assert!(held.contains(2) && held.contains(4));
        assert_eq!(held.len(), 9);
        assert!(!held.settle(3, Settlement::Acked), "no longer held");
    }

    #[test]
    fn a_run_is_dropped_once_its_last_record_is_settled_in_any_order() {
        let mut held = HeldRecords::default();
        acquire(&mut held, 0..5, 1);
        for offset in [4, 0, 2, 1] {
            held.settle(offset, Settlement::Acked);
            held.remove(offset);
        }
        assert_eq!(held.runs.len(), 1);
        held.remove(3);
        assert!(held.runs.is_empty());
        assert_eq!(held.iter().count(), 0);
    }

    #[test]
    fn gaps_are_bridged_when_small_and_start_a_run_when_wide() {
        let mut held = HeldRecords::default();
        acquire(&mut held, 0..3, 1);
        acquire(&mut held, 10..12, 1);
        assert_eq!(held.runs.len(), 1, "a hole of 7 offsets is bridged");
        assert!(!held.contains(5));
        acquire(&mut held, 1_000..1_002, 1);
        assert_eq!(held.runs.len(), 2);
        assert_eq!(
            held.iter().map(|(o, _)| o).collect::<Vec<_>>(),
            vec![0, 1, 2, 10, 11, 1_000, 1_001]
        );
    }

    #[test]
    fn offsets_acquired_out_of_order_land_in_order() {
        let mut held = HeldRecords::default();
        acquire(&mut held, [500, 200, 800, 201, 199, 100_000, 0], 1);
        assert_eq!(
            held.iter().map(|(o, _)| o).collect::<Vec<_>>(),
            vec![0, 199, 200, 201, 500, 800, 100_000]
        );
        assert_eq!(held.unsettled(), 7);
        for offset in [0, 199, 200, 201, 500, 800, 100_000] {
            assert!(held.contains(offset), "{offset}");
        }
        // A run never grows over the next one.
        for w in held.runs.windows(2) {
            assert!(w[0].end() <= w[1].first, "{:?}", held.runs);
        }
    }

    #[test]
    fn a_run_spans_a_bounded_number_of_offsets() {
        let mut held = HeldRecords::default();
        acquire(&mut held, 0..(RUN_SPAN as i64 * 3), 1);
        assert_eq!(held.runs.len(), 3);
        // One record never settled keeps its own run only.
        for offset in 1..(RUN_SPAN as i64 * 3) {
            held.settle(offset, Settlement::Acked);
            held.remove(offset);
        }
        assert_eq!(held.runs.len(), 1);
        assert_eq!(held.unsettled(), 1);
    }

    #[test]
    fn a_record_acquired_again_replaces_its_slot() {
        let mut held = HeldRecords::default();
        acquire(&mut held, 0..3, 1);
        held.settle(1, Settlement::Acked);
        held.insert(1, unsettled(2));
        assert_eq!(held.get(1), Some(unsettled(2)));
        assert_eq!(held.unsettled(), 3);
        assert!(!held.any_acked());
        assert_eq!(held.len(), 3);
    }

    #[test]
    fn acks_keep_offset_order_whatever_order_they_come_in() {
        let mut acks = AckList::default();
        for (offset, kind) in [(5, 1), (7, 1), (6, 3), (1, 2), (9, 1)] {
            acks.insert(offset, kind);
        }
        assert_eq!(
            acks.iter().collect::<Vec<_>>(),
            vec![(1, 2), (5, 1), (6, 3), (7, 1), (9, 1)]
        );
        acks.insert(6, 2);
        acks.insert_if_absent(7, 3);
        acks.insert_if_absent(8, 3);
        assert_eq!(acks.remove(1), Some(2));
        assert_eq!(acks.remove(1), None);
        assert_eq!(
            acks.into_iter().collect::<Vec<_>>(),
            vec![(5, 1), (6, 2), (7, 1), (8, 3), (9, 1)]
        );
    }
}
