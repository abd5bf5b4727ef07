//! [`Topic`]: a topic name shared by every record read from that topic.
//!
//! A record carries its topic through every stage (raw record, sink record, its coordinates,
//! its verdict, its acknowledgement); as a `String` that was one allocation and copy per record
//! per stage. A `Topic` is a reference-counted name: cloning it for a record costs a counter
//! increment. It reads as a `&str` (`Deref`), compares with strings, and converts from and to
//! `String`, so code that names topics as text keeps working.

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;
use std::sync::Arc;

/// A topic name, shared (see the module's documentation).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Topic(Arc<str>);

impl Topic {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The shared name, for maps keyed by `Arc<str>`.
    pub fn as_arc(&self) -> &Arc<str> {
        &self.0
    }
}

impl Default for Topic {
    fn default() -> Self {
        Topic(Arc::from(""))
    }
}

impl Deref for Topic {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for Topic {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for Topic {
    fn borrow(&self) -> &str {
        &self.0
    }
}

// Hashes as the `str` it is, so maps keyed by `Topic` can be looked up with a `&str`
// (`Borrow<str>` requires it).
impl Hash for Topic {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (*self.0).hash(state)
    }
}

impl fmt::Display for Topic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Topic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl From<&str> for Topic {
    fn from(name: &str) -> Self {
        Topic(Arc::from(name))
    }
}

impl From<String> for Topic {
    fn from(name: String) -> Self {
        Topic(Arc::from(name))
    }
}

impl From<&String> for Topic {
    fn from(name: &String) -> Self {
        Topic(Arc::from(name.as_str()))
    }
}

impl From<Arc<str>> for Topic {
    fn from(name: Arc<str>) -> Self {
        Topic(name)
    }
}

impl From<&Arc<str>> for Topic {
    fn from(name: &Arc<str>) -> Self {
        Topic(Arc::clone(name))
    }
}

impl From<&Topic> for Topic {
    fn from(name: &Topic) -> Self {
        name.clone()
    }
}

impl From<Topic> for String {
    fn from(name: Topic) -> Self {
        name.0.to_string()
    }
}

impl From<Topic> for Arc<str> {
    fn from(name: Topic) -> Self {
        name.0
    }
}

impl PartialEq<str> for Topic {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for Topic {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

impl PartialEq<String> for Topic {
    fn eq(&self, other: &String) -> bool {
        &*self.0 == other.as_str()
    }
}

impl PartialEq<Topic> for str {
    fn eq(&self, other: &Topic) -> bool {
        self == &*other.0
    }
}

impl PartialEq<Topic> for &str {
    fn eq(&self, other: &Topic) -> bool {
        *self == &*other.0
    }
}

impl PartialEq<Topic> for String {
    fn eq(&self, other: &Topic) -> bool {
        self.as_str() == &*other.0
    }
}

impl PartialOrd<str> for Topic {
    fn partial_cmp(&self, other: &str) -> Option<Ordering> {
        (*self.0).partial_cmp(other)
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
    fn a_map_keyed_by_topic_is_found_by_str() {
        let map: HashMap<Topic, i32> = [(Topic::from("a"), 1)].into_iter().collect();
        assert_eq!(map.get("a"), Some(&1));
    }
}
