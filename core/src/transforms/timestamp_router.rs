//! `TimestampRouter`: renames the topic from a format with `${topic}` and `${timestamp}`, the
//! record's timestamp written with a Java `SimpleDateFormat`-style pattern in UTC
//! (`yyyyMMdd` by default). Supported letters: `y M d H m s S`; `'quoted'` text is literal.

use crate::config::{
    ConfigDef, ConfigKey, ConfigMap, ConfigType, ConfigValue, Importance, Validator,
};
use crate::error::{ConfigError, TransformError};
use crate::record::SinkRecord;
use crate::transforms::Transformation;

const TOPIC_FORMAT: &str = "topic.format";
const TIMESTAMP_FORMAT: &str = "timestamp.format";

/// One piece of a date pattern.
#[derive(Debug, Clone, PartialEq)]
enum Part {
    Literal(String),
    /// A pattern letter and how many times it repeats (`yyyy` is `('y', 4)`).
    Field(char, usize),
}

fn parse_pattern(pattern: &str) -> Result<Vec<Part>, String> {
    let mut parts = Vec::new();
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\'' {
            let mut text = String::new();
            loop {
                match chars.next() {
                    Some('\'') if chars.peek() == Some(&'\'') => {
                        chars.next();
                        text.push('\'');
                    }
                    Some('\'') => break,
                    Some(other) => text.push(other),
                    None => return Err(format!("unclosed quote in '{pattern}'")),
                }
            }
            // '' outside text is a literal quote.
            parts.push(Part::Literal(if text.is_empty() {
                "'".into()
            } else {
                text
            }));
        } else if c.is_ascii_alphabetic() {
            if !"yMdHmsS".contains(c) {
                return Err(format!(
                    "unsupported pattern letter '{c}' in '{pattern}'; supported: y M d H m s S and 'quoted' text"
                ));
            }
            let mut count = 1;
            while chars.next_if_eq(&c).is_some() {
                count += 1;
            }
            parts.push(Part::Field(c, count));
        } else {
            parts.push(Part::Literal(c.to_string()));
        }
    }
    Ok(parts)
}

