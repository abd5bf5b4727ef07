//! The built-in transforms and predicates by name. Each is known by its short name
//! (`InsertField$Value`) and by its Kafka Connect class name
//! (`org.apache.kafka.connect.transforms.InsertField$Value`).

use crate::config::{ConfigDef, ConfigMap};
use crate::error::ConfigError;
use crate::transforms::cast::Cast;
use crate::transforms::extract_field::ExtractField;
use crate::transforms::filter::Filter;
use crate::transforms::headers::{DropHeaders, HeaderFrom, InsertHeader};
use crate::transforms::hoist_field::HoistField;
use crate::transforms::insert_field::InsertField;
use crate::transforms::mask_field::MaskField;
use crate::transforms::predicates::{HasHeaderKey, Predicate, RecordIsTombstone, TopicNameMatches};
use crate::transforms::regex_router::RegexRouter;
use crate::transforms::replace_field::ReplaceField;
use crate::transforms::side::Side;
use crate::transforms::timestamp_router::TimestampRouter;
use crate::transforms::value_to_key::ValueToKey;
use crate::transforms::Transformation;

const TRANSFORM_PACKAGE: &str = "org.apache.kafka.connect.transforms.";
const PREDICATE_PACKAGE: &str = "org.apache.kafka.connect.transforms.predicates.";

type BuildTransform = fn(Side, &ConfigMap, &str) -> Result<Box<dyn Transformation>, ConfigError>;
type BuildPredicate = fn(&ConfigMap, &str) -> Result<Box<dyn Predicate>, ConfigError>;

/// One transform type: its name, whether it has `$Key`/`$Value` variants, its settings and
/// how to build it (the side is ignored by transforms without variants).
pub struct TransformType {
    pub name: &'static str,
    pub keyed: bool,
    pub config_def: fn() -> ConfigDef,
    build: BuildTransform,
}

impl TransformType {
    pub fn build(
        &self,
        side: Side,
        settings: &ConfigMap,
        prefix: &str,
    ) -> Result<Box<dyn Transformation>, ConfigError> {
        (self.build)(side, settings, prefix)
    }

    /// The short name with the variant suffix when there is one.
    pub fn display_name(&self, side: Side) -> String {
        if self.keyed {
            format!("{}${}", self.name, side.suffix())
        } else {
            self.name.to_owned()
        }
    }
}

impl std::fmt::Debug for TransformType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransformType")
            .field("name", &self.name)
            .field("keyed", &self.keyed)
            .finish()
    }
}

fn boxed<T: Transformation + 'static>(
    t: Result<T, ConfigError>,
) -> Result<Box<dyn Transformation>, ConfigError> {
    t.map(|t| Box::new(t) as Box<dyn Transformation>)
}

pub static TRANSFORMS: &[TransformType] = &[
    TransformType {
        name: "Cast",
        keyed: true,
        config_def: Cast::config_def,
        build: |s, c, p| boxed(Cast::configure(s, c, p)),
    },
    TransformType {
        name: "DropHeaders",
        keyed: false,
        config_def: DropHeaders::config_def,
        build: |_, c, p| boxed(DropHeaders::configure(c, p)),
    },
    TransformType {
        name: "ExtractField",
        keyed: true,
        config_def: ExtractField::config_def,
        build: |s, c, p| boxed(ExtractField::configure(s, c, p)),
    },
    TransformType {
        name: "Filter",
        keyed: false,
        config_def: Filter::config_def,
        build: |_, _, _| boxed(Ok(Filter)),
    },
    TransformType {
        name: "HeaderFrom",
        keyed: true,
        config_def: HeaderFrom::config_def,
        build: |s, c, p| boxed(HeaderFrom::configure(s, c, p)),
    },
    TransformType {
        name: "HoistField",
        keyed: true,
        config_def: HoistField::config_def,
        build: |s, c, p| boxed(HoistField::configure(s, c, p)),
    },
    TransformType {
        name: "InsertField",
        keyed: true,
        config_def: InsertField::config_def,
        build: |s, c, p| boxed(InsertField::configure(s, c, p)),
    },
    TransformType {
        name: "InsertHeader",
        keyed: false,
        config_def: InsertHeader::config_def,
        build: |_, c, p| boxed(InsertHeader::configure(c, p)),
    },
    TransformType {
        name: "MaskField",
        keyed: true,
        config_def: MaskField::config_def,
        build: |s, c, p| boxed(MaskField::configure(s, c, p)),
    },
    TransformType {
        name: "RegexRouter",
        keyed: false,
        config_def: RegexRouter::config_def,
        build: |_, c, p| boxed(RegexRouter::configure(c, p)),
    },
    TransformType {
        name: "ReplaceField",
        keyed: true,
        config_def: ReplaceField::config_def,
        build: |s, c, p| boxed(ReplaceField::configure(s, c, p)),
    },
    TransformType {
        name: "TimestampRouter",
        keyed: false,
        config_def: TimestampRouter::config_def,
        build: |_, c, p| boxed(TimestampRouter::configure(c, p)),
    },
    TransformType {
        name: "ValueToKey",
        keyed: false,
        config_def: ValueToKey::config_def,
        build: |_, c, p| boxed(ValueToKey::configure(c, p)),
    },
];

/// One predicate type.
pub struct PredicateType {
    pub name: &'static str,
    pub config_def: fn() -> ConfigDef,
    build: BuildPredicate,
}

