//! What a connector sets up in Kafka before its tasks run (docs/runtime.md, "Share-group
//! settings" and "Topics the worker creates"):
//!
//! - in share mode, the share group's configs `share.auto.offset.reset`,
//!   `share.isolation.level` and `share.record.lock.duration.ms`, read with DescribeConfigs and
//!   set with IncrementalAlterConfigs, and the brokers' `group.share.delivery.count.limit`;
//! - in share mode, when the connector ran in classic mode before (KIP-1302 migration), the
//!   consumer group's committed offsets as the new share group's start offsets
//!   (AlterShareGroupOffsets), so the share group goes on where the consumer group left off;
//! - the dead letter queue topic, created with CreateTopics when it is missing.
//!
//! The rule for group configs: Spillway sets a value when the connector asks for it
//! explicitly, or (for `share.auto.offset.reset` only, Spillway's default `earliest`) when the
//! group has no value of its own. A value set on the group is never replaced silently: kept
//! when the connector does not ask for another, replaced with a WARN naming it when it does.
//! What is in force and where it came from goes to the log and to the connector's status.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use spillway_core::config::DeadLetterQueue;
use spillway_kafka::admin::{
    codes, AdminClient, AdminClients, AdminError, AlterOp, ConfigResource, ConfigSource, NewTopic,
    TopicCreation,
};
use spillway_kafka::groups::{check_group_id, Membership};
use spillway_kafka::security::SecuritySettings;
use tracing::{info, warn};

use crate::consumer_settings::{
    GroupConfigWish, SHARE_AUTO_OFFSET_RESET, SHARE_ISOLATION_LEVEL, SHARE_RECORD_LOCK_DURATION_MS,
};

/// Spillway's `share.auto.offset.reset` for a group that has none: a sink reads the backlog
/// (Connect's sinks start at earliest; Kafka's share-group default, latest, would skip it).
pub const DEFAULT_AUTO_OFFSET_RESET: &str = "earliest";
/// Kafka's broker setting: deliveries of a record before the group archives it.
pub const DELIVERY_COUNT_LIMIT: &str = "group.share.delivery.count.limit";
/// Kafka's defaults, for the report when the cluster does not say.
const KAFKA_DEFAULTS: [(&str, &str); 3] = [
    (SHARE_AUTO_OFFSET_RESET, "latest"),
    (SHARE_ISOLATION_LEVEL, "read_uncommitted"),
    (SHARE_RECORD_LOCK_DURATION_MS, "30000"),
];
/// Dead letter queue topics have one partition, as Kafka Connect creates them.
const DLQ_PARTITIONS: i32 = 1;

/// One group config as it is in force.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SettingInForce {
    pub name: String,
    /// `None` when the cluster would not say.
    pub value: Option<String>,
    /// Where the value comes from, in words.
    pub source: String,
}

/// The share group's settings as the connector's status shows them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct GroupSettingsReport {
    pub group: String,
    pub settings: Vec<SettingInForce>,
    /// The brokers' `group.share.delivery.count.limit`, when they told.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delivery_count_limit: Option<u16>,
    /// Where a new share group starts when the connector moved from classic mode: the
    /// consumer group's positions copied, or why they were not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_positions: Option<String>,
    /// What could not be done (refusals, a broker without the admin APIs).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// What the connector asks of Kafka before its tasks run.
#[derive(Debug, Clone)]
pub struct Preparation {
    pub bootstrap: String,
    pub security: SecuritySettings,
    pub timeout: Duration,
    /// In share mode: the group, its topics and the configs the connector asks for.
    pub share: Option<ShareGroupWish>,
    pub dead_letter_queue: Option<DeadLetterQueue>,
}

#[derive(Debug, Clone)]
pub struct ShareGroupWish {
    pub group: String,
    pub topics: Vec<String>,
    pub configs: Vec<GroupConfigWish>,
    /// The consumer group this connector reads through in classic mode, when its id differs
    /// from the share group's: a new share group starts at its committed offsets.
    pub positions_from: Option<String>,
}

/// What preparing found.
#[derive(Debug, Clone, Default)]
pub struct Prepared {
    pub report: Option<GroupSettingsReport>,
}

