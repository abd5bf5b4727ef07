use super::*;

fn settings(pairs: &[(&str, &str)]) -> Result<SecuritySettings, SecurityError> {
    SecuritySettings::from_keys(pairs.iter().map(|(k, v)| (*k, *v, *k)))
}

fn entries(s: &SecuritySettings) -> BTreeMap<String, String> {
    s.rdkafka_entries().into_iter().collect()
}

fn user_password(s: &SecuritySettings) -> (String, String) {
    match &s.sasl.as_ref().expect("sasl").credentials {
        SaslCredentials::UserPassword { username, password } => {
            (username.clone(), password.expose().to_owned())
        }
        other => panic!("not a user/password: {other:?}"),
    }
}

#[test]
fn nothing_set_is_plaintext_and_tells_librdkafka_so() {
    let s = settings(&[("bootstrap.servers", "b:9092"), ("max.poll.records", "5")]).unwrap();
    assert_eq!(s.protocol, SecurityProtocol::Plaintext);
    assert!(s.tls.is_none() && s.sasl.is_none() && s.passthrough.is_empty());
    assert_eq!(
        entries(&s),
        BTreeMap::from([("security.protocol".into(), "plaintext".into())])
    );
}

#[test]
fn every_protocol_spelling_is_read_and_a_wrong_one_is_named() {
    for (text, protocol) in [
        ("PLAINTEXT", SecurityProtocol::Plaintext),
        ("ssl", SecurityProtocol::Ssl),
        ("SASL_PLAINTEXT", SecurityProtocol::SaslPlaintext),
        ("sasl_ssl", SecurityProtocol::SaslSsl),
    ] {
        let mut pairs = vec![("security.protocol", text)];
        if protocol.sasl() {
            pairs.extend([
                ("sasl.mechanism", "PLAIN"),
                ("sasl.username", "u"),
                ("sasl.password", "p"),
            ]);
        }
        assert_eq!(settings(&pairs).unwrap().protocol, protocol, "{text}");
    }
    let err = settings(&[("security.protocol", "TLS")])
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "invalid value 'TLS' for security.protocol: expected PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"
    );
}

#[test]
fn java_pem_truststore_location_and_inline_certificates_and_librdkafka_ca_location() {
    let s = settings(&[
        ("security.protocol", "SSL"),
        ("ssl.truststore.type", "PEM"),
        ("ssl.truststore.location", "/etc/kafka/ca.pem"),
    ])
    .unwrap();
    let tls = s.tls.as_ref().unwrap();
    assert_eq!(
        tls.trust,
        Some(PemSource::File {
            key: "ssl.truststore.location".into(),
            path: "/etc/kafka/ca.pem".into()
        })
    );
    assert!(tls.verify_hostname);
    let e = entries(&s);
    assert_eq!(e["ssl.ca.location"], "/etc/kafka/ca.pem");
    assert_eq!(e["security.protocol"], "ssl");
    assert_eq!(e["ssl.endpoint.identification.algorithm"], "https");
    assert!(!e.contains_key("ssl.truststore.type") && !e.contains_key("ssl.truststore.location"));

    let inline = settings(&[
        ("security.protocol", "SSL"),
        ("ssl.truststore.type", "PEM"),
        (
            "ssl.truststore.certificates",
            "-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----",
        ),
    ])
    .unwrap();
    assert!(matches!(
        inline.tls.as_ref().unwrap().trust,
        Some(PemSource::Inline { .. })
    ));
    assert!(entries(&inline)["ssl.ca.pem"].starts_with("-----BEGIN CERTIFICATE-----"));

    let rd = settings(&[("security.protocol", "SSL"), ("ssl.ca.location", "/ca.pem")]).unwrap();
    assert_eq!(
        rd.tls.unwrap().trust,
        Some(PemSource::File {
            key: "ssl.ca.location".into(),
            path: "/ca.pem".into()
        })
    );
}

#[test]
fn a_jks_store_is_refused_with_how_to_convert_it() {
    let err = settings(&[
        ("security.protocol", "SSL"),
        ("ssl.truststore.type", "JKS"),
        ("ssl.truststore.location", "/ca.jks"),
    ])
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("'JKS' for ssl.truststore.type: only PEM is supported"),
        "{err}"
    );
    assert!(err.contains("ssl.truststore.location"), "{err}");
}

