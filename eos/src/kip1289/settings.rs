//! The `exactly.once.kip1289.*` settings, declared once ([`config_def`]) and parsed into
//! [`Kip1289Settings`].

use std::time::Duration;

use spillway_core::config::{ConfigDef, ConfigKey, ConfigType, Importance, Validator};
use spillway_core::error::ConfigError;
use spillway_core::ConfigMap;

use super::wire::DraftLayout;

/// Api key of TxnShareAcknowledge. The drafts disagree (93 in PR #22357, 94 in another
/// apache/kafka snapshot, 95 in the author's fork), so it is a setting.
pub const API_KEY_CONFIG: &str = "exactly.once.kip1289.api.key";
/// How long to wait for the coordinator lookup, the producer-identity fetch and the
/// TxnShareAcknowledge response.
pub const REQUEST_TIMEOUT_CONFIG: &str = "exactly.once.kip1289.request.timeout.ms";

/// Which draft's field layout to speak: `types-array` (the brief's §7.3; keys 94 and 95) or
/// `single-type` (the apache/kafka snapshot declaring key 93).
pub const SCHEMA_CONFIG: &str = "exactly.once.kip1289.schema";

const SCHEMAS: &[&str] = &["types-array", "single-type"];

/// The api key PR apache/kafka#22357 declares.
pub const DEFAULT_API_KEY: i16 = 93;

/// Declaration of the KIP-1289 settings.
pub fn config_def() -> ConfigDef {
    ConfigDef::new()
        .define(
            ConfigKey::new(
                API_KEY_CONFIG,
                ConfigType::Int,
                Importance::Low,
                "Api key of the draft TxnShareAcknowledge request (KIP-1289). The drafts use \
                 93 (apache/kafka PR #22357), 94 and 95; set the one your broker build \
                 advertises in ApiVersions. No released Kafka broker implements it.",
            )
            .default(DEFAULT_API_KEY.to_string())
            .validator(Validator::Between(0, i16::MAX as i64))
            .group("Exactly-once (KIP-1289 draft)", 1),
        )
        .define(
            ConfigKey::new(
                SCHEMA_CONFIG,
                ConfigType::String,
                Importance::Low,
                "Which draft layout of TxnShareAcknowledge to use. types-array: an \
                 AcknowledgeTypes array per batch and an ErrorMessage per partition result \
                 (the KIP-1289 brief, drafts with keys 94 and 95). single-type: one \
                 AcknowledgeType per batch and no ErrorMessage (the apache/kafka snapshot \
                 declaring key 93).",
            )
            .default("types-array")
            .validator(Validator::OneOf(SCHEMAS))
            .group("Exactly-once (KIP-1289 draft)", 2),
        )
        .define(
            ConfigKey::new(
                REQUEST_TIMEOUT_CONFIG,
                ConfigType::Int,
                Importance::Low,
                "How long the KIP-1289 path waits for each request it sends itself (the \
                 transaction coordinator lookup, the producer-identity fetch and \
                 TxnShareAcknowledge).",
            )
            .default("30000")
            .validator(Validator::Between(1, i32::MAX as i64))
            .group("Exactly-once (KIP-1289 draft)", 3),
        )
}

/// Parsed KIP-1289 settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kip1289Settings {
    pub api_key: i16,
    pub layout: DraftLayout,
    pub request_timeout: Duration,
}

impl Default for Kip1289Settings {
    fn default() -> Self {
        Kip1289Settings {
            api_key: DEFAULT_API_KEY,
            layout: DraftLayout::TypesArray,
            request_timeout: Duration::from_secs(30),
        }
    }
}

impl Kip1289Settings {
    /// Parse the settings out of a connector's properties; other keys are ignored.
    pub fn from_props(props: &ConfigMap) -> Result<Kip1289Settings, ConfigError> {
        let parsed = config_def().parse(props)?;
        let api_key = parsed.int(API_KEY_CONFIG)?;
        let timeout = parsed.int(REQUEST_TIMEOUT_CONFIG)?;
        // One of SCHEMAS (ignoring case), by the validator.
        let layout = match parsed.string(SCHEMA_CONFIG)? {
            Some(s) if s.eq_ignore_ascii_case("single-type") => DraftLayout::SingleType,
            _ => DraftLayout::TypesArray,
        };
        Ok(Kip1289Settings {
            // Range-checked by the validator.
            api_key: i16::try_from(api_key).unwrap_or(DEFAULT_API_KEY),
            layout,
            request_timeout: Duration::from_millis(timeout as u64),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(pairs: &[(&str, &str)]) -> ConfigMap {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_api_key_defaults_to_the_draft_prs_93() {
        let s = Kip1289Settings::from_props(&props(&[])).unwrap();
        assert_eq!(s, Kip1289Settings::default());
        assert_eq!(s.api_key, 93);
    }

    #[test]
    fn the_api_key_of_another_draft_can_be_chosen() {
        let s = Kip1289Settings::from_props(&props(&[
            (API_KEY_CONFIG, "95"),
            (REQUEST_TIMEOUT_CONFIG, "1500"),
        ]))
        .unwrap();
        assert_eq!(s.api_key, 95);
        assert_eq!(s.layout, DraftLayout::TypesArray);
        assert_eq!(s.request_timeout, Duration::from_millis(1500));
    }

    #[test]
    fn the_single_type_draft_layout_can_be_chosen_and_others_are_refused() {
        let s = Kip1289Settings::from_props(&props(&[(SCHEMA_CONFIG, "single-type")])).unwrap();
        assert_eq!(s.layout, DraftLayout::SingleType);
        let err = Kip1289Settings::from_props(&props(&[(SCHEMA_CONFIG, "v2")])).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains(SCHEMA_CONFIG) && msg.contains("types-array, single-type"),
            "{msg}"
        );
    }

    #[test]
    fn an_api_key_outside_int16_is_refused_naming_the_key() {
        let err = Kip1289Settings::from_props(&props(&[(API_KEY_CONFIG, "40000")])).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains(API_KEY_CONFIG) && msg.contains("40000") && msg.contains("32767"),
            "{msg}"
        );
        let err = Kip1289Settings::from_props(&props(&[(API_KEY_CONFIG, "abc")])).unwrap_err();
        assert!(err.to_string().contains(API_KEY_CONFIG), "{err}");
    }
}