impl Preparation {
    /// Set up the group and topics. An `Err` is why the tasks cannot run.
    pub async fn run(&self, clients: &AdminClients, connector: &str) -> Result<Prepared, String> {
        let admin = match clients
            .get(&self.bootstrap, &self.security, self.timeout)
            .await
        {
            Ok(admin) => Some(admin),
            Err(e) => {
                warn!(connector, error = %e, "no admin client for the cluster");
                None
            }
        };
        let mut prepared = Prepared::default();
        if let Some(wish) = &self.share {
            // Before the configs: an explicit `earliest` that cannot be set is no loss for a
            // group whose start offsets were just copied.
            let takeover = match (&admin, &wish.positions_from) {
                (Some(admin), Some(from)) => {
                    Some(take_over_positions(admin, wish, from, connector).await)
                }
                _ => None,
            };
            let mut report = match &admin {
                Some(admin) => apply_group_configs(admin, wish, connector).await?,
                None => unreachable_cluster_report(wish),
            };
            if let Some(takeover) = takeover {
                report.start_positions = Some(takeover.description);
                report.warnings.extend(takeover.warning);
            }
            prepared.report = Some(report);
        }
        if let Some(dlq) = &self.dead_letter_queue {
            match &admin {
                Some(admin) => create_dead_letter_topic(admin, dlq, connector).await?,
                None => {
                    warn!(connector, topic = %dlq.topic, "the dead letter queue topic is not checked: the cluster was not reachable for admin requests; the first record sent there may create it (auto.create.topics.enable)")
                }
            }
        }
        Ok(prepared)
    }
}

fn unreachable_cluster_report(wish: &ShareGroupWish) -> GroupSettingsReport {
    let warning = "the cluster was not reachable for admin requests: the group's configs are what the group or the brokers have (Kafka's default for share.auto.offset.reset is latest)".to_owned();
    let start_positions = wish.positions_from.as_ref().map(|from| {
        format!(
            "not copied from consumer group '{from}' (the cluster was not reachable for admin requests): a new share group starts where share.auto.offset.reset says"
        )
    });
    GroupSettingsReport {
        group: wish.group.clone(),
        settings: unknown_settings(wish),
        delivery_count_limit: None,
        start_positions,
        warnings: vec![warning],
    }
}

/// What taking over the consumer group's positions did.
struct Takeover {
    /// For the status: where the share group starts.
    description: String,
    /// Why the positions could not be copied, when that changes what is delivered.
    warning: Option<String>,
}

