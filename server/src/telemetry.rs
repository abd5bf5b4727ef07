//! Logs and traces of a Spillway process, set up once by every subcommand that runs
//! connectors (`demo`, `standalone`, `worker`).
//!
//! - Logs: `tracing-subscriber`'s fmt output on standard error, as text or JSON
//!   (`--log-format` / `SPILLWAY_LOG_FORMAT`), starting at the levels of `RUST_LOG` (INFO by
//!   default) and changeable at runtime through `/admin/loggers` ([`LogLevels`]).
//! - Traces: off unless the standard OpenTelemetry environment asks for them
//!   (`OTEL_TRACES_EXPORTER=otlp`, or an `OTEL_EXPORTER_OTLP_ENDPOINT` /
//!   `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`); then the batch stage spans (see
//!   `spillway_actors::telemetry`) go to the collector over OTLP/HTTP with protobuf (or
//!   OTLP/gRPC with the `otlp-grpc` feature).
//!   [`Telemetry::shutdown`] flushes what is buffered.
//!
//! [`TelemetryConfig::from_env`] reads the environment; tests build a [`TelemetryConfig`]
//! themselves and need not touch the process environment.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry::KeyValue;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use spillway_actors::telemetry::TARGET as STAGE_SPAN_TARGET;
use tracing::Level;
use tracing_subscriber::filter::{filter_fn, FilterExt};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, Layer};

use crate::log_levels::LogLevels;

/// Chooses the log format: `text` (default) or `json`.
pub const LOG_FORMAT_ENV: &str = "SPILLWAY_LOG_FORMAT";
/// The start-up log levels, in `EnvFilter` syntax.
pub const LOG_LEVEL_ENV: &str = "RUST_LOG";

const OTEL_SDK_DISABLED: &str = "OTEL_SDK_DISABLED";
const OTEL_TRACES_EXPORTER: &str = "OTEL_TRACES_EXPORTER";
const OTEL_EXPORTER_OTLP_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
const OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
const OTEL_EXPORTER_OTLP_PROTOCOL: &str = "OTEL_EXPORTER_OTLP_PROTOCOL";
const OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: &str = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL";
const OTEL_SERVICE_NAME: &str = "OTEL_SERVICE_NAME";
const OTEL_RESOURCE_ATTRIBUTES: &str = "OTEL_RESOURCE_ATTRIBUTES";
const OTEL_TRACES_SAMPLER: &str = "OTEL_TRACES_SAMPLER";
const OTEL_TRACES_SAMPLER_ARG: &str = "OTEL_TRACES_SAMPLER_ARG";

/// OTLP/HTTP's default collector address (the gRPC one is port 4317).
const DEFAULT_HTTP_ENDPOINT: &str = "http://localhost:4318";
/// OTLP/gRPC's default collector address.
const DEFAULT_GRPC_ENDPOINT: &str = "http://localhost:4317";
const DEFAULT_SERVICE_NAME: &str = "spillway";
/// How long shutdown waits for the last spans to reach the collector.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// Why telemetry could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("{variable}='{value}' is not valid: {reason}")]
    BadVariable {
        variable: &'static str,
        value: String,
        reason: String,
    },
    #[error("log format '{0}' is not known; use text or json")]
    BadLogFormat(String),
    #[error("the log levels '{filter}' are not valid: {reason}")]
    BadLogFilter { filter: String, reason: String },
    #[error("cannot create the OTLP trace exporter for {endpoint}: {reason}")]
    Exporter { endpoint: String, reason: String },
    #[error("logging is already set up in this process")]
    AlreadyInitialized,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    #[default]
    Text,
    /// One JSON object per line, with the fields of the enclosing spans.
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = TelemetryError;

    fn from_str(text: &str) -> Result<LogFormat, TelemetryError> {
        match text.trim().to_ascii_lowercase().as_str() {
            "text" | "" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            _ => Err(TelemetryError::BadLogFormat(text.to_owned())),
        }
    }
}

