//! The HTTP sink's settings. Names follow Confluent's HTTP sink where one exists (its
//! `headers`/`header.separator` pair is `http.headers`/`http.headers.separator` here, beside
//! `http.url` and `http.method`).

use std::time::Duration;

use reqwest::header::{HeaderName, HeaderValue};
use reqwest::{Method, Url};
use spillway_core::config::{
    ConfigDef, ConfigKey, ConfigType, ConfigValue, Importance, ParsedConfig, Password, Reach,
    Validator,
};
use spillway_core::{ConfigError, ConfigMap};

pub const HTTP_URL: &str = "http.url";
pub const HTTP_METHOD: &str = "http.method";
pub const HTTP_HEADERS: &str = "http.headers";
pub const HTTP_HEADERS_SEPARATOR: &str = "http.headers.separator";
pub const HTTP_TIMEOUT_MS: &str = "http.timeout.ms";
pub const BATCH_MAX_RECORDS: &str = "batch.max.records";
pub const BATCH_FORMAT: &str = "batch.format";
pub const BEHAVIOR_ON_NULL_VALUES: &str = "behavior.on.null.values";
pub const AUTH_TYPE: &str = "auth.type";
pub const CONNECTION_USER: &str = "connection.user";
pub const CONNECTION_PASSWORD: &str = "connection.password";
pub const BEARER_TOKEN: &str = "bearer.token";
pub const RETRY_MAX_ATTEMPTS: &str = "retry.max.attempts";
pub const RETRY_BACKOFF_MS: &str = "retry.backoff.ms";
pub const RETRY_BACKOFF_MAX_MS: &str = "retry.backoff.max.ms";
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency.key.header";

const CONNECTION_GROUP: &str = "Connection";
const BATCHING_GROUP: &str = "Batching";
const AUTH_GROUP: &str = "Authentication";
const RETRY_GROUP: &str = "Retries";

/// How a batch of records becomes one request body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchFormat {
    /// `[v1,v2,...]`, `Content-Type: application/json`.
    JsonArray,
    /// One JSON value per line, `Content-Type: application/x-ndjson`.
    Ndjson,
}

/// What a tombstone (null value) does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NullValues {
    /// Accepted without a request.
    Ignore,
    /// Rejected.
    Fail,
}

/// Credentials sent with every request.
#[derive(Debug, Clone, PartialEq)]
pub enum Auth {
    None,
    Basic { user: String, password: Password },
    Bearer { token: Password },
}

/// The parsed and cross-checked settings of one HTTP sink task.
#[derive(Debug, Clone)]
pub struct HttpSinkConfig {
    pub url: Url,
    pub method: Method,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub timeout: Duration,
    pub batch_max_records: usize,
    pub batch_format: BatchFormat,
    pub null_values: NullValues,
    pub auth: Auth,
    /// Attempts per request, the first included.
    pub retry_max_attempts: u32,
    pub retry_backoff: Duration,
    pub retry_backoff_max: Duration,
    pub idempotency_key_header: HeaderName,
    /// The connector's `name`, mixed into idempotency keys so that two connectors writing
    /// the same topic to one receiver do not collide.
    pub connector_name: String,
}

fn check_url(value: &ConfigValue) -> Result<(), String> {
    let ConfigValue::String(text) = value else {
        return Err("expected a URL".into());
    };
    let url = Url::parse(text).map_err(|e| format!("not a URL ({e})"))?;
    match url.scheme() {
        "http" | "https" => Ok(()),
        other => Err(format!(
            "scheme '{other}' is not supported; use http or https"
        )),
    }
}

fn check_header_name(value: &ConfigValue) -> Result<(), String> {
    match value {
        ConfigValue::String(name) => HeaderName::from_bytes(name.as_bytes())
            .map(|_| ())
            .map_err(|_| "not a valid HTTP header name".into()),
        _ => Err("expected a header name".into()),
    }
}

/// The host and port `http.url` connects to, for the egress policy.
fn url_hosts(url: &str) -> Result<Vec<(String, u16)>, String> {
    let parsed = Url::parse(url.trim()).map_err(|e| format!("not a URL ({e})"))?;
    let host = parsed
        .host_str()
        .filter(|h| !h.is_empty())
        .ok_or_else(|| "the URL names no host".to_owned())?;
    // An IPv6 literal comes in brackets.
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let port = parsed
        .port_or_known_default()
        .ok_or_else(|| "the URL names no port".to_owned())?;
    Ok(vec![(host, port)])
}

