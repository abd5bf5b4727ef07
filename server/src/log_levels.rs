//! Log levels that change at runtime, behind Kafka Connect's `/admin/loggers` API.
//!
//! A logger is a `tracing` target (a Rust module path such as `spillway_actors::sink`), or
//! `root` for every target. Connect-style dotted names are accepted (`spillway_actors.sink`).
//! As in Connect, a logger exists once something logged through it (or once a level was set
//! for it); setting a level on a logger sets it on every logger below it, and the answer names
//! the loggers whose level changed. Levels are log4j's names: OFF, ERROR, WARN, INFO, DEBUG,
//! TRACE. The levels become the directives of an `EnvFilter` that is swapped in through a
//! `tracing-subscriber` reload handle, so the change applies at once to every thread.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::level_filters::LevelFilter;
use tracing::{Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Filter};
use tracing_subscriber::EnvFilter;

/// Connect's name of the logger above all others.
pub const ROOT: &str = "root";

/// A level as log4j names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Off,
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

/// The level names the API accepts, for error messages.
pub const LEVEL_NAMES: &str = "OFF, ERROR, WARN, INFO, DEBUG, TRACE";

impl LogLevel {
    /// Reads a level name, in any case.
    pub fn parse(text: &str) -> Result<LogLevel, LoggerError> {
        match text.trim().to_ascii_uppercase().as_str() {
            "OFF" => Ok(LogLevel::Off),
            "ERROR" => Ok(LogLevel::Error),
            "WARN" | "WARNING" => Ok(LogLevel::Warn),
            "INFO" => Ok(LogLevel::Info),
            "DEBUG" => Ok(LogLevel::Debug),
            "TRACE" => Ok(LogLevel::Trace),
            _ => Err(LoggerError::InvalidLevel(text.to_owned())),
        }
    }

    fn directive(self) -> &'static str {
        match self {
            LogLevel::Off => "off",
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
            LogLevel::Trace => "trace",
        }
    }
}

impl fmt::Display for LogLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LogLevel::Off => "OFF",
            LogLevel::Error => "ERROR",
            LogLevel::Warn => "WARN",
            LogLevel::Info => "INFO",
            LogLevel::Debug => "DEBUG",
            LogLevel::Trace => "TRACE",
        })
    }
}

/// Why a logger request failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoggerError {
    #[error("invalid log level '{0}'; use one of {LEVEL_NAMES}")]
    InvalidLevel(String),
    #[error("invalid logger name '{0}'; a logger is a Rust module path such as spillway_actors::sink (or spillway_actors.sink), or root")]
    InvalidName(String),
    #[error("Logger {0} not found; loggers exist once something logged through them (GET /admin/loggers lists them)")]
    NotFound(String),
    #[error("log levels cannot change at runtime: this process did not set up Spillway's logging")]
    Detached,
    #[error("cannot apply the log levels '{directives}': {reason}")]
    Apply { directives: String, reason: String },
}

/// One logger's level as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggerLevel {
    pub level: LogLevel,
    /// Milliseconds since the epoch of the last change through the API; `None` if never.
    pub last_modified: Option<i64>,
}

/// Swaps the filter in; set up by the telemetry layer stack.
type ApplyFilter = Box<dyn Fn(EnvFilter) -> Result<(), String> + Send + Sync>;

#[derive(Debug, Clone)]
struct Levels {
    root: LogLevel,
    /// Targets with a level of their own.
    explicit: BTreeMap<String, LogLevel>,
    /// Directives of the start-up filter that are not plain levels (span or field filters),
    /// kept as they are.
    other: Vec<String>,
    last_modified: BTreeMap<String, i64>,
}

