//! `spillway dev-broker --security ...` (issue 13's "done when"): the Python confluent-kafka
//! wheel produces to a SASL_SSL SCRAM-SHA-512 dev broker with `ssl.ca.location` set to the CA
//! file it printed, and reads the records back.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// Kills the dev broker when the test ends, however it ends.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `spillway dev-broker` with `args`; returns it and its stdout lines up to `lines`.
fn dev_broker(args: &[&str], lines: usize) -> (Running, Vec<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_spillway"))
        .arg("dev-broker")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spillway starts");
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let running = Running(child);
    let mut out = Vec::new();
    for _ in 0..lines {
        let mut line = String::new();
        assert!(
            stdout.read_line(&mut line).unwrap() > 0,
            "dev-broker printed only {out:?}"
        );
        out.push(line.trim().to_string());
    }
    (running, out)
}

/// tools/kafka_roundtrip.py with the confluent-kafka wheel: produce `n`, read them back.
fn python_round_trip(conf: serde_json::Value, topic: &str, n: usize) -> Result<String, String> {
    let python = spillway_tests::python::venv_python().expect("python venv");
    let script = spillway_tests::python::tools_dir().join("kafka_roundtrip.py");
    let output = Command::new(python)
        .arg(script)
        .arg(conf.to_string())
        .arg(topic)
        .arg(n.to_string())
        .output()
        .expect("python runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    if output.status.success() {
        Ok(text)
    } else {
        Err(text)
    }
}

#[test]
fn python_produces_to_a_sasl_ssl_scram_512_dev_broker_and_reads_it_back() {
    let (_broker, lines) = dev_broker(
        &[
            "--brokers",
            "2",
            "--topic",
            "secured:2",
            "--security",
            "SASL_SSL",
            "--sasl-mechanism",
            "SCRAM-SHA-512",
            "--user",
            "alice:alice-secret",
        ],
        2,
    );
    let bootstrap = &lines[0];
    assert_eq!(bootstrap.split(',').count(), 2, "{bootstrap}");
    let ca = lines[1]
        .strip_prefix("ca=")
        .unwrap_or_else(|| panic!("second line is not ca=<path>: {:?}", lines[1]));
    assert!(
        std::fs::read_to_string(ca)
            .unwrap()
            .contains("BEGIN CERTIFICATE"),
        "{ca}"
    );
    let conf = |password: &str| {
        serde_json::json!({
            "bootstrap.servers": bootstrap,
            "security.protocol": "SASL_SSL",
            "ssl.ca.location": ca,
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "alice",
            "sasl.password": password,
            "message.timeout.ms": 8000,
        })
    };
    let out =
        python_round_trip(conf("alice-secret"), "secured", 100).unwrap_or_else(|e| panic!("{e}"));
    assert!(out.contains("consumed 100"), "{out}");
    let err = python_round_trip(conf("wrong-secret"), "secured", 1).unwrap_err();
    assert!(err.contains("produce failed"), "{err}");
    assert!(!err.contains("wrong-secret"), "{err}");
}

/// The whole chain a user would try first: librdkafka produces to `spillway dev-broker
/// --security SASL_SSL --sasl-mechanism SCRAM-SHA-512`, and `spillway standalone` runs a
/// share-mode file sink configured the Kafka Connect way (`sasl.jaas.config` with Kafka's SCRAM
/// login module, a PEM truststore) that delivers every record.
#[test]
fn a_share_connector_with_java_style_keys_delivers_what_librdkafka_produced_over_sasl_ssl() {
    let (_broker, lines) = dev_broker(
        &[
            "--topic",
            "payments:3",
            "--security",
            "SASL_SSL",
            "--sasl-mechanism",
            "SCRAM-SHA-512",
            "--user",
            "alice:alice-secret",
        ],
        2,
    );
    let bootstrap = &lines[0];
    let ca = lines[1].strip_prefix("ca=").expect("ca= line");
    let produced = python_round_trip(
        serde_json::json!({
            "bootstrap.servers": bootstrap,
            "security.protocol": "SASL_SSL",
            "ssl.ca.location": ca,
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "alice",
            "sasl.password": "alice-secret",
        }),
        "payments",
        300,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(produced.contains("consumed 300"), "{produced}");

    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("payments.txt");
    let worker = dir.path().join("worker.properties");
    let connector = dir.path().join("connector.properties");
    // As in Kafka Connect, the sink tasks' consumers take the `consumer.`-prefixed keys; the
    // unprefixed ones are the worker's own clients'.
    let security = format!(
        "security.protocol=SASL_SSL\n\
         sasl.mechanism=SCRAM-SHA-512\n\
         sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username=\"alice\" password=\"alice-secret\";\n\
         ssl.truststore.type=PEM\n\
         ssl.truststore.location={ca}\n"
    );
    let consumer_security: String = security
        .lines()
        .map(|l| format!("consumer.{l}\n"))
        .collect();
    std::fs::write(
        &worker,
        format!(
            "bootstrap.servers={bootstrap}\n{security}{consumer_security}state.dir={}\nrest.port=0\n",
            dir.path().join("state").display()
        ),
    )
    .expect("worker file");
    std::fs::write(
        &connector,
        format!(
            "name=payments-sink\n\
             connector.class=org.apache.kafka.connect.file.FileStreamSinkConnector\n\
             topics=payments\n\
             tasks.max=2\n\
             file={}\n\
             consumer.override.group.protocol=share\n",
            out.display()
        ),
    )
    .expect("connector file");
    let standalone = Command::new(env!("CARGO_BIN_EXE_spillway"))
        .arg("standalone")
        .arg(&worker)
        .arg(&connector)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spillway standalone starts");
    let mut standalone = Running(standalone);
    // Read the log as it comes, so a full pipe never stalls the worker.
    let log = {
        let mut stderr = standalone.0.stderr.take().expect("piped stderr");
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
            text
        })
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut values: std::collections::BTreeSet<String> = Default::default();
    while values.len() < 300 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(200));
        values = std::fs::read_to_string(&out)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect();
    }
    let _ = standalone.0.kill();
    let _ = standalone.0.wait();
    let output = log.join().expect("log reader");
    assert_eq!(
        values.len(),
        300,
        "the share connector delivered {} of 300 records; standalone's log:\n{output}",
        values.len()
    );
    assert!(
        values.contains("v0") && values.contains("v299"),
        "{values:?}"
    );
    assert!(
        !output.contains("alice-secret"),
        "a secret reached the log:\n{output}"
    );
}

#[test]
fn plaintext_stays_as_it_was_and_misfitting_flags_are_refused() {
    let (_broker, lines) = dev_broker(&["--brokers", "1"], 1);
    assert!(lines[0].starts_with("127.0.0.1:"), "{lines:?}");

    let output = Command::new(env!("CARGO_BIN_EXE_spillway"))
        .args([
            "dev-broker",
            "--security",
            "SSL",
            "--user",
            "alice:alice-secret",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(
        err.contains("--user need --security SASL_PLAINTEXT or SASL_SSL"),
        "{err}"
    );
    assert!(!err.contains("alice-secret"), "{err}");

    let output = Command::new(env!("CARGO_BIN_EXE_spillway"))
        .args(["dev-broker", "--security", "SASL_SSL"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(
        err.contains("needs at least one --user NAME:PASSWORD"),
        "{err}"
    );

    let output = Command::new(env!("CARGO_BIN_EXE_spillway"))
        .args(["dev-broker", "--security", "TLS"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(err.contains("'TLS'") && err.contains("SASL_SSL"), "{err}");
}