fn check_pattern(value: &ConfigValue) -> Result<(), String> {
    match value {
        ConfigValue::String(s) => parse_pattern(s).map(|_| ()),
        _ => Err("expected a date pattern".into()),
    }
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (Howard Hinnant's method).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Formats epoch milliseconds with a parsed pattern, in UTC.
fn format_millis(parts: &[Part], millis: i64) -> String {
    let days = millis.div_euclid(86_400_000);
    let ms_of_day = millis.rem_euclid(86_400_000);
    let (year, month, day) = civil_from_days(days);
    let mut out = String::new();
    for part in parts {
        match part {
            Part::Literal(text) => out.push_str(text),
            Part::Field(letter, width) => {
                let value = match letter {
                    'y' if *width == 2 => year.rem_euclid(100),
                    'y' => year,
                    'M' => i64::from(month),
                    'd' => i64::from(day),
                    'H' => ms_of_day / 3_600_000,
                    'm' => ms_of_day / 60_000 % 60,
                    's' => ms_of_day / 1000 % 60,
                    _ => ms_of_day % 1000,
                };
                out.push_str(&format!("{value:0width$}", width = *width));
            }
        }
    }
    out
}

#[derive(Debug, Clone)]
pub struct TimestampRouter {
    topic_format: String,
    pattern: Vec<Part>,
}

impl TimestampRouter {
    pub fn config_def() -> ConfigDef {
        ConfigDef::new()
            .define(
                ConfigKey::new(
                    TOPIC_FORMAT,
                    ConfigType::String,
                    Importance::High,
                    "New topic name; ${topic} and ${timestamp} are replaced.",
                )
                .default("${topic}-${timestamp}"),
            )
            .define(
                ConfigKey::new(
                    TIMESTAMP_FORMAT,
                    ConfigType::String,
                    Importance::High,
                    "Date pattern (SimpleDateFormat letters y M d H m s S), in UTC.",
                )
                .default("yyyyMMdd")
                .validator(Validator::Custom {
                    check: check_pattern,
                    allowed: "date pattern with y M d H m s S",
                }),
            )
    }

    pub fn configure(settings: &ConfigMap, prefix: &str) -> Result<Self, ConfigError> {
        let parsed = TimestampRouter::config_def().parse_prefixed(settings, prefix)?;
        let pattern_text = parsed.string(TIMESTAMP_FORMAT)?.unwrap_or_default();
        let pattern = parse_pattern(pattern_text).map_err(|reason| ConfigError::InvalidValue {
            key: parsed.full_key(TIMESTAMP_FORMAT),
            value: pattern_text.to_owned(),
            reason,
        })?;
        Ok(TimestampRouter {
            topic_format: parsed.string(TOPIC_FORMAT)?.unwrap_or_default().to_owned(),
            pattern,
        })
    }
}

impl Transformation for TimestampRouter {
    fn apply(&self, mut record: SinkRecord) -> Result<Option<SinkRecord>, TransformError> {
        let millis = record.timestamp.ok_or_else(|| {
            TransformError::new(
                "TimestampRouter",
                format!("record {} has no timestamp to route by", record.original),
            )
        })?;
        let stamp = format_millis(&self.pattern, millis);
        record.topic = self
            .topic_format
            .replace("${topic}", &record.topic)
            .replace("${timestamp}", &stamp)
            .into();
        Ok(Some(record))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Value;
    use crate::transforms::testkit::config;

    fn record(ts: Option<i64>) -> SinkRecord {
        let mut r = SinkRecord::new("orders", 0, 9, Value::Null);
        r.timestamp = ts;
        r
    }

    #[test]
    fn the_default_format_appends_the_utc_date() {
        let t = TimestampRouter::configure(&ConfigMap::new(), "").expect("defaults");
        // 2024-02-29T23:59:59.999Z
        let out = t
            .apply(record(Some(1_709_251_199_999)))
            .expect("has ts")
            .expect("kept");
        assert_eq!(out.topic, "orders-20240229");
    }

    #[test]
    fn custom_formats_with_time_fields_and_quoted_text() {
        let t = TimestampRouter::configure(
            &config(&[
                ("topic.format", "${timestamp}/${topic}"),
                ("timestamp.format", "yy-MM-dd'T'HH:mm:ss.SSS"),
            ]),
            "",
        )
        .expect("valid");
        let out = t
            .apply(record(Some(1_000_000_000_123)))
            .expect("has ts")
            .expect("kept");
        assert_eq!(out.topic, "01-09-09T01:46:40.123/orders");
    }

    #[test]
    fn times_before_1970_format_correctly() {
        let parts = parse_pattern("yyyy-MM-dd HH").expect("valid");
        assert_eq!(format_millis(&parts, -1), "1969-12-31 23");
    }

    #[test]
    fn a_record_without_timestamp_is_refused_naming_it() {
        let t = TimestampRouter::configure(&ConfigMap::new(), "").expect("defaults");
        let err = t.apply(record(None)).expect_err("no ts");
        assert_eq!(
            err.to_string(),
            "transform TimestampRouter failed: record orders-0@9 has no timestamp to route by"
        );
    }

    #[test]
    fn unsupported_pattern_letters_are_refused_at_configuration() {
        let err = TimestampRouter::configure(
            &config(&[("timestamp.format", "EEE yyyy")]),
            "transforms.tr.",
        )
        .expect_err("E unsupported");
        assert_eq!(
            err.to_string(),
            "invalid value 'EEE yyyy' for transforms.tr.timestamp.format: unsupported pattern letter 'E' in 'EEE yyyy'; supported: y M d H m s S and 'quoted' text"
        );
    }
}