impl Levels {
    /// The level in effect for `target`: its own, else the closest prefix's, else root's,
    /// matching how an `EnvFilter` directive applies to every target starting with it.
    fn effective(&self, target: &str) -> LogLevel {
        if target == ROOT {
            return self.root;
        }
        self.explicit
            .iter()
            .filter(|(prefix, _)| target.starts_with(prefix.as_str()))
            .max_by_key(|(prefix, _)| prefix.len())
            .map_or(self.root, |(_, level)| *level)
    }

    fn directives(&self) -> String {
        let mut parts = vec![self.root.directive().to_owned()];
        parts.extend(
            self.explicit
                .iter()
                .map(|(target, level)| format!("{target}={}", level.directive())),
        );
        parts.extend(self.other.iter().cloned());
        parts.join(",")
    }
}

/// The worker's loggers and their levels.
pub struct LogLevels {
    levels: Mutex<Levels>,
    /// Targets that have logged (or could have: their call sites were registered).
    known: Arc<Mutex<BTreeSet<String>>>,
    apply: Option<ApplyFilter>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves the data whole; a panic elsewhere does not poison it.
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

fn now_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The target a logger name stands for: `root`, or the module path (dots become `::`).
pub fn canonical_name(name: &str) -> Result<String, LoggerError> {
    let trimmed = name.trim();
    if trimmed.is_empty() || trimmed.eq_ignore_ascii_case(ROOT) {
        return Ok(ROOT.to_owned());
    }
    let valid = trimmed
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | ':' | '.' | '-'));
    if !valid || trimmed.starts_with(':') || trimmed.ends_with(':') {
        return Err(LoggerError::InvalidName(name.to_owned()));
    }
    Ok(trimmed.replace('.', "::"))
}

impl LogLevels {
    /// Levels read from `filter` (`RUST_LOG` syntax), applied through `apply`.
    fn new(filter: &str, apply: Option<ApplyFilter>) -> LogLevels {
        let mut levels = Levels {
            root: LogLevel::Info,
            explicit: BTreeMap::new(),
            other: Vec::new(),
            last_modified: BTreeMap::new(),
        };
        for directive in filter.split(',').map(str::trim).filter(|d| !d.is_empty()) {
            match directive.split_once('=') {
                None => match LogLevel::parse(directive) {
                    Ok(level) => levels.root = level,
                    // A bare target means "everything from it".
                    Err(_) => {
                        levels
                            .explicit
                            .insert(directive.to_owned(), LogLevel::Trace);
                    }
                },
                Some((target, level)) => match (canonical_name(target), LogLevel::parse(level)) {
                    (Ok(target), Ok(level)) if target != ROOT => {
                        levels.explicit.insert(target, level);
                    }
                    _ => levels.other.push(directive.to_owned()),
                },
            }
        }
        LogLevels {
            levels: Mutex::new(levels),
            known: Arc::default(),
            apply,
        }
    }

    /// Levels that are only reported: nothing applies a change (logging was set up elsewhere).
    pub fn detached(filter: &str) -> LogLevels {
        LogLevels::new(filter, None)
    }

    /// The filter to install for the start-up levels, with the levels that will manage it once
    /// [`LogLevels::attach`] gave them the reload handle.
    pub(crate) fn with_filter(filter: &str) -> Result<(LogLevels, EnvFilter), LoggerError> {
        let levels = LogLevels::new(filter, None);
        let directives = lock(&levels.levels).directives();
        let env_filter = EnvFilter::try_new(&directives).map_err(|e| LoggerError::Apply {
            directives,
            reason: e.to_string(),
        })?;
        Ok((levels, env_filter))
    }

    pub(crate) fn attach(&mut self, apply: ApplyFilter) {
        self.apply = Some(apply);
    }

    /// A filter wrapper that notes every target whose call sites register, so the API can
    /// list the loggers that exist.
    pub(crate) fn recording<F>(&self, inner: F) -> RecordTargets<F> {
        RecordTargets {
            inner,
            known: Arc::clone(&self.known),
        }
    }

