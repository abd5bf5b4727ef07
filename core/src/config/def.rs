//! Configuration declared once: [`ConfigDef`] holds each key's name, type, default, importance,
//! documentation, validator and group, and everything else derives from it — parsing with
//! messages that name the key, the bad value and what is allowed; the REST `validate` result;
//! the reference docs. This is Kafka Connect's `ConfigDef` idea.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use crate::config::report::{ConfigInfo, KeyInfo, ValueInfo};
use crate::config::value::{ConfigValue, ParsedConfig};
use crate::config::ConfigMap;
use crate::error::ConfigError;

/// The type a key's text is parsed as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigType {
    String,
    Int,
    Long,
    Double,
    Boolean,
    /// Comma-separated values.
    List,
    /// A secret: masked in messages, reports and docs.
    Password,
    /// A plugin name: a short alias or a Connect class name.
    Class,
}

impl ConfigType {
    /// Connect's upper-case name, as the REST API reports it.
    pub fn name(self) -> &'static str {
        match self {
            ConfigType::String => "STRING",
            ConfigType::Int => "INT",
            ConfigType::Long => "LONG",
            ConfigType::Double => "DOUBLE",
            ConfigType::Boolean => "BOOLEAN",
            ConfigType::List => "LIST",
            ConfigType::Password => "PASSWORD",
            ConfigType::Class => "CLASS",
        }
    }

    /// What a value of this type looks like, for messages.
    pub fn describe(self) -> &'static str {
        match self {
            ConfigType::String => "a string",
            ConfigType::Int => "an int (32-bit integer)",
            ConfigType::Long => "a long (64-bit integer)",
            ConfigType::Double => "a double (decimal number)",
            ConfigType::Boolean => "a boolean (true or false)",
            ConfigType::List => "a comma-separated list",
            ConfigType::Password => "a password",
            ConfigType::Class => "a class name or alias",
        }
    }
}

/// How much a user should care about a key (Connect's importance).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Importance {
    High,
    Medium,
    Low,
}

impl Importance {
    pub fn name(self) -> &'static str {
        match self {
            Importance::High => "HIGH",
            Importance::Medium => "MEDIUM",
            Importance::Low => "LOW",
        }
    }
}

/// A check on a parsed value; each variant knows how to describe what it allows.
#[derive(Debug, Clone)]
pub enum Validator {
    /// An int or long no smaller than this.
    AtLeast(i64),
    /// An int or long within these bounds (inclusive).
    Between(i64, i64),
    /// One of these strings, compared ignoring ASCII case.
    OneOf(&'static [&'static str]),
    /// A string with at least one non-space character.
    NonEmptyString,
    /// A list with at least one item.
    NonEmptyList,
    /// A list without repeated or empty items (aliases).
    UniqueList,
    /// A string that compiles as a regular expression (or is empty).
    Regex,
    /// Any other rule: the function returns the reason a value is refused.
    Custom {
        check: fn(&ConfigValue) -> Result<(), String>,
        allowed: &'static str,
    },
}

