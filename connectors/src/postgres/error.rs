//! The PostgreSQL sink's errors and the one decision that matters about each: is it worth
//! trying again (RELEASE the batch), is it this record's fault (REJECT the record), or is the
//! statement itself refused (REJECT every record it carried)?

use spillway_core::{RecordCoordinates, SinkError};
use tokio_postgres::error::SqlState;

/// What the database said, kept as text so that the error can be cloned into outcomes.
#[derive(Debug, Clone, PartialEq)]
pub struct DbFailure {
    /// Five-character SQLSTATE (`23505`); `None` when the failure never reached the server.
    pub code: Option<String>,
    /// The server's message, with its detail line when it sent one.
    pub message: String,
    /// Whether the connection was gone (closed, reset, terminated by the server).
    pub connection_lost: bool,
}

impl DbFailure {
    pub fn from_postgres(error: &tokio_postgres::Error) -> DbFailure {
        match error.as_db_error() {
            Some(db) => {
                let mut message = db.message().to_owned();
                if let Some(detail) = db.detail() {
                    message.push_str(": ");
                    message.push_str(detail);
                }
                DbFailure {
                    code: Some(db.code().code().to_owned()),
                    message,
                    connection_lost: false,
                }
            }
            None => DbFailure {
                code: error.code().map(|c| c.code().to_owned()),
                message: error.to_string(),
                // Without a server error the statement never completed: the socket broke,
                // the server closed it, or the connection timed out.
                connection_lost: true,
            },
        }
    }

    /// Worth trying again later: the connection, not the data, failed; or the server asked
    /// us to retry (serialization failure, deadlock, shutdown, lack of resources).
    pub fn is_retriable(&self) -> bool {
        if self.connection_lost {
            return true;
        }
        let Some(code) = self.code.as_deref() else {
            return true;
        };
        let retriable_codes = [
            SqlState::T_R_SERIALIZATION_FAILURE.code(),
            SqlState::T_R_DEADLOCK_DETECTED.code(),
            SqlState::ADMIN_SHUTDOWN.code(),
            SqlState::CRASH_SHUTDOWN.code(),
            SqlState::CANNOT_CONNECT_NOW.code(),
            SqlState::LOCK_NOT_AVAILABLE.code(),
            SqlState::QUERY_CANCELED.code(),
            SqlState::IDLE_IN_TRANSACTION_SESSION_TIMEOUT.code(),
        ];
        // Class 08: connection exception; 40: transaction rollback; 53: insufficient
        // resources; 58: system (I/O) error.
        ["08", "40", "53", "58"].iter().any(|c| code.starts_with(c))
            || retriable_codes.contains(&code)
    }

    /// The record's own data is refused: class 22 (data exception: bad value, out of range,
    /// invalid text) and 23 (integrity constraint: unique, not null, check, foreign key).
    pub fn is_record_data_error(&self) -> bool {
        !self.connection_lost
            && self
                .code
                .as_deref()
                .is_some_and(|c| c.starts_with("22") || c.starts_with("23"))
    }

    /// The server refuses the connector's credentials or rights, not a record: class 28
    /// (invalid authorization: wrong user or password, `pg_hba.conf` refusal), 3D000 (the
    /// database does not exist) and 42501 (insufficient privilege on the table).
    pub fn refuses_the_configuration(&self) -> bool {
        refuses_the_configuration(self.code.as_deref())
    }

    /// The table or one of its columns is missing (dropped behind the sink's back).
    pub fn is_missing_relation(&self) -> bool {
        matches!(
            self.code.as_deref(),
            Some(c) if c == SqlState::UNDEFINED_TABLE.code() || c == SqlState::UNDEFINED_COLUMN.code()
        )
    }
}

impl std::fmt::Display for DbFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.code {
            Some(code) => write!(f, "{} (SQLSTATE {code})", self.message),
            None => f.write_str(&self.message),
        }
    }
}

/// Whether SQLSTATE `code` refuses the connector's configuration (see
/// [`DbFailure::refuses_the_configuration`]).
pub fn refuses_the_configuration(code: Option<&str>) -> bool {
    code.is_some_and(|c| {
        c.starts_with("28")
            || c == SqlState::INVALID_CATALOG_NAME.code()
            || c == SqlState::INSUFFICIENT_PRIVILEGE.code()
    })
}

/// An error of the PostgreSQL sink.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PostgresSinkError {
    /// No connection could be had from the pool (server down, refused, timed out, or the
    /// server refused the login: then `code` is its SQLSTATE).
    #[error("cannot connect to PostgreSQL at {target}: {detail}")]
    Connect {
        target: String,
        detail: String,
        code: Option<String>,
    },
    /// The server refused or failed a statement on `table`.
    #[error("writing to table '{table}' failed: {failure}")]
    Statement { table: String, failure: DbFailure },
    /// The server refused one record's row.
    #[error("the database refused record {record} for table '{table}': {failure}")]
    RecordRefused {
        record: RecordCoordinates,
        table: String,
        failure: DbFailure,
    },
    /// A record this sink cannot turn into a row (wrong shape, missing key field...).
    #[error("record {record} cannot be written to PostgreSQL: {detail}")]
    BadRecord {
        record: RecordCoordinates,
        detail: String,
    },
    /// The table does not exist and the sink may not create it.
    #[error("table '{table}' does not exist and auto.create is false; create the table or set auto.create=true")]
    MissingTable { table: String },
    /// The table lacks columns the records have, and the sink may not add them.
    #[error("table '{table}' has no column(s) {columns} and auto.evolve is false; add them or set auto.evolve=true")]
    MissingColumns { table: String, columns: String },
    /// Creating or altering the table failed.
    #[error("changing the definition of table '{table}' failed: {failure}")]
    Ddl { table: String, failure: DbFailure },
    /// Beginning or committing the batch's transaction failed.
    #[error("the transaction of a batch of {records} records failed: {failure}")]
    Transaction { records: usize, failure: DbFailure },
}

