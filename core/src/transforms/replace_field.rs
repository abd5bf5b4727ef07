//! `ReplaceField`: keeps only `include`d fields (all when empty), drops `exclude`d ones, and
//! renames with `renames=old:new,...`. Tombstones pass through.

use std::collections::BTreeMap;

use crate::config::{
    ConfigDef, ConfigKey, ConfigMap, ConfigType, ConfigValue, Importance, Validator,
};
use crate::data::{Struct, Value};
use crate::error::{ConfigError, TransformError};
use crate::record::SinkRecord;
use crate::schema::Field;
use crate::transforms::side::{key_str, require_map, require_struct, with_fields, Side};
use crate::transforms::Transformation;

const EXCLUDE: &str = "exclude";
const INCLUDE: &str = "include";
const RENAMES: &str = "renames";

fn check_renames(value: &ConfigValue) -> Result<(), String> {
    let ConfigValue::List(items) = value else {
        return Err("expected a list".into());
    };
    for item in items {
        match item.split_once(':') {
            Some((from, to)) if !from.is_empty() && !to.is_empty() && !to.contains(':') => {}
            _ => return Err(format!("'{item}' is not a rename; write old:new")),
        }
    }
    Ok(())
}

#[derive(Debug, Clone)]
pub struct ReplaceField {
    side: Side,
    exclude: Vec<String>,
    include: Vec<String>,
    renames: BTreeMap<String, String>,
}

impl ReplaceField {
    pub fn config_def() -> ConfigDef {
        ConfigDef::new()
            .define(
                ConfigKey::new(
                    EXCLUDE,
                    ConfigType::List,
                    Importance::Medium,
                    "Fields to drop; they win over include.",
                )
                .default(""),
            )
            .define(
                ConfigKey::new(
                    INCLUDE,
                    ConfigType::List,
                    Importance::Medium,
                    "Fields to keep; empty keeps all.",
                )
                .default(""),
            )
            .define(
                ConfigKey::new(
                    RENAMES,
                    ConfigType::List,
                    Importance::Medium,
                    "Renames as old:new pairs.",
                )
                .default("")
                .validator(Validator::Custom {
                    check: check_renames,
                    allowed: "list of old:new pairs",
                }),
            )
    }

    pub fn configure(side: Side, settings: &ConfigMap, prefix: &str) -> Result<Self, ConfigError> {
        let parsed = ReplaceField::config_def().parse_prefixed(settings, prefix)?;
        let renames = parsed
            .list(RENAMES)?
            .iter()
            .filter_map(|r| r.split_once(':'))
            .map(|(a, b)| (a.to_owned(), b.to_owned()))
            .collect();
        Ok(ReplaceField {
            side,
            exclude: parsed.list(EXCLUDE)?.to_vec(),
            include: parsed.list(INCLUDE)?.to_vec(),
            renames,
        })
    }

    fn keeps(&self, name: &str) -> bool {
        !self.exclude.iter().any(|e| e == name)
            && (self.include.is_empty() || self.include.iter().any(|i| i == name))
    }

    fn renamed(&self, name: &str) -> String {
        self.renames
            .get(name)
            .cloned()
            .unwrap_or_else(|| name.to_owned())
    }

    fn fail(&self, detail: String) -> TransformError {
        TransformError::new(format!("ReplaceField${}", self.side.suffix()), detail)
    }
}

impl Transformation for ReplaceField {
    fn apply(&self, mut record: SinkRecord) -> Result<Option<SinkRecord>, TransformError> {
        let value = self.side.value(&record);
        if value.is_null() {
            return Ok(Some(record));
        }
        match self.side.schema(&record) {
            None => {
                let entries = require_map(value, "field replacement").map_err(|e| self.fail(e))?;
                let out = entries
                    .iter()
                    .filter(|(k, _)| key_str(k).is_none_or(|k| self.keeps(k)))
                    .map(|(k, v)| match key_str(k) {
                        Some(name) => (Value::String(self.renamed(name).into()), v.clone()),
                        None => (k.clone(), v.clone()),
                    })
                    .collect();
                self.side.set(&mut record, None, Value::Map(out));
            }
            Some(schema) => {
                let s = require_struct(value, "field replacement").map_err(|e| self.fail(e))?;
                let mut fields = Vec::new();
                let mut out = Struct::new();
                for field in schema.fields().iter().filter(|f| self.keeps(&f.name)) {
                    let name = self.renamed(&field.name);
                    out.put(
                        name.clone(),
                        s.get(&field.name).cloned().unwrap_or(Value::Null),
                    );
                    fields.push(Field::new(name, field.schema.clone()));
                }
                let schema = with_fields(schema, fields);
                self.side.set(&mut record, Some(schema), Value::Struct(out));
            }
        }
        Ok(Some(record))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::Schema;
    use crate::schema::SchemaRef;
    use crate::transforms::testkit::config;

    fn value() -> Value {
        Value::string_map([
            ("id", Value::Int64(1)),
            ("secret", "x".into()),
            ("name", "n".into()),
        ])
    }

    #[test]
    fn exclude_drops_fields_and_renames_rename_the_rest() {
        let t = ReplaceField::configure(
            Side::Value,
            &config(&[("exclude", "secret"), ("renames", "id:order_id")]),
            "",
        )
        .expect("valid");
        let out = t
            .apply(SinkRecord::new("t", 0, 0, value()))
            .expect("map")
            .expect("kept");
        assert_eq!(
            out.value,
            Value::string_map([("order_id", Value::Int64(1)), ("name", "n".into())])
        );
    }

    #[test]
    fn include_keeps_only_listed_fields_and_exclude_wins_over_it() {
        let t = ReplaceField::configure(
            Side::Value,
            &config(&[("include", "id,secret"), ("exclude", "secret")]),
            "",
        )
        .expect("valid");
        let out = t
            .apply(SinkRecord::new("t", 0, 0, value()))
            .expect("map")
            .expect("kept");
        assert_eq!(out.value, Value::string_map([("id", Value::Int64(1))]));
    }

    #[test]
    fn struct_schemas_lose_and_rename_the_same_fields() {
        let t = ReplaceField::configure(
            Side::Value,
            &config(&[("exclude", "b"), ("renames", "a:x")]),
            "",
        )
        .expect("valid");
        let mut r = SinkRecord::new(
            "t",
            0,
            0,
            Value::Struct(Struct::new().with("a", 1.into()).with("b", 2.into())),
        );
        r.value_schema = Some(SchemaRef::new(Schema::structure(vec![
            Field::new("a", Schema::int32()),
            Field::new("b", Schema::int32()),
        ])));
        let out = t.apply(r).expect("struct").expect("kept");
        assert_eq!(
            out.value_schema,
            Some(SchemaRef::new(Schema::structure(vec![Field::new(
                "x",
                Schema::int32()
            )])))
        );
        assert_eq!(out.value, Value::Struct(Struct::new().with("x", 1.into())));
    }

    #[test]
    fn a_rename_without_a_colon_is_refused_naming_it() {
        let err = ReplaceField::configure(
            Side::Value,
            &config(&[("renames", "a:b,c")]),
            "transforms.r.",
        )
        .expect_err("bad pair");
        assert_eq!(
            err.to_string(),
            "invalid value 'a:b,c' for transforms.r.renames: 'c' is not a rename; write old:new"
        );
    }

    #[test]
    fn tombstones_pass_through() {
        let t =
            ReplaceField::configure(Side::Value, &config(&[("exclude", "a")]), "").expect("valid");
        let r = SinkRecord::new("t", 0, 0, Value::Null);
        assert_eq!(t.apply(r.clone()), Ok(Some(r)));
    }
}