impl Validator {
    /// Returns the reason `value` is not allowed.
    pub fn check(&self, value: &ConfigValue) -> Result<(), String> {
        match self {
            Validator::AtLeast(min) => match value.as_i64() {
                Some(v) if v >= *min => Ok(()),
                _ => Err(format!("must be at least {min}")),
            },
            Validator::Between(min, max) => match value.as_i64() {
                Some(v) if (*min..=*max).contains(&v) => Ok(()),
                _ => Err(format!("must be between {min} and {max}")),
            },
            Validator::OneOf(allowed) => match value {
                ConfigValue::String(s) if allowed.iter().any(|a| a.eq_ignore_ascii_case(s)) => {
                    Ok(())
                }
                _ => Err(format!("expected one of {}", allowed.join(", "))),
            },
            Validator::NonEmptyString => match value {
                ConfigValue::String(s) if !s.trim().is_empty() => Ok(()),
                _ => Err("must not be empty".into()),
            },
            Validator::NonEmptyList => match value {
                ConfigValue::List(items) if !items.is_empty() => Ok(()),
                _ => Err("must list at least one item".into()),
            },
            Validator::UniqueList => match value {
                ConfigValue::List(items) => {
                    let mut seen = BTreeSet::new();
                    for item in items {
                        if item.is_empty() {
                            return Err("contains an empty item".into());
                        }
                        if !seen.insert(item) {
                            return Err(format!("lists '{item}' more than once"));
                        }
                    }
                    Ok(())
                }
                _ => Err("expected a list".into()),
            },
            Validator::Regex => match value {
                ConfigValue::String(s) => regex::Regex::new(s)
                    .map(|_| ())
                    .map_err(|e| format!("not a valid regular expression ({e})")),
                _ => Err("expected a regular expression".into()),
            },
            Validator::Custom { check, .. } => check(value),
        }
    }

    /// What the validator allows, for docs.
    pub fn describe(&self) -> String {
        match self {
            Validator::AtLeast(min) => format!("[{min},...]"),
            Validator::Between(min, max) => format!("[{min},...,{max}]"),
            Validator::OneOf(allowed) => format!("[{}]", allowed.join(", ")),
            Validator::NonEmptyString => "non-empty string".into(),
            Validator::NonEmptyList => "non-empty list".into(),
            Validator::UniqueList => "list of unique names".into(),
            Validator::Regex => "regular expression".into(),
            Validator::Custom { allowed, .. } => (*allowed).into(),
        }
    }

    /// Values a UI can offer (Connect's `recommended_values`).
    fn recommended(&self) -> Vec<String> {
        match self {
            Validator::OneOf(allowed) => allowed.iter().map(|s| (*s).to_owned()).collect(),
            _ => Vec::new(),
        }
    }
}

/// Whether a key must be set, may be null, or has a default value.
#[derive(Debug, Clone, PartialEq)]
pub enum DefaultValue {
    /// No default: the key must be set.
    Required,
    /// Optional with no value.
    Null,
    /// This text, parsed like a user's value.
    Value(String),
}

/// Reads the `(host, port)` pairs a value connects to, or says why it cannot.
pub type HostsOf = fn(&str) -> Result<Vec<(String, u16)>, String>;

/// What a key's value reaches outside the worker. The runtime polices these keys for tenants:
/// paths are confined to the tenant's directory, addresses to the worker's egress policy,
/// and keys naming a Kafka cluster need the tenant's override policy `All`.
#[derive(Debug, Clone, Copy)]
pub enum Reach {
    /// A file or directory the connector writes.
    FilePath,
    /// Hosts the connector connects to: the function reads `(host, port)` pairs from the
    /// value, or says why it cannot.
    Hosts(HostsOf),
    /// The bootstrap servers of a Kafka cluster the connector writes to (`host:port,...`).
    KafkaCluster,
}

/// One declared configuration key.
#[derive(Debug, Clone)]
pub struct ConfigKey {
    pub name: String,
    pub kind: ConfigType,
    pub default: DefaultValue,
    pub importance: Importance,
    pub doc: String,
    pub validator: Option<Validator>,
    pub group: Option<String>,
    /// Position within the group (Connect's `orderInGroup`).
    pub order: i32,
    pub display_name: String,
    /// What the value reaches outside the worker, when it does.
    pub reach: Option<Reach>,
}

impl ConfigKey {
    /// A required key; chain [`default`](Self::default) or [`null_default`](Self::null_default)
    /// to make it optional.
    pub fn new(
        name: impl Into<String>,
        kind: ConfigType,
        importance: Importance,
        doc: impl Into<String>,
    ) -> Self {
        let name = name.into();
        ConfigKey {
            display_name: name.clone(),
            name,
            kind,
            default: DefaultValue::Required,
            importance,
            doc: doc.into(),
            validator: None,
            group: None,
            order: 0,
            reach: None,
        }
    }