/// How spans travel to the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OtlpProtocol {
    /// OTLP/HTTP with protobuf bodies (`http/protobuf`, port 4318).
    #[default]
    HttpProtobuf,
    /// OTLP/gRPC (`grpc`, port 4317); needs the `otlp-grpc` cargo feature.
    Grpc,
}

/// Where and how spans are exported.
#[derive(Debug, Clone)]
pub struct TraceExport {
    /// HTTP: the traces URL, e.g. `http://localhost:4318/v1/traces`; gRPC: the collector's
    /// address, e.g. `http://localhost:4317`.
    pub endpoint: String,
    pub protocol: OtlpProtocol,
    pub service_name: String,
    /// Further resource attributes (`OTEL_RESOURCE_ATTRIBUTES`).
    pub resource: Vec<(String, String)>,
    pub sampler: Sampler,
}

impl TraceExport {
    /// Export to `endpoint` (the full traces URL), every span sampled unless its parent was not.
    pub fn to(endpoint: impl Into<String>) -> TraceExport {
        TraceExport {
            endpoint: endpoint.into(),
            protocol: OtlpProtocol::HttpProtobuf,
            service_name: DEFAULT_SERVICE_NAME.to_owned(),
            resource: Vec::new(),
            sampler: Sampler::ParentBased(Box::new(Sampler::AlwaysOn)),
        }
    }
}

/// Everything [`init`] sets up.
#[derive(Debug, Clone)]
pub struct TelemetryConfig {
    pub log_format: LogFormat,
    /// Start-up levels in `EnvFilter` syntax (`info,spillway_actors=debug`).
    pub log_filter: String,
    /// `None`: tracing is off.
    pub traces: Option<TraceExport>,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig {
            log_format: LogFormat::Text,
            log_filter: "info".to_owned(),
            traces: None,
        }
    }
}

impl TelemetryConfig {
    /// From the process environment.
    pub fn from_env() -> Result<TelemetryConfig, TelemetryError> {
        TelemetryConfig::from_lookup(|name| std::env::var(name).ok())
    }

    /// From the variables `lookup` returns (unset: `None`).
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<TelemetryConfig, TelemetryError> {
        let get = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        let log_format = get(LOG_FORMAT_ENV)
            .map(|v| v.parse())
            .transpose()?
            .unwrap_or_default();
        let log_filter = get(LOG_LEVEL_ENV).unwrap_or_else(|| "info".to_owned());
        Ok(TelemetryConfig {
            log_format,
            log_filter,
            traces: trace_export_from(&get)?,
        })
    }
}

fn bad(variable: &'static str, value: &str, reason: impl Into<String>) -> TelemetryError {
    TelemetryError::BadVariable {
        variable,
        value: value.to_owned(),
        reason: reason.into(),
    }
}

