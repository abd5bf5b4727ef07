//! The PostgreSQL sink's settings, named after Kafka Connect's JDBC sink so that an existing
//! JDBC sink configuration carries over (`connection.url` may keep its `jdbc:` prefix).

use std::str::FromStr;

use spillway_core::config::{
    ConfigDef, ConfigKey, ConfigType, ConfigValue, Importance, ParsedConfig, Password, Reach,
    Validator,
};
use spillway_core::{ConfigError, ConfigMap};

pub const CONNECTION_URL: &str = "connection.url";
pub const CONNECTION_USER: &str = "connection.user";
pub const CONNECTION_PASSWORD: &str = "connection.password";
pub const CONNECTION_POOL_SIZE: &str = "connection.pool.size";
pub const TABLE_NAME_FORMAT: &str = "table.name.format";
pub const INSERT_MODE: &str = "insert.mode";
pub const PK_MODE: &str = "pk.mode";
pub const PK_FIELDS: &str = "pk.fields";
pub const AUTO_CREATE: &str = "auto.create";
pub const AUTO_EVOLVE: &str = "auto.evolve";
pub const DELETE_ENABLED: &str = "delete.enabled";

const CONNECTION_GROUP: &str = "Connection";
const WRITES_GROUP: &str = "Writes";
const DATA_MAPPING_GROUP: &str = "Data Mapping";
const DDL_GROUP: &str = "DDL Support";

/// How rows are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InsertMode {
    /// Plain `INSERT`: a redelivered record fails on the primary key (if there is one).
    Insert,
    /// `INSERT ... ON CONFLICT (pk) DO UPDATE`: redelivery rewrites the same row.
    Upsert,
}

/// Where the primary key columns come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PkMode {
    None,
    RecordKey,
    RecordValue,
}

/// The parsed and cross-checked settings of one PostgreSQL sink task.
#[derive(Debug, Clone)]
pub struct PostgresSinkConfig {
    /// Parsed connection settings (host, port, database, user...).
    pub connection: tokio_postgres::Config,
    pub pool_size: usize,
    pub table_name_format: String,
    pub insert_mode: InsertMode,
    pub pk_mode: PkMode,
    pub pk_fields: Vec<String>,
    pub auto_create: bool,
    pub auto_evolve: bool,
    pub delete_enabled: bool,
}

/// `jdbc:postgresql://…` (a Connect JDBC URL) and `postgres://…` both name a server.
fn strip_jdbc(url: &str) -> &str {
    url.trim().strip_prefix("jdbc:").unwrap_or(url.trim())
}

fn check_url(value: &ConfigValue) -> Result<(), String> {
    let ConfigValue::String(url) = value else {
        return Err("expected a string".into());
    };
    let url = strip_jdbc(url);
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(
            "expected a URL of the form postgres://host:5432/database (jdbc:postgresql://... is accepted too)"
                .into(),
        );
    }
    tokio_postgres::Config::from_str(url)
        .map(|_| ())
        .map_err(|e| format!("not a PostgreSQL connection URL ({e})"))
}

/// The servers `connection.url` connects to, for the egress policy. A Unix socket is a path
/// on the worker's machine, not a host: refused here, so a tenant cannot use one.
fn url_hosts(url: &str) -> Result<Vec<(String, u16)>, String> {
    let config = tokio_postgres::Config::from_str(strip_jdbc(url))
        .map_err(|e| format!("not a PostgreSQL connection URL ({e})"))?;
    let ports = config.get_ports();
    let mut hosts = Vec::new();
    for (i, host) in config.get_hosts().iter().enumerate() {
        let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
        match host {
            tokio_postgres::config::Host::Tcp(name) => hosts.push((name.clone(), port)),
            #[cfg(unix)]
            tokio_postgres::config::Host::Unix(path) => {
                return Err(format!(
                    "connects through the Unix socket {}, a path on the worker's machine",
                    path.display()
                ))
            }
        }
    }
    for addr in config.get_hostaddrs() {
        hosts.push((addr.to_string(), ports.first().copied().unwrap_or(5432)));
    }
    if hosts.is_empty() {
        return Err("the URL names no host".into());
    }
    Ok(hosts)
}

