//! Values kept per topic and looked up for every record ([`TopicTable`]).

use rustc_hash::FxHashMap;
use spillway_core::Topic;

/// Values by topic, for lookups made once per record. A batch runs by topic, so the topic
/// looked up last is tried first (two interned names compare by address, others by their
/// text), then an index; no lookup allocates.
#[derive(Debug)]
pub struct TopicTable<T> {
    entries: Vec<(Topic, T)>,
    /// Where each topic is in `entries`.
    index: FxHashMap<Topic, usize>,
    /// The entry looked up last.
    last: usize,
}

impl<T> Default for TopicTable<T> {
    fn default() -> Self {
        TopicTable {
            entries: Vec::new(),
            index: FxHashMap::default(),
            last: 0,
        }
    }
}

impl<T> TopicTable<T> {
    /// `topic`'s value, made by `make` on its first lookup.
    pub fn get_or_insert_with(&mut self, topic: &Topic, make: impl FnOnce() -> T) -> &mut T {
        let at = match self.entries.get(self.last) {
            Some((last, _)) if last == topic => self.last,
            _ => match self.index.get(topic.as_str()) {
                Some(at) => *at,
                None => {
                    self.entries.push((topic.clone(), make()));
                    self.index.insert(topic.clone(), self.entries.len() - 1);
                    self.entries.len() - 1
                }
            },
        };
        self.last = at;
        &mut self.entries[at].1
    }

    /// `topic`'s value, if it has one.
    pub fn get_mut(&mut self, topic: &str) -> Option<&mut T> {
        let at = *self.index.get(topic)?;
        Some(&mut self.entries[at].1)
    }

    /// How many topics have a value.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_topic_keeps_its_own_value_whichever_was_looked_up_last() {
        let mut table: TopicTable<Vec<i32>> = TopicTable::default();
        let (a, b) = (Topic::from("a"), Topic::interned("b"));
        for (i, topic) in [&a, &b, &b, &a, &Topic::from("a"), &b]
            .into_iter()
            .enumerate()
        {
            table.get_or_insert_with(topic, Vec::new).push(i as i32);
        }
        assert_eq!(table.len(), 2, "one entry per topic");
        assert_eq!(table.get_mut("a"), Some(&mut vec![0, 3, 4]));
        assert_eq!(table.get_mut("b"), Some(&mut vec![1, 2, 5]));
        assert_eq!(table.get_mut("c"), None);
    }
}