#[test]
fn two_trust_sources_conflict() {
    let err = settings(&[
        ("security.protocol", "SSL"),
        ("ssl.truststore.location", "/a.pem"),
        ("ssl.ca.location", "/b.pem"),
    ])
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("ssl.truststore.location, ssl.ca.location"),
        "{err}"
    );
}

#[test]
fn client_certificates_in_every_spelling() {
    // Java: one PEM keystore file with key and chain.
    let s = settings(&[
        ("security.protocol", "SSL"),
        ("ssl.keystore.type", "PEM"),
        ("ssl.keystore.location", "/client.pem"),
        ("ssl.key.password", "kp"),
    ])
    .unwrap();
    let client = s.tls.as_ref().unwrap().client.as_ref().unwrap();
    assert_eq!(client.chain, client.key);
    assert_eq!(client.key_password.as_ref().unwrap().expose(), "kp");
    let e = entries(&s);
    assert_eq!(e["ssl.certificate.location"], "/client.pem");
    assert_eq!(e["ssl.key.location"], "/client.pem");
    assert_eq!(e["ssl.key.password"], "kp");

    // Java: inline key and chain.
    let s = settings(&[
        ("security.protocol", "SSL"),
        ("ssl.keystore.type", "PEM"),
        ("ssl.keystore.key", "-----BEGIN PRIVATE KEY-----"),
        (
            "ssl.keystore.certificate.chain",
            "-----BEGIN CERTIFICATE-----",
        ),
    ])
    .unwrap();
    let e = entries(&s);
    assert_eq!(e["ssl.key.pem"], "-----BEGIN PRIVATE KEY-----");
    assert_eq!(e["ssl.certificate.pem"], "-----BEGIN CERTIFICATE-----");
    assert!(!format!("{s:?}").contains("BEGIN PRIVATE KEY"), "{s:?}");

    // librdkafka: two files.
    let s = settings(&[
        ("security.protocol", "SSL"),
        ("ssl.certificate.location", "/c.pem"),
        ("ssl.key.location", "/k.pem"),
    ])
    .unwrap();
    let e = entries(&s);
    assert_eq!(e["ssl.certificate.location"], "/c.pem");
    assert_eq!(e["ssl.key.location"], "/k.pem");

    let err = settings(&[
        ("security.protocol", "SSL"),
        ("ssl.certificate.location", "/c.pem"),
    ])
    .unwrap_err()
    .to_string();
    assert!(err.starts_with("ssl.key.location is required"), "{err}");
}

#[test]
fn an_empty_endpoint_identification_algorithm_turns_the_host_check_off() {
    for off in ["", "none"] {
        let s = settings(&[
            ("security.protocol", "SSL"),
            ("ssl.endpoint.identification.algorithm", off),
        ])
        .unwrap();
        assert!(!s.tls.as_ref().unwrap().verify_hostname);
        assert_eq!(entries(&s)["ssl.endpoint.identification.algorithm"], "none");
    }
    let err = settings(&[
        ("security.protocol", "SSL"),
        ("ssl.endpoint.identification.algorithm", "ldap"),
    ])
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("ssl.endpoint.identification.algorithm"),
        "{err}"
    );
}

#[test]
fn tls_keys_without_a_tls_protocol_are_a_conflict_naming_them() {
    let err = settings(&[("ssl.truststore.location", "/ca.pem")])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("ssl.truststore.location set but security.protocol is PLAINTEXT"),
        "{err}"
    );
}

#[test]
fn jaas_plain_login_module() {
    let s = settings(&[
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanism", "PLAIN"),
        (
            "sasl.jaas.config",
            r#"org.apache.kafka.common.security.plain.PlainLoginModule required username="alice" password="al\"ice;secret";"#,
        ),
    ])
    .unwrap();
    assert_eq!(s.sasl.as_ref().unwrap().mechanism, SaslMechanism::Plain);
    assert_eq!(user_password(&s), ("alice".into(), "al\"ice;secret".into()));
    let e = entries(&s);
    assert_eq!(e["sasl.mechanisms"], "PLAIN");
    assert_eq!(e["sasl.username"], "alice");
    assert_eq!(e["sasl.password"], "al\"ice;secret");
    assert!(!e.contains_key("sasl.jaas.config"));
    assert_eq!(s.describe(), "SASL_SSL with SASL PLAIN as 'alice'");
    assert!(!format!("{s:?}").contains("secret"), "{s:?}");
}