/// The connector's own keys.
pub fn config_def() -> ConfigDef {
    ConfigDef::new()
        .define(
            ConfigKey::new(
                CONNECTION_URL,
                ConfigType::String,
                Importance::High,
                "PostgreSQL server and database, e.g. postgres://db.example:5432/shop. \
                 A Kafka Connect JDBC URL (jdbc:postgresql://...) is accepted as well. \
                 TLS is not supported yet: sslmode=require fails to connect.",
            )
            .validator(Validator::Custom {
                check: check_url,
                allowed: "postgres://host[:port]/database",
            })
            .reaches(Reach::Hosts(url_hosts))
            .group(CONNECTION_GROUP, 1),
        )
        .define(
            ConfigKey::new(
                CONNECTION_USER,
                ConfigType::String,
                Importance::High,
                "Database user; overrides a user given in connection.url.",
            )
            .null_default()
            .group(CONNECTION_GROUP, 2),
        )
        .define(
            ConfigKey::new(
                CONNECTION_PASSWORD,
                ConfigType::Password,
                Importance::High,
                "Password of connection.user; overrides one given in connection.url.",
            )
            .null_default()
            .group(CONNECTION_GROUP, 3),
        )
        .define(
            ConfigKey::new(
                CONNECTION_POOL_SIZE,
                ConfigType::Int,
                Importance::Low,
                "Connections each task keeps open. A task writes one batch at a time, so a \
                 second connection only helps to replace a broken one without waiting.",
            )
            .default("2")
            .validator(Validator::Between(1, 64))
            .group(CONNECTION_GROUP, 4),
        )
        .define(
            ConfigKey::new(
                INSERT_MODE,
                ConfigType::String,
                Importance::High,
                "insert: plain INSERT. upsert: INSERT ... ON CONFLICT (primary key) DO UPDATE, \
                 which makes redelivered records harmless; needs pk.mode other than none.",
            )
            .default("insert")
            .validator(Validator::OneOf(&["insert", "upsert"]))
            .group(WRITES_GROUP, 1),
        )
        .define(
            ConfigKey::new(
                DELETE_ENABLED,
                ConfigType::Boolean,
                Importance::Medium,
                "Whether a tombstone (null value) deletes the row with the record key's primary \
                 key. Needs pk.mode=record_key. When false a tombstone is rejected.",
            )
            .default("false")
            .group(WRITES_GROUP, 2),
        )
        .define(
            ConfigKey::new(
                TABLE_NAME_FORMAT,
                ConfigType::String,
                Importance::Medium,
                "Table to write, where ${topic} stands for the record's topic (kafka_${topic} \
                 writes topic orders to table kafka_orders). The name is one quoted identifier \
                 in the connection's current schema.",
            )
            .default("${topic}")
            .validator(Validator::NonEmptyString)
            .group(DATA_MAPPING_GROUP, 1),
        )
        .define(
            ConfigKey::new(
                PK_MODE,
                ConfigType::String,
                Importance::High,
                "Where the primary key comes from. none: no key. record_key: the record key \
                 (a primitive, named by the single entry of pk.fields, or fields of a struct). \
                 record_value: fields of the value struct.",
            )
            .default("none")
            .validator(Validator::OneOf(&["none", "record_key", "record_value"]))
            .group(DATA_MAPPING_GROUP, 2),
        )
        .define(
            ConfigKey::new(
                PK_FIELDS,
                ConfigType::List,
                Importance::Medium,
                "Primary key column names. record_key with a primitive key: exactly one name. \
                 record_key with a struct key or record_value: the fields to use (empty: all \
                 fields of the key or value struct).",
            )
            .default("")
            .validator(Validator::Custom {
                check: check_pk_fields,
                allowed: "list of unique field names",
            })
            .group(DATA_MAPPING_GROUP, 3),
        )
        .define(
            ConfigKey::new(
                AUTO_CREATE,
                ConfigType::Boolean,
                Importance::Medium,
                "Whether to create a missing table from the record's schema (CREATE TABLE with \
                 the primary key of pk.mode).",
            )
            .default("false")
            .group(DDL_GROUP, 1),
        )
        .define(
            ConfigKey::new(
                AUTO_EVOLVE,
                ConfigType::Boolean,
                Importance::Medium,
                "Whether to add a nullable column (ALTER TABLE ... ADD COLUMN) when a record \
                 has a field the table lacks.",
            )
            .default("false")
            .group(DDL_GROUP, 2),
        )
}

