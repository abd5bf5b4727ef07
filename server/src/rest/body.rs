//! Request bodies: read up to `rest.max.body.bytes`, then parsed as JSON with answers that say
//! what is wrong (a 413 for a body too large, a 400 naming the position of a syntax error or the
//! key of a value that is not a configuration value).

use std::collections::BTreeMap;

use actix_web::web::{BytesMut, Payload};
use actix_web::HttpRequest;
use futures::StreamExt;
use serde_json::Value as Json;

use crate::rest::error::ApiError;

/// How many times the limit a too-large body may be before it is refused without reading it.
const DRAIN_FACTOR: usize = 8;

/// Reads the whole body as JSON, refusing more than `limit` bytes.
pub async fn read_json(
    request: &HttpRequest,
    mut payload: Payload,
    limit: usize,
) -> Result<Json, ApiError> {
    let declared = request
        .headers()
        .get(actix_web::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    // A body somewhat too large is read to its end before the 413, so that clients that
    // send it whole before reading the answer see the answer rather than a reset connection.
    let drain_limit = limit.saturating_mul(DRAIN_FACTOR);
    if declared.is_some_and(|n| n > drain_limit) {
        return Err(ApiError::TooLarge { limit });
    }
    let mut body = BytesMut::new();
    let mut seen = 0usize;
    while let Some(chunk) = payload.next().await {
        let chunk = chunk
            .map_err(|e| ApiError::BadRequest(format!("cannot read the request body: {e}")))?;
        seen = seen.saturating_add(chunk.len());
        if seen > drain_limit {
            return Err(ApiError::TooLarge { limit });
        }
        if seen <= limit {
            body.extend_from_slice(&chunk);
        }
    }
    if seen > limit {
        return Err(ApiError::TooLarge { limit });
    }
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::BadJson(
            "the body is empty; expected a JSON object".into(),
        ));
    }
    parse_strict(&body)
}

/// Parses JSON refusing an object that repeats a key: which of the values was meant is
/// ambiguous, and two readers of the body could disagree on it.
pub fn parse_strict(body: &[u8]) -> Result<Json, ApiError> {
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let Strict(value) = serde::Deserialize::deserialize(&mut deserializer)
        .map_err(|e| ApiError::BadJson(e.to_string()))?;
    deserializer
        .end()
        .map_err(|e| ApiError::BadJson(e.to_string()))?;
    Ok(value)
}

/// A JSON value whose objects have no repeated key.
struct Strict(Json);

impl<'de> serde::Deserialize<'de> for Strict {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Strict, D::Error> {
        deserializer.deserialize_any(StrictVisitor).map(Strict)
    }
}

struct StrictVisitor;

impl<'de> serde::de::Visitor<'de> for StrictVisitor {
    type Value = Json;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Json, E> {
        Ok(Json::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Json, E> {
        Ok(Json::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Json, E> {
        Ok(Json::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Json, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Json::Null, Json::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Json, E> {
        Ok(Json::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Json, E> {
        Ok(Json::String(v))
    }

    fn visit_unit<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }

    fn visit_none<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
        let mut out = Vec::new();
        while let Some(Strict(v)) = seq.next_element()? {
            out.push(v);
        }
        Ok(Json::Array(out))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
        let mut out = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if out.contains_key(&key) {
                return Err(serde::de::Error::custom(format!(
                    "duplicate key '{key}': each key may appear once in an object"
                )));
            }
            let Strict(value) = map.next_value()?;
            out.insert(key, value);
        }
        Ok(Json::Object(out))
    }
}

/// A flat JSON object of settings: strings, numbers and booleans as text, arrays as
/// comma-separated lists, `null` as `None` (PATCH removes the key).
pub fn settings(value: &Json, what: &str) -> Result<BTreeMap<String, Option<String>>, ApiError> {
    let Json::Object(map) = value else {
        return Err(ApiError::BadRequest(format!(
            "{what} must be a JSON object of settings, found {}",
            kind(value)
        )));
    };
    map.iter()
        .map(|(key, value)| Ok((key.clone(), text(key, value)?)))
        .collect()
}

/// Like [`settings`], refusing `null` values.
pub fn config(value: &Json, what: &str) -> Result<BTreeMap<String, String>, ApiError> {
    settings(value, what)?
        .into_iter()
        .map(|(k, v)| match v {
            Some(v) => Ok((k, v)),
            None => Err(ApiError::BadRequest(format!(
                "the value of '{k}' in {what} is null; give a value, or leave the key out (PATCH removes keys with null)"
            ))),
        })
        .collect()
}

fn text(key: &str, value: &Json) -> Result<Option<String>, ApiError> {
    spillway_core::config::config_value_from_json(key, value)
        .map_err(|e| ApiError::BadRequest(e.to_string()))
}

fn kind(value: &Json) -> &'static str {
    match value {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "an array",
        Json::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeated_key_is_refused_at_any_depth_naming_it() {
        for (body, key) in [
            (r#"{"a": 1, "a": 2}"#, "a"),
            (r#"{"config": {"topics": "x", "topics": "y"}}"#, "topics"),
            (r#"[{"k": 1}, {"k": 1, "k": 1}]"#, "k"),
        ] {
            let err = parse_strict(body.as_bytes()).expect_err(body);
            assert!(
                err.to_string().contains(&format!("duplicate key '{key}'")),
                "{err}"
            );
        }
    }

    #[test]
    fn ordinary_json_parses_as_serde_json_does() {
        let body =
            r#"{"a": [1, -2, 3.5, true, null, "s"], "b": {"c": {}}, "d": 18446744073709551615}"#;
        let strict = parse_strict(body.as_bytes()).expect("valid");
        let plain: Json = serde_json::from_str(body).expect("valid");
        assert_eq!(strict, plain);
        assert!(parse_strict(b"{} trailing").is_err());
        assert!(parse_strict(b"{\"a\": ").is_err());
    }
}
