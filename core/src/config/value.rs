//! Typed configuration values: what a declared key's text parses into, and the parsed set
//! that components read their settings from.

use std::collections::BTreeMap;
use std::fmt;

use crate::config::def::ConfigType;
use crate::error::ConfigError;

/// A secret (credentials, tokens). Its `Debug` and `Display` never show the text, so it
/// cannot leak through logs or error messages by accident.
#[derive(Clone, PartialEq, Eq)]
pub struct Password(String);

impl Password {
    pub fn new(secret: impl Into<String>) -> Self {
        Password(secret.into())
    }

    /// The secret itself, for the one place that must send it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[hidden]")
    }
}

impl fmt::Display for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[hidden]")
    }
}

/// A parsed value of one of the [`ConfigType`]s.
#[derive(Debug, Clone, PartialEq)]
pub enum ConfigValue {
    String(String),
    Int(i32),
    Long(i64),
    Double(f64),
    Boolean(bool),
    List(Vec<String>),
    Password(Password),
    Class(String),
}

impl ConfigValue {
    /// Parses `text` as `kind`; the error is the reason only, the caller adds key and value.
    pub fn parse(kind: ConfigType, text: &str) -> Result<ConfigValue, String> {
        let trimmed = text.trim();
        match kind {
            ConfigType::String => Ok(ConfigValue::String(trimmed.to_owned())),
            ConfigType::Password => Ok(ConfigValue::Password(Password::new(text))),
            ConfigType::Class => {
                if trimmed.is_empty() {
                    Err("expected a class name or alias, got an empty string".into())
                } else {
                    Ok(ConfigValue::Class(trimmed.to_owned()))
                }
            }
            ConfigType::Int => trimmed
                .parse()
                .map(ConfigValue::Int)
                .map_err(|_| format!("not a number; expected {}", kind.describe())),
            ConfigType::Long => trimmed
                .parse()
                .map(ConfigValue::Long)
                .map_err(|_| format!("not a number; expected {}", kind.describe())),
            ConfigType::Double => trimmed
                .parse()
                .map(ConfigValue::Double)
                .map_err(|_| format!("not a number; expected {}", kind.describe())),
            ConfigType::Boolean => {
                if trimmed.eq_ignore_ascii_case("true") {
                    Ok(ConfigValue::Boolean(true))
                } else if trimmed.eq_ignore_ascii_case("false") {
                    Ok(ConfigValue::Boolean(false))
                } else {
                    Err(format!("expected {}", kind.describe()))
                }
            }
            ConfigType::List => Ok(ConfigValue::List(parse_list(trimmed))),
        }
    }

    /// The value as config text again; passwords stay hidden.
    pub fn display_text(&self) -> String {
        match self {
            ConfigValue::String(s) | ConfigValue::Class(s) => s.clone(),
            ConfigValue::Int(v) => v.to_string(),
            ConfigValue::Long(v) => v.to_string(),
            ConfigValue::Double(v) => v.to_string(),
            ConfigValue::Boolean(v) => v.to_string(),
            ConfigValue::List(items) => items.join(","),
            ConfigValue::Password(p) => p.to_string(),
        }
    }

    /// The value as an integer, for range checks on int and long keys.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            ConfigValue::Int(v) => Some(v.into()),
            ConfigValue::Long(v) => Some(v),
            _ => None,
        }
    }
}

/// Comma-separated items, trimmed; an empty text is an empty list.
pub fn parse_list(text: &str) -> Vec<String> {
    if text.trim().is_empty() {
        return Vec::new();
    }
    text.split(',').map(|s| s.trim().to_owned()).collect()
}

/// The result of parsing a configuration against its definition: every declared key has a
/// value (`None` when it is null by default). Read it with the typed getters.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedConfig {
    values: BTreeMap<String, (ConfigType, Option<ConfigValue>)>,
    /// Prefix put before key names in messages (`transforms.ts.`).
    prefix: String,
}

impl ParsedConfig {
    pub(crate) fn new(
        values: BTreeMap<String, (ConfigType, Option<ConfigValue>)>,
        prefix: &str,
    ) -> Self {
        ParsedConfig {
            values,
            prefix: prefix.to_owned(),
        }
    }

    /// The value of `key`, `None` if it is null or not declared.
    pub fn get(&self, key: &str) -> Option<&ConfigValue> {
        self.values.get(key).and_then(|(_, v)| v.as_ref())
    }

    /// The full key name as the user wrote it (with the prefix).
    pub fn full_key(&self, key: &str) -> String {
        format!("{}{}", self.prefix, key)
    }

