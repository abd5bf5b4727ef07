//! Requests the proxy answers itself instead of forwarding: a dispatch keyed by API key.
//!
//! An emulation implements [`LocalApi`] and is registered once in [`LocalApis`]; the connection
//! pump asks [`LocalApis::answer`] before forwarding, so adding an emulated API is one
//! `register` call. While any emulation is registered the proxy also answers ApiVersions
//! itself, with the dev broker's list (learned once at start) merged with the emulated ranges,
//! so that a client that only uses emulated APIs never causes a connection to the dev broker.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::{ApiVersionsRequest, ApiVersionsResponse};
use kafka_protocol::protocol::Message;

use super::frame::{decode_request, encode_response, response_header, RequestMeta};
use super::rewrite::{advertise_sasl, API_VERSIONS};

/// Kafka's UNSUPPORTED_VERSION.
const UNSUPPORTED_VERSION: i16 = 35;

/// A response frame the proxy made (without length prefix), or why it could not make one.
pub(crate) type LocalAnswer = Pin<Box<dyn Future<Output = Result<Bytes, String>> + Send>>;

/// One emulated set of APIs.
pub(crate) trait LocalApi: Send + Sync {
    /// (api key, min version, max version) of every API this emulation answers.
    fn versions(&self) -> Vec<(i16, i16, i16)>;
    /// Answers one request (`frame` is the whole request, header included) that arrived on the
    /// listener standing for broker `node`.
    fn answer(&self, meta: RequestMeta, frame: Bytes, node: i32) -> LocalAnswer;
}

/// The emulations of one proxy, by API key.
#[derive(Default)]
pub(crate) struct LocalApis {
    handlers: BTreeMap<i16, (i16, i16, Arc<dyn LocalApi>)>,
    /// The dev broker's own ApiVersions list, learned at start; `Some` once anything is
    /// registered.
    upstream_versions: Option<Vec<ApiVersion>>,
    sasl: bool,
}

impl LocalApis {
    /// `upstream_versions`: the dev broker's ApiVersions answer; `sasl`: the listener
    /// advertises the SASL APIs too.
    pub(crate) fn new(upstream_versions: Option<Vec<ApiVersion>>, sasl: bool) -> LocalApis {
        LocalApis {
            handlers: BTreeMap::new(),
            upstream_versions,
            sasl,
        }
    }

    pub(crate) fn register(&mut self, api: Arc<dyn LocalApi>) {
        for (key, min, max) in api.versions() {
            self.handlers.insert(key, (min, max, Arc::clone(&api)));
        }
    }

    /// The answer to this request when the proxy makes it itself; `None` to forward it.
    pub(crate) fn answer(
        &self,
        meta: RequestMeta,
        frame: &Bytes,
        node: i32,
    ) -> Option<LocalAnswer> {
        if meta.api_key == API_VERSIONS {
            let upstream = self.upstream_versions.as_ref()?;
            if self.handlers.is_empty() {
                return None;
            }
            let reply = self.api_versions(meta, frame, upstream);
            return Some(Box::pin(async move { reply }));
        }
        let (min, max, api) = self.handlers.get(&meta.api_key)?;
        if meta.version < *min || meta.version > *max {
            // Kafka closes the connection on a version it does not support.
            let message = format!(
                "api_key={} v{} is outside the emulated range v{min}-{max}",
                meta.api_key, meta.version
            );
            return Some(Box::pin(async move { Err(message) }));
        }
        Some(api.answer(meta, frame.clone(), node))
    }

    /// The dev broker's list with the emulated APIs put in, answered as Kafka does: a version
    /// above the highest supported gets UNSUPPORTED_VERSION with the ApiVersions range, in v0.
    fn api_versions(
        &self,
        meta: RequestMeta,
        frame: &Bytes,
        upstream: &[ApiVersion],
    ) -> Result<Bytes, String> {
        let mut keys: BTreeMap<i16, ApiVersion> =
            upstream.iter().map(|k| (k.api_key, k.clone())).collect();
        for (key, (min, max, _)) in &self.handlers {
            let mut entry = ApiVersion::default();
            entry.api_key = *key;
            entry.min_version = *min;
            entry.max_version = *max;
            keys.insert(*key, entry);
        }
        let ours = keys
            .get(&API_VERSIONS)
            .map(|k| (k.min_version, k.max_version))
            .unwrap_or((0, 3));
        let max = ours.1.min(ApiVersionsResponse::VERSIONS.max);
        let header = response_header(meta.correlation_id);
        let mut response = ApiVersionsResponse::default();
        if meta.version > max {
            response.error_code = UNSUPPORTED_VERSION;
            let mut entry = ApiVersion::default();
            entry.api_key = API_VERSIONS;
            entry.min_version = ours.0;
            entry.max_version = max;
            response.api_keys = vec![entry];
            return encode_response(&header, &response, 0);
        }
        // The body is only checked to be decodable; ApiVersions carries nothing we act on.
        decode_request::<ApiVersionsRequest>(frame, meta.version)?;
        response.api_keys = keys.into_values().collect();
        if self.sasl {
            advertise_sasl(&mut response);
        }
        encode_response(&header, &response, meta.version)
    }
}
