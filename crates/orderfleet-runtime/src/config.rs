//! Typed configuration, read once at start from the environment (SPEC §3).
//!
//! Each binary asks for exactly the settings it uses, through the small readers here, and
//! gets typed values back. A missing or malformed setting is a [`ConfigError`] whose one-line
//! message names the variable; `main` prints it and exits non-zero before doing anything else.
//!
//! Secrets ([`SecretString`]) never print: `Debug` on a config shows `[REDACTED]`.

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};

/// A setting that stops the binary at start. The message is one line and names the variable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The variable is unset or empty.
    #[error("configuration error: {name} is not set")]
    Missing {
        /// The variable.
        name: &'static str,
    },
    /// The variable's value is not one it takes.
    #[error("configuration error: {name} is malformed: {reason}")]
    Malformed {
        /// The variable.
        name: &'static str,
        /// What is wrong with its value.
        reason: String,
    },
}

impl ConfigError {
    /// The variable this error is about.
    pub fn variable(&self) -> &'static str {
        match self {
            ConfigError::Missing { name } | ConfigError::Malformed { name, .. } => name,
        }
    }
}

/// Where settings come from: the process environment, or a fixed map in tests.
#[derive(Clone)]
pub struct Env {
    overrides: Option<HashMap<String, String>>,
}

impl Env {
    /// The process environment.
    pub fn process() -> Self {
        Self { overrides: None }
    }

    /// A fixed set of variables, and nothing from the process (for tests).
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        let map = pairs.into_iter().map(|(k, v)| (k.to_owned(), v.to_owned())).collect();
        Self { overrides: Some(map) }
    }

    /// The raw value; an empty value counts as unset, which is what an operator who writes
    /// `FOO=` in an env file means.
    fn raw(&self, name: &str) -> Option<String> {
        let value = match &self.overrides {
            Some(map) => map.get(name).cloned(),
            None => std::env::var(name).ok(),
        };
        value.filter(|v| !v.trim().is_empty())
    }

    /// A setting that must be set.
    pub fn required<T: Setting>(&self, name: &'static str) -> Result<T, ConfigError> {
        let raw = self.raw(name).ok_or(ConfigError::Missing { name })?;
        T::parse_setting(raw.trim()).map_err(|reason| ConfigError::Malformed { name, reason })
    }

    /// A setting that may be unset.
    pub fn optional<T: Setting>(&self, name: &'static str) -> Result<Option<T>, ConfigError> {
        match self.raw(name) {
            None => Ok(None),
            Some(raw) => T::parse_setting(raw.trim())
                .map(Some)
                .map_err(|reason| ConfigError::Malformed { name, reason }),
        }
    }

    /// A setting with a default when unset.
    pub fn or_default<T: Setting>(&self, name: &'static str, default: T) -> Result<T, ConfigError> {
        Ok(self.optional(name)?.unwrap_or(default))
    }
}

/// A value that can be read from one environment variable.
pub trait Setting: Sized {
    /// Parses the variable's value, or says why not.
    fn parse_setting(raw: &str) -> Result<Self, String>;
}

impl Setting for String {
    fn parse_setting(raw: &str) -> Result<Self, String> {
        Ok(raw.to_owned())
    }
}

impl Setting for SecretString {
    fn parse_setting(raw: &str) -> Result<Self, String> {
        Ok(SecretString::from(raw.to_owned()))
    }
}

impl Setting for SocketAddr {
    fn parse_setting(raw: &str) -> Result<Self, String> {
        SocketAddr::from_str(raw).map_err(|_| format!("expected HOST:PORT with an IP address, got {raw:?}"))
    }
}

impl Setting for u32 {
    fn parse_setting(raw: &str) -> Result<Self, String> {
        raw.parse().map_err(|_| format!("expected a whole number, got {raw:?}"))
    }
}

impl Setting for u64 {
    fn parse_setting(raw: &str) -> Result<Self, String> {
        raw.parse().map_err(|_| format!("expected a whole number, got {raw:?}"))
    }
}

/// A whole number of seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seconds(pub Duration);