#[test]
fn jaas_scram_login_module_for_both_hashes_and_confluent_shaded_names() {
    for (mechanism, expected) in [
        ("SCRAM-SHA-256", SaslMechanism::ScramSha256),
        ("scram-sha-512", SaslMechanism::ScramSha512),
    ] {
        let s = settings(&[
            ("security.protocol", "SASL_PLAINTEXT"),
            ("sasl.mechanism", mechanism),
            (
                "sasl.jaas.config",
                "org.apache.kafka.common.security.scram.ScramLoginModule required\n  username=bob\n  password=\"b0b\";",
            ),
        ])
        .unwrap();
        assert_eq!(s.sasl.as_ref().unwrap().mechanism, expected);
        assert_eq!(user_password(&s), ("bob".into(), "b0b".into()));
    }
    let shaded = settings(&[
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanism", "PLAIN"),
        (
            "sasl.jaas.config",
            r#"io.confluent.shaded.org.apache.kafka.common.security.plain.PlainLoginModule required username="k" password="s";"#,
        ),
    ])
    .unwrap();
    assert_eq!(user_password(&shaded), ("k".into(), "s".into()));
}

#[test]
fn a_login_module_that_does_not_fit_the_mechanism_is_named() {
    let err = settings(&[
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanism", "SCRAM-SHA-512"),
        (
            "sasl.jaas.config",
            r#"org.apache.kafka.common.security.plain.PlainLoginModule required username="a" password="b";"#,
        ),
    ])
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("PlainLoginModule but sasl.mechanism is SCRAM-SHA-512"),
        "{err}"
    );
    assert!(err.contains("ScramLoginModule"), "{err}");
}

#[test]
fn a_broken_jaas_config_is_refused_without_showing_it() {
    for (text, why) in [
        (
            r#"PlainLoginModule required username="a" password="s3cret""#,
            "end with ';'",
        ),
        (
            r#"PlainLoginModule required username="a password=s3cret;"#,
            "no closing quote",
        ),
        (r#"com.example.Krb5LoginModule required;"#, "not supported"),
        (r#"PlainLoginModule username="a";"#, "control flag"),
    ] {
        let err = settings(&[
            ("security.protocol", "SASL_SSL"),
            ("sasl.mechanism", "PLAIN"),
            ("sasl.jaas.config", text),
        ])
        .unwrap_err()
        .to_string();
        assert!(err.contains(why), "{text}: {err}");
        assert!(
            err.contains("sasl.jaas.config") && err.contains("[hidden]"),
            "{err}"
        );
        assert!(!err.contains("s3cret"), "{err}");
    }
}

#[test]
fn librdkafka_username_and_password_with_the_plural_mechanism_key() {
    let s = settings(&[
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanisms", "SCRAM-SHA-256"),
        ("sasl.username", "carol"),
        ("sasl.password", "c4rol"),
    ])
    .unwrap();
    assert_eq!(
        s.sasl.as_ref().unwrap().mechanism,
        SaslMechanism::ScramSha256
    );
    assert_eq!(user_password(&s), ("carol".into(), "c4rol".into()));
    assert_eq!(entries(&s)["sasl.mechanisms"], "SCRAM-SHA-256");
}

#[test]
fn missing_or_doubled_credentials_and_a_missing_mechanism_say_what_to_set() {
    let err = settings(&[
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanism", "PLAIN"),
        ("sasl.username", "u"),
    ])
    .unwrap_err()
    .to_string();
    assert!(err.starts_with("sasl.password is required"), "{err}");
    let err = settings(&[("security.protocol", "SASL_SSL"), ("sasl.username", "u")])
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("sasl.mechanism is required") && err.contains("GSSAPI"),
        "{err}"
    );
    let err = settings(&[
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanism", "PLAIN"),
        ("sasl.username", "u"),
        ("sasl.password", "p"),
        (
            "sasl.jaas.config",
            r#"org.apache.kafka.common.security.plain.PlainLoginModule required username="a" password="b";"#,
        ),
    ])
    .unwrap_err()
    .to_string();
    assert!(err.contains("given twice"), "{err}");
    let err = settings(&[
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanism", "GSSAPI"),
    ])
    .unwrap_err()
    .to_string();
    assert!(err.contains("'GSSAPI' for sasl.mechanism"), "{err}");
    let err = settings(&[("sasl.mechanism", "PLAIN")])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("sasl.mechanism set but security.protocol is PLAINTEXT"),
        "{err}"
    );
}