    /// Every known logger: the targets that logged, their parent modules, the loggers that got
    /// a level, and root.
    fn names(&self, levels: &Levels) -> BTreeSet<String> {
        let mut names: BTreeSet<String> = BTreeSet::new();
        for target in lock(&self.known).iter() {
            let mut end = 0;
            // `a::b::c` also makes `a` and `a::b` loggers.
            while let Some(i) = target[end..].find("::") {
                names.insert(target[..end + i].to_owned());
                end += i + 2;
            }
            names.insert(target.clone());
        }
        names.extend(levels.explicit.keys().cloned());
        names.insert(ROOT.to_owned());
        names
    }

    fn level_of(levels: &Levels, name: &str) -> LoggerLevel {
        LoggerLevel {
            level: levels.effective(name),
            last_modified: levels.last_modified.get(name).copied(),
        }
    }

    /// `GET /admin/loggers`: every known logger whose level is not OFF, as Connect lists them.
    pub fn all(&self) -> BTreeMap<String, LoggerLevel> {
        let levels = lock(&self.levels);
        self.names(&levels)
            .into_iter()
            .map(|name| {
                let level = Self::level_of(&levels, &name);
                (name, level)
            })
            .filter(|(_, level)| level.level != LogLevel::Off)
            .collect()
    }

    /// `GET /admin/loggers/{name}`.
    pub fn get(&self, name: &str) -> Result<LoggerLevel, LoggerError> {
        let target = canonical_name(name)?;
        let levels = lock(&self.levels);
        if !self.names(&levels).contains(&target) {
            return Err(LoggerError::NotFound(name.to_owned()));
        }
        Ok(Self::level_of(&levels, &target))
    }

    /// `PUT /admin/loggers/{name}`: sets `level` on the logger and every logger below it;
    /// returns the loggers whose level changed, sorted.
    pub fn set(&self, name: &str, level: &str) -> Result<Vec<String>, LoggerError> {
        let level = LogLevel::parse(level)?;
        let target = canonical_name(name)?;
        let Some(apply) = &self.apply else {
            return Err(LoggerError::Detached);
        };
        let mut levels = lock(&self.levels);
        let mut next = levels.clone();
        if target == ROOT {
            next.root = level;
            next.explicit.clear();
        } else {
            next.explicit.retain(|t, _| !t.starts_with(target.as_str()));
            next.explicit.insert(target.clone(), level);
        }
        let directives = next.directives();
        let filter = EnvFilter::try_new(&directives).map_err(|e| LoggerError::Apply {
            directives: directives.clone(),
            reason: e.to_string(),
        })?;
        apply(filter).map_err(|reason| LoggerError::Apply { directives, reason })?;
        let mut names = self.names(&levels);
        names.insert(target.clone());
        let now = now_millis();
        let mut changed = Vec::new();
        for name in names {
            let below = target == ROOT || name.starts_with(target.as_str());
            if below && levels.effective(&name) != next.effective(&name) {
                next.last_modified.insert(name.clone(), now);
                changed.push(name);
            }
        }
        *levels = next;
        tracing::info!(logger = %target, level = %level, changed = changed.len(), "log level set");
        Ok(changed)
    }
}

/// A per-layer filter that delegates to `inner` and records the target of every call site it
/// is asked about.
pub struct RecordTargets<F> {
    inner: F,
    known: Arc<Mutex<BTreeSet<String>>>,
}

impl<S: Subscriber, F: Filter<S>> Filter<S> for RecordTargets<F> {
    fn enabled(&self, meta: &Metadata<'_>, cx: &Context<'_, S>) -> bool {
        self.inner.enabled(meta, cx)
    }

    fn callsite_enabled(&self, meta: &'static Metadata<'static>) -> tracing::subscriber::Interest {
        let target = meta.target();
        let mut known = lock(&self.known);
        if !known.contains(target) {
            known.insert(target.to_owned());
        }
        drop(known);
        self.inner.callsite_enabled(meta)
    }

