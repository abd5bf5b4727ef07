//! A dev broker behind a plaintext test-kit proxy that answers Kafka's admin requests
//! (`ProxyOptions::with_admin_emulation`), for tests and the demo that need CreateTopics,
//! DescribeConfigs/IncrementalAlterConfigs or the share-group offsets APIs.

use crate::kafka_proxy::{AdminEmulation, KafkaProxy, ProxyOptions, ProxySecurity};
use crate::{DevBroker, DevBrokerError};

/// Clients use [`Self::bootstrap`] (the proxy's); tests drive the mock through [`Self::broker`].
pub struct ProxiedDevBroker {
    // Dropped first: the proxy's connections close before the broker goes away.
    proxy: KafkaProxy,
    broker: DevBroker,
}

impl ProxiedDevBroker {
    /// Starts `brokers` mock brokers with `topics` (name, partitions) and a plaintext proxy
    /// with the admin emulation in front of them.
    pub fn start(brokers: u32, topics: &[(&str, i32)]) -> Result<ProxiedDevBroker, String> {
        Self::start_with(brokers, topics, ProxyOptions::new(ProxySecurity::Plaintext))
    }

    /// As [`Self::start`], with these proxy options (the admin emulation is added to them).
    /// With `with_partition_growth` the `topics` are made with room to grow and clients see
    /// the partition counts given here.
    pub fn start_with(
        brokers: u32,
        topics: &[(&str, i32)],
        options: ProxyOptions,
    ) -> Result<ProxiedDevBroker, String> {
        // With partition growth the dev broker gets room to grow (`with_partition_growth`).
        let capacity = |partitions: i32| {
            options
                .partition_capacity
                .map_or(partitions, |c| partitions.max(c))
        };
        let made: Vec<(&str, i32)> = topics.iter().map(|&(t, n)| (t, capacity(n))).collect();
        let broker =
            DevBroker::try_start(brokers, &made).map_err(|e: DevBrokerError| e.to_string())?;
        let proxy = KafkaProxy::start(
            &broker.bootstrap(),
            options.with_admin_emulation(broker.control()),
        )
        .map_err(|e| e.to_string())?;
        if let Some(growth) = proxy.partition_growth() {
            for (&(topic, visible), &(_, actual)) in topics.iter().zip(&made) {
                growth.track(topic, visible, actual);
            }
        }
        Ok(ProxiedDevBroker { proxy, broker })
    }

    /// The proxy's bootstrap list: what clients connect to.
    pub fn bootstrap(&self) -> String {
        self.proxy.bootstrap()
    }

    pub fn broker(&self) -> &DevBroker {
        &self.broker
    }

    pub fn proxy(&self) -> &KafkaProxy {
        &self.proxy
    }

    pub fn admin(&self) -> &AdminEmulation {
        self.proxy
            .admin()
            .expect("the proxy was started with the admin emulation")
    }
}