impl PostgresSinkError {
    /// Whether redelivering the records may succeed (not while the server refuses the
    /// connector's credentials or rights: that is [`is_task_level`](Self::is_task_level)).
    pub fn is_retriable(&self) -> bool {
        if self.is_task_level() {
            return false;
        }
        match self {
            PostgresSinkError::Connect { .. } => true,
            PostgresSinkError::Statement { failure, .. }
            | PostgresSinkError::RecordRefused { failure, .. }
            | PostgresSinkError::Ddl { failure, .. }
            | PostgresSinkError::Transaction { failure, .. } => failure.is_retriable(),
            PostgresSinkError::BadRecord { .. }
            | PostgresSinkError::MissingTable { .. }
            | PostgresSinkError::MissingColumns { .. } => false,
        }
    }

    /// The server refuses the connector (bad credentials, missing database, no privilege):
    /// no record would get through, so the task fails and its records are released.
    pub fn is_task_level(&self) -> bool {
        match self {
            PostgresSinkError::Connect { code, .. } => refuses_the_configuration(code.as_deref()),
            PostgresSinkError::Statement { failure, .. }
            | PostgresSinkError::RecordRefused { failure, .. }
            | PostgresSinkError::Ddl { failure, .. }
            | PostgresSinkError::Transaction { failure, .. } => failure.refuses_the_configuration(),
            PostgresSinkError::BadRecord { .. }
            | PostgresSinkError::MissingTable { .. }
            | PostgresSinkError::MissingColumns { .. } => false,
        }
    }

    /// The runtime's view: retriable → RELEASE, task-level → the task fails (its records are
    /// released), otherwise → REJECT with this message.
    pub fn into_sink_error(self) -> SinkError {
        let message = self.to_string();
        if self.is_retriable() {
            SinkError::retriable(message).caused_by(self)
        } else if self.is_task_level() {
            SinkError::task_level(message).caused_by(self)
        } else {
            SinkError::fatal(message).caused_by(self)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(code: &str) -> DbFailure {
        DbFailure {
            code: Some(code.into()),
            message: "m".into(),
            connection_lost: false,
        }
    }

    #[test]
    fn serialization_failures_deadlocks_and_shutdowns_are_retriable() {
        for code in ["40001", "40P01", "57P01", "08006", "53300", "55P03"] {
            assert!(failure(code).is_retriable(), "{code}");
            assert!(!failure(code).is_record_data_error(), "{code}");
        }
    }

    #[test]
    fn constraint_violations_and_bad_data_are_the_records_fault() {
        for code in [
            "23505", "23502", "23514", "23503", "22001", "22003", "22P02",
        ] {
            assert!(!failure(code).is_retriable(), "{code}");
            assert!(failure(code).is_record_data_error(), "{code}");
        }
    }

    #[test]
    fn statement_errors_are_fatal_for_the_statement_not_one_record() {
        let undefined_column = failure("42703");
        assert!(!undefined_column.is_retriable());
        assert!(!undefined_column.is_record_data_error());
        assert!(undefined_column.is_missing_relation());
    }

    #[test]
    fn bad_credentials_a_missing_database_and_no_privilege_fail_the_task() {
        for code in ["28P01", "28000", "3D000", "42501"] {
            let login = PostgresSinkError::Connect {
                target: "db:5432/app".into(),
                detail: "password authentication failed".into(),
                code: Some(code.into()),
            };
            assert!(login.is_task_level(), "{code}");
            assert!(!login.is_retriable(), "{code}");
            assert!(login.into_sink_error().is_task_level(), "{code}");
            let statement = PostgresSinkError::Statement {
                table: "orders".into(),
                failure: failure(code),
            };
            assert!(statement.into_sink_error().is_task_level(), "{code}");
        }
        let down = PostgresSinkError::Connect {
            target: "db:5432/app".into(),
            detail: "connection refused".into(),
            code: None,
        };
        assert!(
            down.is_retriable(),
            "a server that is down is worth waiting for"
        );
        assert!(!down.is_task_level());
        let constraint = PostgresSinkError::Statement {
            table: "orders".into(),
            failure: failure("23505"),
        };
        assert!(!constraint.is_task_level());
    }

    #[test]
    fn a_lost_connection_is_retriable_whatever_it_says() {
        let lost = DbFailure {
            code: None,
            message: "connection closed".into(),
            connection_lost: true,
        };
        assert!(lost.is_retriable());
        assert!(!lost.is_record_data_error());
    }

    #[test]
    fn a_refused_record_names_the_record_table_message_and_sqlstate() {
        let e = PostgresSinkError::RecordRefused {
            record: RecordCoordinates::new("orders", 2, 17),
            table: "orders".into(),
            failure: DbFailure {
                code: Some("23514".into()),
                message:
                    "new row for relation \"orders\" violates check constraint \"qty_positive\""
                        .into(),
                connection_lost: false,
            },
        };
        assert_eq!(
            e.to_string(),
            "the database refused record orders-2@17 for table 'orders': new row for relation \
             \"orders\" violates check constraint \"qty_positive\" (SQLSTATE 23514)"
        );
        let sink = e.into_sink_error();
        assert!(!sink.is_retriable());
    }
}