/// The connector's own keys.
pub fn config_def() -> ConfigDef {
    ConfigDef::new()
        .define(
            ConfigKey::new(HTTP_URL, ConfigType::String, Importance::High, "The endpoint every batch is sent to (http or https).")
                .validator(Validator::Custom { check: check_url, allowed: "http:// or https:// URL" })
                .reaches(Reach::Hosts(url_hosts))
                .group(CONNECTION_GROUP, 1),
        )
        .define(
            ConfigKey::new(HTTP_METHOD, ConfigType::String, Importance::High, "The request method.")
                .default("POST")
                .validator(Validator::OneOf(&["POST", "PUT", "PATCH"]))
                .group(CONNECTION_GROUP, 2),
        )
        .define(
            ConfigKey::new(
                HTTP_HEADERS,
                ConfigType::String,
                Importance::Medium,
                "Extra request headers as Name:value pairs separated by http.headers.separator, \
                 e.g. X-Tenant:acme|X-Source:spillway. They may replace Content-Type but not the \
                 idempotency key header.",
            )
            .default("")
            .group(CONNECTION_GROUP, 3),
        )
        .define(
            ConfigKey::new(HTTP_HEADERS_SEPARATOR, ConfigType::String, Importance::Low, "The separator between pairs in http.headers.")
                .default("|")
                .validator(Validator::NonEmptyString)
                .group(CONNECTION_GROUP, 4),
        )
        .define(
            ConfigKey::new(HTTP_TIMEOUT_MS, ConfigType::Long, Importance::Medium, "How long one request may take, connecting included; a request that takes longer is retried.")
                .default("30000")
                .validator(Validator::Between(1, 600_000))
                .group(CONNECTION_GROUP, 5),
        )
        .define(
            ConfigKey::new(BATCH_MAX_RECORDS, ConfigType::Int, Importance::Medium, "Most records in one request.")
                .default("500")
                .validator(Validator::Between(1, 100_000))
                .group(BATCHING_GROUP, 1),
        )
        .define(
            ConfigKey::new(
                BATCH_FORMAT,
                ConfigType::String,
                Importance::Medium,
                "json_array: the body is a JSON array of the record values. ndjson: one JSON \
                 value per line (application/x-ndjson).",
            )
            .default("json_array")
            .validator(Validator::OneOf(&["json_array", "ndjson"]))
            .group(BATCHING_GROUP, 2),
        )
        .define(
            ConfigKey::new(
                BEHAVIOR_ON_NULL_VALUES,
                ConfigType::String,
                Importance::Low,
                "What a tombstone (null value) does. ignore: accepted without being sent. fail: \
                 rejected.",
            )
            .default("ignore")
            .validator(Validator::OneOf(&["ignore", "fail"]))
            .group(BATCHING_GROUP, 3),
        )
        .define(
            ConfigKey::new(AUTH_TYPE, ConfigType::String, Importance::High, "none, basic (connection.user and connection.password) or bearer (bearer.token).")
                .default("none")
                .validator(Validator::OneOf(&["none", "basic", "bearer"]))
                .group(AUTH_GROUP, 1),
        )
        .define(
            ConfigKey::new(CONNECTION_USER, ConfigType::String, Importance::High, "User for auth.type=basic.")
                .null_default()
                .group(AUTH_GROUP, 2),
        )
        .define(
            ConfigKey::new(CONNECTION_PASSWORD, ConfigType::Password, Importance::High, "Password for auth.type=basic.")
                .null_default()
                .group(AUTH_GROUP, 3),
        )
        .define(
            ConfigKey::new(BEARER_TOKEN, ConfigType::Password, Importance::High, "Token for auth.type=bearer, sent as Authorization: Bearer <token>.")
                .null_default()
                .group(AUTH_GROUP, 4),
        )
        .define(
            ConfigKey::new(
                RETRY_MAX_ATTEMPTS,
                ConfigType::Int,
                Importance::Medium,
                "Attempts per request, the first included, when the endpoint answers 408, 429 \
                 or 5xx or does not answer in time. After the last the records are released \
                 for redelivery.",
            )
            .default("5")
            .validator(Validator::Between(1, 100))
            .group(RETRY_GROUP, 1),
        )
        .define(
            ConfigKey::new(RETRY_BACKOFF_MS, ConfigType::Long, Importance::Medium, "Wait before the first retry; it doubles with each further retry.")
                .default("100")
                .validator(Validator::Between(0, 600_000))
                .group(RETRY_GROUP, 2),
        )
        .define(
            ConfigKey::new(
                RETRY_BACKOFF_MAX_MS,
                ConfigType::Long,
                Importance::Medium,
                "Longest wait between attempts. A Retry-After asking for longer releases the \
                 records at once rather than holding them (and their share-group locks).",
            )
            .default("10000")
            .validator(Validator::Between(0, 600_000))
            .group(RETRY_GROUP, 3),
        )
        .define(
            ConfigKey::new(
                IDEMPOTENCY_KEY_HEADER,
                ConfigType::String,
                Importance::Low,
                "Header carrying each request's idempotency key, derived from the connector \
                 name and the topic, partition and offset of every record in the request.",
            )
            .default("Idempotency-Key")
            .validator(Validator::Custom { check: check_header_name, allowed: "an HTTP header name" })
            .group(CONNECTION_GROUP, 6),
        )
}

