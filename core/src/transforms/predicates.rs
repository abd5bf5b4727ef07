//! Predicates that decide whether a transform applies to a record: `TopicNameMatches`
//! (the whole topic matches `pattern`), `HasHeaderKey` (a header called `name` exists) and
//! `RecordIsTombstone` (the value is null).

use std::fmt;

use regex::Regex;

use crate::config::{ConfigDef, ConfigKey, ConfigMap, ConfigType, Importance, Validator};
use crate::error::ConfigError;
use crate::record::SinkRecord;

/// A yes/no question about a record.
pub trait Predicate: Send + Sync + fmt::Debug {
    fn test(&self, record: &SinkRecord) -> bool;
}

#[derive(Debug, Clone)]
pub struct TopicNameMatches {
    /// Anchored at both ends: the whole topic name must match, as in Connect.
    pattern: Regex,
}

impl TopicNameMatches {
    pub fn config_def() -> ConfigDef {
        ConfigDef::new().define(
            ConfigKey::new(
                "pattern",
                ConfigType::String,
                Importance::Medium,
                "Regular expression the whole topic name must match.",
            )
            .validator(Validator::Regex),
        )
    }

    pub fn configure(settings: &ConfigMap, prefix: &str) -> Result<Self, ConfigError> {
        let parsed = TopicNameMatches::config_def().parse_prefixed(settings, prefix)?;
        let text = parsed.string("pattern")?.unwrap_or_default();
        let pattern =
            Regex::new(&format!("^(?:{text})$")).map_err(|e| ConfigError::InvalidValue {
                key: parsed.full_key("pattern"),
                value: text.to_owned(),
                reason: format!("not a valid regular expression ({e})"),
            })?;
        Ok(TopicNameMatches { pattern })
    }
}

impl Predicate for TopicNameMatches {
    fn test(&self, record: &SinkRecord) -> bool {
        self.pattern.is_match(&record.topic)
    }
}

#[derive(Debug, Clone)]
pub struct HasHeaderKey {
    name: String,
}

impl HasHeaderKey {
    pub fn config_def() -> ConfigDef {
        ConfigDef::new().define(
            ConfigKey::new(
                "name",
                ConfigType::String,
                Importance::Medium,
                "Header key to look for.",
            )
            .validator(Validator::NonEmptyString),
        )
    }

    pub fn configure(settings: &ConfigMap, prefix: &str) -> Result<Self, ConfigError> {
        let parsed = HasHeaderKey::config_def().parse_prefixed(settings, prefix)?;
        Ok(HasHeaderKey {
            name: parsed.string("name")?.unwrap_or_default().to_owned(),
        })
    }
}

impl Predicate for HasHeaderKey {
    fn test(&self, record: &SinkRecord) -> bool {
        record.header(&self.name).is_some()
    }
}

#[derive(Debug, Clone, Default)]
pub struct RecordIsTombstone;

impl RecordIsTombstone {
    pub fn config_def() -> ConfigDef {
        ConfigDef::new()
    }
}

impl Predicate for RecordIsTombstone {
    fn test(&self, record: &SinkRecord) -> bool {
        record.is_tombstone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Value;
    use crate::record::Header;
    use crate::transforms::testkit::config;

    #[test]
    fn topic_name_matches_needs_the_whole_name_to_match() {
        let p =
            TopicNameMatches::configure(&config(&[("pattern", "orders-.*")]), "").expect("valid");
        assert!(p.test(&SinkRecord::new("orders-eu", 0, 0, Value::Null)));
        assert!(!p.test(&SinkRecord::new("old-orders-eu", 0, 0, Value::Null)));
    }

    #[test]
    fn has_header_key_looks_for_the_key_whatever_its_value() {
        let p = HasHeaderKey::configure(&config(&[("name", "traceparent")]), "").expect("valid");
        let mut r = SinkRecord::new("t", 0, 0, Value::Null);
        assert!(!p.test(&r));
        r.headers
            .push(Header::new("traceparent", None, Value::Null));
        assert!(p.test(&r));
    }

    #[test]
    fn record_is_tombstone_is_true_for_null_values_only() {
        assert!(RecordIsTombstone.test(&SinkRecord::new("t", 0, 0, Value::Null)));
        assert!(!RecordIsTombstone.test(&SinkRecord::new("t", 0, 0, "x".into())));
    }

    #[test]
    fn a_missing_pattern_is_refused_naming_the_key() {
        let err =
            TopicNameMatches::configure(&ConfigMap::new(), "predicates.p.").expect_err("required");
        assert_eq!(
            err.to_string(),
            "missing required configuration 'predicates.p.pattern', which has no default value"
        );
    }
}
