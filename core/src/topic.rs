//! [`Topic`]: a topic name shared by every record read from that topic.
//!
//! A record carries its topic through every stage (raw record, sink record, its coordinates,
//! its verdict, its acknowledgement); as a `String` that was one allocation and copy per record
//! per stage. A `Topic` is a reference-counted name: cloning it for a record costs a counter
//! increment. It reads as a `&str` (`Deref`), compares with strings, and converts from and to
//! `String`, so code that names topics as text keeps working.
//!
//! Even a counter increment is an atomic operation, and a record's topic is cloned and dropped
//! about seven times on its way from a source to a sink (issue 18: 5% of a mirror's CPU). The
//! names sources read from a cluster are therefore [`interned`](Topic::interned): kept for the
//! life of the process, so that cloning or dropping them touches no counter. The table is
//! bounded ([`INTERNED_MAX`]): names are few per cluster, but a tenant could make up many, and
//! past the bound a name is shared by counting again.

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::collections::HashMap;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;
use std::sync::{Arc, LazyLock, Mutex};

/// How many names [`Topic::interned`] keeps for the life of the process; a bounded leak.
pub const INTERNED_MAX: usize = 4096;

/// A topic name, shared (see the module's documentation).
#[derive(Clone)]
pub struct Topic(Name);

#[derive(Clone)]
enum Name {
    Shared(Arc<str>),
    /// Never freed: cloning copies the reference.
    Interned(&'static Arc<str>),
}

static INTERNED: LazyLock<Mutex<HashMap<&'static str, &'static Arc<str>>>> =
    LazyLock::new(Default::default);

impl Topic {
    /// `name`, kept for the life of the process so that clones cost no atomic operation; for
    /// names read from a cluster once per batch or assignment, not per record. Past
    /// [`INTERNED_MAX`] names the same as [`Topic::from`].
    pub fn interned(name: &str) -> Topic {
        let mut table = INTERNED.lock().unwrap_or_else(|e| e.into_inner());
        intern(&mut table, INTERNED_MAX, name)
    }

    /// The name of an interned topic, which lives as long as the process: bytes made from it
    /// (`Bytes::from_static`) are cloned without a reference count. `None` for others.
    pub fn as_static(&self) -> Option<&'static str> {
        match self.0 {
            Name::Interned(kept) => Some(kept),
            Name::Shared(_) => None,
        }
    }

    /// Whether this is an interned name (see [`Topic::interned`]).
    pub fn is_interned(&self) -> bool {
        matches!(self.0, Name::Interned(_))
    }

    pub fn as_str(&self) -> &str {
        self.as_arc()
    }

    /// The shared name, for maps keyed by `Arc<str>`.
    pub fn as_arc(&self) -> &Arc<str> {
        match &self.0 {
            Name::Shared(name) => name,
            Name::Interned(name) => name,
        }
    }
}

/// `name` from `table`, or added to it while it holds fewer than `max` names.
fn intern(table: &mut HashMap<&'static str, &'static Arc<str>>, max: usize, name: &str) -> Topic {
    if let Some(&kept) = table.get(name) {
        return Topic(Name::Interned(kept));
    }
    if table.len() >= max {
        return Topic::from(name);
    }
    let kept: &'static Arc<str> = Box::leak(Box::new(Arc::from(name)));
    table.insert(kept, kept);
    Topic(Name::Interned(kept))
}

impl PartialEq for Topic {
    fn eq(&self, other: &Topic) -> bool {
        let (a, b) = (self.as_arc(), other.as_arc());
        Arc::ptr_eq(a, b) || **a == **b
    }
}

impl Eq for Topic {}

