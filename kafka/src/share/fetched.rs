//! The records the fetch tasks delivered and `poll` has not handed out yet.
//!
//! Kept as the deliveries' own lists, not one queue of records: a poll that takes whole
//! deliveries hands the first list over as it is, so most records are never copied between
//! the fetch and the application (a queue of records copied each one in and out again).

use std::collections::VecDeque;

/// Records in delivery order, as the lists they were delivered in.
#[derive(Debug)]
pub(crate) struct Fetched<T> {
    lists: VecDeque<Vec<T>>,
    len: usize,
}

impl<T> Default for Fetched<T> {
    fn default() -> Self {
        Fetched {
            lists: VecDeque::new(),
            len: 0,
        }
    }
}

impl<T> Fetched<T> {
    /// Records waiting, over all lists.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Queues one delivery's records after those already waiting.
    pub(crate) fn push(&mut self, records: Vec<T>) {
        if !records.is_empty() {
            self.len += records.len();
            self.lists.push_back(records);
        }
    }

    /// The first `max` records waiting (all of them when fewer wait), in delivery order.
    ///
    /// The first list is handed over without a copy; records of later lists are moved once
    /// (into its spare room when it has enough), and a list cut at `max` keeps its tail
    /// (moved once) for the next call.
    pub(crate) fn take(&mut self, max: usize) -> Vec<T> {
        let Some(mut out) = self.lists.pop_front() else {
            return Vec::new();
        };
        if out.len() > max {
            let tail = out.split_off(max);
            self.lists.push_front(tail);
        }
        while let Some(next) = self.lists.front_mut() {
            let room = max - out.len();
            if room == 0 {
                break;
            }
            if next.len() <= room {
                out.append(next);
                self.lists.pop_front();
            } else {
                out.extend(next.drain(..room));
            }
        }
        self.len -= out.len();
        out
    }

    /// Every record waiting, in delivery order.
    pub(crate) fn take_all(&mut self) -> Vec<T> {
        self.take(self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queued(lists: &[std::ops::Range<u32>]) -> Fetched<u32> {
        let mut fetched = Fetched::default();
        for list in lists {
            fetched.push(list.clone().collect());
        }
        fetched
    }

    #[test]
    fn takes_records_in_delivery_order_at_most_max_at_a_time() {
        let mut fetched = queued(&[0..3, 3..10, 10..11, 11..15]);
        assert_eq!(fetched.len(), 15);
        let mut seen = Vec::new();
        let mut sizes = Vec::new();
        while !fetched.is_empty() {
            let before = fetched.len();
            let taken = fetched.take(4);
            assert_eq!(fetched.len(), before - taken.len());
            sizes.push(taken.len());
            seen.extend(taken);
        }
        assert_eq!(seen, (0..15).collect::<Vec<_>>());
        // Full takes until the last: a take stops short only when nothing more waits.
        assert_eq!(sizes, vec![4, 4, 4, 3]);
        assert!(fetched.take(4).is_empty());
    }

    #[test]
    fn a_list_that_fits_is_handed_over_without_a_copy() {
        let mut fetched = Fetched::default();
        // As the fetch task makes them: room for what it asked for.
        let mut list = Vec::with_capacity(10);
        list.extend(0..5u32);
        let at = list.as_ptr();
        fetched.push(list);
        fetched.push((5..7).collect());
        let taken = fetched.take(10);
        assert_eq!(taken, (0..7).collect::<Vec<_>>());
        assert_eq!(
            taken.as_ptr(),
            at,
            "the first list is the one returned, with the second appended in its room"
        );
        // One cut at `max` keeps the head where it lies too.
        let list: Vec<u32> = (0..9).collect();
        let at = list.as_ptr();
        fetched.push(list);
        let taken = fetched.take(6);
        assert_eq!(
            (taken.as_slice(), taken.as_ptr()),
            (&[0, 1, 2, 3, 4, 5][..], at)
        );
        assert_eq!(fetched.take_all(), vec![6, 7, 8]);
        assert_eq!(fetched.len(), 0);
    }

    #[test]
    fn empty_deliveries_are_not_kept_and_take_all_takes_everything() {
        let mut fetched = queued(&[0..0, 0..2, 2..2, 2..5]);
        assert_eq!(fetched.len(), 5);
        assert_eq!(fetched.take(0), Vec::<u32>::new());
        assert_eq!(fetched.take_all(), (0..5).collect::<Vec<_>>());
        assert!(fetched.is_empty());
        assert!(fetched.take_all().is_empty());
    }
}