    /// Declares what the value reaches outside the worker (see [`Reach`]).
    pub fn reaches(mut self, reach: Reach) -> Self {
        self.reach = Some(reach);
        self
    }

    pub fn default(mut self, text: impl Into<String>) -> Self {
        self.default = DefaultValue::Value(text.into());
        self
    }

    pub fn null_default(mut self) -> Self {
        self.default = DefaultValue::Null;
        self
    }

    pub fn validator(mut self, validator: Validator) -> Self {
        self.validator = Some(validator);
        self
    }

    pub fn group(mut self, group: impl Into<String>, order: i32) -> Self {
        self.group = Some(group.into());
        self.order = order;
        self
    }

    pub fn display_name(mut self, name: impl Into<String>) -> Self {
        self.display_name = name.into();
        self
    }

    /// Parses and checks `text` (or the default when `None`); `prefix` goes before the key name
    /// in messages.
    fn resolve(
        &self,
        text: Option<&str>,
        prefix: &str,
    ) -> Result<Option<ConfigValue>, ConfigError> {
        let key = format!("{prefix}{}", self.name);
        let text = match (text, &self.default) {
            (Some(text), _) => text,
            (None, DefaultValue::Value(text)) => text.as_str(),
            (None, DefaultValue::Null) => return Ok(None),
            (None, DefaultValue::Required) => return Err(ConfigError::Missing { key }),
        };
        let shown = if self.kind == ConfigType::Password {
            "[hidden]".to_owned()
        } else {
            text.to_owned()
        };
        let invalid = |reason: String| ConfigError::InvalidValue {
            key: key.clone(),
            value: shown.clone(),
            reason,
        };
        let value = ConfigValue::parse(self.kind, text).map_err(invalid)?;
        if let Some(validator) = &self.validator {
            validator.check(&value).map_err(invalid)?;
        }
        Ok(Some(value))
    }
}

/// The declared keys of one component (a connector, a converter, a transform).
#[derive(Debug, Clone, Default)]
pub struct ConfigDef {
    keys: Vec<ConfigKey>,
}

impl ConfigDef {
    pub fn new() -> Self {
        ConfigDef::default()
    }

    /// Adds a key. Declaring a name twice is a programming error and panics, as in Connect:
    /// two declarations would disagree about the key's type or default.
    pub fn define(mut self, key: ConfigKey) -> Self {
        assert!(
            self.key(&key.name).is_none(),
            "configuration key '{}' is declared twice",
            key.name
        );
        self.keys.push(key);
        self
    }

    /// Adds every key of `other` (e.g. the transform keys every SMT shares).
    pub fn merge(mut self, other: ConfigDef) -> Self {
        for key in other.keys {
            self = self.define(key);
        }
        self
    }

    pub fn keys(&self) -> &[ConfigKey] {
        &self.keys
    }

    pub fn key(&self, name: &str) -> Option<&ConfigKey> {
        self.keys.iter().find(|k| k.name == name)
    }

    /// Parses `props`, reporting every bad key at once. Keys not declared are ignored.
    pub fn parse(&self, props: &ConfigMap) -> Result<ParsedConfig, ConfigError> {
        self.parse_prefixed(props, "")
    }

    /// Like [`parse`](Self::parse) for settings whose keys had `prefix` removed
    /// (`transforms.ts.`), so that messages name the key as the user wrote it.
    pub fn parse_prefixed(
        &self,
        props: &ConfigMap,
        prefix: &str,
    ) -> Result<ParsedConfig, ConfigError> {
        let mut values = BTreeMap::new();
        let mut errors = Vec::new();
        for key in &self.keys {
            match key.resolve(props.get(&key.name).map(String::as_str), prefix) {
                Ok(value) => {
                    values.insert(key.name.clone(), (key.kind, value));
                }
                Err(e) => errors.push(e),
            }
        }
        match ConfigError::from_list(errors) {
            Some(e) => Err(e),
            None => Ok(ParsedConfig::new(values, prefix)),
        }
    }