impl PredicateType {
    pub fn build(
        &self,
        settings: &ConfigMap,
        prefix: &str,
    ) -> Result<Box<dyn Predicate>, ConfigError> {
        (self.build)(settings, prefix)
    }
}

impl std::fmt::Debug for PredicateType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PredicateType")
            .field("name", &self.name)
            .finish()
    }
}

pub static PREDICATES: &[PredicateType] = &[
    PredicateType {
        name: "HasHeaderKey",
        config_def: HasHeaderKey::config_def,
        build: |c, p| HasHeaderKey::configure(c, p).map(|x| Box::new(x) as Box<dyn Predicate>),
    },
    PredicateType {
        name: "RecordIsTombstone",
        config_def: RecordIsTombstone::config_def,
        build: |_, _| Ok(Box::new(RecordIsTombstone)),
    },
    PredicateType {
        name: "TopicNameMatches",
        config_def: TopicNameMatches::config_def,
        build: |c, p| TopicNameMatches::configure(c, p).map(|x| Box::new(x) as Box<dyn Predicate>),
    },
];

/// Every accepted short transform name, for messages.
pub fn transform_names() -> String {
    TRANSFORMS
        .iter()
        .flat_map(|t| {
            if t.keyed {
                vec![format!("{}$Key", t.name), format!("{}$Value", t.name)]
            } else {
                vec![t.name.to_owned()]
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Finds the transform named `name` (read from `key`) and the side it works on.
pub fn lookup_transform(
    key: &str,
    name: &str,
) -> Result<(&'static TransformType, Side), ConfigError> {
    let trimmed = name.trim();
    let short = trimmed.strip_prefix(TRANSFORM_PACKAGE).unwrap_or(trimmed);
    let (base, suffix) = match short.split_once('$') {
        Some((base, suffix)) => (base, Some(suffix)),
        None => (short, None),
    };
    let unknown = || ConfigError::UnknownPlugin {
        kind: "transform",
        key: key.to_owned(),
        name: name.to_owned(),
        expected: transform_names(),
    };
    let found = TRANSFORMS
        .iter()
        .find(|t| t.name == base)
        .ok_or_else(unknown)?;
    match (found.keyed, suffix) {
        (true, Some("Key")) => Ok((found, Side::Key)),
        (true, Some("Value")) => Ok((found, Side::Value)),
        (true, None) => Err(ConfigError::InvalidValue {
            key: key.to_owned(),
            value: name.to_owned(),
            reason: format!(
                "{base} needs a $Key or $Value suffix to say which part of the record it changes"
            ),
        }),
        (false, None) => Ok((found, Side::Value)),
        _ => Err(unknown()),
    }
}

/// Finds the predicate named `name` (read from `key`).
pub fn lookup_predicate(key: &str, name: &str) -> Result<&'static PredicateType, ConfigError> {
    let trimmed = name.trim();
    let short = trimmed.strip_prefix(PREDICATE_PACKAGE).unwrap_or(trimmed);
    PREDICATES
        .iter()
        .find(|p| p.name == short)
        .ok_or_else(|| ConfigError::UnknownPlugin {
            kind: "predicate",
            key: key.to_owned(),
            name: name.to_owned(),
            expected: PREDICATES
                .iter()
                .map(|p| p.name)
                .collect::<Vec<_>>()
                .join(", "),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_and_connect_class_names_find_the_same_transform() {
        let (a, side_a) = lookup_transform("k", "InsertField$Value").expect("short");
        let (b, side_b) =
            lookup_transform("k", "org.apache.kafka.connect.transforms.InsertField$Value")
                .expect("class");
        assert_eq!((a.name, side_a), (b.name, side_b));
        assert_eq!(side_a, Side::Value);
        let (f, _) =
            lookup_transform("k", "org.apache.kafka.connect.transforms.Filter").expect("class");
        assert_eq!(f.name, "Filter");
        let (k, side) = lookup_transform("k", "Cast$Key").expect("key variant");
        assert_eq!((k.name, side), ("Cast", Side::Key));
    }

    #[test]
    fn a_keyed_transform_without_suffix_asks_for_one() {
        let err = lookup_transform("transforms.a.type", "MaskField").expect_err("no suffix");
        assert_eq!(
            err.to_string(),
            "invalid value 'MaskField' for transforms.a.type: MaskField needs a $Key or $Value suffix to say which part of the record it changes"
        );
    }

    #[test]
    fn unknown_transforms_list_the_known_names() {
        let err = lookup_transform("transforms.a.type", "Flatten$Value").expect_err("not built in");
        let message = err.to_string();
        assert!(message.starts_with("unknown transform 'Flatten$Value' for transforms.a.type; expected one of Cast$Key, Cast$Value, DropHeaders"), "{message}");
        assert!(
            lookup_transform("k", "Filter$Value").is_err(),
            "Filter has no variants"
        );
    }

    #[test]
    fn predicates_are_found_by_short_and_class_name() {
        assert_eq!(
            lookup_predicate("k", "RecordIsTombstone")
                .expect("short")
                .name,
            "RecordIsTombstone"
        );
        assert_eq!(
            lookup_predicate(
                "k",
                "org.apache.kafka.connect.transforms.predicates.TopicNameMatches"
            )
            .expect("class")
            .name,
            "TopicNameMatches"
        );
        let err = lookup_predicate("predicates.p.type", "IsEmpty").expect_err("unknown");
        assert_eq!(
            err.to_string(),
            "unknown predicate 'IsEmpty' for predicates.p.type; expected one of HasHeaderKey, RecordIsTombstone, TopicNameMatches"
        );
    }
}
