//! Mailing approval notices over SMTP (lettre, rustls).
//!
//! One connection per mail, no pool: notices are rare, and a relay that restarted must not
//! leave a dead pooled connection that fails the next notice. Each mail is
//! `multipart/alternative` (plain text, then HTML), because some approvers read mail in
//! clients that show only one of them and both must say the same thing.
//!
//! The SMTP login comes from environment variables named in the config, never from the
//! config itself, and is kept out of `Debug` and errors.

use std::fmt;
use std::time::Duration;

use lettre::message::{Mailbox, MultiPart};
use lettre::transport::smtp::authentication::Credentials;
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};

use super::message::NotifyError;
use crate::config::Smtp;

/// Longest a whole SMTP exchange (connect, greeting, DATA, QUIT) may take; each command
/// has the same limit inside it. The notifier retries after it.
const TIMEOUT: Duration = Duration::from_secs(10);

/// A configured SMTP relay and sender.
#[derive(Clone)]
pub struct Mailer {
    transport: AsyncSmtpTransport<Tokio1Executor>,
    from: Mailbox,
    /// `host:port` and whether a login is used, for `Debug` only.
    relay: String,
    login: bool,
}

impl fmt::Debug for Mailer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mailer")
            .field("relay", &self.relay)
            .field("from", &self.from.to_string())
            .field("login", &self.login)
            .finish()
    }
}

impl Mailer {
    /// Reads the relay URL (`smtp://`, `smtp://…?tls=required`, `smtps://`), the sender and,
    /// when the config names them, the login variables; both must then be set.
    pub fn new(config: &Smtp) -> Result<Self, NotifyError> {
        Self::with_env(config, |name| std::env::var(name).ok())
    }