fn check_pk_fields(value: &ConfigValue) -> Result<(), String> {
    Validator::UniqueList.check(value)
}

impl PostgresSinkConfig {
    /// Parses `props`, checking keys that only make sense together.
    pub fn parse(props: &ConfigMap) -> Result<PostgresSinkConfig, ConfigError> {
        let config = PostgresSinkConfig::parse_keys(props)?;
        config.check_combination()?;
        Ok(config)
    }

    /// Parses each key on its own, without the checks across keys.
    pub fn parse_keys(props: &ConfigMap) -> Result<PostgresSinkConfig, ConfigError> {
        PostgresSinkConfig::from_parsed(&config_def().parse(props)?)
    }

    fn from_parsed(parsed: &ParsedConfig) -> Result<PostgresSinkConfig, ConfigError> {
        let url = parsed.string(CONNECTION_URL)?.unwrap_or_default();
        let mut connection = tokio_postgres::Config::from_str(strip_jdbc(url)).map_err(|e| {
            ConfigError::InvalidValue {
                key: CONNECTION_URL.into(),
                value: url.into(),
                reason: format!("not a PostgreSQL connection URL ({e})"),
            }
        })?;
        if let Some(user) = parsed.string(CONNECTION_USER)? {
            connection.user(user);
        }
        if let Some(password) = parsed.password(CONNECTION_PASSWORD)?.map(Password::expose) {
            connection.password(password);
        }
        if connection.get_connect_timeout().is_none() {
            // A server that does not answer must become a retriable error, not a hung task.
            connection.connect_timeout(std::time::Duration::from_secs(10));
        }
        connection.application_name("spillway-postgres-sink");
        let insert_mode = match parsed.string(INSERT_MODE)?.unwrap_or("insert") {
            m if m.eq_ignore_ascii_case("upsert") => InsertMode::Upsert,
            _ => InsertMode::Insert,
        };
        let pk_mode = match parsed.string(PK_MODE)?.unwrap_or("none") {
            m if m.eq_ignore_ascii_case("record_key") => PkMode::RecordKey,
            m if m.eq_ignore_ascii_case("record_value") => PkMode::RecordValue,
            _ => PkMode::None,
        };
        Ok(PostgresSinkConfig {
            connection,
            pool_size: usize::try_from(parsed.int(CONNECTION_POOL_SIZE)?).unwrap_or(1),
            table_name_format: parsed
                .string(TABLE_NAME_FORMAT)?
                .unwrap_or("${topic}")
                .to_owned(),
            insert_mode,
            pk_mode,
            pk_fields: parsed.list(PK_FIELDS)?.to_vec(),
            auto_create: parsed.boolean(AUTO_CREATE)?,
            auto_evolve: parsed.boolean(AUTO_EVOLVE)?,
            delete_enabled: parsed.boolean(DELETE_ENABLED)?,
        })
    }

    fn check_combination(&self) -> Result<(), ConfigError> {
        let errors = self
            .conflicts()
            .into_iter()
            .map(|(_, message)| ConfigError::Conflict(message))
            .collect();
        match ConfigError::from_list(errors) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Keys that are fine alone but not together: the key to report each under, and why.
    pub fn conflicts(&self) -> Vec<(&'static str, String)> {
        let mut conflicts = Vec::new();
        if self.delete_enabled && self.pk_mode != PkMode::RecordKey {
            conflicts.push((
                DELETE_ENABLED,
                format!(
                    "{DELETE_ENABLED}=true needs {PK_MODE}=record_key (a tombstone has only its \
                     key to say which row to delete), but {PK_MODE} is '{}'",
                    self.pk_mode_name()
                ),
            ));
        }
        if self.insert_mode == InsertMode::Upsert && self.pk_mode == PkMode::None {
            conflicts.push((
                INSERT_MODE,
                format!(
                    "{INSERT_MODE}=upsert needs a primary key to detect conflicts on, but \
                     {PK_MODE} is 'none'; set {PK_MODE}=record_key or record_value"
                ),
            ));
        }
        if self.pk_mode == PkMode::None && !self.pk_fields.is_empty() {
            conflicts.push((
                PK_FIELDS,
                format!(
                    "{PK_FIELDS} is '{}' but {PK_MODE} is 'none', which ignores it; set \
                     {PK_MODE} or clear {PK_FIELDS}",
                    self.pk_fields.join(",")
                ),
            ));
        }
        conflicts
    }

    fn pk_mode_name(&self) -> &'static str {
        match self.pk_mode {
            PkMode::None => "none",
            PkMode::RecordKey => "record_key",
            PkMode::RecordValue => "record_value",
        }
    }

