//! SASL for the native client: SaslHandshake v1, then SaslAuthenticate frames carrying the
//! mechanism's messages (PLAIN, SCRAM-SHA-256/512 via scram-rs, OAUTHBEARER per RFC 7628).

use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::{SaslAuthenticateRequest, SaslHandshakeRequest};
use kafka_protocol::protocol::StrBytes;
use scram_rs::scram_sync::SyncScramClient;
use scram_rs::{
    ChannelBindType, ScramAuthClient, ScramCbHelper, ScramHashing, ScramNonce, ScramResultClient,
    ScramSha256Ring, ScramSha512Ring,
};

use super::{ClientSecurity, SaslCredentials, SaslMechanism, SaslSettings};
use crate::connection::{Connection, ConnectionError};
use crate::error_name;

const SASL_HANDSHAKE_KEY: i16 = 17;
const SASL_AUTHENTICATE_KEY: i16 = 36;
const UNSUPPORTED_SASL_MECHANISM: i16 = 33;
const ILLEGAL_SASL_STATE: i16 = 34;

/// Authenticate `conn` (versions negotiated) as `security` says; nothing to do without SASL.
pub async fn authenticate(
    conn: &Connection,
    security: &ClientSecurity,
    timeout: Duration,
) -> Result<(), ConnectionError> {
    let Some(sasl) = security.sasl() else {
        return Ok(());
    };
    let fail = |message: String| ConnectionError::Authentication {
        addr: conn.addr().to_owned(),
        mechanism: sasl.mechanism.name(),
        principal: sasl.principal().to_owned(),
        message,
    };
    if conn.pick(SASL_HANDSHAKE_KEY, 1, 1).is_err() {
        return Err(fail(
            "the broker does not offer SaslHandshake v1 on this listener; is it a SASL listener? \
             check the port, or set security.protocol=PLAINTEXT/SSL"
                .into(),
        ));
    }
    let mut handshake = SaslHandshakeRequest::default();
    handshake.mechanism = StrBytes::from_static_str(sasl.mechanism.name());
    let answer = conn.request(&handshake, 1, timeout).await?;
    match answer.error_code {
        0 => {}
        UNSUPPORTED_SASL_MECHANISM => {
            let enabled: Vec<&str> = answer.mechanisms.iter().map(|m| m.as_str()).collect();
            return Err(fail(format!(
                "the broker does not enable {} on this listener (it offers: {}); set sasl.mechanism to one of those",
                sasl.mechanism.name(),
                if enabled.is_empty() { "none".to_owned() } else { enabled.join(", ") }
            )));
        }
        ILLEGAL_SASL_STATE => {
            return Err(fail(
                "the broker does not expect SASL on this listener; set security.protocol=PLAINTEXT or SSL, \
                 or use the broker's SASL listener"
                    .into(),
            ))
        }
        code => {
            return Err(fail(format!(
                "SaslHandshake failed with error {code} ({})",
                error_name(code)
            )))
        }
    }
    let version = conn.pick(SASL_AUTHENTICATE_KEY, 0, 2).map_err(|_| {
        fail("the broker does not offer SaslAuthenticate; it is older than Kafka 1.0".into())
    })?;
    let exchange = Exchange {
        conn,
        version,
        timeout,
        sasl,
    };
    match (&sasl.credentials, sasl.mechanism) {
        (SaslCredentials::UserPassword { username, password }, SaslMechanism::Plain) => {
            // authzid NUL authcid NUL password (RFC 4616); Kafka takes an empty authzid.
            let mut msg = Vec::with_capacity(username.len() + password.expose().len() + 2);
            msg.push(0);
            msg.extend_from_slice(username.as_bytes());
            msg.push(0);
            msg.extend_from_slice(password.expose().as_bytes());
            exchange.step(msg).await?;
            Ok(())
        }
        (SaslCredentials::UserPassword { username, password }, SaslMechanism::ScramSha256) => {
            scram::<ScramSha256Ring>(&exchange, username, password.expose()).await
        }
        (SaslCredentials::UserPassword { username, password }, SaslMechanism::ScramSha512) => {
            scram::<ScramSha512Ring>(&exchange, username, password.expose()).await
        }
        (SaslCredentials::OAuth(_), SaslMechanism::OAuthBearer) => {
            let fetcher = security
                .token_fetcher()
                .ok_or_else(|| fail("no token endpoint configured".into()))?;
            let token = fetcher.token().await.map_err(fail)?;
            // RFC 7628 §3.1: gs2 header, then kvpairs separated by ^A.
            let msg = format!("n,,\x01auth=Bearer {}\x01\x01", token.token.expose());
            let challenge = exchange.step(msg.into_bytes()).await?;
            if !challenge.is_empty() {
                // An error challenge (JSON status); answer with ^A so the broker ends the
                // exchange with its error (RFC 7628 §3.2.3).
                let detail = String::from_utf8_lossy(&challenge).into_owned();
                return match exchange.step(vec![0x01]).await {
                    Err(e) => Err(e),
                    Ok(_) => Err(fail(format!("the broker refused the token: {detail}"))),
                };
            }
            Ok(())
        }
        (_, mechanism) => Err(fail(format!(
            "the credentials configured do not fit {}",
            mechanism.name()
        ))),
    }
}