/// Reads the `OTEL_*` variables of the trace exporter; `None` when tracing stays off.
fn trace_export_from(
    get: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<TraceExport>, TelemetryError> {
    if let Some(disabled) = get(OTEL_SDK_DISABLED) {
        match disabled.trim().to_ascii_lowercase().as_str() {
            "true" => return Ok(None),
            "false" => {}
            _ => return Err(bad(OTEL_SDK_DISABLED, &disabled, "use true or false")),
        }
    }
    let signal_endpoint = get(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT);
    let base_endpoint = get(OTEL_EXPORTER_OTLP_ENDPOINT);
    let wanted = match get(OTEL_TRACES_EXPORTER) {
        Some(exporters) => {
            let mut otlp = false;
            for exporter in exporters.split(',').map(str::trim) {
                match exporter {
                    "otlp" => otlp = true,
                    "none" => {}
                    other => {
                        return Err(bad(
                            OTEL_TRACES_EXPORTER,
                            &exporters,
                            format!("exporter '{other}' is not available; use otlp or none"),
                        ))
                    }
                }
            }
            otlp
        }
        None => signal_endpoint.is_some() || base_endpoint.is_some(),
    };
    if !wanted {
        return Ok(None);
    }
    let (protocol_variable, protocol) = match get(OTEL_EXPORTER_OTLP_TRACES_PROTOCOL) {
        Some(p) => (OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, Some(p)),
        None => (
            OTEL_EXPORTER_OTLP_PROTOCOL,
            get(OTEL_EXPORTER_OTLP_PROTOCOL),
        ),
    };
    let protocol = match protocol.as_deref().map(str::trim) {
        None | Some("http/protobuf") => OtlpProtocol::HttpProtobuf,
        Some("grpc") if cfg!(feature = "otlp-grpc") => OtlpProtocol::Grpc,
        Some("grpc") => {
            return Err(bad(
                protocol_variable,
                "grpc",
                "this build has no gRPC exporter (build spillway with --features otlp-grpc); use http/protobuf (a collector's port 4318)",
            ))
        }
        Some(other) => {
            return Err(bad(
                protocol_variable,
                other,
                "use http/protobuf or grpc (http/json is not supported)",
            ))
        }
    };
    // The specification: a signal endpoint is used as is; HTTP appends the signal's path to
    // the base endpoint, gRPC uses the base endpoint as is.
    let endpoint = match (signal_endpoint, base_endpoint, protocol) {
        (Some(url), _, _) => checked_url(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, url)?,
        (None, Some(base), OtlpProtocol::HttpProtobuf) => {
            let base = checked_url(OTEL_EXPORTER_OTLP_ENDPOINT, base)?;
            format!("{}/v1/traces", base.trim_end_matches('/'))
        }
        (None, Some(base), OtlpProtocol::Grpc) => checked_url(OTEL_EXPORTER_OTLP_ENDPOINT, base)?,
        (None, None, OtlpProtocol::HttpProtobuf) => format!("{DEFAULT_HTTP_ENDPOINT}/v1/traces"),
        (None, None, OtlpProtocol::Grpc) => DEFAULT_GRPC_ENDPOINT.to_owned(),
    };
    let mut resource = match get(OTEL_RESOURCE_ATTRIBUTES) {
        Some(text) => resource_attributes(&text)?,
        None => Vec::new(),
    };
    let service_name = get(OTEL_SERVICE_NAME)
        .or_else(|| {
            resource
                .iter()
                .find(|(k, _)| k == "service.name")
                .map(|(_, v)| v.clone())
        })
        .unwrap_or_else(|| DEFAULT_SERVICE_NAME.to_owned());
    resource.retain(|(k, _)| k != "service.name");
    Ok(Some(TraceExport {
        endpoint,
        protocol,
        service_name,
        resource,
        sampler: sampler(get(OTEL_TRACES_SAMPLER), get(OTEL_TRACES_SAMPLER_ARG))?,
    }))
}

fn checked_url(variable: &'static str, url: String) -> Result<String, TelemetryError> {
    let url = url.trim().to_owned();
    if url.starts_with("https://") {
        // The exporter's HTTP client is built without TLS (no native crypto build needed).
        return Err(bad(
            variable,
            &url,
            "this build sends OTLP over plain HTTP; point it at a collector on this host or network (http://...:4318), which may forward over TLS",
        ));
    }
    if !url.starts_with("http://") || url.parse::<actix_web::http::Uri>().is_err() {
        return Err(bad(
            variable,
            &url,
            "expected an http:// URL such as http://localhost:4318",
        ));
    }
    Ok(url)
}

/// `key=value,key2=value2`, as the OpenTelemetry specification writes resource attributes.
fn resource_attributes(text: &str) -> Result<Vec<(String, String)>, TelemetryError> {
    text.split(',')
        .map(str::trim)
        .filter(|pair| !pair.is_empty())
        .map(|pair| match pair.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_owned(), v.trim().to_owned())),
            _ => Err(bad(
                OTEL_RESOURCE_ATTRIBUTES,
                text,
                format!("'{pair}' is not key=value"),
            )),
        })
        .collect()
}