    /// The table for records of `topic`.
    pub fn table_for(&self, topic: &str) -> String {
        self.table_name_format.replace("${topic}", topic)
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
    fn a_jdbc_url_and_credentials_configure_the_connection() {
        let config = PostgresSinkConfig::parse(&props(&[
            (CONNECTION_URL, "jdbc:postgresql://db.example:6543/shop"),
            (CONNECTION_USER, "writer"),
            (CONNECTION_PASSWORD, "s3cret"),
        ]))
        .expect("valid");
        assert_eq!(config.connection.get_dbname(), Some("shop"));
        assert_eq!(config.connection.get_user(), Some("writer"));
        assert_eq!(config.connection.get_ports(), &[6543]);
        assert_eq!(config.insert_mode, InsertMode::Insert);
        assert_eq!(config.pk_mode, PkMode::None);
        assert_eq!(config.table_for("orders"), "orders");
    }

    #[test]
    fn a_url_that_is_not_postgres_is_refused_naming_the_key_and_value() {
        let err = PostgresSinkConfig::parse(&props(&[(CONNECTION_URL, "mysql://db/shop")]))
            .expect_err("not postgres");
        assert_eq!(
            err.to_string(),
            "invalid value 'mysql://db/shop' for connection.url: expected a URL of the form \
             postgres://host:5432/database (jdbc:postgresql://... is accepted too)"
        );
    }

    #[test]
    fn an_unknown_insert_mode_names_the_choices() {
        let err = PostgresSinkConfig::parse(&props(&[
            (CONNECTION_URL, "postgres://h/db"),
            (INSERT_MODE, "merge"),
        ]))
        .expect_err("no merge");
        assert_eq!(
            err.to_string(),
            "invalid value 'merge' for insert.mode: expected one of insert, upsert"
        );
    }

    #[test]
    fn upsert_without_a_primary_key_is_refused() {
        let err = PostgresSinkConfig::parse(&props(&[
            (CONNECTION_URL, "postgres://h/db"),
            (INSERT_MODE, "upsert"),
        ]))
        .expect_err("needs a key");
        assert!(
            err.to_string()
                .starts_with("insert.mode=upsert needs a primary key"),
            "{err}"
        );
    }

    #[test]
    fn deletes_need_the_record_key_as_primary_key() {
        let err = PostgresSinkConfig::parse(&props(&[
            (CONNECTION_URL, "postgres://h/db"),
            (DELETE_ENABLED, "true"),
            (PK_MODE, "record_value"),
            (PK_FIELDS, "id"),
        ]))
        .expect_err("tombstones carry no value");
        assert_eq!(
            err.to_string(),
            "delete.enabled=true needs pk.mode=record_key (a tombstone has only its key to say \
             which row to delete), but pk.mode is 'record_value'"
        );
    }

    #[test]
    fn repeated_pk_fields_are_refused() {
        let err = PostgresSinkConfig::parse(&props(&[
            (CONNECTION_URL, "postgres://h/db"),
            (PK_MODE, "record_value"),
            (PK_FIELDS, "id,id"),
        ]))
        .expect_err("twice");
        assert_eq!(
            err.to_string(),
            "invalid value 'id,id' for pk.fields: lists 'id' more than once"
        );
    }

    #[test]
    fn the_table_name_format_substitutes_the_topic() {
        let config = PostgresSinkConfig::parse(&props(&[
            (CONNECTION_URL, "postgres://h/db"),
            (TABLE_NAME_FORMAT, "kafka_${topic}"),
        ]))
        .expect("valid");
        assert_eq!(config.table_for("orders"), "kafka_orders");
    }
}
