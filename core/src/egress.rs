//! Where a tenant's sinks may connect: not to the worker's own machine nor its private
//! network (loopback, link-local, private, shared and unspecified addresses), unless the
//! worker's `tenant.egress.allow` names them. Host names are judged when the configuration is
//! checked (validate, create, every start) and again when a sink connects: the sink connects
//! to the very addresses [`EgressPolicy::vet`] judged, so a tenant's DNS cannot answer a public
//! address at validation and an internal one at connect time (DNS rebinding).

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::sync::{Arc, RwLock};

use crate::{ConfigError, ConfigMap};

/// Worker key: CIDR blocks (or single addresses) tenant sinks may reach although they are
/// loopback, link-local or private, e.g. `10.1.0.0/16,127.0.0.1/32`.
pub const TENANT_EGRESS_ALLOW: &str = "tenant.egress.allow";

/// Runtime key, set by the runtime in the configuration of a confined tenant's connector and
/// tasks (a value the user wrote is replaced or removed): the worker's allow-list. Present
/// (even empty) means the plugin vets every address it connects to ([`EgressPolicy::vet`]).
pub const EGRESS_RUNTIME_KEY: &str = "spillway.egress.allow";

/// Turns a host name into addresses, for the policy. The worker uses the system's resolver;
/// a test installs one ([`set_resolver`]) that answers differently at validation and at
/// connect time, as a rebinding DNS server would.
pub trait Resolve: Send + Sync {
    fn resolve(&self, host: &str, port: u16) -> io::Result<Vec<IpAddr>>;
}

/// The system's resolver (`getaddrinfo`).
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve(&self, host: &str, port: u16) -> io::Result<Vec<IpAddr>> {
        Ok((host, port).to_socket_addrs()?.map(|a| a.ip()).collect())
    }
}

static RESOLVER: RwLock<Option<Arc<dyn Resolve>>> = RwLock::new(None);

/// Replaces, for the whole process, the resolver every policy uses.
pub fn set_resolver(resolver: Arc<dyn Resolve>) {
    *RESOLVER.write().unwrap_or_else(|p| p.into_inner()) = Some(resolver);
}

/// The resolver policies use: the one set by [`set_resolver`], else the system's.
pub fn resolver() -> Arc<dyn Resolve> {
    RESOLVER
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
        .unwrap_or_else(|| Arc::new(SystemResolver))
}

/// Why the policy refuses a host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EgressRefusal {
    /// `host` is, or resolved to, `address`, an internal address the allow-list does not name.
    Internal {
        host: String,
        address: IpAddr,
        kind: &'static str,
    },
    /// `host` could not be resolved, so it could not be judged.
    Unresolved { host: String, reason: String },
}

impl std::fmt::Display for EgressRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EgressRefusal::Internal {
                host,
                address,
                kind,
            } => write!(
                f,
                "host '{host}' is {address}, a {kind} address: a tenant's sink may not reach \
                 the worker's machine or private network unless the worker admin lists it in \
                 {TENANT_EGRESS_ALLOW}"
            ),
            EgressRefusal::Unresolved { host, reason } => write!(
                f,
                "cannot resolve host '{host}' ({reason}), so it cannot be checked against the \
                 worker's egress policy"
            ),
        }
    }
}

impl std::error::Error for EgressRefusal {}

impl EgressRefusal {
    /// Whether the policy refused the address (not a resolution failure, which may pass).
    pub fn is_internal(&self) -> bool {
        matches!(self, EgressRefusal::Internal { .. })
    }
}

/// One allowed block of addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Block {
    network: IpAddr,
    prefix: u8,
}

impl Block {
    fn parse(text: &str) -> Result<Block, String> {
        let (address, prefix) = match text.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (text, None),
        };
        let network: IpAddr = address.trim().parse().map_err(|_| {
            format!("'{text}' is not an IP address or CIDR block (e.g. 10.0.0.0/8)")
        })?;
        let max = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("'{text}' has a prefix length outside 0..={max}"))?,
        };
        Ok(Block { network, prefix })
    }

    fn contains(&self, ip: IpAddr) -> bool {
        fn bits(ip: IpAddr) -> (u128, u32) {
            match ip {
                IpAddr::V4(v4) => (u128::from(u32::from(v4)), 32),
                IpAddr::V6(v6) => (u128::from(v6), 128),
            }
        }
        let ip = canonical(ip);
        if ip.is_ipv4() != self.network.is_ipv4() {
            return false;
        }
        let (net, width) = bits(self.network);
        let (addr, _) = bits(ip);
        let shift = width - u32::from(self.prefix);
        shift >= width || (net >> shift) == (addr >> shift)
    }
}

impl std::fmt::Display for Block {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

/// An IPv4 address written as IPv6 (`::ffff:127.0.0.1`) is the IPv4 address.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Why `ip` is an internal address, or `None` for a public one.
pub fn internal_kind(ip: IpAddr) -> Option<&'static str> {
    match canonical(ip) {
        IpAddr::V4(v4) => v4_kind(v4),
        IpAddr::V6(v6) => v6_kind(v6),
    }
}

