//! The answer to "is this configuration valid?", shaped like Kafka Connect's REST
//! `ConfigInfos` so existing tooling can read it: per key, its definition and the value seen
//! with the errors found.

use serde::Serialize;

use crate::config::def::{ConfigKey, DefaultValue};

/// The whole validation answer for one connector configuration.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ValidationReport {
    /// The connector class validated.
    pub name: String,
    pub error_count: usize,
    pub groups: Vec<String>,
    pub configs: Vec<ConfigInfo>,
}

impl ValidationReport {
    pub fn new(name: impl Into<String>, configs: Vec<ConfigInfo>) -> Self {
        let mut groups: Vec<String> = Vec::new();
        for config in &configs {
            if let Some(group) = &config.definition.group {
                if !groups.contains(group) {
                    groups.push(group.clone());
                }
            }
        }
        let mut report = ValidationReport {
            name: name.into(),
            error_count: 0,
            groups,
            configs,
        };
        report.recount();
        report
    }

    /// Adds an error found by a check across keys to the entry of `key`.
    ///
    /// Returns false when no entry has that name, so the caller can report it elsewhere.
    pub fn add_error(&mut self, key: &str, message: impl Into<String>) -> bool {
        let found = match self.configs.iter_mut().find(|c| c.value.name == key) {
            Some(entry) => {
                entry.value.errors.push(message.into());
                true
            }
            None => false,
        };
        self.recount();
        found
    }

    /// Every error, as `key: message`.
    pub fn errors(&self) -> Vec<String> {
        self.configs
            .iter()
            .flat_map(|c| {
                c.value
                    .errors
                    .iter()
                    .map(move |e| format!("{}: {e}", c.value.name))
            })
            .collect()
    }

    pub fn is_valid(&self) -> bool {
        self.error_count == 0
    }

    fn recount(&mut self) {
        self.error_count = self.configs.iter().map(|c| c.value.errors.len()).sum();
    }
}

/// One key's definition and value.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConfigInfo {
    pub definition: KeyInfo,
    pub value: ValueInfo,
}

/// A key's declaration as the REST API shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KeyInfo {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub required: bool,
    pub default_value: Option<String>,
    pub importance: String,
    pub documentation: String,
    pub group: Option<String>,
    pub order: i32,
    pub width: String,
    pub display_name: String,
    pub dependents: Vec<String>,
}

impl KeyInfo {
    pub(crate) fn from_key(key: &ConfigKey, prefix: &str) -> Self {
        KeyInfo {
            name: format!("{prefix}{}", key.name),
            kind: key.kind.name().to_owned(),
            required: key.default == DefaultValue::Required,
            default_value: match &key.default {
                DefaultValue::Value(v) => Some(v.clone()),
                _ => None,
            },
            importance: key.importance.name().to_owned(),
            documentation: key.doc.clone(),
            group: key.group.clone(),
            order: key.order,
            width: "NONE".to_owned(),
            display_name: key.display_name.clone(),
            dependents: Vec::new(),
        }
    }
}

/// The value seen for a key and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ValueInfo {
    pub name: String,
    pub value: Option<String>,
    pub recommended_values: Vec<String>,
    pub errors: Vec<String>,
    pub visible: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::def::{ConfigDef, ConfigType, Importance};
    use crate::config::ConfigMap;

    #[test]
    fn report_serializes_in_connects_rest_shape() {
        let def = ConfigDef::new().define(
            ConfigKey::new("topics", ConfigType::List, Importance::High, "Topics.")
                .default("")
                .group("Common", 1),
        );
        let mut report = ValidationReport::new("file", def.validate(&ConfigMap::new()));
        assert!(report.is_valid());
        assert!(report.add_error("topics", "must configure one of topics or topics.regex"));
        assert!(!report.add_error("nope", "x"));
        let json = serde_json::to_value(&report).expect("plain data serializes");
        assert_eq!(json["error_count"], 1);
        assert_eq!(json["groups"][0], "Common");
        assert_eq!(json["configs"][0]["definition"]["type"], "LIST");
        assert_eq!(json["configs"][0]["value"]["name"], "topics");
        assert_eq!(
            report.errors(),
            vec!["topics: must configure one of topics or topics.regex"]
        );
    }
}
