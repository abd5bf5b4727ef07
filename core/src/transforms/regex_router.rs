//! `RegexRouter`: renames the topic when the whole name matches `regex`, using `replacement`
//! with Java's `$1` group references (as Connect configs are written).

use regex::Regex;

use crate::config::{ConfigDef, ConfigKey, ConfigMap, ConfigType, Importance, Validator};
use crate::error::{ConfigError, TransformError};
use crate::record::SinkRecord;
use crate::transforms::Transformation;

const REGEX: &str = "regex";
const REPLACEMENT: &str = "replacement";

/// Rewrites a Java replacement (`$1`, `${name}`, `\$`) in the `regex` crate's syntax, where a
/// bare `$1a` would name a group called `1a`.
pub fn java_replacement(java: &str) -> String {
    let mut out = String::with_capacity(java.len() + 4);
    let mut chars = java.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('$') => out.push_str("$$"),
                Some(other) => out.push(other),
                None => {}
            },
            '$' if chars.peek().is_some_and(char::is_ascii_digit) => {
                out.push_str("${");
                while let Some(d) = chars.next_if(char::is_ascii_digit) {
                    out.push(d);
                }
                out.push('}');
            }
            other => out.push(other),
        }
    }
    out
}

#[derive(Debug, Clone)]
pub struct RegexRouter {
    /// The user's regex anchored at both ends: Connect requires the whole topic to match.
    regex: Regex,
    replacement: String,
}

impl RegexRouter {
    pub fn config_def() -> ConfigDef {
        ConfigDef::new()
            .define(
                ConfigKey::new(
                    REGEX,
                    ConfigType::String,
                    Importance::High,
                    "Regular expression that must match the whole topic name.",
                )
                .validator(Validator::Regex),
            )
            .define(ConfigKey::new(
                REPLACEMENT,
                ConfigType::String,
                Importance::High,
                "Replacement, with $1 style group references.",
            ))
    }

    pub fn configure(settings: &ConfigMap, prefix: &str) -> Result<Self, ConfigError> {
        let parsed = RegexRouter::config_def().parse_prefixed(settings, prefix)?;
        let pattern = parsed.string(REGEX)?.unwrap_or_default();
        let regex =
            Regex::new(&format!("^(?:{pattern})$")).map_err(|e| ConfigError::InvalidValue {
                key: parsed.full_key(REGEX),
                value: pattern.to_owned(),
                reason: format!("not a valid regular expression ({e})"),
            })?;
        Ok(RegexRouter {
            regex,
            replacement: java_replacement(parsed.string(REPLACEMENT)?.unwrap_or_default()),
        })
    }
}

impl Transformation for RegexRouter {
    fn apply(&self, mut record: SinkRecord) -> Result<Option<SinkRecord>, TransformError> {
        if self.regex.is_match(&record.topic) {
            record.topic = self
                .regex
                .replace(&record.topic, self.replacement.as_str())
                .into_owned()
                .into();
        }
        Ok(Some(record))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Value;
    use crate::transforms::testkit::config;

    fn route(regex: &str, replacement: &str, topic: &str) -> String {
        let t = RegexRouter::configure(
            &config(&[("regex", regex), ("replacement", replacement)]),
            "",
        )
        .expect("valid");
        t.apply(SinkRecord::new(topic, 0, 0, Value::Null))
            .expect("routes")
            .expect("kept")
            .topic
            .to_string()
    }

    #[test]
    fn matching_topics_are_renamed_with_group_references() {
        assert_eq!(route("(.*)-(\\d+)", "$1_v$2", "orders-7"), "orders_v7");
        assert_eq!(route("prod\\.(.*)", "$1x", "prod.a"), "ax");
    }

    #[test]
    fn topics_that_match_only_in_part_are_left_alone() {
        assert_eq!(route("orders", "x", "orders-eu"), "orders-eu");
    }

    #[test]
    fn java_escapes_translate_to_the_regex_crates_syntax() {
        assert_eq!(java_replacement("$1-\\$-${name}"), "${1}-$$-${name}");
    }

    #[test]
    fn an_invalid_regex_is_refused_naming_the_key() {
        let err = RegexRouter::configure(
            &config(&[("regex", "(unclosed"), ("replacement", "x")]),
            "transforms.r.",
        )
        .expect_err("bad regex");
        assert!(err.to_string().starts_with(
            "invalid value '(unclosed' for transforms.r.regex: not a valid regular expression"
        ));
    }
}
