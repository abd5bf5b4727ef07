//! The SASL server side, as Apache Kafka's `SaslServerAuthenticator` runs it: PLAIN,
//! SCRAM-SHA-256/512 (scram-rs) and OAUTHBEARER (RFC 7628, tokens from a [`TokenIssuer`]).

use std::collections::HashMap;
use std::sync::Arc;

use scram_rs::scram_sync::{ScramServerDyn, SyncScramServer};
use scram_rs::{
    ScramAuthServer, ScramCbHelper, ScramHashing, ScramNonce, ScramPassword, ScramResult,
    ScramResultServer, ScramSha256Ring, ScramSha512Ring, SCRAM_TYPES,
};

use super::token::TokenIssuer;

/// A SASL mechanism the proxy can accept.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SaslMechanism {
    Plain,
    ScramSha256,
    ScramSha512,
    OAuthBearer,
}

impl SaslMechanism {
    /// The name Kafka and `sasl.mechanism` use.
    pub fn name(self) -> &'static str {
        match self {
            SaslMechanism::Plain => "PLAIN",
            SaslMechanism::ScramSha256 => "SCRAM-SHA-256",
            SaslMechanism::ScramSha512 => "SCRAM-SHA-512",
            SaslMechanism::OAuthBearer => "OAUTHBEARER",
        }
    }

    pub const ALL: [SaslMechanism; 4] = [
        SaslMechanism::Plain,
        SaslMechanism::ScramSha256,
        SaslMechanism::ScramSha512,
        SaslMechanism::OAuthBearer,
    ];
}

impl std::fmt::Display for SaslMechanism {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for SaslMechanism {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        SaslMechanism::ALL
            .into_iter()
            .find(|m| m.name().eq_ignore_ascii_case(text))
            .ok_or_else(|| {
                format!(
                    "unknown SASL mechanism '{text}'; expected one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER"
                )
            })
    }
}

/// What the SASL listeners accept.
pub(crate) struct SaslConfig {
    pub mechanisms: Vec<SaslMechanism>,
    pub users: Arc<HashMap<String, String>>,
    pub token_issuer: Option<TokenIssuer>,
}

/// The outcome of one authentication step.
pub(crate) enum Step {
    /// Send these bytes and wait for the client's next message.
    Challenge(Vec<u8>),
    /// Authenticated; send these (possibly empty) final bytes.
    Done(Vec<u8>),
    /// Refused: answer SASL_AUTHENTICATION_FAILED with this message and close.
    Failed(String),
}

/// Kafka's message for bad credentials on PLAIN.
const PLAIN_FAILED: &str = "Authentication failed: Invalid username or password";

fn scram_failed(mechanism: SaslMechanism) -> String {
    format!("Authentication failed during authentication due to invalid credentials with SASL mechanism {mechanism}")
}

/// The user store as scram-rs asks for it. Debug never shows passwords.
#[derive(Clone)]
pub(crate) struct UserDb(Arc<HashMap<String, String>>);

impl std::fmt::Debug for UserDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UserDb({} users)", self.0.len())
    }
}

impl ScramCbHelper for UserDb {}

fn lookup<S: ScramHashing>(db: &UserDb, username: &str) -> ScramResult<ScramPassword> {
    match db.0.get(username) {
        Some(password) => ScramPassword::found_plaintext_password::<S>(password.as_bytes(), None),
        None => ScramPassword::not_found::<S>(),
    }
}

impl ScramAuthServer<ScramSha256Ring> for UserDb {
    fn get_password_for_user(
        &self,
        username: &str,
        _authzid: Option<&str>,
    ) -> ScramResult<ScramPassword> {
        lookup::<ScramSha256Ring>(self, username)
    }
}

impl ScramAuthServer<ScramSha512Ring> for UserDb {
    fn get_password_for_user(
        &self,
        username: &str,
        _authzid: Option<&str>,
    ) -> ScramResult<ScramPassword> {
        lookup::<ScramSha512Ring>(self, username)
    }
}

/// One connection's authentication in progress.
pub(crate) enum Authenticator {
    Plain(Arc<HashMap<String, String>>),
    Scram256(Box<SyncScramServer<ScramSha256Ring, UserDb, UserDb>>),
    Scram512(Box<SyncScramServer<ScramSha512Ring, UserDb, UserDb>>),
    OAuthBearer(Option<TokenIssuer>),
}