fn v4_kind(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, ..] = ip.octets();
    if ip.is_loopback() {
        Some("loopback")
    } else if ip.is_unspecified() || a == 0 {
        Some("unspecified ('this host')")
    } else if ip.is_link_local() {
        Some("link-local (cloud metadata services live here)")
    } else if ip.is_private() {
        Some("private")
    } else if a == 100 && (64..128).contains(&b) {
        Some("shared address space (carrier-grade NAT)")
    } else if ip.is_broadcast() || ip.is_multicast() || a >= 240 {
        Some("broadcast, multicast or reserved")
    } else {
        None
    }
}

fn v6_kind(ip: Ipv6Addr) -> Option<&'static str> {
    let first = ip.segments()[0];
    if ip.is_loopback() {
        Some("loopback")
    } else if ip.is_unspecified() {
        Some("unspecified ('this host')")
    } else if first & 0xffc0 == 0xfe80 {
        Some("link-local")
    } else if first & 0xfe00 == 0xfc00 {
        Some("unique local (private)")
    } else if ip.is_multicast() {
        Some("multicast")
    } else {
        None
    }
}

/// The worker's egress policy for tenant sinks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EgressPolicy {
    allowed: Vec<Block>,
}

impl EgressPolicy {
    /// Reads `tenant.egress.allow` (a comma-separated list; empty: internal addresses are
    /// all refused).
    pub fn parse(text: &str) -> Result<EgressPolicy, ConfigError> {
        let allowed = text
            .split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(Block::parse)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|reason| ConfigError::InvalidValue {
                key: TENANT_EGRESS_ALLOW.into(),
                value: text.to_owned(),
                reason,
            })?;
        Ok(EgressPolicy { allowed })
    }

    /// Whether a tenant's sink may connect to `ip`.
    pub fn allows(&self, ip: IpAddr) -> bool {
        internal_kind(ip).is_none() || self.allowed.iter().any(|b| b.contains(ip))
    }

    /// The policy a plugin runs under: `Some` when the runtime set [`EGRESS_RUNTIME_KEY`] in
    /// its configuration (a confined tenant's connector), `None` otherwise.
    pub fn from_plugin_config(config: &ConfigMap) -> Result<Option<EgressPolicy>, ConfigError> {
        config
            .get(EGRESS_RUNTIME_KEY)
            .map(|list| EgressPolicy::parse(list))
            .transpose()
    }

    /// The addresses to connect to for `host` (a name or an address) and `port`: every one
    /// `host` resolves to now, each allowed, or the refusal naming the host and the address.
    /// A caller connects to these addresses, never to the name, so what is connected is what
    /// was judged.
    pub fn vet(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, EgressRefusal> {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let addresses = match host.parse::<IpAddr>() {
            Ok(ip) => vec![ip],
            Err(_) => resolver()
                .resolve(host, port)
                .map_err(|e| EgressRefusal::Unresolved {
                    host: host.to_owned(),
                    reason: e.to_string(),
                })?,
        };
        if addresses.is_empty() {
            return Err(EgressRefusal::Unresolved {
                host: host.to_owned(),
                reason: "no address".into(),
            });
        }
        for ip in &addresses {
            if let (false, Some(kind)) = (self.allows(*ip), internal_kind(*ip)) {
                return Err(EgressRefusal::Internal {
                    host: host.to_owned(),
                    address: *ip,
                    kind,
                });
            }
        }
        Ok(addresses
            .into_iter()
            .map(|ip| SocketAddr::new(ip, port))
            .collect())
    }

    /// Refuses, naming `key`, a host of `hosts` that is (or resolves to) an address the policy
    /// does not allow, or that cannot be resolved.
    pub fn check(
        &self,
        key: &str,
        value: &str,
        hosts: &[(String, u16)],
    ) -> Result<(), ConfigError> {
        for (host, port) in hosts {
            self.vet(host, *port)
                .map_err(|refusal| ConfigError::InvalidValue {
                    key: key.to_owned(),
                    value: value.to_owned(),
                    reason: refusal.to_string(),
                })?;
        }
        Ok(())
    }
}

/// The allow-list as `tenant.egress.allow` spells it (what [`EgressPolicy::parse`] reads).
impl std::fmt::Display for EgressPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, block) in self.allowed.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{block}")?;
        }
        Ok(())
    }
}

