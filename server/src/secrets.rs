//! Which configuration values are secrets, and hiding them: every configuration, message and
//! trace the worker shows has its secrets hidden.
//!
//! - A key is sensitive when its plugin (or the runtime) declares it a password, or when its
//!   name says so: it mentions a password (`pass`, `pwd`, `passphrase`), secret, token,
//!   credential, authorization, JAAS config or basic-auth user info, or its last part is a key
//!   (`api.key`, `apikey`, `private_key`, `ssl.keystore.key` — but not `key.converter`). Its
//!   whole value shows as `[hidden]`.
//! - In every other value, credentials inside URLs (`postgres://user:pass@host` shows as
//!   `postgres://user:****@host`) and secret parameters (`password=...`, `token=...` in a query
//!   string or a libpq/JDBC connection string) show as `****`.
//! - In header lists (`http.headers`, any key ending in `headers`), the values of headers whose
//!   names say secret (`Authorization`, `Cookie`, `X-Api-Key`, `Private-Token`, ...) show as
//!   `****`.

use std::sync::{OnceLock, RwLock};

use regex::Regex;
use spillway_core::ConfigMap;

/// What a hidden value shows as (Connect's masking text).
pub const HIDDEN: &str = "[hidden]";

/// What a secret inside a value (a URL password, a header value) shows as.
pub const MASK: &str = "****";

/// Secret values shorter than this are hidden in configurations but not searched for in free
/// text, where they would match ordinary words.
const MIN_REDACTED_LEN: usize = 4;

/// Words that make a key (or a header, or a parameter) name sensitive wherever they appear.
const SECRET_WORDS: [&str; 10] = [
    "password",
    "passwd",
    "passphrase",
    "secret",
    "token",
    "credential",
    "jaas",
    "authorization",
    "userinfo",
    "user.info",
];

/// Name parts (split at `.`, `_`, `-`) that make a name sensitive on their own.
const SECRET_PARTS: [&str; 3] = ["pass", "pwd", "cookie"];

fn parts(lower: &str) -> impl Iterator<Item = &str> {
    lower.split(['.', '_', '-', ' ']).filter(|p| !p.is_empty())
}

/// Whether a key's name marks its value as secret.
pub fn is_sensitive(key: &str) -> bool {
    let lower = key.trim().to_ascii_lowercase();
    if SECRET_WORDS.iter().any(|word| lower.contains(word)) {
        return true;
    }
    if parts(&lower).any(|p| SECRET_PARTS.contains(&p)) {
        return true;
    }
    parts(&lower)
        .last()
        .is_some_and(|last| last.ends_with("key"))
}

/// Whether a header's name marks its value as secret (`Authorization`, `X-Api-Key`,
/// `Cookie`, `Private-Token`, `X-Amz-Security-Token`, ...).
pub fn is_sensitive_header(name: &str) -> bool {
    let lower = name.trim().to_ascii_lowercase();
    is_sensitive(&lower)
        || parts(&lower)
            .any(|p| p.ends_with("key") || ["auth", "session", "signature", "sig"].contains(&p))
}

/// Whether the value of `key` is a list of `Name:value` headers.
fn is_header_list(key: &str) -> bool {
    let lower = key.to_ascii_lowercase();
    lower == "headers" || lower.ends_with(".headers") || lower.ends_with("_headers")
}

/// `scheme://user:password@` inside a value: the password is group 2.
fn url_credentials() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(r"([A-Za-z][A-Za-z0-9+.\-]*://[^:/?#@\s]*):([^@/?#\s]*)@").expect("valid")
    })
}

/// `name=value` parameters whose name says secret (query strings, libpq and JDBC connection
/// strings): the value is group 2.
fn secret_parameters() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(
            r"(?i)(\b(?:[a-z0-9_.\-]*(?:password|passwd|pwd|secret|token|api[_\-]?key|access[_\-]?key|credentials?|sig|signature)|pass|auth))=([^&;,\s]*)",
        )
        .expect("valid")
    })
}

/// The separator of the header list in `key` (`<key>.separator`, else `|`).
fn header_separator<'a>(key: &str, config: &'a ConfigMap) -> &'a str {
    config
        .get(&format!("{key}.separator"))
        .map(String::as_str)
        .filter(|s| !s.is_empty())
        .unwrap_or("|")
}