/// One SaslAuthenticate round trip.
struct Exchange<'a> {
    conn: &'a Connection,
    version: i16,
    timeout: Duration,
    sasl: &'a SaslSettings,
}

impl Exchange<'_> {
    async fn step(&self, bytes: Vec<u8>) -> Result<Bytes, ConnectionError> {
        let mut request = SaslAuthenticateRequest::default();
        request.auth_bytes = Bytes::from(bytes);
        let answer = self
            .conn
            .request(&request, self.version, self.timeout)
            .await?;
        if answer.error_code != 0 {
            let said = answer
                .error_message
                .as_ref()
                .map(|m| m.to_string())
                .unwrap_or_default();
            return Err(ConnectionError::Authentication {
                addr: self.conn.addr().to_owned(),
                mechanism: self.sasl.mechanism.name(),
                principal: self.sasl.principal().to_owned(),
                message: format!(
                    "the broker refused it with error {} ({}){}; {}",
                    answer.error_code,
                    error_name(answer.error_code),
                    if said.is_empty() {
                        String::new()
                    } else {
                        format!(": {said}")
                    },
                    what_to_check(self.sasl)
                ),
            });
        }
        Ok(answer.auth_bytes)
    }
}

/// What a user should look at when a broker refuses the credentials.
fn what_to_check(sasl: &SaslSettings) -> String {
    match sasl.mechanism {
        SaslMechanism::OAuthBearer => "check the OAuth client (sasl.oauthbearer.client.credentials.client.id / clientId) and that \
             the brokers accept tokens of this issuer"
            .into(),
        m => format!(
            "check the user name and password (sasl.jaas.config, or sasl.username / sasl.password) and that the user \
             has {} credentials on the cluster{}",
            m.name(),
            if m == SaslMechanism::Plain {
                ""
            } else {
                " (kafka-configs --alter --add-config 'SCRAM-SHA-...=[password=...]' --entity-type users)"
            }
        ),
    }
}

/// SCRAM user names escape ',' and '=' (RFC 5802 §5.1), as Kafka's ScramFormatter does.
fn sasl_name(user: &str) -> String {
    user.replace('=', "=3D").replace(',', "=2C")
}

struct ScramUser {
    name: String,
    password: String,
}

impl std::fmt::Debug for ScramUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ScramUser({}, [hidden])", self.name)
    }
}

impl ScramAuthClient for &ScramUser {
    fn get_username(&self) -> &str {
        &self.name
    }
    fn get_password(&self) -> &str {
        &self.password
    }
}

impl ScramCbHelper for &ScramUser {}

/// client-first → server-first → client-final → server-final; scram-rs checks the server's
/// signature in the last step.
async fn scram<S: ScramHashing>(
    exchange: &Exchange<'_>,
    username: &str,
    password: &str,
) -> Result<(), ConnectionError> {
    let fail = |message: String| ConnectionError::Authentication {
        addr: exchange.conn.addr().to_owned(),
        mechanism: exchange.sasl.mechanism.name(),
        principal: username.to_owned(),
        message,
    };
    let user = ScramUser {
        name: sasl_name(username),
        password: password.to_owned(),
    };
    let nonce = ScramNonce::none().map_err(|e| fail(format!("cannot make a SCRAM nonce: {e}")))?;
    let mut client = SyncScramClient::<S, &ScramUser, &ScramUser>::new(
        &user,
        nonce,
        ChannelBindType::None,
        &user,
        true,
    )
    .map_err(|e| fail(format!("cannot start SCRAM: {e}")))?;
    let first = match client.init_client() {
        ScramResultClient::Output(s) => s,
        ScramResultClient::Completed => return Err(fail("SCRAM ended before it began".into())),
    };
    let mut reply = exchange.step(first.into_bytes()).await?;
    loop {
        let text = String::from_utf8_lossy(&reply).into_owned();
        match client.parse_response(&text) {
            Ok(ScramResultClient::Output(out)) => {
                reply = exchange.step(out.into_bytes()).await?;
            }
            Ok(ScramResultClient::Completed) => return Ok(()),
            Err(e) => {
                return Err(fail(format!(
                    "the SCRAM exchange failed: {e}; {}",
                    what_to_check(exchange.sasl)
                )))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scram_user_names_are_escaped_as_kafka_does() {
        assert_eq!(sasl_name("a=b,c"), "a=3Db=2Cc");
        assert_eq!(sasl_name("alice"), "alice");
    }
}