impl PartialOrd for Topic {
    fn partial_cmp(&self, other: &Topic) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Topic {
    fn cmp(&self, other: &Topic) -> Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl Default for Topic {
    fn default() -> Self {
        Topic::from("")
    }
}

impl Deref for Topic {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for Topic {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl Borrow<str> for Topic {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

// Hashes as the `str` it is, so maps keyed by `Topic` can be looked up with a `&str`
// (`Borrow<str>` requires it).
impl Hash for Topic {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_str().hash(state)
    }
}

impl fmt::Display for Topic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for Topic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl From<&str> for Topic {
    fn from(name: &str) -> Self {
        Topic(Name::Shared(Arc::from(name)))
    }
}

impl From<String> for Topic {
    fn from(name: String) -> Self {
        Topic(Name::Shared(Arc::from(name)))
    }
}

impl From<&String> for Topic {
    fn from(name: &String) -> Self {
        Topic(Name::Shared(Arc::from(name.as_str())))
    }
}

impl From<Arc<str>> for Topic {
    fn from(name: Arc<str>) -> Self {
        Topic(Name::Shared(name))
    }
}

impl From<&Arc<str>> for Topic {
    fn from(name: &Arc<str>) -> Self {
        Topic(Name::Shared(Arc::clone(name)))
    }
}

impl From<&Topic> for Topic {
    fn from(name: &Topic) -> Self {
        name.clone()
    }
}

impl From<Topic> for String {
    fn from(name: Topic) -> Self {
        name.as_str().to_owned()
    }
}

impl From<Topic> for Arc<str> {
    fn from(name: Topic) -> Self {
        match name.0 {
            Name::Shared(name) => name,
            Name::Interned(name) => Arc::clone(name),
        }
    }
}

impl PartialEq<str> for Topic {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Topic {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<String> for Topic {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == other.as_str()
    }
}

impl PartialEq<Topic> for str {
    fn eq(&self, other: &Topic) -> bool {
        self == other.as_str()
    }
}

impl PartialEq<Topic> for &str {
    fn eq(&self, other: &Topic) -> bool {
        *self == other.as_str()
    }
}

impl PartialEq<Topic> for String {
    fn eq(&self, other: &Topic) -> bool {
        self.as_str() == other.as_str()
    }
}

impl PartialOrd<str> for Topic {
    fn partial_cmp(&self, other: &str) -> Option<Ordering> {
        self.as_str().partial_cmp(other)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn a_topic_reads_compares_and_prints_as_its_name() {
        let topic = Topic::from("orders");
        assert_eq!(topic, "orders");
        assert_eq!("orders".to_owned(), topic);
        assert_eq!(topic.len(), 6);
        assert_eq!(format!("{topic} {topic:?}"), "orders \"orders\"");
        assert_eq!(String::from(topic.clone()), "orders");
    }

    #[test]
    fn clones_share_one_name() {
        let topic = Topic::from("orders".to_owned());
        let copy = topic.clone();
        assert!(Arc::ptr_eq(topic.as_arc(), copy.as_arc()));
    }

    #[test]
    fn interned_names_are_kept_once_and_equal_shared_ones() {
        let a = Topic::interned("interned-orders");
        let b = Topic::interned("interned-orders");
        assert!(a.is_interned());
        assert_eq!(a.as_static(), Some("interned-orders"));
        assert_eq!(Topic::from("x").as_static(), None);
        assert!(Arc::ptr_eq(a.as_arc(), b.as_arc()), "one name, kept once");
        let shared = Topic::from("interned-orders");
        assert!(!shared.is_interned());
        assert_eq!(a, shared);
        assert_eq!(a.cmp(&shared), Ordering::Equal);
        assert!(Topic::interned("a-interned") < shared);
        let map: HashMap<Topic, i32> = [(shared, 1)].into_iter().collect();
        assert_eq!(map.get(&a), Some(&1));
        assert_eq!(String::from(a.clone()), "interned-orders");
        assert_eq!(&*Arc::<str>::from(a), "interned-orders");
    }

    #[test]
    fn past_the_bound_names_are_shared_by_counting() {
        let mut table = HashMap::new();
        let first = intern(&mut table, 2, "bound-1");
        assert!(intern(&mut table, 2, "bound-2").is_interned());
        let third = intern(&mut table, 2, "bound-3");
        assert!(!third.is_interned(), "the table is full");
        assert_eq!(third, "bound-3");
        assert_eq!(table.len(), 2);
        // A kept name is still found.
        assert!(Arc::ptr_eq(
            intern(&mut table, 2, "bound-1").as_arc(),
            first.as_arc()
        ));
    }

    #[test]
    fn a_map_keyed_by_topic_is_found_by_str() {
        let map: HashMap<Topic, i32> = [(Topic::from("a"), 1)].into_iter().collect();
        assert_eq!(map.get("a"), Some(&1));
    }
}