    fn event_enabled(&self, event: &tracing::Event<'_>, cx: &Context<'_, S>) -> bool {
        self.inner.event_enabled(event, cx)
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        self.inner.max_level_hint()
    }

    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        cx: Context<'_, S>,
    ) {
        self.inner.on_new_span(attrs, id, cx)
    }

    fn on_record(
        &self,
        id: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        cx: Context<'_, S>,
    ) {
        self.inner.on_record(id, values, cx)
    }

    fn on_enter(&self, id: &tracing::span::Id, cx: Context<'_, S>) {
        self.inner.on_enter(id, cx)
    }

    fn on_exit(&self, id: &tracing::span::Id, cx: Context<'_, S>) {
        self.inner.on_exit(id, cx)
    }

    fn on_close(&self, id: tracing::span::Id, cx: Context<'_, S>) {
        self.inner.on_close(id, cx)
    }
}

/// Whether a log event may be shown at all, whatever the levels: sled (the state store's
/// database) logs whole pages and write batches at TRACE — stored connector configurations,
/// secrets included, as bytes no redaction can recognise — so its TRACE events never are.
pub fn shown(meta: &tracing::Metadata<'_>) -> bool {
    !(*meta.level() == tracing::Level::TRACE
        && (meta.target() == "sled" || meta.target().starts_with("sled::")))
}

/// The log layer's filter of [`shown`], asked for every event: `log` records (sled's) all
/// come through one callsite per level, so a decision per callsite would not see their target.
#[derive(Debug, Clone, Copy, Default)]
pub struct NeverShown;

impl<S> tracing_subscriber::layer::Filter<S> for NeverShown {
    fn enabled(
        &self,
        meta: &tracing::Metadata<'_>,
        _cx: &tracing_subscriber::layer::Context<'_, S>,
    ) -> bool {
        shown(meta)
    }

    /// It only ever hides: whatever the levels allow, it allows no more verbose.
    fn max_level_hint(&self) -> Option<tracing_subscriber::filter::LevelFilter> {
        Some(tracing_subscriber::filter::LevelFilter::TRACE)
    }

    fn callsite_enabled(
        &self,
        _meta: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        tracing::subscriber::Interest::sometimes()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex as StdMutex;

    use super::*;

    /// Levels whose filter changes are recorded instead of installed.
    fn levels(filter: &str) -> (LogLevels, Arc<StdMutex<Vec<String>>>) {
        let applied: Arc<StdMutex<Vec<String>>> = Arc::default();
        let sink = Arc::clone(&applied);
        let mut levels = LogLevels::new(filter, None);
        levels.attach(Box::new(move |f: EnvFilter| {
            sink.lock().unwrap().push(f.to_string());
            Ok(())
        }));
        (levels, applied)
    }

    fn known(levels: &LogLevels, targets: &[&str]) {
        lock(&levels.known).extend(targets.iter().map(|t| (*t).to_owned()));
    }

    #[test]
    fn levels_parse_in_any_case_and_bad_ones_name_the_allowed_values() {
        assert_eq!(LogLevel::parse("debug"), Ok(LogLevel::Debug));
        assert_eq!(LogLevel::parse("OFF"), Ok(LogLevel::Off));
        let err = LogLevel::parse("LOUD").unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid log level 'LOUD'; use one of OFF, ERROR, WARN, INFO, DEBUG, TRACE"
        );
    }

    #[test]
    fn dotted_names_map_to_module_paths() {
        assert_eq!(
            canonical_name("spillway_actors.sink").unwrap(),
            "spillway_actors::sink"
        );
        assert_eq!(canonical_name("ROOT").unwrap(), ROOT);
        assert!(matches!(
            canonical_name("a=b"),
            Err(LoggerError::InvalidName(_))
        ));
        assert!(matches!(
            canonical_name("x,y"),
            Err(LoggerError::InvalidName(_))
        ));
    }

