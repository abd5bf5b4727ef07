//! Which configuration values are secrets, and hiding them: every configuration, message and
//! trace the worker shows has the value of a sensitive key replaced by `[hidden]`.
//!
//! A key is sensitive when its plugin declares it a password, or when its name says so:
//! it mentions a password, secret, token, credential or JAAS config, or its last part is a key
//! (`api.key`, `apikey`, `private_key` — but not `key.converter`).

use spillway_core::ConfigMap;

/// What a hidden value shows as (Connect's masking text).
pub const HIDDEN: &str = "[hidden]";

/// Secret values shorter than this are hidden in configurations but not searched for in free
/// text, where they would match ordinary words.
const MIN_REDACTED_LEN: usize = 4;

/// Whether a key's name marks its value as secret.
pub fn is_sensitive(key: &str) -> bool {
    let lower = key.to_ascii_lowercase();
    if ["password", "secret", "token", "credential", "jaas"]
        .iter()
        .any(|word| lower.contains(word))
    {
        return true;
    }
    let last = lower.rsplit('.').next().unwrap_or(&lower);
    last.ends_with("key")
}

/// `config` with every sensitive value (by name, or listed in `declared`) hidden.
pub fn mask(config: &ConfigMap, declared: &[String]) -> ConfigMap {
    config
        .iter()
        .map(|(k, v)| {
            let hide = is_sensitive(k) || declared.iter().any(|d| d == k);
            (k.clone(), if hide { HIDDEN.to_owned() } else { v.clone() })
        })
        .collect()
}

/// `text` with every secret value of `config` replaced by `[hidden]`.
pub fn redact(text: &str, config: &ConfigMap, declared: &[String]) -> String {
    let mut secrets: Vec<&str> = config
        .iter()
        .filter(|(k, v)| {
            (is_sensitive(k) || declared.iter().any(|d| d == *k)) && v.len() >= MIN_REDACTED_LEN
        })
        .map(|(_, v)| v.as_str())
        .collect();
    // Longest first, so a secret that contains another is hidden whole.
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    let mut out = text.to_owned();
    for secret in secrets {
        out = out.replace(secret, HIDDEN);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_say_secret_are_sensitive_and_converter_keys_are_not() {
        for key in [
            "connection.password",
            "consumer.override.sasl.jaas.config",
            "http.auth.token",
            "aws.secret.access.key",
            "api.key",
            "apikey",
            "client_secret",
        ] {
            assert!(is_sensitive(key), "{key}");
        }
        for key in ["key.converter", "topics", "transforms.key.type", "file"] {
            assert!(!is_sensitive(key), "{key}");
        }
    }

    #[test]
    fn masked_configs_and_redacted_text_hold_no_secret() {
        let config: ConfigMap = [
            ("api.key", "s3cr3t-value"),
            ("pin", "98765"),
            ("topics", "t"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
        let declared = vec!["pin".to_owned()];
        let masked = mask(&config, &declared);
        assert_eq!(masked["api.key"], HIDDEN);
        assert_eq!(masked["pin"], HIDDEN);
        assert_eq!(masked["topics"], "t");
        assert_eq!(
            redact(
                "login with s3cr3t-value and 98765 failed",
                &config,
                &declared
            ),
            "login with [hidden] and [hidden] failed"
        );
    }
}