/// `(host, port)` pairs of a Kafka bootstrap list (`host:port,host:port`).
pub fn bootstrap_hosts(list: &str) -> Result<Vec<(String, u16)>, String> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|entry| {
            // librdkafka accepts a protocol prefix (`PLAINTEXT://host:port`).
            let entry = entry.rsplit("://").next().unwrap_or(entry);
            let (host, port) = entry
                .rsplit_once(':')
                .ok_or_else(|| format!("'{entry}' is not host:port"))?;
            let port = port
                .parse::<u16>()
                .map_err(|_| format!("'{entry}' has no valid port"))?;
            let host = host.trim_start_matches('[').trim_end_matches(']');
            Ok((host.to_owned(), port))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(h: &str) -> Vec<(String, u16)> {
        vec![(h.to_owned(), 80)]
    }

    #[test]
    fn internal_addresses_are_refused_unless_allowed_by_block() {
        let none = EgressPolicy::default();
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "::1",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
        ] {
            let err = none
                .check("http.url", "u", &hosts(ip))
                .expect_err(ip)
                .to_string();
            assert!(
                err.contains("http.url") && err.contains(TENANT_EGRESS_ALLOW),
                "{err}"
            );
        }
        for ip in ["8.8.8.8", "2001:4860:4860::8888", "172.32.0.1"] {
            assert!(none.check("k", "v", &hosts(ip)).is_ok(), "{ip}");
        }
        let some = EgressPolicy::parse("127.0.0.1/32, 10.1.0.0/16,::1").expect("valid");
        assert!(some.check("k", "v", &hosts("127.0.0.1")).is_ok());
        assert!(some.check("k", "v", &hosts("::ffff:127.0.0.1")).is_ok());
        assert!(some.check("k", "v", &hosts("10.1.200.3")).is_ok());
        assert!(some.check("k", "v", &hosts("::1")).is_ok());
        assert!(some.check("k", "v", &hosts("127.0.0.2")).is_err());
        assert!(some.check("k", "v", &hosts("10.2.0.1")).is_err());
        assert!(EgressPolicy::parse("10.0.0.0/33").is_err());
        assert!(EgressPolicy::parse("localhost").is_err());
        assert!(EgressPolicy::parse("0.0.0.0/0")
            .expect("all")
            .allows("127.0.0.1".parse().unwrap()));
    }

    #[test]
    fn host_names_are_resolved_before_they_are_judged() {
        let err = EgressPolicy::default()
            .check("http.url", "http://localhost:8083/", &hosts("localhost"))
            .expect_err("localhost is loopback");
        assert!(err.to_string().contains("loopback"), "{err}");
    }

    /// Answers a public address for `rebind.egress.test` the first time, loopback after: a
    /// tenant's DNS server rebinding its name between validation and connection.
    struct Rebinding(std::sync::atomic::AtomicUsize);

    impl Resolve for Rebinding {
        fn resolve(&self, host: &str, port: u16) -> io::Result<Vec<IpAddr>> {
            if host != "rebind.egress.test" {
                return SystemResolver.resolve(host, port);
            }
            Ok(
                match self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst) {
                    0 => vec!["93.184.216.34".parse().unwrap()],
                    _ => vec!["127.0.0.1".parse().unwrap()],
                },
            )
        }
    }

    #[test]
    fn a_name_is_judged_by_what_it_resolves_to_when_vetted() {
        set_resolver(Arc::new(Rebinding(Default::default())));
        let policy = EgressPolicy::default();
        let host = vec![("rebind.egress.test".to_owned(), 443)];
        assert!(
            policy.check("http.url", "u", &host).is_ok(),
            "public at first"
        );
        let refusal = policy
            .vet("rebind.egress.test", 443)
            .expect_err("loopback now");
        assert!(refusal.is_internal());
        let text = refusal.to_string();
        for part in ["rebind.egress.test", "127.0.0.1", TENANT_EGRESS_ALLOW] {
            assert!(text.contains(part), "{text}");
        }
        let allowed = EgressPolicy::parse("127.0.0.0/8").expect("valid");
        assert_eq!(
            allowed.vet("rebind.egress.test", 443).expect("allowed"),
            vec!["127.0.0.1:443".parse().unwrap()]
        );
    }

    #[test]
    fn the_allow_list_is_written_as_it_is_read() {
        let policy = EgressPolicy::parse("10.1.0.0/16, 127.0.0.1,::1").expect("valid");
        assert_eq!(policy.to_string(), "10.1.0.0/16,127.0.0.1/32,::1/128");
        assert_eq!(EgressPolicy::parse(&policy.to_string()), Ok(policy));
        let config: ConfigMap = [(EGRESS_RUNTIME_KEY.to_owned(), String::new())].into();
        assert_eq!(
            EgressPolicy::from_plugin_config(&config),
            Ok(Some(EgressPolicy::default()))
        );
        assert_eq!(
            EgressPolicy::from_plugin_config(&ConfigMap::new()),
            Ok(None)
        );
    }

    #[test]
    fn bootstrap_lists_give_every_host() {
        assert_eq!(
            bootstrap_hosts("a:9092, PLAINTEXT://b:9093,[::1]:9094").expect("valid"),
            vec![
                ("a".to_owned(), 9092),
                ("b".to_owned(), 9093),
                ("::1".to_owned(), 9094)
            ]
        );
        assert!(bootstrap_hosts("nohost").is_err());
    }
}