impl Authenticator {
    pub(crate) fn new(
        mechanism: SaslMechanism,
        config: &SaslConfig,
    ) -> Result<Authenticator, String> {
        let db = UserDb(Arc::clone(&config.users));
        let nonce = || ScramNonce::none().map_err(|e| format!("SCRAM nonce: {e}"));
        let scram_type = |name: &str| {
            SCRAM_TYPES
                .get_scramtype(name)
                .map_err(|e| format!("SCRAM type {name}: {e}"))
        };
        Ok(match mechanism {
            SaslMechanism::Plain => Authenticator::Plain(Arc::clone(&config.users)),
            SaslMechanism::ScramSha256 => Authenticator::Scram256(Box::new(
                SyncScramServer::new(db.clone(), db, nonce()?, scram_type("SCRAM-SHA-256")?, true)
                    .map_err(|e| format!("SCRAM-SHA-256 server: {e}"))?,
            )),
            SaslMechanism::ScramSha512 => Authenticator::Scram512(Box::new(
                SyncScramServer::new(db.clone(), db, nonce()?, scram_type("SCRAM-SHA-512")?, true)
                    .map_err(|e| format!("SCRAM-SHA-512 server: {e}"))?,
            )),
            SaslMechanism::OAuthBearer => Authenticator::OAuthBearer(config.token_issuer.clone()),
        })
    }

    /// Handles the client's next message.
    pub(crate) fn step(&mut self, input: &[u8]) -> Step {
        match self {
            Authenticator::Plain(users) => plain(users, input),
            Authenticator::Scram256(server) => scram(
                server.parse_response(&String::from_utf8_lossy(input)),
                SaslMechanism::ScramSha256,
            ),
            Authenticator::Scram512(server) => scram(
                server.parse_response(&String::from_utf8_lossy(input)),
                SaslMechanism::ScramSha512,
            ),
            Authenticator::OAuthBearer(issuer) => oauth_bearer(issuer.as_ref(), input),
        }
    }
}

fn scram(result: ScramResultServer, mechanism: SaslMechanism) -> Step {
    match result {
        ScramResultServer::Data(text) => Step::Challenge(text.into_bytes()),
        ScramResultServer::Final(text) => Step::Done(text.into_bytes()),
        ScramResultServer::Error(_) => Step::Failed(scram_failed(mechanism)),
    }
}

/// RFC 4616: `[authzid] NUL authcid NUL passwd`; like Kafka, an authzid must equal the user.
fn plain(users: &HashMap<String, String>, input: &[u8]) -> Step {
    let parts: Vec<&[u8]> = input.split(|b| *b == 0).collect();
    let [authzid, user, password] = parts.as_slice() else {
        return Step::Failed(
            "Invalid SASL/PLAIN response: expected 3 tokens separated by NUL".into(),
        );
    };
    let (Ok(authzid), Ok(user), Ok(password)) = (
        std::str::from_utf8(authzid),
        std::str::from_utf8(user),
        std::str::from_utf8(password),
    ) else {
        return Step::Failed("Invalid SASL/PLAIN response: not UTF-8".into());
    };
    if !authzid.is_empty() && authzid != user {
        return Step::Failed("Authentication failed: Client requested an authorization id that is different from username".into());
    }
    match users.get(user) {
        Some(expected) if expected == password => Step::Done(Vec::new()),
        _ => Step::Failed(PLAIN_FAILED.into()),
    }
}

