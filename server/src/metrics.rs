//! Where the runtime's metrics go (docs/metrics.md): an OpenTelemetry meter provider with a
//! Prometheus reader, rendered as Prometheus text at `GET /metrics` on the REST port, and an
//! OTLP exporter when the standard `OTEL_*` environment variables ask for one (off otherwise).
//!
//! OTLP metrics are on when `OTEL_METRICS_EXPORTER` lists `otlp`, or when it is unset and
//! `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` is set;
//! `OTEL_METRICS_EXPORTER=none` or `OTEL_SDK_DISABLED=true` turns them off. The exporter itself
//! reads the endpoint, headers, timeout and temporality variables, and the reader reads
//! `OTEL_METRIC_EXPORT_INTERVAL`.

use std::sync::Arc;

use actix_web::web::Data;
use actix_web::{HttpMessage, HttpRequest, HttpResponse};
use anyhow::{bail, Context, Result};
use opentelemetry::metrics::{Meter, MeterProvider as _};
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::Resource;
use prometheus::proto::MetricFamily;
use prometheus::{Encoder, TextEncoder};
use tracing::{info, warn};

use crate::rest::auth::Principal;
use crate::rest::Api;

/// The instrumentation scope of the runtime's instruments.
pub const METER_NAME: &str = "spillway";

/// The worker's metrics pipeline.
pub struct Telemetry {
    provider: SdkMeterProvider,
    registry: prometheus::Registry,
    otlp: bool,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry")
            .field("otlp", &self.otlp)
            .finish()
    }
}

/// Whether the `OTEL_*` variables (read through `var`) ask for OTLP metrics.
pub fn otlp_metrics_wanted(var: impl Fn(&str) -> Option<String>) -> Result<bool> {
    let set = |name: &str| var(name).filter(|v| !v.trim().is_empty());
    if set("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
        return Ok(false);
    }
    for name in [
        "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ] {
        if let Some(protocol) = set(name) {
            if !matches!(protocol.trim(), "http/protobuf" | "http/json") {
                bail!("{name}={protocol} is not supported; use http/protobuf or http/json");
            }
        }
    }
    match set("OTEL_METRICS_EXPORTER") {
        Some(list) => {
            let mut otlp = false;
            for exporter in list.split(',').map(str::trim) {
                match exporter {
                    "otlp" => otlp = true,
                    // Prometheus text is always served at /metrics.
                    "prometheus" | "none" => {}
                    other => bail!(
                        "OTEL_METRICS_EXPORTER lists '{other}'; supported: otlp, prometheus, none"
                    ),
                }
            }
            Ok(otlp && !list.split(',').any(|e| e.trim() == "none"))
        }
        None => Ok(set("OTEL_EXPORTER_OTLP_ENDPOINT").is_some()
            || set("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT").is_some()),
    }
}

impl Telemetry {
    /// The pipeline the process environment asks for (Prometheus always, OTLP when set).
    pub fn from_env() -> Result<Telemetry> {
        let otlp = otlp_metrics_wanted(|name| std::env::var(name).ok())?;
        Self::build(otlp)
    }

    /// A pipeline with the Prometheus reader, and an OTLP exporter when `otlp`.
    pub fn build(otlp: bool) -> Result<Telemetry> {
        let registry = prometheus::Registry::new();
        let prometheus = opentelemetry_prometheus::exporter()
            .with_registry(registry.clone())
            // Connect's names already say the unit and end in -total where they count.
            .without_units()
            .without_counter_suffixes()
            .scope_info_enabled(false)
            .build()
            .context("cannot set up the Prometheus exporter")?;
        let mut resource = Resource::builder();
        if std::env::var("OTEL_SERVICE_NAME").is_err() {
            resource = resource.with_service_name(METER_NAME);
        }
        let mut builder = SdkMeterProvider::builder()
            .with_resource(resource.build())
            .with_reader(prometheus);
        if otlp {
            let exporter = opentelemetry_otlp::MetricExporter::builder()
                .build()
                .context("cannot set up the OTLP metrics exporter (OTEL_EXPORTER_OTLP_*)")?;
            builder = builder.with_reader(PeriodicReader::builder(exporter).build());
            info!("exporting metrics over OTLP");
        }
        let provider = builder.build();
        // MirrorMaker 2's age and latency statistics, read from the flows' tasks.
        spillway_connectors::kafka_mirror_metrics::register_gauges(&provider.meter(METER_NAME));
        Ok(Telemetry {
            provider,
            registry,
            otlp,
        })
    }