    #[test]
    fn the_start_up_filter_gives_root_and_explicit_levels() {
        let (levels, _) = levels("warn,spillway_actors=debug,h2[conn]=trace");
        known(&levels, &["spillway_actors::sink", "spillway_kafka::share"]);
        let all = levels.all();
        assert_eq!(all["root"].level, LogLevel::Warn);
        assert_eq!(all["spillway_actors"].level, LogLevel::Debug);
        assert_eq!(all["spillway_actors::sink"].level, LogLevel::Debug);
        assert_eq!(all["spillway_kafka"].level, LogLevel::Warn);
        assert_eq!(all["spillway_kafka::share"].last_modified, None);
        assert_eq!(
            lock(&levels.levels).directives(),
            "warn,spillway_actors=debug,h2[conn]=trace"
        );
    }

    #[test]
    fn setting_a_parent_sets_its_children_and_reports_what_changed() {
        let (levels, applied) = levels("info,spillway_actors::sink=warn");
        known(
            &levels,
            &[
                "spillway_actors::sink",
                "spillway_actors::consumer",
                "spillway_kafka::share",
            ],
        );
        let changed = levels.set("spillway_actors", "DEBUG").unwrap();
        assert_eq!(
            changed,
            [
                "spillway_actors",
                "spillway_actors::consumer",
                "spillway_actors::sink"
            ]
        );
        assert_eq!(
            applied.lock().unwrap().last().unwrap(),
            "spillway_actors=debug,info"
        );
        let sink = levels.get("spillway_actors.sink").unwrap();
        assert_eq!(sink.level, LogLevel::Debug);
        assert!(sink.last_modified.is_some());
        assert_eq!(
            levels.get("spillway_kafka::share").unwrap(),
            LoggerLevel {
                level: LogLevel::Info,
                last_modified: None
            }
        );
        // The same level again changes nothing.
        assert!(levels.set("spillway_actors", "debug").unwrap().is_empty());
    }

    #[test]
    fn setting_root_resets_every_logger() {
        let (levels, applied) = levels("info,spillway_actors=trace");
        known(&levels, &["spillway_actors::sink", "rdkafka::client"]);
        let changed = levels.set("root", "WARN").unwrap();
        assert_eq!(
            changed,
            [
                "rdkafka",
                "rdkafka::client",
                "root",
                "spillway_actors",
                "spillway_actors::sink"
            ]
        );
        assert_eq!(applied.lock().unwrap().last().unwrap(), "warn");
        levels.set("root", "off").unwrap();
        assert!(levels.all().is_empty(), "Connect leaves OFF loggers out");
        assert_eq!(levels.get("root").unwrap().level, LogLevel::Off);
    }

    #[test]
    fn unknown_loggers_are_not_found_until_a_level_is_set() {
        let (levels, _) = levels("info");
        assert_eq!(
            levels.get("no.such.logger"),
            Err(LoggerError::NotFound("no.such.logger".into()))
        );
        assert_eq!(
            levels.set("no.such.logger", "ERROR").unwrap(),
            ["no::such::logger"]
        );
        assert_eq!(levels.get("no.such.logger").unwrap().level, LogLevel::Error);
    }

    #[test]
    fn a_bad_level_changes_nothing() {
        let (levels, applied) = levels("info");
        assert_eq!(
            levels.set("root", "verbose"),
            Err(LoggerError::InvalidLevel("verbose".into()))
        );
        assert!(applied.lock().unwrap().is_empty());
        assert_eq!(levels.get("root").unwrap().level, LogLevel::Info);
    }

    #[test]
    fn detached_levels_are_reported_but_cannot_change() {
        let levels = LogLevels::detached("debug");
        assert_eq!(levels.get("root").unwrap().level, LogLevel::Debug);
        assert_eq!(levels.set("root", "INFO"), Err(LoggerError::Detached));
    }
}
