//! The transform chain a connector configures: `transforms=a,b` with `transforms.a.type=...`
//! and each transform's own keys under `transforms.a.`; `predicates=p` with
//! `predicates.p.type=...`; and per transform the implicit `predicate` (an alias from
//! `predicates`) and `negate` keys. A transform with a predicate applies only to records for
//! which the predicate is true (false with `negate=true`).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::config::{
    parse_list, ConfigDef, ConfigInfo, ConfigKey, ConfigMap, ConfigType, Importance,
};
use crate::convert::strip_prefix;
use crate::error::{ConfigError, TransformError};
use crate::record::SinkRecord;
use crate::transforms::predicates::Predicate;
use crate::transforms::registry::{lookup_predicate, lookup_transform};
use crate::transforms::Transformation;

const TRANSFORMS: &str = "transforms";
const PREDICATES: &str = "predicates";

/// One configured transform.
#[derive(Debug)]
struct Step {
    /// How messages name it: `'mask' (MaskField$Value)`.
    label: String,
    transform: Box<dyn Transformation>,
    predicate: Option<Arc<dyn Predicate>>,
    negate: bool,
}

/// The configured transforms, applied in order.
#[derive(Debug, Default)]
pub struct TransformChain {
    steps: Vec<Step>,
}

/// The keys every transform alias has besides its own.
fn alias_def() -> ConfigDef {
    ConfigDef::new()
        .define(ConfigKey::new("type", ConfigType::Class, Importance::High, "Transform type: a short name (InsertField$Value) or Connect class name."))
        .define(ConfigKey::new("predicate", ConfigType::String, Importance::Medium, "Alias of a predicate from 'predicates'; the transform applies only where it holds.").default(""))
        .define(ConfigKey::new("negate", ConfigType::Boolean, Importance::Medium, "Apply where the predicate does not hold.").default("false"))
}

fn predicate_alias_def() -> ConfigDef {
    ConfigDef::new().define(ConfigKey::new(
        "type",
        ConfigType::Class,
        Importance::High,
        "Predicate type: a short name (TopicNameMatches) or Connect class name.",
    ))
}

/// Aliases listed under `key`, refusing repeats.
fn aliases(props: &ConfigMap, key: &str) -> Result<Vec<String>, ConfigError> {
    let list = parse_list(props.get(key).map(String::as_str).unwrap_or(""));
    for (i, alias) in list.iter().enumerate() {
        if alias.is_empty() {
            return Err(ConfigError::InvalidValue {
                key: key.to_owned(),
                value: list.join(","),
                reason: "contains an empty alias".into(),
            });
        }
        if list[..i].contains(alias) {
            return Err(ConfigError::InvalidValue {
                key: key.to_owned(),
                value: list.join(","),
                reason: format!("lists the alias '{alias}' more than once"),
            });
        }
    }
    Ok(list)
}