/// `Name:value` pairs split by `separator`.
pub fn parse_headers(
    text: &str,
    separator: &str,
) -> Result<Vec<(HeaderName, HeaderValue)>, String> {
    let mut headers = Vec::new();
    for pair in text
        .split(separator)
        .map(str::trim)
        .filter(|p| !p.is_empty())
    {
        let Some((name, value)) = pair.split_once(':') else {
            return Err(format!(
                "'{pair}' is not a Name:value pair (pairs are separated by '{separator}')"
            ));
        };
        let name = HeaderName::from_bytes(name.trim().as_bytes())
            .map_err(|_| format!("'{}' is not a valid header name", name.trim()))?;
        let value = HeaderValue::from_str(value.trim()).map_err(|_| {
            format!("the value of header '{name}' has characters a header cannot carry")
        })?;
        headers.push((name, value));
    }
    Ok(headers)
}

/// A problem found across keys: the key to report it under and the message.
type Problem = (&'static str, ConfigError);

impl HttpSinkConfig {
    /// Parses `props`, checking the keys that depend on each other.
    pub fn parse(props: &ConfigMap) -> Result<HttpSinkConfig, ConfigError> {
        let parsed = config_def().parse(props)?;
        let (config, problems) = HttpSinkConfig::from_parsed(&parsed, props)?;
        match ConfigError::from_list(problems.into_iter().map(|(_, e)| e).collect()) {
            Some(e) => Err(e),
            None => Ok(config),
        }
    }

    /// The problems [`parse`](Self::parse) finds beyond each key's own checks, by key, for
    /// the REST validate answer; empty when a key is invalid on its own.
    pub fn cross_key_problems(props: &ConfigMap) -> Vec<(&'static str, String)> {
        let Ok(parsed) = config_def().parse(props) else {
            return Vec::new();
        };
        match HttpSinkConfig::from_parsed(&parsed, props) {
            Ok((_, problems)) => problems
                .into_iter()
                .map(|(key, e)| (key, e.to_string()))
                .collect(),
            Err(_) => Vec::new(),
        }
    }

    fn from_parsed(
        parsed: &ParsedConfig,
        props: &ConfigMap,
    ) -> Result<(HttpSinkConfig, Vec<Problem>), ConfigError> {
        let mut problems: Vec<Problem> = Vec::new();
        let url_text = parsed.string(HTTP_URL)?.unwrap_or_default();
        let url = Url::parse(url_text).map_err(|e| ConfigError::InvalidValue {
            key: HTTP_URL.into(),
            value: url_text.into(),
            reason: format!("not a URL ({e})"),
        })?;
        let method_text = parsed
            .string(HTTP_METHOD)?
            .unwrap_or("POST")
            .to_ascii_uppercase();
        let method = Method::from_bytes(method_text.as_bytes()).unwrap_or(Method::POST);
        let header_text = parsed.string(HTTP_HEADERS)?.unwrap_or_default();
        let separator = parsed.string(HTTP_HEADERS_SEPARATOR)?.unwrap_or("|");
        let idempotency_name = parsed
            .string(IDEMPOTENCY_KEY_HEADER)?
            .unwrap_or("Idempotency-Key");
        let idempotency_key_header =
            HeaderName::from_bytes(idempotency_name.as_bytes()).map_err(|_| {
                ConfigError::InvalidValue {
                    key: IDEMPOTENCY_KEY_HEADER.into(),
                    value: idempotency_name.into(),
                    reason: "not a valid HTTP header name".into(),
                }
            })?;
        let headers = match parse_headers(header_text, separator) {
            Ok(headers) => headers,
            Err(reason) => {
                problems.push((
                    HTTP_HEADERS,
                    ConfigError::InvalidValue {
                        key: HTTP_HEADERS.into(),
                        value: header_text.into(),
                        reason,
                    },
                ));
                Vec::new()
            }
        };
        if headers
            .iter()
            .any(|(name, _)| *name == idempotency_key_header)
        {
            problems.push((
                HTTP_HEADERS,
                ConfigError::Conflict(format!(
                    "{HTTP_HEADERS} sets '{idempotency_key_header}', which the sink sets itself \
                     on every request (see {IDEMPOTENCY_KEY_HEADER}); remove it from {HTTP_HEADERS}"
                )),
            ));
        }
        let user = parsed.string(CONNECTION_USER)?;
        let password = parsed.password(CONNECTION_PASSWORD)?;
        let token = parsed.password(BEARER_TOKEN)?;
        let auth = match parsed
            .string(AUTH_TYPE)?
            .unwrap_or("none")
            .to_ascii_lowercase()
            .as_str()
        {
            "basic" => match user {
                Some(user) if !user.is_empty() => Auth::Basic {
                    user: user.to_owned(),
                    password: password.cloned().unwrap_or_else(|| Password::new("")),
                },
                _ => {
                    problems.push((
                        CONNECTION_USER,
                        ConfigError::Conflict(format!(
                            "{AUTH_TYPE}=basic needs {CONNECTION_USER} (and usually \
                             {CONNECTION_PASSWORD}), but {CONNECTION_USER} is not set"
                        )),
                    ));
                    Auth::None
                }
            },
            "bearer" => match token {
                Some(token) if !token.expose().is_empty() => Auth::Bearer {
                    token: token.clone(),
                },
                _ => {
                    problems.push((
                        BEARER_TOKEN,
                        ConfigError::Conflict(format!(
                            "{AUTH_TYPE}=bearer needs {BEARER_TOKEN}, but it is not set"
                        )),
                    ));
                    Auth::None
                }
            },
            _ => Auth::None,
        };
        let millis = |key: &str| -> Result<Duration, ConfigError> {
            Ok(Duration::from_millis(
                u64::try_from(parsed.long(key)?).unwrap_or(0),
            ))
        };
        let retry_backoff = millis(RETRY_BACKOFF_MS)?;
        let retry_backoff_max = millis(RETRY_BACKOFF_MAX_MS)?;
        if retry_backoff > retry_backoff_max {
            problems.push((
                RETRY_BACKOFF_MS,
                ConfigError::Conflict(format!(
                    "{RETRY_BACKOFF_MS}={} is more than {RETRY_BACKOFF_MAX_MS}={}; the first \
                     wait cannot exceed the longest",
                    retry_backoff.as_millis(),
                    retry_backoff_max.as_millis()
                )),
            ));
        }
        let config = HttpSinkConfig {
            url,
            method,
            headers,
            timeout: millis(HTTP_TIMEOUT_MS)?,
            batch_max_records: usize::try_from(parsed.int(BATCH_MAX_RECORDS)?).unwrap_or(1),
            batch_format: match parsed.string(BATCH_FORMAT)?.unwrap_or("json_array") {
                f if f.eq_ignore_ascii_case("ndjson") => BatchFormat::Ndjson,
                _ => BatchFormat::JsonArray,
            },
            null_values: match parsed.string(BEHAVIOR_ON_NULL_VALUES)?.unwrap_or("ignore") {
                b if b.eq_ignore_ascii_case("fail") => NullValues::Fail,
                _ => NullValues::Ignore,
            },
            auth,
            retry_max_attempts: u32::try_from(parsed.int(RETRY_MAX_ATTEMPTS)?).unwrap_or(1),
            retry_backoff,
            retry_backoff_max,
            idempotency_key_header,
            connector_name: props.get("name").cloned().unwrap_or_default(),
        };
        Ok((config, problems))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(pairs: &[(&str, &str)]) -> ConfigMap {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn defaults_post_json_arrays_of_500_with_five_attempts() {
        let config = HttpSinkConfig::parse(&props(&[(HTTP_URL, "http://127.0.0.1:8080/in")]))
            .expect("valid");
        assert_eq!(config.method, Method::POST);
        assert_eq!(config.batch_max_records, 500);
        assert_eq!(config.batch_format, BatchFormat::JsonArray);
        assert_eq!(config.retry_max_attempts, 5);
        assert_eq!(config.auth, Auth::None);
        assert_eq!(config.idempotency_key_header.as_str(), "idempotency-key");
    }

    #[test]
    fn headers_are_split_on_the_configured_separator() {
        let config = HttpSinkConfig::parse(&props(&[
            (HTTP_URL, "https://example.com/in"),
            (HTTP_HEADERS, "X-Tenant: acme ; X-Source:spillway"),
            (HTTP_HEADERS_SEPARATOR, ";"),
        ]))
        .expect("valid");
        let pairs: Vec<(String, String)> = config
            .headers
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_str().unwrap_or_default().to_owned()))
            .collect();
        assert_eq!(
            pairs,
            vec![
                ("x-tenant".to_owned(), "acme".to_owned()),
                ("x-source".to_owned(), "spillway".to_owned())
            ]
        );
    }

    #[test]
    fn a_header_without_a_colon_is_refused_naming_key_and_value() {
        let err = HttpSinkConfig::parse(&props(&[
            (HTTP_URL, "https://example.com/in"),
            (HTTP_HEADERS, "X-Tenant=acme"),
        ]))
        .expect_err("no colon");
        assert_eq!(
            err.to_string(),
            "invalid value 'X-Tenant=acme' for http.headers: 'X-Tenant=acme' is not a Name:value \
             pair (pairs are separated by '|')"
        );
    }

    #[test]
    fn a_url_of_another_scheme_is_refused() {
        let err =
            HttpSinkConfig::parse(&props(&[(HTTP_URL, "ftp://example.com/in")])).expect_err("ftp");
        assert_eq!(
            err.to_string(),
            "invalid value 'ftp://example.com/in' for http.url: scheme 'ftp' is not supported; use http or https"
        );
    }

    #[test]
    fn an_unknown_method_names_the_choices() {
        let err = HttpSinkConfig::parse(&props(&[
            (HTTP_URL, "http://h/in"),
            (HTTP_METHOD, "DELETE"),
        ]))
        .expect_err("no DELETE");
        assert_eq!(
            err.to_string(),
            "invalid value 'DELETE' for http.method: expected one of POST, PUT, PATCH"
        );
    }

    #[test]
    fn bearer_auth_needs_a_token_and_hides_it() {
        let err =
            HttpSinkConfig::parse(&props(&[(HTTP_URL, "http://h/in"), (AUTH_TYPE, "bearer")]))
                .expect_err("no token");
        assert_eq!(
            err.to_string(),
            "auth.type=bearer needs bearer.token, but it is not set"
        );
        let config = HttpSinkConfig::parse(&props(&[
            (HTTP_URL, "http://h/in"),
            (AUTH_TYPE, "bearer"),
            (BEARER_TOKEN, "t0ken"),
        ]))
        .expect("valid");
        assert!(!format!("{config:?}").contains("t0ken"));
    }

    #[test]
    fn the_idempotency_header_cannot_be_set_by_hand() {
        let problems = HttpSinkConfig::cross_key_problems(&props(&[
            (HTTP_URL, "http://h/in"),
            (HTTP_HEADERS, "Idempotency-Key:fixed"),
        ]));
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].0, HTTP_HEADERS);
        assert!(
            problems[0].1.contains("which the sink sets itself"),
            "{}",
            problems[0].1
        );
    }
}
