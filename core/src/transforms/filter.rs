//! `Filter`: drops every record it is applied to; pair it with a predicate to choose which.
//! A dropped record counts as handled (the pipeline accepts it), as in Connect.

use crate::config::ConfigDef;
use crate::error::TransformError;
use crate::record::SinkRecord;
use crate::transforms::Transformation;

#[derive(Debug, Clone, Default)]
pub struct Filter;

impl Filter {
    pub fn config_def() -> ConfigDef {
        ConfigDef::new()
    }
}

impl Transformation for Filter {
    fn apply(&self, _record: SinkRecord) -> Result<Option<SinkRecord>, TransformError> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Value;

    #[test]
    fn filter_drops_the_record() {
        assert_eq!(
            Filter.apply(SinkRecord::new("t", 0, 0, Value::Null)),
            Ok(None)
        );
    }
}