    /// One entry per declared key, with its definition, the value seen and its errors: the
    /// material of Connect's `PUT /connector-plugins/{type}/config/validate` answer.
    pub fn validate(&self, props: &ConfigMap) -> Vec<ConfigInfo> {
        self.validate_prefixed(props, "")
    }

    /// [`validate`](Self::validate) for keys that had `prefix` removed.
    pub fn validate_prefixed(&self, props: &ConfigMap, prefix: &str) -> Vec<ConfigInfo> {
        self.keys
            .iter()
            .map(|key| {
                let raw = props.get(&key.name);
                let errors = match key.resolve(raw.map(String::as_str), prefix) {
                    Ok(_) => Vec::new(),
                    Err(e) => vec![e.to_string()],
                };
                let value = match (raw, key.kind) {
                    (Some(_), ConfigType::Password) => Some("[hidden]".to_owned()),
                    (Some(text), _) => Some(text.clone()),
                    (None, _) => match &key.default {
                        DefaultValue::Value(text) if key.kind != ConfigType::Password => {
                            Some(text.clone())
                        }
                        _ => None,
                    },
                };
                ConfigInfo {
                    definition: KeyInfo::from_key(key, prefix),
                    value: ValueInfo {
                        name: format!("{prefix}{}", key.name),
                        value,
                        recommended_values: key
                            .validator
                            .as_ref()
                            .map(Validator::recommended)
                            .unwrap_or_default(),
                        errors,
                        visible: true,
                    },
                }
            })
            .collect()
    }