impl Setting for Seconds {
    fn parse_setting(raw: &str) -> Result<Self, String> {
        raw.parse::<u64>()
            .map(|s| Seconds(Duration::from_secs(s)))
            .map_err(|_| format!("expected a whole number of seconds, got {raw:?}"))
    }
}

/// An `http://` or `https://` URL, normalised to end without a slash.
#[derive(Clone, PartialEq, Eq)]
pub struct HttpUrl(String);

impl HttpUrl {
    /// The URL as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for HttpUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Display for HttpUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Setting for HttpUrl {
    fn parse_setting(raw: &str) -> Result<Self, String> {
        let rest = raw
            .strip_prefix("https://")
            .or_else(|| raw.strip_prefix("http://"))
            .ok_or_else(|| format!("expected an http:// or https:// URL, got {raw:?}"))?;
        if rest.is_empty() || rest.starts_with('/') || rest.contains(char::is_whitespace) {
            return Err(format!("expected an http:// or https:// URL with a host, got {raw:?}"));
        }
        Ok(HttpUrl(raw.trim_end_matches('/').to_owned()))
    }
}

/// `LOG_FORMAT`: human-readable text (the default) or one JSON object per line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

impl Setting for LogFormat {
    fn parse_setting(raw: &str) -> Result<Self, String> {
        match raw.to_ascii_lowercase().as_str() {
            "json" => Ok(LogFormat::Json),
            "text" | "pretty" | "plain" => Ok(LogFormat::Text),
            _ => Err(format!("expected \"json\" or \"text\", got {raw:?}")),
        }
    }
}

/// `ORDERFLEET_BATCHING`: `on` (the default) puts up to 10 entries in every SQS and SNS
/// call; `off` sends one per call, only to measure what batching buys (`make bench`).
pub fn batching(env: &Env) -> Result<bool, ConfigError> {
    let raw: Option<String> = env.optional("ORDERFLEET_BATCHING")?;
    match raw.as_deref() {
        None | Some("on") => Ok(true),
        Some("off") => Ok(false),
        Some(other) => Err(ConfigError::Malformed {
            name: "ORDERFLEET_BATCHING",
            reason: format!("expected \"on\" or \"off\", got {other:?}"),
        }),
    }
}

/// `DATABASE_URL`.
#[derive(Debug, Clone)]
pub struct DatabaseConfig {
    /// `DATABASE_URL` (secret: it holds a password).
    pub url: SecretString,
    /// Set when the connection to another machine is encrypted but the server's certificate is
    /// not checked (`sslmode=require` or `verify-ca`): allowed, with a warning at start.
    pub unverified_tls: bool,
}

impl DatabaseConfig {
    /// A database on another machine must be reached over TLS that checks the server
    /// (`sslmode=verify-full`); `require` is accepted with a warning; anything less (no
    /// `sslmode`, `disable`, `allow`, `prefer`) stops the binary. Loopback and Unix sockets
    /// need none.
    pub fn from_env(env: &Env) -> Result<Self, ConfigError> {
        let url: SecretString = env.required("DATABASE_URL")?;
        // The URL may hold a password, so no reason below echoes it.
        let malformed = |reason: &str| ConfigError::Malformed { name: "DATABASE_URL", reason: reason.into() };
        let scheme_ok = ["postgres://", "postgresql://"].iter().any(|p| url.expose_secret().starts_with(p));
        if !scheme_ok {
            return Err(malformed("expected a postgres:// or postgresql:// URL"));
        }
        // Decided from the options sqlx itself will connect with: the last of repeated
        // parameters, `ssl-mode` as well as `sslmode`, `hostaddr`, and PGHOST/PGSSLMODE.
        let options = sqlx::postgres::PgConnectOptions::from_str(url.expose_secret())
            .map_err(|_| malformed("not a valid PostgreSQL URL"))?;
        if options.get_socket().is_some() || is_local(options.get_host()) {
            return Ok(Self { url, unverified_tls: false });
        }
        use sqlx::postgres::PgSslMode;
        match options.get_ssl_mode() {
            PgSslMode::VerifyFull => Ok(Self { url, unverified_tls: false }),
            PgSslMode::Require | PgSslMode::VerifyCa => Ok(Self { url, unverified_tls: true }),
            PgSslMode::Disable | PgSslMode::Allow | PgSslMode::Prefer => Err(malformed(
                "a database on another machine needs sslmode=verify-full (or require, which does not check the server's certificate)",
            )),
        }
    }
}