fn build_predicates(
    props: &ConfigMap,
) -> Result<BTreeMap<String, Arc<dyn Predicate>>, ConfigError> {
    let mut out = BTreeMap::new();
    let mut errors = Vec::new();
    for alias in aliases(props, PREDICATES)? {
        let prefix = format!("{PREDICATES}.{alias}.");
        let settings = strip_prefix(props, &prefix);
        let built = predicate_alias_def()
            .parse_prefixed(&settings, &prefix)
            .and_then(|parsed| {
                let type_name = parsed.class("type")?.unwrap_or_default().to_owned();
                lookup_predicate(&format!("{prefix}type"), &type_name)
            })
            .and_then(|kind| kind.build(&settings, &prefix));
        match built {
            Ok(p) => {
                out.insert(alias, Arc::from(p));
            }
            Err(e) => errors.push(e),
        }
    }
    match ConfigError::from_list(errors) {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

fn build_step(
    props: &ConfigMap,
    alias: &str,
    predicates: &BTreeMap<String, Arc<dyn Predicate>>,
) -> Result<Step, ConfigError> {
    let prefix = format!("{TRANSFORMS}.{alias}.");
    let settings = strip_prefix(props, &prefix);
    let parsed = alias_def().parse_prefixed(&settings, &prefix)?;
    let type_name = parsed.class("type")?.unwrap_or_default();
    let (kind, side) = lookup_transform(&format!("{prefix}type"), type_name)?;
    let transform = kind.build(side, &settings, &prefix)?;
    let predicate = match parsed.string("predicate")? {
        None | Some("") => None,
        Some(name) => Some(predicates.get(name).cloned().ok_or_else(|| ConfigError::InvalidValue {
            key: format!("{prefix}predicate"),
            value: name.to_owned(),
            reason: format!(
                "no predicate has that alias; list it in '{PREDICATES}' (now '{}') and set {PREDICATES}.{name}.type",
                props.get(PREDICATES).map(String::as_str).unwrap_or("")
            ),
        })?),
    };
    Ok(Step {
        label: format!("'{alias}' ({})", kind.display_name(side)),
        transform,
        predicate,
        negate: parsed.boolean("negate")?,
    })
}

impl TransformChain {
    /// A chain with no transforms: records pass unchanged.
    pub fn empty() -> Self {
        TransformChain::default()
    }

    /// Builds the chain from a connector configuration, reporting every bad key at once.
    pub fn from_config(props: &ConfigMap) -> Result<Self, ConfigError> {
        let predicates = build_predicates(props);
        let transform_aliases = aliases(props, TRANSFORMS)?;
        let mut errors = Vec::new();
        let predicates = match predicates {
            Ok(p) => p,
            Err(e) => {
                errors.push(e);
                BTreeMap::new()
            }
        };
        let mut steps = Vec::new();
        for alias in &transform_aliases {
            match build_step(props, alias, &predicates) {
                Ok(step) => steps.push(step),
                Err(e) => errors.push(e),
            }
        }
        match ConfigError::from_list(errors.iter().flat_map(|e| e.flatten()).cloned().collect()) {
            Some(e) => Err(e),
            None => Ok(TransformChain { steps }),
        }
    }

    pub fn len(&self) -> usize {
        self.steps.len()
    }

    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// Runs the record through every transform whose predicate allows it; `Ok(None)` when a
    /// transform dropped it. Errors name the transform's alias and type.
    pub fn apply(&self, record: SinkRecord) -> Result<Option<SinkRecord>, TransformError> {
        let mut record = record;
        for step in &self.steps {
            let applies = step
                .predicate
                .as_ref()
                .is_none_or(|p| p.test(&record) != step.negate);
            if !applies {
                continue;
            }
            match step.transform.apply(record) {
                Ok(Some(next)) => record = next,
                Ok(None) => return Ok(None),
                Err(e) => return Err(TransformError::new(step.label.clone(), e.detail)),
            }
        }
        Ok(Some(record))
    }
}

/// The REST `validate` entries for every transform and predicate alias: their common keys,
/// each type's own keys, and the errors building them found.
pub fn validate_transforms(props: &ConfigMap) -> Vec<ConfigInfo> {
    let mut infos = Vec::new();
    for (list_key, is_transform) in [(TRANSFORMS, true), (PREDICATES, false)] {
        let common = if is_transform {
            alias_def
        } else {
            predicate_alias_def
        };
        let Ok(list) = aliases(props, list_key) else {
            continue; // The list key's own entry reports this.
        };
        for alias in list {
            let prefix = format!("{list_key}.{alias}.");
            let settings = strip_prefix(props, &prefix);
            let group = format!(
                "{}: {alias}",
                if is_transform {
                    "Transforms"
                } else {
                    "Predicates"
                }
            );
            let mut entries = common().validate_prefixed(&settings, &prefix);
            let type_key = format!("{prefix}type");
            if let Some(type_name) = settings.get("type") {
                let found = if is_transform {
                    lookup_transform(&type_key, type_name).map(|(kind, _)| (kind.config_def)())
                } else {
                    lookup_predicate(&type_key, type_name).map(|kind| (kind.config_def)())
                };
                match found {
                    Ok(def) => entries.extend(def.validate_prefixed(&settings, &prefix)),
                    Err(e) => add_error(&mut entries, &type_key, e.to_string()),
                }
            }
            let no_errors_yet = entries.iter().all(|e| e.value.errors.is_empty());
            if no_errors_yet && is_transform {
                let predicates = build_predicates(props).unwrap_or_default();
                if let Err(e) = build_step(props, &alias, &predicates) {
                    for err in e.flatten() {
                        let key = err.key().unwrap_or(&type_key).to_owned();
                        add_error(&mut entries, &key, err.to_string());
                    }
                }
            }
            for entry in &mut entries {
                entry.definition.group = Some(group.clone());
            }
            infos.extend(entries);
        }
    }
    infos
}

fn add_error(entries: &mut [ConfigInfo], key: &str, message: String) {
    let index = entries
        .iter()
        .position(|e| e.value.name == key)
        .unwrap_or(0);
    if let Some(entry) = entries.get_mut(index) {
        entry.value.errors.push(message);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Value;
    use crate::record::Header;
    use crate::transforms::testkit::config;

    fn chain(pairs: &[(&str, &str)]) -> TransformChain {
        TransformChain::from_config(&config(pairs)).expect("valid chain")
    }

    #[test]
    fn transforms_apply_in_the_listed_order() {
        let c = chain(&[
            ("transforms", "hoist,insert"),
            ("transforms.hoist.type", "HoistField$Value"),
            ("transforms.hoist.field", "line"),
            (
                "transforms.insert.type",
                "org.apache.kafka.connect.transforms.InsertField$Value",
            ),
            ("transforms.insert.topic.field", "topic"),
        ]);
        assert_eq!(c.len(), 2);
        let out = c
            .apply(SinkRecord::new("logs", 0, 0, "hello".into()))
            .expect("ok")
            .expect("kept");
        assert_eq!(
            out.value,
            Value::string_map([("line", "hello".into()), ("topic", "logs".into())])
        );
    }

    #[test]
    fn a_filter_with_a_predicate_drops_only_matching_records() {
        let c = chain(&[
            ("transforms", "dropTombstones"),
            ("transforms.dropTombstones.type", "Filter"),
            ("transforms.dropTombstones.predicate", "isTombstone"),
            ("predicates", "isTombstone"),
            (
                "predicates.isTombstone.type",
                "org.apache.kafka.connect.transforms.predicates.RecordIsTombstone",
            ),
        ]);
        assert_eq!(c.apply(SinkRecord::new("t", 0, 0, Value::Null)), Ok(None));
        assert!(c
            .apply(SinkRecord::new("t", 0, 1, "x".into()))
            .expect("ok")
            .is_some());
    }

    #[test]
    fn negate_applies_the_transform_where_the_predicate_is_false() {
        let c = chain(&[
            ("transforms", "keepTraced"),
            ("transforms.keepTraced.type", "Filter"),
            ("transforms.keepTraced.predicate", "traced"),
            ("transforms.keepTraced.negate", "true"),
            ("predicates", "traced"),
            ("predicates.traced.type", "HasHeaderKey"),
            ("predicates.traced.name", "traceparent"),
        ]);
        let mut traced = SinkRecord::new("t", 0, 0, "x".into());
        traced
            .headers
            .push(Header::new("traceparent", None, Value::Null));
        assert!(c.apply(traced).expect("ok").is_some());
        assert_eq!(c.apply(SinkRecord::new("t", 0, 1, "x".into())), Ok(None));
    }

    #[test]
    fn transform_errors_name_the_alias_and_type() {
        let c = chain(&[
            ("transforms", "ins"),
            ("transforms.ins.type", "InsertField$Value"),
            ("transforms.ins.topic.field", "t"),
        ]);
        let err = c
            .apply(SinkRecord::new("t", 0, 0, "text".into()))
            .expect_err("not a map");
        assert!(
            err.to_string().starts_with(
                "transform 'ins' (InsertField$Value) failed: without a schema only maps"
            ),
            "{err}"
        );
    }

    #[test]
    fn every_configuration_problem_is_reported_at_once() {
        let err = TransformChain::from_config(&config(&[
            ("transforms", "a,b,c"),
            ("transforms.a.type", "Nope"),
            ("transforms.b.type", "MaskField$Value"),
            ("transforms.c.type", "Filter"),
            ("transforms.c.predicate", "missing"),
        ]))
        .expect_err("three problems");
        let messages: Vec<String> = err.flatten().iter().map(|e| e.to_string()).collect();
        assert_eq!(messages.len(), 3, "{messages:?}");
        assert!(messages[0].starts_with("unknown transform 'Nope' for transforms.a.type"));
        assert_eq!(
            messages[1],
            "missing required configuration 'transforms.b.fields', which has no default value"
        );
        assert_eq!(
            messages[2],
            "invalid value 'missing' for transforms.c.predicate: no predicate has that alias; list it in 'predicates' (now '') and set predicates.missing.type"
        );
    }

    #[test]
    fn a_repeated_alias_is_refused() {
        let err = TransformChain::from_config(&config(&[
            ("transforms", "a,a"),
            ("transforms.a.type", "Filter"),
        ]))
        .expect_err("duplicate");
        assert_eq!(
            err.to_string(),
            "invalid value 'a,a' for transforms: lists the alias 'a' more than once"
        );
    }

    #[test]
    fn a_transform_without_type_is_refused_naming_the_key() {
        let err =
            TransformChain::from_config(&config(&[("transforms", "x")])).expect_err("no type");
        assert_eq!(
            err.to_string(),
            "missing required configuration 'transforms.x.type', which has no default value"
        );
    }

    #[test]
    fn validation_lists_each_alias_keys_with_their_errors() {
        let infos = validate_transforms(&config(&[
            ("transforms", "mask"),
            ("transforms.mask.type", "MaskField$Value"),
            ("transforms.mask.fields", ""),
        ]));
        let names: Vec<&str> = infos.iter().map(|i| i.value.name.as_str()).collect();
        assert_eq!(
            names,
            vec![
                "transforms.mask.type",
                "transforms.mask.predicate",
                "transforms.mask.negate",
                "transforms.mask.fields",
                "transforms.mask.replacement"
            ]
        );
        let fields = &infos[3];
        assert_eq!(
            fields.value.errors,
            vec!["invalid value '' for transforms.mask.fields: must list at least one item"]
        );
        assert_eq!(fields.definition.group.as_deref(), Some("Transforms: mask"));
    }

    #[test]
    fn validation_reports_errors_only_building_the_transform_finds() {
        let infos = validate_transforms(&config(&[
            ("transforms", "hf"),
            ("transforms.hf.type", "HeaderFrom$Value"),
            ("transforms.hf.fields", "a,b"),
            ("transforms.hf.headers", "h"),
            ("transforms.hf.operation", "copy"),
            ("transforms.hf.predicate", "nope"),
        ]));
        let errors: Vec<(&str, &String)> = infos
            .iter()
            .flat_map(|i| {
                i.value
                    .errors
                    .iter()
                    .map(move |e| (i.value.name.as_str(), e))
            })
            .collect();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].0, "transforms.hf.type");
        assert!(errors[0].1.contains("lists 2 field(s)"));
    }
}