/// The secrets inside a value that is not secret as a whole: URL passwords, secret
/// parameters, and (for a header list) the values of secret headers.
fn embedded_secrets(key: &str, value: &str, config: &ConfigMap) -> Vec<String> {
    let mut found: Vec<String> = url_credentials()
        .captures_iter(value)
        .chain(secret_parameters().captures_iter(value))
        .filter_map(|c| c.get(2))
        .map(|m| m.as_str().to_owned())
        .filter(|s| !s.is_empty() && s != MASK)
        .collect();
    if is_header_list(key) {
        for pair in value.split(header_separator(key, config)) {
            if let Some((name, v)) = pair.split_once(':') {
                let v = v.trim();
                if is_sensitive_header(name) && !v.is_empty() && v != MASK {
                    found.push(v.to_owned());
                }
            }
        }
    }
    found
}

/// `value` with the secrets inside it (URL passwords, secret parameters) shown as `****`.
pub fn mask_text(value: &str) -> String {
    let masked = url_credentials().replace_all(value, format!("${{1}}:{MASK}@"));
    secret_parameters()
        .replace_all(&masked, format!("${{1}}={MASK}"))
        .into_owned()
}

/// How `value` of `key` is shown: `[hidden]` when the key is secret (by name or `declared`),
/// else with the secrets inside it masked.
pub fn mask_value(key: &str, value: &str, declared: &[String], config: &ConfigMap) -> String {
    if is_sensitive(key) || declared.iter().any(|d| d == key) {
        return HIDDEN.to_owned();
    }
    let mut shown = mask_text(value);
    if is_header_list(key) {
        let separator = header_separator(key, config);
        shown = shown
            .split(separator)
            .map(|pair| match pair.split_once(':') {
                Some((name, v)) if is_sensitive_header(name) && !v.trim().is_empty() => {
                    format!("{name}:{MASK}")
                }
                _ => pair.to_owned(),
            })
            .collect::<Vec<_>>()
            .join(separator);
    }
    shown
}

/// `config` with every secret hidden (see the module documentation).
pub fn mask(config: &ConfigMap, declared: &[String]) -> ConfigMap {
    config
        .iter()
        .map(|(k, v)| (k.clone(), mask_value(k, v, declared, config)))
        .collect()
}

/// Every secret of `config`: whole values of secret keys and the secrets inside other values.
pub fn secret_values(config: &ConfigMap, declared: &[String]) -> Vec<String> {
    let mut secrets: Vec<String> = config
        .iter()
        .flat_map(|(k, v)| {
            if is_sensitive(k) || declared.iter().any(|d| d == k) {
                vec![v.clone()]
            } else {
                embedded_secrets(k, v, config)
            }
        })
        .filter(|s| s.len() >= MIN_REDACTED_LEN)
        .collect();
    // Longest first, so a secret that contains another is hidden whole.
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    secrets.dedup();
    secrets
}

/// `text` with every secret of `config` replaced by `[hidden]`, and credentials in URLs or
/// parameters it holds masked.
pub fn redact(text: &str, config: &ConfigMap, declared: &[String]) -> String {
    let mut out = text.to_owned();
    for secret in secret_values(config, declared) {
        out = out.replace(&secret, HIDDEN);
    }
    mask_text(&out)
}

/// The secrets of every configuration this process has stored or run, for [`redact_known`].
fn known() -> &'static RwLock<Vec<String>> {
    static KNOWN: OnceLock<RwLock<Vec<String>>> = OnceLock::new();
    KNOWN.get_or_init(RwLock::default)
}

/// Remembers the secrets of `config` so that no log line shows them (see [`redact_known`]).
pub fn remember(config: &ConfigMap, declared: &[String]) {
    let found = secret_values(config, declared);
    if found.is_empty() {
        return;
    }
    let mut all = known().write().unwrap_or_else(|e| e.into_inner());
    let before = all.len();
    for secret in found {
        if !all.contains(&secret) {
            all.push(secret);
        }
    }
    if all.len() != before {
        all.sort_by_key(|s| std::cmp::Reverse(s.len()));
    }
}

/// `text` with every remembered secret replaced by `[hidden]` and credentials in URLs or
/// parameters masked: what the log output passes each line through.
pub fn redact_known(text: &str) -> String {
    let all = known().read().unwrap_or_else(|e| e.into_inner());
    let mut out = std::borrow::Cow::Borrowed(text);
    for secret in all.iter() {
        if out.contains(secret.as_str()) {
            out = std::borrow::Cow::Owned(out.replace(secret.as_str(), HIDDEN));
        }
    }
    mask_text(&out)
}

/// A log writer that passes everything it writes through [`redact_known`].
#[derive(Debug, Clone)]
pub struct RedactingWriter<W>(pub W);

impl<'a, W: tracing_subscriber::fmt::MakeWriter<'a>> tracing_subscriber::fmt::MakeWriter<'a>
    for RedactingWriter<W>
{
    type Writer = Redacting<W::Writer>;

    fn make_writer(&'a self) -> Self::Writer {
        Redacting(self.0.make_writer())
    }

    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> Self::Writer {
        Redacting(self.0.make_writer_for(meta))
    }
}