/// Whether `host` is this machine: a loopback name or address, or a Unix socket directory.
pub fn is_local(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.is_empty()
        || host.starts_with('/')
        || host.eq_ignore_ascii_case("localhost")
        || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The SQS queues the fleet sends to and reads from (the messaging stack's outputs).
#[derive(Debug, Clone)]
pub struct QueueConfig {
    /// `STOCK_QUEUE_URL`.
    pub stock_queue_url: HttpUrl,
    /// `NOTIFICATION_QUEUE_URL`.
    pub notification_queue_url: HttpUrl,
}

impl QueueConfig {
    /// Reads both queue URLs.
    pub fn from_env(env: &Env) -> Result<Self, ConfigError> {
        Ok(Self {
            stock_queue_url: env.required("STOCK_QUEUE_URL")?,
            notification_queue_url: env.required("NOTIFICATION_QUEUE_URL")?,
        })
    }
}

/// The SNS topic for user-facing notifications.
#[derive(Debug, Clone)]
pub struct TopicConfig {
    /// `NOTIFICATION_TOPIC_ARN`.
    pub notification_topic_arn: String,
}

impl TopicConfig {
    /// Reads the topic's ARN.
    pub fn from_env(env: &Env) -> Result<Self, ConfigError> {
        let arn: String = env.required("NOTIFICATION_TOPIC_ARN")?;
        if !arn.starts_with("arn:") || arn.split(':').count() < 6 {
            return Err(ConfigError::Malformed {
                name: "NOTIFICATION_TOPIC_ARN",
                reason: format!("expected an SNS topic ARN (arn:aws:sns:REGION:ACCOUNT:NAME), got {arn:?}"),
            });
        }
        Ok(Self { notification_topic_arn: arn })
    }
}

/// Bearer tokens: `AUTH_JWT_SECRET` (the HS256 secret), and the `iss` and `aud` every token
/// must carry exactly (`AUTH_JWT_ISSUER`, `AUTH_JWT_AUDIENCE`), so a token made for another
/// service with the same secret is refused here.
#[derive(Debug, Clone)]
pub struct AuthConfig {
    /// `AUTH_JWT_SECRET`.
    pub jwt_secret: SecretString,
    /// `AUTH_JWT_ISSUER`: the `iss` a token must carry.
    pub issuer: String,
    /// `AUTH_JWT_AUDIENCE`: the `aud` a token must carry.
    pub audience: String,
    /// `AUTH_JWKS_URL`: the buyers' identity provider's JSON Web Key Set, whose RS256 and ES256
    /// keys the intake also accepts tokens from (unset: HS256 tokens alone).
    pub jwks_url: Option<String>,
}

impl AuthConfig {
    /// Shorter secrets make HS256 tokens guessable; RFC 7518 asks for at least the hash size.
    pub(crate) const MIN_SECRET_BYTES: usize = 32;
    /// The issuer when unset.
    pub const DEFAULT_ISSUER: &'static str = "orderfleet";
    /// The audience when unset.
    pub const DEFAULT_AUDIENCE: &'static str = "orderfleet-api";

    /// Reads the token settings.
    pub fn from_env(env: &Env) -> Result<Self, ConfigError> {
        let jwt_secret: SecretString = env.required("AUTH_JWT_SECRET")?;
        if jwt_secret.expose_secret().len() < Self::MIN_SECRET_BYTES {
            return Err(ConfigError::Malformed {
                name: "AUTH_JWT_SECRET",
                reason: format!("must be at least {} bytes long", Self::MIN_SECRET_BYTES),
            });
        }
        let issuer = claim_value(env, "AUTH_JWT_ISSUER", Self::DEFAULT_ISSUER)?;
        let audience = claim_value(env, "AUTH_JWT_AUDIENCE", Self::DEFAULT_AUDIENCE)?;
        let jwks_url = env.optional::<String>("AUTH_JWKS_URL")?.map(|url| key_set_url(&url)).transpose()?;
        Ok(Self { jwt_secret, issuer, audience, jwks_url })
    }
}

/// `AUTH_JWKS_URL`: an `https://` URL (`http://` for a provider on this machine, as in tests).
fn key_set_url(value: &str) -> Result<String, ConfigError> {
    let malformed =
        |reason: &str| ConfigError::Malformed { name: "AUTH_JWKS_URL", reason: reason.to_owned() };
    let url = url::Url::parse(value).map_err(|e| malformed(&format!("not a URL: {e}")))?;
    let local = matches!(url.host_str(), Some("127.0.0.1" | "localhost" | "[::1]"));
    match url.scheme() {
        "https" => Ok(value.to_owned()),
        "http" if local => Ok(value.to_owned()),
        _ => Err(malformed("expected an https:// URL (the provider's keys must come over TLS)")),
    }
}

/// A token claim's expected value: 1 to 255 visible characters, no spaces.
fn claim_value(env: &Env, name: &'static str, default: &str) -> Result<String, ConfigError> {
    let value: String = env.or_default(name, default.to_owned())?;
    if value.is_empty() || value.len() > 255 || !value.chars().all(|c| c.is_ascii_graphic()) {
        return Err(ConfigError::Malformed {
            name,
            reason: "expected 1 to 255 visible ASCII characters".into(),
        });
    }
    Ok(value)
}

/// What both queue workers read: their database, their queue and whether to batch.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// `DATABASE_URL`.
    pub database: DatabaseConfig,
    /// The queue it consumes.
    pub queue_url: HttpUrl,
    /// `ORDERFLEET_BATCHING`.
    pub batching: bool,
}

impl WorkerConfig {
    /// `queue_variable` names the worker's queue: `STOCK_QUEUE_URL` or `NOTIFICATION_QUEUE_URL`.
    pub fn from_env(env: &Env, queue_variable: &'static str) -> Result<Self, ConfigError> {
        Ok(Self {
            database: DatabaseConfig::from_env(env)?,
            batching: batching(env)?,
            queue_url: env.required(queue_variable)?,
        })
    }
}

/// What every long-running binary reads: logs, the metrics address, the shutdown grace.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// `LOG_FORMAT`.
    pub log_format: LogFormat,
    /// `METRICS_LISTEN_ADDR`: where `/healthz` and `/metrics` are served, if anywhere.
    pub metrics_listen_addr: Option<SocketAddr>,
    /// `SHUTDOWN_GRACE_SECONDS`: how long in-flight work may finish after the stop signal.
    pub shutdown_grace: Duration,
}