/// KIP-1302 migration, classic → share: a new share group starts where the consumer group
/// `from` left off. Its committed offsets become the share group's start offsets
/// (AlterShareGroupOffsets, Kafka 4.1+, accepted while the share group has no members: the
/// tasks have not started). A share group that exists (ListGroups) is left alone, and so are
/// partitions it already has state for where existence cannot be told (migrating again goes
/// on where the share group stood; start offsets deleted on purpose stay deleted), and
/// partitions the consumer group never committed (they start where
/// `share.auto.offset.reset` says). Never fails the connector: what could not be done is a
/// WARN naming what happens instead.
async fn take_over_positions(
    admin: &AdminClient,
    wish: &ShareGroupWish,
    from: &str,
    connector: &str,
) -> Takeover {
    let group = &wish.group;
    let not_copied = |why: String, then: &str| {
        warn!(connector, %group, consumer_group = %from, "the consumer group's positions were not copied into the share group: {why}; {then}");
        Takeover {
            description: format!("not copied from consumer group '{from}': {why}; {then}"),
            warning: Some(format!(
                "the positions of consumer group '{from}' were not copied: {why}; {then}"
            )),
        }
    };
    let from_reset = "the share group starts where share.auto.offset.reset says (records the consumer group had committed are delivered again at earliest, or records it had not read are skipped at latest)";
    // Only a share group that does not exist yet takes the consumer group's positions: one
    // that exists has its own history (migrating again, or start offsets deleted on purpose
    // to start at share.auto.offset.reset). Brokers without ListGroups cannot tell; then the
    // partitions the share group has no state for are the new ones.
    if let Ok(check) = check_group_id(admin.cluster(), group, Membership::Consumer, &[]).await {
        if let Some(share) = check.conflict.filter(|o| o.group_type == "share") {
            info!(connector, %group, consumer_group = %from, "the share group exists: it keeps its own positions");
            return Takeover {
                description: format!(
                    "kept: share group '{group}' exists ({}), so it goes on from its own positions; consumer group '{from}' is not copied",
                    share.evidence
                ),
                warning: None,
            };
        }
    }
    let committed = match admin.committed_offsets(from, &wish.topics).await {
        Ok(committed) => committed,
        Err(e) => return not_copied(e.to_string(), from_reset),
    };
    if committed.is_empty() {
        info!(connector, %group, consumer_group = %from, "the consumer group has no committed offsets on the connector's topics: the share group starts where share.auto.offset.reset says");
        return Takeover {
            description: format!(
                "consumer group '{from}' has no committed offsets on the connector's topics: nothing to copy"
            ),
            warning: None,
        };
    }
    let held: Vec<(String, i32)> = match admin.describe_share_offsets(group, &wish.topics).await {
        Ok(offsets) => offsets
            .partitions
            .into_iter()
            .filter(|p| p.start_offset.is_some())
            .map(|p| (p.topic, p.partition))
            .collect(),
        // Kafka answers an unknown group so: it is new, with no state.
        Err(e) if e.code() == Some(codes::GROUP_ID_NOT_FOUND) => Vec::new(),
        Err(e) if e.is_unsupported() => {
            return not_copied(
                format!("{e} (AlterShareGroupOffsets needs Kafka 4.1 or later)"),
                from_reset,
            )
        }
        Err(e) => return not_copied(e.to_string(), from_reset),
    };
    let to_copy: Vec<(String, i32, i64)> = committed
        .iter()
        .filter(|c| !held.contains(&(c.topic.clone(), c.partition)))
        .map(|c| (c.topic.clone(), c.partition, c.offset))
        .collect();
    let listed = |offsets: &[(String, i32, i64)]| {
        offsets
            .iter()
            .map(|(t, p, o)| format!("{t}-{p}@{o}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if to_copy.is_empty() {
        info!(connector, %group, consumer_group = %from, "the share group has its own start offsets on every partition the consumer group committed: it goes on where it stood");
        return Takeover {
            description: format!(
                "kept: the share group has its own start offsets where consumer group '{from}' committed"
            ),
            warning: None,
        };
    }
    match admin.alter_share_offsets(group, &to_copy).await {
        Ok(()) => {
            let copied = listed(&to_copy);
            info!(connector, %group, consumer_group = %from, offsets = %copied, "the share group starts where the consumer group left off");
            Takeover {
                description: format!("copied from consumer group '{from}': {copied}"),
                warning: None,
            }
        }
        Err(e) if e.is_unsupported() => not_copied(
            format!("{e} (AlterShareGroupOffsets needs Kafka 4.1 or later)"),
            from_reset,
        ),
        Err(e) => not_copied(e.to_string(), from_reset),
    }
}

fn unknown_settings(wish: &ShareGroupWish) -> Vec<SettingInForce> {
    KAFKA_DEFAULTS
        .iter()
        .map(|(name, default)| SettingInForce {
            name: (*name).to_owned(),
            value: None,
            source: format!(
                "unknown: the cluster did not say{}",
                if wish.configs.iter().any(|w| w.config == *name) {
                    ", and the connector's value could not be set"
                } else {
                    ""
                }
            ) + &format!(" (Kafka's default: {default})"),
        })
        .collect()
}

/// What the connector wants for one config: its explicit value, the worker's, or Spillway's
/// default (only for `share.auto.offset.reset`).
struct Wanted {
    config: &'static str,
    value: String,
    /// Where the wish comes from, in words.
    origin: String,
    /// Set on the connector: it replaces a value someone else set on the group.
    explicit: bool,
}

fn wanted(wish: &ShareGroupWish) -> Vec<Wanted> {
    let mut wanted: Vec<Wanted> = wish
        .configs
        .iter()
        .map(|w| Wanted {
            config: w.config,
            value: w.value.clone(),
            origin: format!("set by Spillway from {}", w.key),
            explicit: w.from_connector,
        })
        .collect();
    if !wanted.iter().any(|w| w.config == SHARE_AUTO_OFFSET_RESET) {
        wanted.push(Wanted {
            config: SHARE_AUTO_OFFSET_RESET,
            value: DEFAULT_AUTO_OFFSET_RESET.to_owned(),
            origin: "set by Spillway (its default for a share connector; consumer.override.auto.offset.reset chooses another)".to_owned(),
            explicit: false,
        });
    }
    wanted
}

/// Read the group's configs, set the ones the connector decides, report what is in force.
async fn apply_group_configs(
    admin: &Arc<AdminClient>,
    wish: &ShareGroupWish,
    connector: &str,
) -> Result<GroupSettingsReport, String> {
    let group = &wish.group;
    let resource = ConfigResource::Group(group.clone());
    let names: Vec<&str> = KAFKA_DEFAULTS.iter().map(|(n, _)| *n).collect();
    let wanted = wanted(wish);
    let mut report = GroupSettingsReport {
        group: group.clone(),
        ..GroupSettingsReport::default()
    };
    let current = admin.describe_configs(&resource, &names).await;
    // What to set: everything wanted when the group's values are known and differ; only the
    // connector's explicit values when they are not known (never a default over a value that
    // may have been set by someone else).
    let mut to_set: Vec<&Wanted> = Vec::new();
    let mut kept: Vec<(&Wanted, String)> = Vec::new();
    match &current {
        Ok(configs) => {
            for w in &wanted {
                let entry = configs.get(w.config);
                let on_group = entry.filter(|e| e.source == ConfigSource::Group);
                match on_group.and_then(|e| e.value.clone()) {
                    Some(value) if value.eq_ignore_ascii_case(&w.value) => {}
                    Some(value) if !w.explicit => kept.push((w, value)),
                    Some(value) => {
                        warn!(connector, %group, config = w.config, old = %value, new = %w.value, "replacing the value set on the share group with the connector's ({})", w.origin);
                        report.warnings.push(format!(
                            "{} was {value} on the group; replaced with {} ({})",
                            w.config, w.value, w.origin
                        ));
                        to_set.push(w);
                    }
                    None => to_set.push(w),
                }
            }
        }
        Err(e) => {
            let what = if e.is_unsupported() {
                "the cluster cannot describe group configs (a broker before Kafka 4.0, or one without the admin APIs)"
            } else {
                "the group's configs could not be read"
            };
            warn!(connector, %group, error = %e, "{what}");
            report.warnings.push(format!("{what}: {e}"));
            if !e.is_unsupported() {
                to_set.extend(wanted.iter().filter(|w| w.explicit));
            }
        }
    }
    let set = set_group_configs(admin, &resource, &to_set).await;
    for (w, e) in &set.failed {
        warn!(connector, %group, config = w.config, value = %w.value, error = %e, "the share group's config could not be set");
        report.warnings.push(format!(
            "could not set {}={} on the group: {e}",
            w.config, w.value
        ));
    }
    // What is in force now.
    for (name, default) in KAFKA_DEFAULTS {
        let setting = if let Some(w) = set.done.iter().find(|w| w.config == name) {
            SettingInForce {
                name: name.to_owned(),
                value: Some(w.value.clone()),
                source: w.origin.clone(),
            }
        } else if let Some((w, value)) = kept.iter().find(|(w, _)| w.config == name) {
            info!(connector, %group, config = name, value = %value, wanted = %w.value, "keeping the value set on the share group");
            SettingInForce {
                name: name.to_owned(),
                value: Some(value.clone()),
                source: format!(
                    "set on the group (by someone else; kept: Spillway would set {} only over no value, or when the connector sets {})",
                    w.value,
                    explicit_keys(name)
                ),
            }
        } else {
            match current.as_ref().ok().and_then(|c| c.get(name)) {
                Some(entry) => SettingInForce {
                    name: name.to_owned(),
                    value: entry.value.clone(),
                    source: match entry.source {
                        ConfigSource::Group => "set on the group".to_owned(),
                        other => format!("{} (not set on the group)", other.describe()),
                    },
                },
                None => SettingInForce {
                    name: name.to_owned(),
                    value: None,
                    source: format!(
                        "unknown: the cluster did not say (Kafka's default: {default})"
                    ),
                },
            }
        };
        report.settings.push(setting);
    }
    for s in &report.settings {
        info!(connector, %group, config = %s.name, value = s.value.as_deref().unwrap_or("unknown"), source = %s.source, "share group setting in force");
    }
    if !report.warnings.is_empty() {
        let effective = report
            .settings
            .iter()
            .map(|s| format!("{}={}", s.name, s.value.as_deref().unwrap_or("unknown")))
            .collect::<Vec<_>>()
            .join(", ");
        warn!(connector, %group, "running with the share group's effective settings: {effective}");
    }
    check_needed_start(admin, wish, &wanted, &report).await?;
    report.delivery_count_limit =
        delivery_count_limit(admin, connector, &mut report.warnings).await;
    Ok(report)
}

/// What IncrementalAlterConfigs did with each wanted value.
struct SetOutcome<'a> {
    done: Vec<&'a Wanted>,
    /// Each value that could not be set, with Kafka's answer.
    failed: Vec<(&'a Wanted, String)>,
}

/// Set `to_set` on the group in one request. Kafka validates a resource's changes together, so
/// when it refuses them for a reason other than a missing permission or API (a value outside
/// the brokers' bounds), each is tried alone: one bad value does not keep the others out.
async fn set_group_configs<'a>(
    admin: &AdminClient,
    resource: &ConfigResource,
    to_set: &[&'a Wanted],
) -> SetOutcome<'a> {
    let change = |w: &Wanted| (w.config, AlterOp::Set(w.value.clone()));
    let mut outcome = SetOutcome {
        done: Vec::new(),
        failed: Vec::new(),
    };
    if to_set.is_empty() {
        return outcome;
    }
    let all: Vec<(&str, AlterOp)> = to_set.iter().map(|w| change(w)).collect();
    match admin.incremental_alter_configs(resource, &all).await {
        Ok(()) => outcome.done.extend(to_set.iter().copied()),
        Err(e) if to_set.len() == 1 || e.is_authorization() || e.is_unsupported() => {
            let e = e.to_string();
            outcome
                .failed
                .extend(to_set.iter().map(|w| (*w, e.clone())));
        }
        Err(_) => {
            for w in to_set {
                match admin
                    .incremental_alter_configs(resource, &[change(w)])
                    .await
                {
                    Ok(()) => outcome.done.push(w),
                    Err(e) => outcome.failed.push((w, e.to_string())),
                }
            }
        }
    }
    outcome
}

fn explicit_keys(config: &str) -> String {
    match config {
        SHARE_AUTO_OFFSET_RESET => "consumer.override.auto.offset.reset".to_owned(),
        SHARE_ISOLATION_LEVEL => "consumer.override.isolation.level".to_owned(),
        other => format!("consumer.override.{other}"),
    }
}

/// A connector that explicitly asks for `earliest` needs it for a new group: without it the
/// group would start at the end and skip the backlog. Fails when it is not in force and the
/// group has no start offsets yet (or they cannot be read).
async fn check_needed_start(
    admin: &AdminClient,
    wish: &ShareGroupWish,
    wanted: &[Wanted],
    report: &GroupSettingsReport,
) -> Result<(), String> {
    let Some(w) = wanted
        .iter()
        .find(|w| w.config == SHARE_AUTO_OFFSET_RESET && w.explicit && w.value == "earliest")
    else {
        return Ok(());
    };
    let in_force = report
        .settings
        .iter()
        .find(|s| s.name == SHARE_AUTO_OFFSET_RESET)
        .and_then(|s| s.value.as_deref());
    if in_force == Some("earliest") {
        return Ok(());
    }
    let group_has_offsets = match admin
        .describe_share_offsets(&wish.group, &wish.topics)
        .await
    {
        Ok(offsets) => offsets.partitions.iter().any(|p| p.start_offset.is_some()),
        Err(_) => false,
    };
    if group_has_offsets {
        return Ok(());
    }
    Err(format!(
        "share group '{}' is new and must start at the earliest offsets ({} asks for {}), but \
         share.auto.offset.reset is {} on the cluster and could not be set: {}. Set it on the group \
         (kafka-configs.sh --alter --entity-type groups --entity-name {} --add-config \
         share.auto.offset.reset=earliest), grant ALTER_CONFIGS on the group to the worker's \
         principal, or remove {} to run with the group's value",
        wish.group,
        origin_key(w),
        w.value,
        in_force.unwrap_or("unknown"),
        report.warnings.join("; "),
        wish.group,
        origin_key(w),
    ))
}

fn origin_key(w: &Wanted) -> &str {
    w.origin
        .strip_prefix("set by Spillway from ")
        .unwrap_or(&w.origin)
}

/// The brokers' `group.share.delivery.count.limit`, when one broker tells it.
async fn delivery_count_limit(
    admin: &AdminClient,
    connector: &str,
    warnings: &mut Vec<String>,
) -> Option<u16> {
    let broker = *admin.broker_ids().first()?;
    match admin
        .describe_configs(
            &ConfigResource::Broker(Some(broker)),
            &[DELIVERY_COUNT_LIMIT],
        )
        .await
    {
        Ok(configs) => configs
            .get(DELIVERY_COUNT_LIMIT)
            .and_then(|e| e.value.as_deref())
            .and_then(|v| v.parse().ok()),
        Err(e) => {
            info!(connector, error = %e, "the brokers' {DELIVERY_COUNT_LIMIT} could not be read; the connector's setting is used");
            if !e.is_unsupported() {
                warnings.push(format!("{DELIVERY_COUNT_LIMIT} could not be read: {e}"));
            }
            None
        }
    }
}

/// Create the dead letter queue topic when it is missing, as Kafka Connect does (one
/// partition, `errors.deadletterqueue.topic.replication.factor`).
async fn create_dead_letter_topic(
    admin: &AdminClient,
    dlq: &DeadLetterQueue,
    connector: &str,
) -> Result<(), String> {
    let topic = NewTopic {
        name: dlq.topic.clone(),
        partitions: DLQ_PARTITIONS,
        replication_factor: dlq.replication_factor,
        configs: Vec::new(),
    };
    match admin.create_topic(&topic).await {
        Ok(TopicCreation::Created) => {
            info!(connector, topic = %dlq.topic, replication_factor = dlq.replication_factor, "created the dead letter queue topic");
            Ok(())
        }
        Ok(TopicCreation::AlreadyExists) => Ok(()),
        Err(e) if e.is_unsupported() => {
            warn!(connector, topic = %dlq.topic, error = %e, "the dead letter queue topic is not created: the broker has no CreateTopics; the first record sent there may create it (auto.create.topics.enable)");
            Ok(())
        }
        Err(e) => Err(dead_letter_error(&e, dlq)),
    }
}

fn dead_letter_error(e: &AdminError, dlq: &DeadLetterQueue) -> String {
    let hint = match e.code() {
        Some(codes::INVALID_REPLICATION_FACTOR) => format!(
            "; set errors.deadletterqueue.topic.replication.factor to at most the number of brokers \
             (it is {}; -1 takes the brokers' default.replication.factor), or create the topic yourself",
            dlq.replication_factor
        ),
        _ if e.is_authorization() => "; grant CREATE on the topic (or the cluster) to the worker's principal, or create the topic yourself".to_owned(),
        _ => String::new(),
    };
    format!(
        "cannot create the dead letter queue topic '{}' (errors.deadletterqueue.topic.name): {e}{hint}",
        dlq.topic
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spillway_defaults_to_earliest_unless_the_connector_chooses() {
        let wish = |configs: Vec<GroupConfigWish>| ShareGroupWish {
            group: "g".into(),
            topics: vec!["t".into()],
            configs,
            positions_from: None,
        };
        let w = wanted(&wish(Vec::new()));
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].value, "earliest");
        assert!(!w[0].explicit);
        let w = wanted(&wish(vec![GroupConfigWish {
            config: SHARE_AUTO_OFFSET_RESET,
            value: "by_duration:PT1H".into(),
            key: "consumer.override.auto.offset.reset".into(),
            from_connector: true,
        }]));
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].value, "by_duration:PT1H");
        assert!(w[0].explicit);
        assert_eq!(origin_key(&w[0]), "consumer.override.auto.offset.reset");
    }

    #[test]
    fn a_replication_factor_beyond_the_cluster_names_the_key_to_change() {
        let e = AdminError::Resource {
            operation: "creating topic 'dlq'".into(),
            resource: "topic 'dlq'".into(),
            code: codes::INVALID_REPLICATION_FACTOR,
            code_name: "InvalidReplicationFactor".into(),
            message: ": only 1 broker(s) are registered".into(),
        };
        let dlq = DeadLetterQueue {
            topic: "dlq".into(),
            replication_factor: 3,
            context_headers: false,
        };
        let text = dead_letter_error(&e, &dlq);
        assert!(
            text.contains("'dlq'")
                && text.contains("errors.deadletterqueue.topic.replication.factor")
                && text.contains("it is 3"),
            "{text}"
        );
    }
}