    /// [`Mailer::new`] with the environment given, so tests need not change the process's.
    pub fn with_env(
        config: &Smtp,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, NotifyError> {
        let from: Mailbox = config.from.parse().map_err(|source| NotifyError::Address {
            role: "sender",
            address: config.from.clone(),
            source,
        })?;
        let parsed = url::Url::parse(&config.url)
            .map_err(|e| NotifyError::Config(format!("smtp.url does not parse: {e}")))?;
        if parsed.password().is_some() {
            // lettre would accept it, but the config must not hold secrets (docs/design.md §8).
            return Err(NotifyError::Config(
                "smtp.url carries a password; name environment variables in \
                 smtp.username_env / smtp.password_env instead"
                    .to_owned(),
            ));
        }
        let relay = format!(
            "{}://{}:{}",
            parsed.scheme(),
            parsed.host_str().unwrap_or_default(),
            parsed.port().map(|p| p.to_string()).unwrap_or_default()
        );
        let mut builder = AsyncSmtpTransport::<Tokio1Executor>::from_url(&config.url)
            .map_err(NotifyError::Smtp)?
            .timeout(Some(TIMEOUT));
        let login = match (&config.username_env, &config.password_env) {
            (None, None) => false,
            (Some(user_var), Some(pass_var)) => {
                let user = required(&env, user_var)?;
                let pass = required(&env, pass_var)?;
                builder = builder.credentials(Credentials::new(user, pass));
                true
            }
            _ => {
                return Err(NotifyError::Config(
                    "smtp.username_env and smtp.password_env go together".to_owned(),
                ))
            }
        };
        Ok(Self {
            transport: builder.build(),
            from,
            relay,
            login,
        })
    }

    /// Connects, greets, logs in when configured and quits, sending nothing: whether the
    /// relay answers as a mail would find it (`ostiary doctor`).
    pub async fn check(&self) -> Result<(), NotifyError> {
        match tokio::time::timeout(TIMEOUT, self.transport.test_connection()).await {
            Ok(Ok(true)) => Ok(()),
            Ok(Ok(false)) => Err(NotifyError::Config(format!(
                "the relay at {} did not accept a connection",
                self.relay
            ))),
            Ok(Err(e)) => Err(NotifyError::Smtp(e)),
            Err(_elapsed) => Err(NotifyError::SmtpTimeout(TIMEOUT)),
        }
    }

    /// `scheme://host:port` of the relay, for messages (never a login).
    pub fn relay(&self) -> &str {
        &self.relay
    }

    /// Sends one `multipart/alternative` mail to `to`.
    pub async fn send(
        &self,
        to: &str,
        subject: &str,
        text: &str,
        html: &str,
    ) -> Result<(), NotifyError> {
        let to: Mailbox = to.parse().map_err(|source| NotifyError::Address {
            role: "recipient",
            address: to.to_owned(),
            source,
        })?;
        let message = Message::builder()
            .from(self.from.clone())
            .to(to)
            .subject(subject)
            .multipart(MultiPart::alternative_plain_html(
                text.to_owned(),
                html.to_owned(),
            ))
            .map_err(NotifyError::Message)?;
        match tokio::time::timeout(TIMEOUT, self.transport.send(message)).await {
            Ok(Ok(_response)) => Ok(()),
            Ok(Err(e)) => Err(NotifyError::Smtp(e)),
            Err(_elapsed) => Err(NotifyError::SmtpTimeout(TIMEOUT)),
        }
    }
}

fn required(env: &impl Fn(&str) -> Option<String>, var: &str) -> Result<String, NotifyError> {
    match env(var) {
        Some(value) if !value.is_empty() => Ok(value),
        _ => Err(NotifyError::Config(format!(
            "environment variable {var} (SMTP login) is not set"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn smtp(url: &str) -> Smtp {
        Smtp {
            url: url.to_owned(),
            from: "ostiary@example.com".to_owned(),
            username_env: None,
            password_env: None,
        }
    }

    #[test]
    fn builds_from_plain_and_tls_urls() {
        for url in [
            "smtp://127.0.0.1:2525",
            "smtp://127.0.0.1:587?tls=required",
            "smtps://127.0.0.1:465",
        ] {
            Mailer::new(&smtp(url)).unwrap_or_else(|e| panic!("{url}: {e}"));
        }
    }

    #[test]
    fn refuses_bad_sender_and_secrets_in_the_url() {
        let mut config = smtp("smtp://127.0.0.1:2525");
        config.from = "not an address".to_owned();
        assert!(matches!(
            Mailer::new(&config),
            Err(NotifyError::Address { role: "sender", .. })
        ));
        let err = Mailer::new(&smtp("smtp://user:hunter2@127.0.0.1:2525")).unwrap_err();
        assert!(matches!(err, NotifyError::Config(_)));
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }

    #[test]
    fn login_from_named_variables_never_shown() {
        let mut config = smtp("smtp://127.0.0.1:2525");
        config.username_env = Some("U".to_owned());
        config.password_env = Some("P".to_owned());
        let env = |name: &str| match name {
            "U" => Some("mailer".to_owned()),
            "P" => Some("hunter2".to_owned()),
            _ => None,
        };
        let mailer = Mailer::with_env(&config, env).unwrap();
        let shown = format!("{mailer:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("login: true"), "{shown}");

        let err = Mailer::with_env(&config, |_| None).unwrap_err();
        assert!(err.to_string().contains("environment variable U"), "{err}");
        config.password_env = None;
        assert!(matches!(
            Mailer::with_env(&config, env),
            Err(NotifyError::Config(_))
        ));
    }

    #[tokio::test]
    async fn bad_recipient_is_an_address_error() {
        let mailer = Mailer::new(&smtp("smtp://127.0.0.1:2525")).unwrap();
        let err = mailer.send("nope", "s", "t", "h").await.unwrap_err();
        assert!(
            matches!(
                err,
                NotifyError::Address {
                    role: "recipient",
                    ..
                }
            ),
            "{err:?}"
        );
    }
}