impl RuntimeConfig {
    /// The grace when unset.
    pub(crate) const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(20);

    /// Reads the settings every binary shares.
    pub fn from_env(env: &Env) -> Result<Self, ConfigError> {
        Ok(Self {
            log_format: env.or_default("LOG_FORMAT", LogFormat::Text)?,
            metrics_listen_addr: env.optional("METRICS_LISTEN_ADDR")?,
            shutdown_grace: env
                .or_default("SHUTDOWN_GRACE_SECONDS", Seconds(Self::DEFAULT_SHUTDOWN_GRACE))?
                .0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_variable_is_named_in_one_line() {
        let env = Env::from_pairs([]);
        let err = DatabaseConfig::from_env(&env).unwrap_err();
        assert_eq!(err, ConfigError::Missing { name: "DATABASE_URL" });
        assert_eq!(err.to_string(), "configuration error: DATABASE_URL is not set");
        assert!(!err.to_string().contains('\n'));
    }

    #[test]
    fn an_empty_variable_counts_as_missing() {
        let env = Env::from_pairs([("STOCK_QUEUE_URL", " "), ("NOTIFICATION_QUEUE_URL", "http://x/q")]);
        let err = QueueConfig::from_env(&env).unwrap_err();
        assert_eq!(err.variable(), "STOCK_QUEUE_URL");
    }

    #[test]
    fn a_malformed_number_is_named_with_the_value() {
        let env = Env::from_pairs([("SHUTDOWN_GRACE_SECONDS", "soon")]);
        let err = RuntimeConfig::from_env(&env).unwrap_err();
        assert_eq!(err.variable(), "SHUTDOWN_GRACE_SECONDS");
        assert!(err.to_string().contains("\"soon\""), "{err}");
    }

    #[test]
    fn a_database_url_with_another_scheme_is_refused_without_echoing_it() {
        let env = Env::from_pairs([("DATABASE_URL", "mysql://user:hunter2@db/x")]);
        let err = DatabaseConfig::from_env(&env).unwrap_err();
        assert_eq!(err.variable(), "DATABASE_URL");
        assert!(!err.to_string().contains("hunter2"));
    }

    #[test]
    fn runtime_defaults_apply_when_unset() {
        let config = RuntimeConfig::from_env(&Env::from_pairs([])).unwrap();
        assert_eq!(config.shutdown_grace, Duration::from_secs(20));
        assert_eq!(config.log_format, LogFormat::Text);
        assert_eq!(config.metrics_listen_addr, None);
    }

    #[test]
    fn a_topic_that_is_not_an_arn_is_refused() {
        let env = Env::from_pairs([("NOTIFICATION_TOPIC_ARN", "order-notifications")]);
        assert_eq!(TopicConfig::from_env(&env).unwrap_err().variable(), "NOTIFICATION_TOPIC_ARN");
    }
}

#[cfg(test)]
mod transport_tests {
    use super::*;

    fn database(url: &str) -> Result<DatabaseConfig, ConfigError> {
        DatabaseConfig::from_env(&Env::from_pairs([("DATABASE_URL", url)]))
    }

    #[test]
    fn a_database_on_another_machine_needs_a_verified_tls_connection() {
        for local in [
            "postgres://u:p@127.0.0.1:5432/db",
            "postgres://u@localhost/db",
            "postgres://u@[::1]/db",
            "postgres:///db?host=/var/run/postgresql",
        ] {
            let config = database(local).unwrap_or_else(|e| panic!("{local}: {e}"));
            assert!(!config.unverified_tls, "{local}");
        }
        for refused in [
            "postgres://u:secret@db.example.com/db",
            "postgres://u:secret@10.0.0.5/db?sslmode=prefer",
            "postgres://u:secret@db.example.com/db?sslmode=disable",
            "postgres://u:secret@127.0.0.1/db?host=db.example.com",
            "postgres://u:secret@db.example.com/db?sslmode=verify-full&sslmode=disable",
            "postgres://u:secret@db.example.com/db?sslmode=verify-full&ssl-mode=disable",
            "postgres://u:secret@localhost/db?hostaddr=10.0.0.5",
        ] {
            let error = database(refused).unwrap_err().to_string();
            assert!(error.contains("DATABASE_URL") && error.contains("verify-full"), "{refused}: {error}");
            assert!(!error.contains("secret"), "the password was echoed: {error}");
        }
        assert!(!database("postgres://u@db.example.com/db?sslmode=verify-full").unwrap().unverified_tls);
        assert!(database("postgres://u@db.example.com/db?sslmode=require").unwrap().unverified_tls);
    }

    #[test]
    fn a_short_signing_secret_or_a_malformed_issuer_is_refused_by_name() {
        let auth = |pairs: &[(&str, &str)]| AuthConfig::from_env(&Env::from_pairs(pairs.iter().copied()));
        let short = auth(&[("AUTH_JWT_SECRET", "too-short")]).unwrap_err().to_string();
        assert!(short.contains("AUTH_JWT_SECRET") && short.contains("32"), "{short}");
        let secret = ("AUTH_JWT_SECRET", "0123456789abcdef0123456789abcdef");
        let blank = auth(&[secret, ("AUTH_JWT_ISSUER", "has a space")]).unwrap_err().to_string();
        assert!(blank.contains("AUTH_JWT_ISSUER"), "{blank}");
        let defaults = auth(&[secret]).unwrap();
        assert_eq!((defaults.issuer.as_str(), defaults.audience.as_str()), ("orderfleet", "orderfleet-api"));
    }
}