/// `OTEL_TRACES_SAMPLER` and its argument; the default is `parentbased_always_on`.
fn sampler(name: Option<String>, argument: Option<String>) -> Result<Sampler, TelemetryError> {
    let ratio = || -> Result<f64, TelemetryError> {
        match &argument {
            None => Ok(1.0),
            Some(text) => match text.trim().parse::<f64>() {
                Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
                _ => Err(bad(
                    OTEL_TRACES_SAMPLER_ARG,
                    text,
                    "expected a sampling ratio between 0 and 1",
                )),
            },
        }
    };
    let Some(name) = name else {
        return Ok(Sampler::ParentBased(Box::new(Sampler::AlwaysOn)));
    };
    Ok(match name.trim() {
        "always_on" => Sampler::AlwaysOn,
        "always_off" => Sampler::AlwaysOff,
        "traceidratio" => Sampler::TraceIdRatioBased(ratio()?),
        "parentbased_always_on" => Sampler::ParentBased(Box::new(Sampler::AlwaysOn)),
        "parentbased_always_off" => Sampler::ParentBased(Box::new(Sampler::AlwaysOff)),
        "parentbased_traceidratio" => {
            Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(ratio()?)))
        }
        _ => return Err(bad(
            OTEL_TRACES_SAMPLER,
            &name,
            "use always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off or parentbased_traceidratio",
        )),
    })
}

/// The process's telemetry; [`Telemetry::shutdown`] (or drop) flushes the spans.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// True when spans are exported.
    pub fn traces_enabled(&self) -> bool {
        self.provider.is_some()
    }

    /// Exports the spans buffered so far (the batch exporter otherwise sends every few seconds).
    pub fn flush(&self) -> Result<(), String> {
        match &self.provider {
            Some(provider) => provider.force_flush().map_err(|e| e.to_string()),
            None => Ok(()),
        }
    }

    /// Exports the spans still buffered and stops the exporter.
    pub fn shutdown(&mut self) {
        if let Some(provider) = self.provider.take() {
            if let Err(e) = provider.force_flush() {
                tracing::warn!(error = %e, "flushing the last spans failed");
            }
            if let Err(e) = provider.shutdown_with_timeout(SHUTDOWN_TIMEOUT) {
                tracing::warn!(error = %e, "stopping the trace exporter failed");
            }
        }
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        self.shutdown();
    }
}

static LOG_LEVELS: OnceLock<Arc<LogLevels>> = OnceLock::new();

/// The log levels `/admin/loggers` shows and changes. Before [`init`] (a process that set up
/// logging otherwise, e.g. a test), levels from `RUST_LOG` that cannot change.
pub fn log_levels() -> Arc<LogLevels> {
    Arc::clone(LOG_LEVELS.get_or_init(|| {
        Arc::new(LogLevels::detached(
            &std::env::var(LOG_LEVEL_ENV).unwrap_or_else(|_| "info".to_owned()),
        ))
    }))
}

/// Sets up logs (on standard error) and traces for this process.
pub fn init(config: TelemetryConfig) -> Result<Telemetry, TelemetryError> {
    let colours = std::io::IsTerminal::is_terminal(&std::io::stderr());
    install(config, std::io::stderr, colours)
}

/// As [`init`], with log lines going to `writer` without colours (tests capture them).
pub fn init_with_writer<W>(config: TelemetryConfig, writer: W) -> Result<Telemetry, TelemetryError>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    install(config, writer, false)
}

fn install<W>(
    config: TelemetryConfig,
    writer: W,
    colours: bool,
) -> Result<Telemetry, TelemetryError>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let Built {
        subscriber,
        levels,
        provider,
    } = build(&config, writer, colours)?;
    subscriber
        .try_init()
        .map_err(|_| TelemetryError::AlreadyInitialized)?;
    follow_tracing_max_level();
    if let Some(provider) = &provider {
        opentelemetry::global::set_tracer_provider(provider.clone());
        opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    }
    LOG_LEVELS
        .set(Arc::new(levels))
        .map_err(|_| TelemetryError::AlreadyInitialized)?;
    if let Some(export) = &config.traces {
        tracing::info!(endpoint = %export.endpoint, protocol = ?export.protocol, service = %export.service_name, "exporting traces over OTLP");
    }
    Ok(Telemetry { provider })
}