    /// Makes this pipeline OpenTelemetry's global meter provider, for instruments made where no
    /// meter is handed down (the kafka sink's mirror metrics).
    pub fn install_global(&self) {
        opentelemetry::global::set_meter_provider(self.provider.clone());
    }

    /// The meter the runtime records through.
    pub fn meter(&self) -> Meter {
        self.provider.meter(METER_NAME)
    }

    pub fn exports_otlp(&self) -> bool {
        self.otlp
    }

    /// Every metric now, in Prometheus' text format.
    pub fn render(&self) -> Result<String> {
        self.render_for(None)
    }

    /// The metrics `tenant` may see in Prometheus' text format: with `Some(tenant)` only the
    /// series labelled `tenant="<tenant>"` (worker totals and other tenants' series are left
    /// out); with `None` every series (the admin's view).
    pub fn render_for(&self, tenant: Option<&str>) -> Result<String> {
        let mut families = self.registry.gather();
        if let Some(tenant) = tenant {
            families = only_tenant(families, tenant);
        }
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&families, &mut out)
            .context("cannot encode the metrics")?;
        String::from_utf8(out).context("the metrics text is not UTF-8")
    }

    /// Exports what is pending over OTLP and stops the readers.
    pub fn shutdown(&self) {
        if let Err(e) = self.provider.shutdown() {
            warn!(error = %e, "cannot flush the metrics");
        }
    }
}

/// The series of `families` labelled with `tenant`; families left without one are dropped.
fn only_tenant(families: Vec<MetricFamily>, tenant: &str) -> Vec<MetricFamily> {
    families
        .into_iter()
        .filter_map(|mut family| {
            let kept: Vec<_> = family
                .take_metric()
                .into_iter()
                .filter(|m| {
                    m.get_label()
                        .iter()
                        .any(|l| l.name() == "tenant" && l.value() == tenant)
                })
                .collect();
            if kept.is_empty() {
                return None;
            }
            family.set_metric(kept);
            Some(family)
        })
        .collect()
}

/// `GET /metrics`: Prometheus text (format 0.0.4). The admin (and every caller with
/// authentication off) sees every series; a tenant only its own (`tenant` label).
pub async fn scrape(api: Data<Api>, request: HttpRequest) -> HttpResponse {
    let tenant = match request.extensions().get::<Principal>() {
        Some(Principal::Tenant(tenant)) => Some(tenant.clone()),
        Some(Principal::Admin) => None,
        // The route needs a caller; without one nothing is shown.
        None => Some(String::new()),
    };
    let telemetry: Arc<Telemetry> = Arc::clone(&api.telemetry);
    let rendered =
        actix_web::rt::task::spawn_blocking(move || telemetry.render_for(tenant.as_deref())).await;
    match rendered {
        Ok(Ok(text)) => HttpResponse::Ok()
            .content_type("text/plain; version=0.0.4; charset=utf-8")
            .body(text),
        Ok(Err(e)) => collect_failed(format!("{e:#}")),
        Err(e) => collect_failed(format!("cannot collect the metrics: {e}")),
    }
}

/// Connect's error shape, for the one failure a scrape can have.
fn collect_failed(message: String) -> HttpResponse {
    HttpResponse::InternalServerError().json(serde_json::json!({
        "error_code": 500,
        "message": message,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        }
    }

    #[test]
    fn otlp_is_off_unless_an_endpoint_or_the_exporter_variable_asks() {
        assert!(!otlp_metrics_wanted(env(&[])).expect("valid"));
        assert!(otlp_metrics_wanted(env(&[(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "http://127.0.0.1:4318"
        )]))
        .expect("valid"));
        assert!(otlp_metrics_wanted(env(&[("OTEL_METRICS_EXPORTER", "otlp")])).expect("valid"));
        assert!(!otlp_metrics_wanted(env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
            ("OTEL_METRICS_EXPORTER", "none"),
        ]))
        .expect("valid"));
        assert!(!otlp_metrics_wanted(env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
            ("OTEL_SDK_DISABLED", "true"),
        ]))
        .expect("valid"));
    }

    #[test]
    fn unsupported_settings_are_refused_naming_the_variable() {
        let err = otlp_metrics_wanted(env(&[("OTEL_METRICS_EXPORTER", "statsd")]))
            .expect_err("unknown exporter");
        assert!(err.to_string().contains("OTEL_METRICS_EXPORTER"), "{err}");
        assert!(err.to_string().contains("statsd"), "{err}");
        let err = otlp_metrics_wanted(env(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]))
            .expect_err("grpc is not built in");
        assert!(
            err.to_string().contains("OTEL_EXPORTER_OTLP_PROTOCOL=grpc"),
            "{err}"
        );
    }
}