fn oauth(s: &SecuritySettings) -> OAuthSettings {
    match &s.sasl.as_ref().expect("sasl").credentials {
        SaslCredentials::OAuth(o) => o.clone(),
        other => panic!("not oauth: {other:?}"),
    }
}

#[test]
fn oauthbearer_java_style_with_jaas_options_and_with_keys() {
    let s = settings(&[
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanism", "OAUTHBEARER"),
        ("sasl.oauthbearer.token.endpoint.url", "https://idp/token"),
        (
            "sasl.login.callback.handler.class",
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler",
        ),
        (
            "sasl.jaas.config",
            r#"org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required clientId="svc" clientSecret="cs" scope="kafka";"#,
        ),
    ])
    .unwrap();
    let o = oauth(&s);
    assert_eq!(
        (
            o.token_endpoint.as_str(),
            o.client_id.as_str(),
            o.client_secret.expose(),
            o.scope.as_deref()
        ),
        ("https://idp/token", "svc", "cs", Some("kafka"))
    );
    let e = entries(&s);
    assert_eq!(e["sasl.mechanisms"], "OAUTHBEARER");
    assert!(!e.contains_key("sasl.login.callback.handler.class"));
    assert!(
        !e.keys().any(|k| k.starts_with("sasl.oauthbearer")),
        "{e:?}"
    );
    assert!(!format!("{s:?}").contains("\"cs\""), "{s:?}");

    let keys = settings(&[
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanism", "OAUTHBEARER"),
        ("sasl.oauthbearer.token.endpoint.url", "https://idp/token"),
        ("sasl.oauthbearer.client.credentials.client.id", "svc2"),
        ("sasl.oauthbearer.client.credentials.client.secret", "cs2"),
        ("sasl.oauthbearer.scope", "s2"),
    ])
    .unwrap();
    let o = oauth(&keys);
    assert_eq!(
        (
            o.client_id.as_str(),
            o.client_secret.expose(),
            o.scope.as_deref()
        ),
        ("svc2", "cs2", Some("s2"))
    );
}

#[test]
fn oauthbearer_librdkafka_style() {
    let s = settings(&[
        ("security.protocol", "SASL_PLAINTEXT"),
        ("sasl.mechanisms", "OAUTHBEARER"),
        ("sasl.oauthbearer.method", "oidc"),
        (
            "sasl.oauthbearer.token.endpoint.url",
            "http://127.0.0.1:1/token",
        ),
        ("sasl.oauthbearer.client.id", "rd"),
        ("sasl.oauthbearer.client.secret", "rds"),
    ])
    .unwrap();
    let o = oauth(&s);
    assert_eq!(
        (o.client_id.as_str(), o.client_secret.expose(), o.scope),
        ("rd", "rds", None)
    );
    assert!(!entries(&s).contains_key("sasl.oauthbearer.method"));
}

#[test]
fn oauthbearer_without_endpoint_or_client_or_with_another_handler_says_what_to_set() {
    let base = [
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanism", "OAUTHBEARER"),
    ];
    let err = settings(&base).unwrap_err().to_string();
    assert!(
        err.starts_with("sasl.oauthbearer.token.endpoint.url is required"),
        "{err}"
    );
    let mut pairs = base.to_vec();
    pairs.push(("sasl.oauthbearer.token.endpoint.url", "https://idp/token"));
    let err = settings(&pairs).unwrap_err().to_string();
    assert!(
        err.starts_with("sasl.oauthbearer.client.credentials.client.id is required"),
        "{err}"
    );
    pairs.push(("sasl.oauthbearer.client.id", "x"));
    let err = settings(&pairs).unwrap_err().to_string();
    assert!(err.contains("client.secret is required"), "{err}");
    pairs.push(("sasl.login.callback.handler.class", "com.example.MyHandler"));
    pairs.push(("sasl.oauthbearer.client.secret", "y"));
    let err = settings(&pairs).unwrap_err().to_string();
    assert!(err.contains("com.example.MyHandler"), "{err}");
}