/// The level of the batch stage spans (`spillway_actors::telemetry`): what the trace layer
/// needs enabled.
const STAGE_SPAN_LEVEL: Level = Level::DEBUG;

/// Sets the `log` crate's maximum level (librdkafka's and sled's records come through it) to
/// the most verbose level any installed subscriber wants, so a disabled record costs one
/// comparison. `tracing-subscriber` sets it once at start-up; a level change must set it again.
fn follow_tracing_max_level() {
    log::set_max_level(as_log_level(tracing::level_filters::LevelFilter::current()));
}

fn as_log_level(level: tracing::level_filters::LevelFilter) -> log::LevelFilter {
    use tracing::level_filters::LevelFilter;
    match level {
        LevelFilter::OFF => log::LevelFilter::Off,
        LevelFilter::ERROR => log::LevelFilter::Error,
        LevelFilter::WARN => log::LevelFilter::Warn,
        LevelFilter::INFO => log::LevelFilter::Info,
        LevelFilter::DEBUG => log::LevelFilter::Debug,
        _ => log::LevelFilter::Trace,
    }
}

/// A subscriber not yet installed, with what manages it.
struct Built<S> {
    subscriber: S,
    levels: LogLevels,
    provider: Option<SdkTracerProvider>,
}

/// The layer stack: the log output behind a reloadable level filter, and the span exporter
/// behind a filter of its own (so lowering log levels never loses spans).
fn build<W>(
    config: &TelemetryConfig,
    writer: W,
    colours: bool,
) -> Result<Built<impl tracing::Subscriber + Send + Sync + 'static>, TelemetryError>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let (mut levels, env_filter) =
        LogLevels::with_filter(&config.log_filter).map_err(|e| TelemetryError::BadLogFilter {
            filter: config.log_filter.clone(),
            reason: e.to_string(),
        })?;
    let (reloadable, handle) = reload::Layer::new(env_filter);
    levels.attach(Box::new(move |filter| {
        handle.reload(filter).map_err(|e| e.to_string())?;
        // The reload recomputed the levels any subscriber wants; `log` records follow them.
        follow_tracing_max_level();
        Ok(())
    }));
    let log_filter = levels.recording(reloadable);
    // Secrets of stored configurations never reach the log output, whatever the level.
    let writer = crate::secrets::RedactingWriter(writer);
    let logs = match config.log_format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_ansi(colours)
            .with_writer(writer)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_ansi(false)
            .with_current_span(true)
            .with_span_list(true)
            .with_writer(writer)
            .boxed(),
    }
    // One filter, not two stacked: a stack's level hint is only its outer filter's, and
    // without a hint every disabled `debug!`/`trace!` call (rdkafka logs one per message
    // freed) would be matched against the levels at run time instead of skipped.
    .with_filter(log_filter.and(crate::log_levels::NeverShown));

    let provider = config.traces.as_ref().map(tracer_provider).transpose()?;
    // Stage spans, and warnings and errors inside them (as span events); nothing else: the
    // long-lived `task` span of the logs must not become every batch's parent.
    let trace_filter = filter_fn(|meta| {
        meta.target() == STAGE_SPAN_TARGET || (meta.is_event() && *meta.level() <= Level::WARN)
    })
    .with_max_level_hint(STAGE_SPAN_LEVEL);
    let traces = provider.as_ref().map(|provider| {
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer(spillway_actors::telemetry::TRACER_NAME))
            .with_filter(trace_filter)
    });
    Ok(Built {
        subscriber: tracing_subscriber::registry().with(logs).with(traces),
        levels,
        provider,
    })
}