    /// Reference documentation in Markdown, grouped as declared.
    pub fn to_markdown(&self) -> String {
        let mut groups: Vec<Option<&str>> = Vec::new();
        for key in &self.keys {
            let group = key.group.as_deref();
            if !groups.contains(&group) {
                groups.push(group);
            }
        }
        let mut out = String::new();
        for group in groups {
            if let Some(name) = group {
                let _ = writeln!(out, "### {name}\n");
            }
            let mut keys: Vec<&ConfigKey> = self
                .keys
                .iter()
                .filter(|k| k.group.as_deref() == group)
                .collect();
            keys.sort_by_key(|k| k.order);
            for key in keys {
                let _ = writeln!(out, "#### `{}`\n\n{}\n", key.name, key.doc);
                let _ = writeln!(out, "- Type: {}", key.kind.name().to_lowercase());
                let default = match &key.default {
                    DefaultValue::Required => "none (required)".to_owned(),
                    DefaultValue::Null => "null".to_owned(),
                    DefaultValue::Value(v) if v.is_empty() => "\"\"".to_owned(),
                    DefaultValue::Value(v) => format!("`{v}`"),
                };
                let _ = writeln!(out, "- Default: {default}");
                if let Some(validator) = &key.validator {
                    let _ = writeln!(out, "- Valid values: {}", validator.describe());
                }
                let _ = writeln!(
                    out,
                    "- Importance: {}\n",
                    key.importance.name().to_lowercase()
                );
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn def() -> ConfigDef {
        ConfigDef::new()
            .define(
                ConfigKey::new("tasks.max", ConfigType::Int, Importance::High, "Tasks.")
                    .default("1")
                    .validator(Validator::AtLeast(1))
                    .group("Common", 1),
            )
            .define(
                ConfigKey::new("mode", ConfigType::String, Importance::Low, "Mode.")
                    .default("none")
                    .validator(Validator::OneOf(&["none", "all"]))
                    .group("Common", 2),
            )
            .define(ConfigKey::new(
                "name",
                ConfigType::String,
                Importance::High,
                "Name.",
            ))
            .define(
                ConfigKey::new("secret", ConfigType::Password, Importance::Low, "Secret.")
                    .null_default()
                    .validator(Validator::Custom {
                        check: |v| match v {
                            ConfigValue::Password(p) if p.expose().len() >= 8 => Ok(()),
                            _ => Err("must have at least 8 characters".into()),
                        },
                        allowed: "at least 8 characters",
                    }),
            )
    }

    fn props(pairs: &[(&str, &str)]) -> ConfigMap {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn defaults_fill_keys_that_are_not_set() {
        let parsed = def().parse(&props(&[("name", "n")])).expect("valid");
        assert_eq!(parsed.int("tasks.max"), Ok(1));
        assert_eq!(parsed.string("mode"), Ok(Some("none")));
        assert_eq!(parsed.password("secret"), Ok(None));
    }

    #[test]
    fn every_bad_key_is_reported_with_its_value_and_what_is_allowed() {
        let err = def()
            .parse(&props(&[("tasks.max", "0"), ("mode", "some")]))
            .expect_err("three problems");
        let messages: Vec<String> = err.flatten().iter().map(|e| e.to_string()).collect();
        assert_eq!(
            messages,
            vec![
                "invalid value '0' for tasks.max: must be at least 1",
                "invalid value 'some' for mode: expected one of none, all",
                "missing required configuration 'name', which has no default value",
            ]
        );
    }

    #[test]
    fn wrong_types_say_which_type_was_expected() {
        let err = def()
            .parse(&props(&[("name", "n"), ("tasks.max", "many")]))
            .expect_err("not a number");
        assert_eq!(
            err.to_string(),
            "invalid value 'many' for tasks.max: not a number; expected an int (32-bit integer)"
        );
    }

    #[test]
    fn password_values_are_masked_in_messages_and_reports() {
        let bad = props(&[("name", "n"), ("secret", "short")]);
        let err = def().parse(&bad).expect_err("too short");
        assert_eq!(
            err.to_string(),
            "invalid value '[hidden]' for secret: must have at least 8 characters"
        );
        let report = def().validate(&bad);
        let secret = report
            .iter()
            .find(|c| c.value.name == "secret")
            .expect("declared");
        assert_eq!(secret.value.value.as_deref(), Some("[hidden]"));
        assert_eq!(secret.value.errors.len(), 1);
    }

    #[test]
    fn prefixed_parsing_names_the_full_key() {
        let err = def()
            .parse_prefixed(
                &props(&[("tasks.max", "-1"), ("name", "x")]),
                "transforms.a.",
            )
            .expect_err("below minimum");
        assert_eq!(
            err.to_string(),
            "invalid value '-1' for transforms.a.tasks.max: must be at least 1"
        );
    }

    #[test]
    fn validate_reports_each_key_with_recommended_values() {
        let report = def().validate(&props(&[("mode", "ALL")]));
        assert_eq!(report.len(), 4);
        let mode = &report[1];
        assert_eq!(mode.value.recommended_values, vec!["none", "all"]);
        assert!(mode.value.errors.is_empty(), "case is ignored");
        let name = &report[2];
        assert_eq!(
            name.value.errors,
            vec!["missing required configuration 'name', which has no default value"]
        );
        assert!(name.definition.required);
    }

    #[test]
    fn docs_list_every_key_with_type_default_and_allowed_values() {
        let docs = def().to_markdown();
        assert!(docs.contains("### Common"));
        assert!(docs.contains("#### `tasks.max`"));
        assert!(docs.contains("- Valid values: [1,...]"));
        assert!(docs.contains("- Default: none (required)"));
        assert!(docs.contains("- Valid values: [none, all]"));
    }

    #[test]
    #[should_panic(expected = "declared twice")]
    fn declaring_a_key_twice_is_refused() {
        let _ = def().define(ConfigKey::new(
            "name",
            ConfigType::String,
            Importance::High,
            "again",
        ));
    }
}