#[test]
fn later_keys_win_and_errors_name_the_key_as_written() {
    let s = SecuritySettings::from_keys([
        ("security.protocol", "SSL", "consumer.security.protocol"),
        (
            "security.protocol",
            "PLAINTEXT",
            "consumer.override.security.protocol",
        ),
    ])
    .unwrap();
    assert_eq!(s.protocol, SecurityProtocol::Plaintext);
    let err = SecuritySettings::from_keys([
        (
            "security.protocol",
            "SASL_SSL",
            "consumer.security.protocol",
        ),
        (
            "sasl.mechanism",
            "PLAIN",
            "consumer.override.sasl.mechanism",
        ),
        ("sasl.password", "pw", "consumer.override.sasl.password"),
    ])
    .unwrap_err()
    .to_string();
    assert!(err.contains("sasl.username is required"), "{err}");
    let err = SecuritySettings::from_keys([("sasl.mechanism", "X", "producer.sasl.mechanism")])
        .unwrap_err()
        .to_string();
    assert!(err.contains("for producer.sasl.mechanism"), "{err}");
}

#[test]
fn other_ssl_keys_pass_to_librdkafka_and_java_only_keys_are_dropped_with_a_warning() {
    let s = settings(&[
        ("security.protocol", "SSL"),
        ("ssl.cipher.suites", "ECDHE-RSA-AES256-GCM-SHA384"),
        ("ssl.enabled.protocols", "TLSv1.3"),
        ("ssl.truststore.password", "changeit"),
    ])
    .unwrap();
    let e = entries(&s);
    assert_eq!(e["ssl.cipher.suites"], "ECDHE-RSA-AES256-GCM-SHA384");
    assert!(!e.contains_key("ssl.enabled.protocols") && !e.contains_key("ssl.truststore.password"));
    assert_eq!(s.warnings.len(), 3, "{:?}", s.warnings);
    assert!(!s.warnings.iter().any(|w| w.contains("changeit")));
}

/// The client-key examples of `docs/security.md` (part 1), split by the client they are for
/// (no prefix, `consumer.`, `producer.`, `consumer.override.`): each translates, to the
/// protocol and mechanism it names. An example that drifts from the translation fails here.
#[test]
fn every_client_example_in_the_security_guide_translates_as_written() {
    let guide =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/security.md"))
            .expect("docs/security.md is readable");
    let part_one = guide
        .split("# Part 2")
        .next()
        .expect("the guide has a part 1");
    let mut blocks = 0;
    let mut translated = 0;
    for block in part_one.split("```properties").skip(1) {
        let body = block.split("```").next().expect("a closed block");
        blocks += 1;
        let mut clients: BTreeMap<&str, Vec<(&str, &str)>> = BTreeMap::new();
        for line in body.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (key, value) = line.split_once('=').expect("key=value");
            let (client, name) = [
                "consumer.override.",
                "producer.override.",
                "consumer.",
                "producer.",
            ]
            .iter()
            .find_map(|p| key.strip_prefix(p).map(|name| (*p, name)))
            .unwrap_or(("", key));
            clients.entry(client).or_default().push((name, value));
        }
        for (client, keys) in clients {
            if !keys.iter().any(|(k, _)| is_security_key(k)) {
                continue;
            }
            let settings = settings(&keys).unwrap_or_else(|e| {
                panic!("the guide's example for client '{client}' ({keys:?}) is refused: {e}")
            });
            translated += 1;
            if let Some((_, protocol)) = keys.iter().find(|(k, _)| *k == "security.protocol") {
                assert!(
                    settings.protocol.name().eq_ignore_ascii_case(protocol),
                    "{client}{keys:?}: {:?}",
                    settings.protocol
                );
            }
            if let Some((_, mechanism)) = keys
                .iter()
                .find(|(k, _)| *k == "sasl.mechanism" || *k == "sasl.mechanisms")
            {
                let sasl = settings
                    .sasl
                    .as_ref()
                    .expect("a SASL example has SASL settings");
                assert_eq!(sasl.mechanism.name(), *mechanism, "{client}{keys:?}");
            }
        }
    }
    assert!(
        blocks >= 8 && translated >= 10,
        "the guide's examples were not found ({blocks} blocks, {translated} clients)"
    );
}