/// RFC 7628 client first message: `n,[a=authzid],\x01auth=Bearer <token>\x01\x01`.
fn oauth_bearer(issuer: Option<&TokenIssuer>, input: &[u8]) -> Step {
    let failed = |why: String| {
        Step::Failed(format!(
            "Authentication failed during authentication due to invalid credentials with SASL mechanism OAUTHBEARER: {why}"
        ))
    };
    let Ok(text) = std::str::from_utf8(input) else {
        return failed("the client message is not UTF-8".into());
    };
    let Some(rest) = text.strip_prefix("n,") else {
        return failed("the client message does not start with the GS2 header 'n,'".into());
    };
    let Some((_authzid, kvs)) = rest.split_once(',') else {
        return failed("the GS2 header is not terminated by ','".into());
    };
    let Some(kvs) = kvs.strip_prefix('\x01') else {
        return failed("no key/value section after the GS2 header".into());
    };
    let token = kvs.split('\x01').find_map(|kv| {
        let (key, value) = kv.split_once('=')?;
        if key != "auth" {
            return None;
        }
        let (scheme, token) = value.split_once(' ')?;
        scheme.eq_ignore_ascii_case("Bearer").then(|| token.trim())
    });
    let Some(token) = token else {
        return failed("no 'auth=Bearer <token>' in the client message".into());
    };
    let Some(issuer) = issuer else {
        return failed("no token issuer is configured on this proxy".into());
    };
    match issuer.validate(token) {
        Ok(_subject) => Step::Done(Vec::new()),
        Err(e) => failed(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use scram_rs::scram_sync::SyncScramClient;
    use scram_rs::{ChannelBindType, ScramAuthClient, ScramResultClient};
    use std::time::Duration;

    fn config() -> SaslConfig {
        SaslConfig {
            mechanisms: SaslMechanism::ALL.to_vec(),
            users: Arc::new(HashMap::from([(
                "alice".to_string(),
                "alice-secret".to_string(),
            )])),
            token_issuer: None,
        }
    }

    #[derive(Debug)]
    struct Client(&'static str, &'static str);
    impl ScramAuthClient for &Client {
        fn get_username(&self) -> &str {
            self.0
        }
        fn get_password(&self) -> &str {
            self.1
        }
    }
    impl ScramCbHelper for &Client {}

    fn scram_exchange<S: ScramHashing>(mechanism: SaslMechanism, password: &'static str) -> bool {
        let creds = Client("alice", password);
        let mut client = SyncScramClient::<S, &Client, &Client>::new(
            &creds,
            ScramNonce::none().unwrap(),
            ChannelBindType::None,
            &creds,
            true,
        )
        .unwrap();
        let mut server = Authenticator::new(mechanism, &config()).unwrap();
        let ScramResultClient::Output(first) = client.init_client() else {
            panic!("no client-first message");
        };
        let Step::Challenge(server_first) = server.step(first.as_bytes()) else {
            panic!("no server-first message");
        };
        let out = client
            .parse_response(&String::from_utf8(server_first).unwrap())
            .unwrap();
        let ScramResultClient::Output(client_final) = out else {
            panic!("no client-final message");
        };
        match server.step(client_final.as_bytes()) {
            Step::Done(server_final) => matches!(
                client.parse_response(&String::from_utf8(server_final).unwrap()),
                Ok(ScramResultClient::Completed)
            ),
            Step::Failed(message) => {
                assert!(message.contains(mechanism.name()), "{message}");
                false
            }
            Step::Challenge(_) => panic!("a third SCRAM round"),
        }
    }

    #[test]
    fn scram_accepts_the_right_password_and_refuses_a_wrong_one() {
        assert!(scram_exchange::<ScramSha256Ring>(
            SaslMechanism::ScramSha256,
            "alice-secret"
        ));
        assert!(!scram_exchange::<ScramSha256Ring>(
            SaslMechanism::ScramSha256,
            "nope"
        ));
        assert!(scram_exchange::<ScramSha512Ring>(
            SaslMechanism::ScramSha512,
            "alice-secret"
        ));
        assert!(!scram_exchange::<ScramSha512Ring>(
            SaslMechanism::ScramSha512,
            "nope"
        ));
    }

    #[test]
    fn plain_checks_user_password_and_authzid() {
        let users = config().users;
        assert!(matches!(
            plain(&users, b"\0alice\0alice-secret"),
            Step::Done(_)
        ));
        assert!(matches!(
            plain(&users, b"alice\0alice\0alice-secret"),
            Step::Done(_)
        ));
        assert!(matches!(plain(&users, b"\0alice\0wrong"), Step::Failed(m) if m == PLAIN_FAILED));
        assert!(matches!(
            plain(&users, b"bob\0alice\0alice-secret"),
            Step::Failed(_)
        ));
        assert!(matches!(plain(&users, b"garbage"), Step::Failed(_)));
    }

    #[test]
    fn oauth_bearer_takes_only_unexpired_tokens_of_its_issuer() {
        let issuer = TokenIssuer::start("app", "secret", Duration::from_secs(60));
        let message = |token: &str| format!("n,,\x01auth=Bearer {token}\x01\x01").into_bytes();
        let good = issuer.issue(None);
        assert!(matches!(
            oauth_bearer(Some(&issuer), &message(&good)),
            Step::Done(_)
        ));
        let other = TokenIssuer::start("app", "secret", Duration::from_secs(60)).issue(None);
        let Step::Failed(why) = oauth_bearer(Some(&issuer), &message(&other)) else {
            panic!("a foreign token was accepted");
        };
        assert!(why.contains("signature"), "{why}");
        assert!(matches!(
            oauth_bearer(Some(&issuer), b"n,,\x01\x01"),
            Step::Failed(_)
        ));
        assert!(matches!(
            oauth_bearer(None, &message(&good)),
            Step::Failed(_)
        ));
    }
}
