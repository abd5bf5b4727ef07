//! Configuration: keys declared once ([`ConfigDef`]) and what derives from them, the keys every
//! sink connector shares, the group-protocol choice, and the `.properties` file format.

mod def;
mod group_protocol;
mod json_map;
mod properties;
mod report;
pub mod sink_connector;
mod value;

use std::collections::BTreeMap;

pub use def::{
    ConfigDef, ConfigKey, ConfigType, DefaultValue, HostsOf, Importance, Reach, Validator,
};
pub use group_protocol::{
    resolve_group_protocol, GroupProtocol, ProtocolSource, ResolvedProtocol,
    CONNECTOR_GROUP_PROTOCOL, WORKER_GROUP_PROTOCOL,
};
pub use json_map::{config_map_from_json, config_value_from_json};
pub use properties::{parse_properties, Properties, Property};
pub use report::{ConfigInfo, KeyInfo, ValidationReport, ValueInfo};
pub use sink_connector::{
    sink_connector_config_def, validate_sink_connector, DeadLetterQueue, ErrorHandling,
    ErrorTolerance, RetryTimeout, SinkConnectorConfig, TopicSelection,
};
pub use value::{parse_list, ConfigValue, ParsedConfig, Password};

/// Configuration as users write it: key to text, as in Connect's `Map<String, String>`.
pub type ConfigMap = BTreeMap<String, String>;

/// A config from `(key, value)` pairs, as tests and examples write one.
pub fn config_map(pairs: &[(&str, &str)]) -> ConfigMap {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}
