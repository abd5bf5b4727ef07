//! Connector configurations written as JSON, as Connect's REST API and standalone mode accept
//! them: `{"name": "...", "config": {...}}`, or the flat `{...}` of the config alone.

use serde_json::Value as Json;

use crate::config::ConfigMap;
use crate::error::ConfigError;

/// The configuration text of one JSON value: scalars as written, arrays comma-separated (how
/// configs hold lists), `null` as absent. Nested objects are refused naming the key.
pub fn config_value_from_json(key: &str, value: &Json) -> Result<Option<String>, ConfigError> {
    let scalar = |v: &Json| match v {
        Json::String(s) => Some(s.clone()),
        Json::Number(n) => Some(n.to_string()),
        Json::Bool(b) => Some(b.to_string()),
        _ => None,
    };
    match value {
        Json::Null => Ok(None),
        // Lists may be written as JSON arrays; configs hold them comma-separated.
        Json::Array(items) => items
            .iter()
            .map(|item| {
                scalar(item).ok_or_else(|| ConfigError::InvalidValue {
                    key: key.to_owned(),
                    value: value.to_string(),
                    reason: "list items must be strings, numbers or booleans".into(),
                })
            })
            .collect::<Result<Vec<_>, _>>()
            .map(|items| Some(items.join(","))),
        other => scalar(other).map(Some).ok_or_else(|| ConfigError::InvalidValue {
            key: key.to_owned(),
            value: other.to_string(),
            reason: "expected a string, number, boolean or list; nested objects are not configuration values".into(),
        }),
    }
}

/// Reads a JSON connector configuration; a top-level `name` fills in `config.name` when the
/// config lacks one. Null values are left out (the key's default applies).
pub fn config_map_from_json(text: &str) -> Result<ConfigMap, ConfigError> {
    let json: Json = serde_json::from_str(text).map_err(|e| ConfigError::Syntax {
        line: e.line(),
        message: format!("not valid JSON: {e}"),
    })?;
    let Json::Object(top) = &json else {
        return Err(ConfigError::Conflict(format!(
            "a JSON connector configuration must be an object, found {json}"
        )));
    };
    let (body, name) = match top.get("config") {
        Some(Json::Object(config)) => (config, top.get("name")),
        Some(other) => {
            return Err(ConfigError::Conflict(format!(
                "\"config\" must be an object of settings, found {other}"
            )))
        }
        None => (top, None),
    };
    let mut map = ConfigMap::new();
    for (key, value) in body {
        if let Some(text) = config_value_from_json(key, value)? {
            map.insert(key.clone(), text);
        }
    }
    if let Some(name) = name {
        if let (false, Some(text)) = (
            map.contains_key("name"),
            config_value_from_json("name", name)?,
        ) {
            map.insert("name".into(), text);
        }
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rest_shape_with_name_and_config_is_read() {
        let map = config_map_from_json(
            r#"{"name": "files", "config": {"connector.class": "file", "tasks.max": 3, "topics": ["a", "b"], "errors.log.enable": true, "x": null}}"#,
        )
        .expect("valid");
        assert_eq!(map["name"], "files");
        assert_eq!(map["tasks.max"], "3");
        assert_eq!(map["topics"], "a,b");
        assert_eq!(map["errors.log.enable"], "true");
        assert!(!map.contains_key("x"));
    }

    #[test]
    fn a_flat_object_is_the_config_itself() {
        let map = config_map_from_json(r#"{"name": "n", "topics": "t"}"#).expect("valid");
        assert_eq!(map.len(), 2);
    }

    #[test]
    fn nested_objects_are_refused_naming_the_key() {
        let err =
            config_map_from_json(r#"{"config": {"transforms": {"a": 1}}}"#).expect_err("nested");
        assert_eq!(
            err.to_string(),
            "invalid value '{\"a\":1}' for transforms: expected a string, number, boolean or list; nested objects are not configuration values"
        );
    }

    #[test]
    fn malformed_json_reports_its_line() {
        let err = config_map_from_json("{\n\"a\": 1,\n}").expect_err("trailing comma");
        assert!(
            err.to_string().starts_with("line 3: not valid JSON"),
            "{err}"
        );
    }
}
