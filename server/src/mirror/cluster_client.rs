//! The rdkafka client the mirror's own rounds use on a cluster (topic listing, offset syncs,
//! group offsets): the cluster's address and security, one group id per use, no auto-commit.

use anyhow::{anyhow, Context, Result};
use rdkafka::consumer::BaseConsumer;
use rdkafka::ClientConfig;
use spillway_kafka::security::{rdkafka_config, SecurityContext};

use super::config::ClusterSettings;

/// A consumer on `cluster` under `group` that commits only when told to. The group names what
/// the client is for; offsets it commits land in that group.
pub fn cluster_client(
    cluster: &ClusterSettings,
    group: &str,
) -> Result<BaseConsumer<SecurityContext>> {
    client(cluster, group, &[])
}

/// A [`cluster_client`] that reads a partition to its end: it reports the end
/// (`PartitionEOF`), which a position cannot show when the partition ends with a transaction
/// marker (a marker is never delivered, so the position stops before it).
pub fn cluster_reader(
    cluster: &ClusterSettings,
    group: &str,
) -> Result<BaseConsumer<SecurityContext>> {
    client(cluster, group, &[("enable.partition.eof", "true")])
}

fn client(
    cluster: &ClusterSettings,
    group: &str,
    extra: &[(&str, &str)],
) -> Result<BaseConsumer<SecurityContext>> {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &cluster.bootstrap_servers)
        .set("group.id", group)
        .set("enable.auto.commit", "false");
    for (key, value) in extra {
        config.set(*key, *value);
    }
    let context = rdkafka_config(
        &mut config,
        cluster
            .security
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str())),
    )
    .map_err(|e| anyhow!("cluster {}: {e}", cluster.alias))?;
    config
        .create_with_context(context)
        .with_context(|| format!("cannot make a client for cluster {}", cluster.alias))
}
