//! `spillway dev-broker`: the development cluster (librdkafka's mock brokers) for people, not
//! tests. It prints the bootstrap list and runs until Ctrl-C. With `--security` other than
//! PLAINTEXT the test-kit proxy stands in front of the brokers (TLS with a generated CA, SASL
//! users), and the bootstrap list printed is the proxy's.

use anyhow::{bail, Context, Result};
use spillway_tests::kafka_proxy::{KafkaProxy, ProxyOptions};
use spillway_tests::{DevBroker, ProxySecurity, SaslMechanism};

/// A SASL user given as `NAME:PASSWORD`. Debug and errors never show the password.
#[derive(Clone)]
pub struct UserSpec {
    pub name: String,
    pub password: String,
}

impl std::fmt::Debug for UserSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UserSpec({})", self.name)
    }
}

impl std::str::FromStr for UserSpec {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let Some((name, password)) = text.split_once(':') else {
            return Err(format!(
                "user '{text}' has no password; expected NAME:PASSWORD, e.g. alice:alice-secret"
            ));
        };
        if name.is_empty() || password.is_empty() {
            return Err(
                "a user needs a name and a password; expected NAME:PASSWORD, e.g. alice:alice-secret"
                    .to_string(),
            );
        }
        Ok(UserSpec {
            name: name.to_string(),
            password: password.to_string(),
        })
    }
}

/// `--security`, `--sasl-mechanism` and `--user`.
#[derive(Debug)]
pub struct Security {
    pub protocol: ProxySecurity,
    pub mechanism: Option<SaslMechanism>,
    pub users: Vec<UserSpec>,
}

impl Security {
    /// The proxy options, or `None` for plain brokers; refuses flags that do not fit together.
    fn proxy_options(&self) -> Result<Option<ProxyOptions>> {
        let sasl = self.protocol.uses_sasl();
        if !sasl && (self.mechanism.is_some() || !self.users.is_empty()) {
            bail!(
                "--sasl-mechanism and --user need --security SASL_PLAINTEXT or SASL_SSL (got {})",
                self.protocol
            );
        }
        if self.protocol == ProxySecurity::Plaintext {
            return Ok(None);
        }
        let mut options = ProxyOptions::new(self.protocol);
        if sasl {
            if self.users.is_empty() {
                bail!(
                    "--security {} needs at least one --user NAME:PASSWORD",
                    self.protocol
                );
            }
            match self.mechanism {
                Some(SaslMechanism::OAuthBearer) => bail!(
                    "--sasl-mechanism OAUTHBEARER is not offered by the dev broker; use PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"
                ),
                Some(mechanism) => options = options.with_mechanisms(&[mechanism]),
                None => {}
            }
            for user in &self.users {
                options = options.with_user(&user.name, &user.password);
            }
        }
        Ok(Some(options))
    }
}

/// A topic to create at start, given as `NAME:PARTITIONS`.
#[derive(Clone, Debug)]
pub struct TopicSpec {
    pub name: String,
    pub partitions: i32,
}

impl std::str::FromStr for TopicSpec {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (name, partitions) = text.split_once(':').unwrap_or((text, "1"));
        if name.is_empty() {
            return Err(format!(
                "topic '{text}' has no name; expected NAME:PARTITIONS, e.g. orders:8"
            ));
        }
        let partitions: i32 = partitions.parse().map_err(|_| {
            format!("topic '{text}': partitions '{partitions}' is not a number; expected NAME:PARTITIONS, e.g. orders:8")
        })?;
        if partitions < 1 {
            return Err(format!("topic '{text}': partitions must be at least 1"));
        }
        Ok(TopicSpec {
            name: name.to_string(),
            partitions,
        })
    }
}

pub async fn run(
    brokers: u32,
    topics: Vec<TopicSpec>,
    share_auto_offset_reset: &str,
    security: Security,
) -> Result<()> {
    if brokers == 0 {
        bail!("--brokers must be at least 1");
    }
    let proxy_options = security.proxy_options()?;
    let specs: Vec<(&str, i32)> = topics
        .iter()
        .map(|t| (t.name.as_str(), t.partitions))
        .collect();
    let broker = DevBroker::try_start(brokers, &specs).context("starting the dev broker")?;
    broker
        .command(serde_json::json!({"cmd": "share_settings", "auto_offset_reset": share_auto_offset_reset}))
        .with_context(|| format!("setting the share groups' auto offset reset to '{share_auto_offset_reset}'"))?;
    let proxy = match proxy_options {
        Some(options) => Some(
            KafkaProxy::start(&broker.bootstrap(), options)
                .context("starting the security proxy in front of the dev broker")?,
        ),
        None => None,
    };
    let bootstrap = proxy
        .as_ref()
        .map_or_else(|| broker.bootstrap(), KafkaProxy::bootstrap);
    println!("{bootstrap}");
    if let Some(pki) = proxy.as_ref().and_then(KafkaProxy::pki) {
        println!("ca={}", pki.ca_path.display());
    }
    eprintln!(
        "dev broker: {brokers} broker(s) at {bootstrap} ({}); share groups start at the {share_auto_offset_reset} offset. Ctrl-C stops it.",
        describe(&security)
    );
    tokio::signal::ctrl_c()
        .await
        .context("waiting for Ctrl-C")?;
    eprintln!("dev broker: stopping");
    drop(proxy);
    Ok(())
}

/// What a client must configure, without passwords.
fn describe(security: &Security) -> String {
    let mut text = format!("security.protocol={}", security.protocol);
    if security.protocol.uses_sasl() {
        let mechanisms = match security.mechanism {
            Some(m) => m.name().to_string(),
            None => "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512".to_string(),
        };
        let users: Vec<&str> = security.users.iter().map(|u| u.name.as_str()).collect();
        text.push_str(&format!(
            ", sasl.mechanism {mechanisms}, users {}",
            users.join(", ")
        ));
    }
    if security.protocol.uses_tls() {
        text.push_str(", ssl.ca.location = the ca= file printed above");
    }
    text
}