    fn typed(&self, key: &str, wanted: ConfigType) -> Result<Option<&ConfigValue>, ConfigError> {
        match self.values.get(key) {
            Some((declared, value)) if *declared == wanted => Ok(value.as_ref()),
            Some((declared, _)) => Err(ConfigError::Undeclared {
                key: self.full_key(key),
                wanted: wanted.name(),
                declared: declared.name(),
            }),
            None => Err(ConfigError::Undeclared {
                key: self.full_key(key),
                wanted: wanted.name(),
                declared: "nothing",
            }),
        }
    }

    fn required(&self, key: &str, wanted: ConfigType) -> Result<&ConfigValue, ConfigError> {
        self.typed(key, wanted)?
            .ok_or_else(|| ConfigError::Missing {
                key: self.full_key(key),
            })
    }

    /// A string key; `None` when null.
    pub fn string(&self, key: &str) -> Result<Option<&str>, ConfigError> {
        Ok(match self.typed(key, ConfigType::String)? {
            Some(ConfigValue::String(s)) => Some(s),
            _ => None,
        })
    }

    /// A class key; `None` when null.
    pub fn class(&self, key: &str) -> Result<Option<&str>, ConfigError> {
        Ok(match self.typed(key, ConfigType::Class)? {
            Some(ConfigValue::Class(s)) => Some(s),
            _ => None,
        })
    }

    /// A password key; `None` when null.
    pub fn password(&self, key: &str) -> Result<Option<&Password>, ConfigError> {
        Ok(match self.typed(key, ConfigType::Password)? {
            Some(ConfigValue::Password(p)) => Some(p),
            _ => None,
        })
    }

    pub fn int(&self, key: &str) -> Result<i32, ConfigError> {
        match self.required(key, ConfigType::Int)? {
            ConfigValue::Int(v) => Ok(*v),
            _ => Err(self.mismatch(key, ConfigType::Int)),
        }
    }

    pub fn long(&self, key: &str) -> Result<i64, ConfigError> {
        match self.required(key, ConfigType::Long)? {
            ConfigValue::Long(v) => Ok(*v),
            _ => Err(self.mismatch(key, ConfigType::Long)),
        }
    }

    pub fn double(&self, key: &str) -> Result<f64, ConfigError> {
        match self.required(key, ConfigType::Double)? {
            ConfigValue::Double(v) => Ok(*v),
            _ => Err(self.mismatch(key, ConfigType::Double)),
        }
    }

    pub fn boolean(&self, key: &str) -> Result<bool, ConfigError> {
        match self.required(key, ConfigType::Boolean)? {
            ConfigValue::Boolean(v) => Ok(*v),
            _ => Err(self.mismatch(key, ConfigType::Boolean)),
        }
    }

    /// A list key; null reads as an empty list.
    pub fn list(&self, key: &str) -> Result<&[String], ConfigError> {
        Ok(match self.typed(key, ConfigType::List)? {
            Some(ConfigValue::List(items)) => items,
            _ => &[],
        })
    }

    fn mismatch(&self, key: &str, wanted: ConfigType) -> ConfigError {
        ConfigError::Undeclared {
            key: self.full_key(key),
            wanted: wanted.name(),
            declared: "a value of another type",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn booleans_parse_case_insensitively_and_refuse_anything_else() {
        assert_eq!(
            ConfigValue::parse(ConfigType::Boolean, " TRUE "),
            Ok(ConfigValue::Boolean(true))
        );
        assert_eq!(
            ConfigValue::parse(ConfigType::Boolean, "yes"),
            Err("expected a boolean (true or false)".into())
        );
    }

    #[test]
    fn lists_split_on_commas_and_trim_items() {
        assert_eq!(parse_list(" a, b ,c"), vec!["a", "b", "c"]);
        assert!(parse_list("  ").is_empty());
    }

    #[test]
    fn numbers_that_do_not_fit_the_type_are_refused() {
        assert!(ConfigValue::parse(ConfigType::Int, "3000000000").is_err());
        assert_eq!(
            ConfigValue::parse(ConfigType::Long, "3000000000"),
            Ok(ConfigValue::Long(3_000_000_000))
        );
    }

    #[test]
    fn passwords_never_print_their_secret() {
        let value = ConfigValue::parse(ConfigType::Password, "s3cret").expect("any text");
        assert_eq!(value.display_text(), "[hidden]");
        assert!(!format!("{value:?}").contains("s3cret"));
    }
}