/// One write of a [`RedactingWriter`]: the formatter writes each log line in one call.
pub struct Redacting<W>(W);

impl<W: std::io::Write> std::io::Write for Redacting<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        self.0.write_all(redact_known(&text).as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> ConfigMap {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

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
            "db.pass",
            "db.pwd",
            "ssl.keystore.key",
            "consumer.override.ssl.key.password",
            "value.converter.basic.auth.user.info",
            "sasl.oauthbearer.client.credentials.client.secret",
            "gcp.credentials.json",
            "PRIVATE_KEY",
        ] {
            assert!(is_sensitive(key), "{key}");
        }
        for key in [
            "key.converter",
            "key.converter.schemas.enable",
            "topics",
            "transforms.key.type",
            "file",
            "connection.url",
            "http.headers",
            "passthrough.mode",
            "errors.tolerance",
            "primary.key.mode",
            "http.auth.type",
            "consumer.override.session.timeout.ms",
        ] {
            assert!(!is_sensitive(key), "{key}");
        }
    }

    #[test]
    fn masked_configs_and_redacted_text_hold_no_secret() {
        let config = map(&[
            ("api.key", "s3cr3t-value"),
            ("pin", "98765"),
            ("topics", "t"),
        ]);
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

    #[test]
    fn passwords_inside_urls_and_connection_strings_are_masked() {
        let config = map(&[
            (
                "connection.url",
                "postgres://app:hunter2-pw@db:5432/x?sslmode=require",
            ),
            (
                "jdbc.url",
                "jdbc:postgresql://db/x?user=app&password=pg-s3cret&ssl=true",
            ),
            ("dsn", "host=db user=app password=libpq-s3cret dbname=x"),
            ("http.url", "https://hooks.example/in?token=tok-123456&x=1"),
            ("plain.url", "https://example.com/path"),
        ]);
        let masked = mask(&config, &[]);
        assert_eq!(
            masked["connection.url"],
            "postgres://app:****@db:5432/x?sslmode=require"
        );
        assert_eq!(
            masked["jdbc.url"],
            "jdbc:postgresql://db/x?user=app&password=****&ssl=true"
        );
        assert_eq!(masked["dsn"], "host=db user=app password=**** dbname=x");
        assert_eq!(
            masked["http.url"],
            "https://hooks.example/in?token=****&x=1"
        );
        assert_eq!(masked["plain.url"], "https://example.com/path");
        let text = "cannot connect to postgres://app:hunter2-pw@db:5432/x: refused (pg-s3cret)";
        let redacted = redact(text, &config, &[]);
        for secret in ["hunter2-pw", "pg-s3cret"] {
            assert!(!redacted.contains(secret), "{redacted}");
        }
        // A URL in a message whose secret is not in the configuration is masked too.
        assert_eq!(
            redact("GET https://u:other-pw@h/ failed", &ConfigMap::new(), &[]),
            "GET https://u:****@h/ failed"
        );
    }

    #[test]
    fn remembered_secrets_never_reach_the_log_writer() {
        use std::io::Write as _;
        let config = map(&[
            ("vault.password", "remembered-pw-1"),
            ("connection.url", "mysql://u:remembered-url-pw@h/db"),
        ]);
        remember(&config, &[]);
        let mut out = Vec::new();
        Redacting(&mut out)
            .write_all(b"batch [remembered-pw-1] to remembered-url-pw failed\n")
            .expect("written");
        let line = String::from_utf8(out).expect("utf-8");
        assert_eq!(line, "batch [[hidden]] to [hidden] failed\n");
    }

    #[test]
    fn secret_headers_are_masked_in_header_lists_with_their_separator() {
        let config = map(&[
            (
                "http.headers",
                "Authorization: Bearer abc.def.ghi|X-Tenant:acme|X-Api-Key:k-123456",
            ),
            ("other.headers", "Cookie:sid=42-cookie;X-Source:spillway"),
            ("other.headers.separator", ";"),
        ]);
        let masked = mask(&config, &[]);
        assert_eq!(
            masked["http.headers"],
            "Authorization:****|X-Tenant:acme|X-Api-Key:****"
        );
        assert_eq!(masked["other.headers"], "Cookie:****;X-Source:spillway");
        let secrets = secret_values(&config, &[]);
        for secret in ["Bearer abc.def.ghi", "k-123456", "sid=42-cookie"] {
            assert!(secrets.iter().any(|s| s == secret), "{secret}: {secrets:?}");
        }
        assert!(!secrets.iter().any(|s| s == "acme"), "{secrets:?}");
    }
}