/// The OTLP exporter for `export`. The gRPC one must be built inside a Tokio runtime (the
/// subcommands run in one).
fn span_exporter(export: &TraceExport) -> Result<opentelemetry_otlp::SpanExporter, String> {
    let builder = opentelemetry_otlp::SpanExporter::builder();
    match export.protocol {
        OtlpProtocol::HttpProtobuf => builder
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(&export.endpoint)
            .build()
            .map_err(|e| e.to_string()),
        #[cfg(feature = "otlp-grpc")]
        OtlpProtocol::Grpc => builder
            .with_tonic()
            .with_endpoint(&export.endpoint)
            .build()
            .map_err(|e| e.to_string()),
        #[cfg(not(feature = "otlp-grpc"))]
        OtlpProtocol::Grpc => {
            Err("this build has no gRPC exporter (build spillway with --features otlp-grpc)".into())
        }
    }
}

fn tracer_provider(export: &TraceExport) -> Result<SdkTracerProvider, TelemetryError> {
    let exporter = span_exporter(export).map_err(|reason| TelemetryError::Exporter {
        endpoint: export.endpoint.clone(),
        reason,
    })?;
    let resource = Resource::builder_empty()
        .with_service_name(export.service_name.clone())
        .with_attributes(
            export
                .resource
                .iter()
                .map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
        )
        .build();
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_sampler(export.sampler.clone())
        .with_resource(resource)
        .build())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::io::Write;
    use std::sync::Mutex;

    use serde_json::Value as Json;
    use spillway_actors::telemetry::TaskIdentity;

    use super::*;

    /// Log output kept in memory.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Captured {
        fn lines(&self) -> Vec<String> {
            String::from_utf8(self.0.lock().unwrap().clone())
                .unwrap()
                .lines()
                .map(str::to_owned)
                .collect()
        }
    }

    impl Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Captured {
        type Writer = Captured;

        fn make_writer(&'a self) -> Captured {
            self.clone()
        }
    }

    #[test]
    fn json_lines_carry_the_task_fields_and_levels_change_while_running() {
        let captured = Captured::default();
        let config = TelemetryConfig {
            log_format: LogFormat::Json,
            log_filter: "info".to_owned(),
            traces: None,
        };
        let built = build(&config, captured.clone(), false).expect("builds");
        let levels = built.levels;
        tracing::subscriber::with_default(built.subscriber, || {
            let identity = TaskIdentity {
                tenant: "acme".into(),
                connector: "orders-sink".into(),
                task: 2,
            };
            let _task = identity.log_span().entered();
            tracing::info!(target: "spillway_actors::sink", "visible at info");
            tracing::debug!(target: "spillway_actors::sink", "hidden at info");
            let changed = levels.set("spillway_actors.sink", "debug").expect("set");
            assert_eq!(changed, ["spillway_actors::sink"]);
            tracing::debug!(target: "spillway_actors::sink", "visible at debug");
            tracing::debug!(target: "spillway_kafka::share", "still hidden");
            levels.set("root", "ERROR").expect("set");
            tracing::warn!(target: "spillway_actors::sink", "hidden at error");
        });
        let lines: Vec<Json> = captured
            .lines()
            .iter()
            .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
            .collect();
        let messages: Vec<&str> = lines
            .iter()
            .filter_map(|l| l["fields"]["message"].as_str())
            .collect();
        assert_eq!(
            messages,
            ["visible at info", "log level set", "visible at debug"],
            "the level change itself is logged (at INFO, by this module)"
        );
        for line in lines
            .iter()
            .filter(|l| l["target"] == "spillway_actors::sink")
        {
            assert_eq!(line["span"]["name"], "task", "{line}");
            assert_eq!(line["span"]["tenant"], "acme", "{line}");
            assert_eq!(line["span"]["connector"], "orders-sink", "{line}");
            assert_eq!(line["span"]["task"], 2, "{line}");
        }
        assert_eq!(lines[2]["level"], "DEBUG");
    }

    #[test]
    fn the_subscriber_names_its_most_verbose_level_so_disabled_calls_are_skipped() {
        use tracing::level_filters::LevelFilter;
        use tracing::Subscriber as _;
        let config = TelemetryConfig {
            log_filter: "info".to_owned(),
            traces: None,
            ..TelemetryConfig::default()
        };
        let built = build(&config, Captured::default(), false).expect("builds");
        assert_eq!(built.subscriber.max_level_hint(), Some(LevelFilter::INFO));
        // A level change through /admin/loggers widens it (and narrows it again).
        built.levels.set("rdkafka", "trace").expect("set");
        assert_eq!(built.subscriber.max_level_hint(), Some(LevelFilter::TRACE));
        built.levels.set("rdkafka", "info").expect("set");
        assert_eq!(built.subscriber.max_level_hint(), Some(LevelFilter::INFO));

        // Exporting traces needs the stage spans, whatever the log levels.
        let config = TelemetryConfig {
            log_filter: "warn".to_owned(),
            traces: Some(TraceExport::to("http://127.0.0.1:9/v1/traces")),
            ..TelemetryConfig::default()
        };
        let built = build(&config, Captured::default(), false).expect("builds");
        assert_eq!(built.subscriber.max_level_hint(), Some(LevelFilter::DEBUG));
    }

    #[test]
    fn log_records_follow_the_tracing_levels() {
        use tracing::level_filters::LevelFilter;
        assert_eq!(as_log_level(LevelFilter::OFF), log::LevelFilter::Off);
        assert_eq!(as_log_level(LevelFilter::WARN), log::LevelFilter::Warn);
        assert_eq!(as_log_level(LevelFilter::INFO), log::LevelFilter::Info);
        assert_eq!(as_log_level(LevelFilter::TRACE), log::LevelFilter::Trace);
    }

    #[test]
    fn text_lines_name_the_task_context_even_when_only_warnings_are_on() {
        let captured = Captured::default();
        let config = TelemetryConfig {
            log_filter: "warn".to_owned(),
            ..TelemetryConfig::default()
        };
        let built = build(&config, captured.clone(), false).expect("builds");
        tracing::subscriber::with_default(built.subscriber, || {
            let identity = TaskIdentity {
                tenant: "default".into(),
                connector: "files".into(),
                task: 0,
            };
            let _task = identity.log_span().entered();
            tracing::warn!(target: "spillway_actors::consumer", "commit not applied");
        });
        let lines = captured.lines();
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].contains("task{tenant=default connector=files task=0}"),
            "{}",
            lines[0]
        );
        assert!(lines[0].contains("commit not applied"), "{}", lines[0]);
    }

    fn from(vars: &[(&str, &str)]) -> Result<TelemetryConfig, TelemetryError> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        TelemetryConfig::from_lookup(|name| vars.get(name).cloned())
    }

    #[test]
    fn tracing_is_off_unless_the_environment_asks_for_it() {
        let config = from(&[]).unwrap();
        assert!(config.traces.is_none());
        assert_eq!(config.log_format, LogFormat::Text);
        assert_eq!(config.log_filter, "info");
        assert!(from(&[("OTEL_TRACES_EXPORTER", "none")])
            .unwrap()
            .traces
            .is_none());
        assert!(from(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
            ("OTEL_SDK_DISABLED", "true")
        ])
        .unwrap()
        .traces
        .is_none());
    }

    #[test]
    fn the_endpoint_comes_from_the_signal_variable_then_the_base_then_the_default() {
        let base = from(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")])
            .unwrap()
            .traces
            .unwrap();
        assert_eq!(base.endpoint, "http://collector:4318/v1/traces");
        let signal = from(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://traces:9999/custom",
            ),
        ])
        .unwrap()
        .traces
        .unwrap();
        assert_eq!(signal.endpoint, "http://traces:9999/custom");
        let default = from(&[("OTEL_TRACES_EXPORTER", "otlp")])
            .unwrap()
            .traces
            .unwrap();
        assert_eq!(default.endpoint, "http://localhost:4318/v1/traces");
        assert_eq!(default.service_name, "spillway");
    }

    #[test]
    fn service_name_resource_and_sampler_are_read() {
        let export = from(&[
            ("OTEL_TRACES_EXPORTER", "otlp"),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "service.name=ignored,deployment.environment=prod",
            ),
            ("OTEL_SERVICE_NAME", "spillway-eu"),
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
        ])
        .unwrap()
        .traces
        .unwrap();
        assert_eq!(export.service_name, "spillway-eu");
        assert_eq!(
            export.resource,
            [("deployment.environment".to_owned(), "prod".to_owned())]
        );
        assert!(
            matches!(&export.sampler, Sampler::ParentBased(inner) if format!("{inner:?}").contains("0.25")),
            "{:?}",
            export.sampler
        );
    }

    #[test]
    fn bad_values_are_refused_naming_the_variable_and_the_value() {
        for (vars, needle) in [
            (
                vec![("OTEL_TRACES_EXPORTER", "zipkin")],
                "OTEL_TRACES_EXPORTER='zipkin'",
            ),
            (
                vec![("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318")],
                "OTEL_EXPORTER_OTLP_ENDPOINT='collector:4318'",
            ),
            (
                vec![(
                    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                    "https://collector/v1/traces",
                )],
                "plain HTTP",
            ),
            (
                vec![
                    ("OTEL_TRACES_EXPORTER", "otlp"),
                    ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json"),
                ],
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL='http/json'",
            ),
            (
                vec![
                    ("OTEL_TRACES_EXPORTER", "otlp"),
                    ("OTEL_TRACES_SAMPLER", "traceidratio"),
                    ("OTEL_TRACES_SAMPLER_ARG", "2"),
                ],
                "OTEL_TRACES_SAMPLER_ARG='2'",
            ),
            (
                vec![
                    ("OTEL_TRACES_EXPORTER", "otlp"),
                    ("OTEL_TRACES_SAMPLER", "sometimes"),
                ],
                "OTEL_TRACES_SAMPLER='sometimes'",
            ),
            (vec![("SPILLWAY_LOG_FORMAT", "xml")], "log format 'xml'"),
        ] {
            let err = from(&vars).expect_err(needle).to_string();
            assert!(err.contains(needle), "{err}");
        }
    }

    #[cfg(not(feature = "otlp-grpc"))]
    #[test]
    fn grpc_needs_the_otlp_grpc_feature() {
        let err = from(&[
            ("OTEL_TRACES_EXPORTER", "otlp"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ])
        .expect_err("no gRPC in this build")
        .to_string();
        assert!(err.contains("OTEL_EXPORTER_OTLP_PROTOCOL='grpc'"), "{err}");
        assert!(err.contains("--features otlp-grpc"), "{err}");
    }

    #[cfg(feature = "otlp-grpc")]
    #[test]
    fn grpc_uses_the_base_endpoint_as_is_and_port_4317_by_default() {
        let grpc = |extra: &[(&'static str, &'static str)]| {
            let mut vars = vec![
                ("OTEL_TRACES_EXPORTER", "otlp"),
                ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"),
            ];
            vars.extend_from_slice(extra);
            from(&vars).unwrap().traces.unwrap()
        };
        let default = grpc(&[]);
        assert_eq!(default.protocol, OtlpProtocol::Grpc);
        assert_eq!(default.endpoint, "http://localhost:4317");
        let base = grpc(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317")]);
        assert_eq!(base.endpoint, "http://collector:4317");
    }

    #[test]
    fn the_log_format_is_chosen_by_the_environment() {
        assert_eq!(
            from(&[("SPILLWAY_LOG_FORMAT", "JSON")]).unwrap().log_format,
            LogFormat::Json
        );
        assert_eq!(
            from(&[("RUST_LOG", "warn,spillway_actors=debug")])
                .unwrap()
                .log_filter,
            "warn,spillway_actors=debug"
        );
    }
}
