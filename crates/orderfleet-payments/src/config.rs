//! Stripe's settings (SPEC §3): the secret key, where its API is (Stripe, or stripe-sim), the
//! limits the fleet's request budget shares, and how long a buyer has for 3-D Secure. They are
//! read with the runtime's readers ([`Env`]), and a bad one is a [`ConfigError`] naming it, as
//! every other setting is.

use orderfleet_runtime::config::{ConfigError, Env, HttpUrl, Seconds, Setting, is_local};
use secrecy::{ExposeSecret, SecretString};

/// Stripe (or stripe-sim, through `STRIPE_API_BASE`).
#[derive(Debug, Clone)]
pub struct StripeConfig {
    /// `STRIPE_SECRET_KEY`.
    pub secret_key: SecretString,
    /// `STRIPE_API_BASE`: Stripe, or stripe-sim.
    pub api_base: HttpUrl,
    /// `STRIPE_ACCOUNT_REQUESTS_PER_SECOND` (100): the account's limit, the fleet's to share
    /// (see [`crate::budget`]).
    pub account_requests_per_second: RequestsPerSecond,
    /// `STRIPE_ENDPOINT_REQUESTS_PER_SECOND` (25): each named operation's limit, the fleet's
    /// to share.
    pub endpoint_requests_per_second: RequestsPerSecond,
    /// `STRIPE_MAX_REQUESTS_PER_SECOND`, optional: a ceiling on this one process's requests,
    /// under its share of the fleet's.
    pub max_requests_per_second: Option<RequestsPerSecond>,
    /// `PAYMENT_ACTION_TIMEOUT_SECONDS` (600): how long an order whose card needs 3-D Secure
    /// keeps its units while the buyer authenticates.
    pub action_timeout: Seconds,
}

/// A positive whole number of requests per second, at most 10,000 (Stripe's own limits are
/// 25 per endpoint and 100 per account by default; a larger value is a typo).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestsPerSecond(pub std::num::NonZeroU32);

impl RequestsPerSecond {
    /// The most requests a second a budget may be set to.
    pub const MAX: u32 = 10_000;
}

impl Setting for RequestsPerSecond {
    fn parse_setting(raw: &str) -> Result<Self, String> {
        let n: u32 = raw.parse().map_err(|_| {
            format!("expected a whole number of requests per second from 1 to {}, got {raw:?}", Self::MAX)
        })?;
        match std::num::NonZeroU32::new(n) {
            Some(n) if n.get() <= Self::MAX => Ok(Self(n)),
            _ => Err(format!(
                "expected a whole number of requests per second from 1 to {}, got {raw:?}",
                Self::MAX
            )),
        }
    }
}

impl StripeConfig {
    /// Stripe's API.
    pub(crate) const DEFAULT_API_BASE: &'static str = "https://api.stripe.com";
    /// `STRIPE_ACCOUNT_REQUESTS_PER_SECOND` when unset: Stripe's live mode.
    pub(crate) const DEFAULT_ACCOUNT_REQUESTS_PER_SECOND: u32 = 100;
    /// `STRIPE_ENDPOINT_REQUESTS_PER_SECOND` when unset: Stripe's, on each named operation.
    pub(crate) const DEFAULT_ENDPOINT_REQUESTS_PER_SECOND: u32 = 25;
    /// `PAYMENT_ACTION_TIMEOUT_SECONDS` when unset.
    pub(crate) const DEFAULT_ACTION_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

    /// Reads the Stripe settings.
    pub fn from_env(env: &Env) -> Result<Self, ConfigError> {
        let secret_key: SecretString = env.required("STRIPE_SECRET_KEY")?;
        let prefix_ok = ["sk_", "rk_"].iter().any(|p| secret_key.expose_secret().starts_with(p));
        if !prefix_ok {
            return Err(ConfigError::Malformed {
                name: "STRIPE_SECRET_KEY",
                reason: "expected a Stripe secret key (sk_… or rk_…)".into(),
            });
        }
        let api_base = match env.optional("STRIPE_API_BASE")? {
            Some(base) => base,
            None => HttpUrl::parse_setting(Self::DEFAULT_API_BASE).expect("Stripe's own URL is one"),
        };
        // The secret key travels in every request: only over TLS, unless to this machine (stripe-sim).
        let base = url::Url::parse(api_base.as_str()).ok();
        let local = base.as_ref().and_then(|u| u.host_str()).is_some_and(is_local);
        if !local && base.as_ref().is_none_or(|u| u.scheme() != "https") {
            return Err(ConfigError::Malformed {
                name: "STRIPE_API_BASE",
                reason: "must be https:// (http:// only for a simulator on this machine)".into(),
            });
        }
        let rate = |n| RequestsPerSecond(std::num::NonZeroU32::new(n).expect("non-zero"));
        let account_requests_per_second = env.or_default(
            "STRIPE_ACCOUNT_REQUESTS_PER_SECOND",
            rate(Self::DEFAULT_ACCOUNT_REQUESTS_PER_SECOND),
        )?;
        let endpoint_requests_per_second = env.or_default(
            "STRIPE_ENDPOINT_REQUESTS_PER_SECOND",
            rate(Self::DEFAULT_ENDPOINT_REQUESTS_PER_SECOND),
        )?;
        let max_requests_per_second = env.optional("STRIPE_MAX_REQUESTS_PER_SECOND")?;
        let action_timeout =
            env.or_default("PAYMENT_ACTION_TIMEOUT_SECONDS", Seconds(Self::DEFAULT_ACTION_TIMEOUT))?;
        Ok(Self {
            secret_key,
            api_base,
            account_requests_per_second,
            endpoint_requests_per_second,
            max_requests_per_second,
            action_timeout,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stripe(base: &str) -> Result<StripeConfig, ConfigError> {
        StripeConfig::from_env(&Env::from_pairs([
            ("STRIPE_SECRET_KEY", "sk_test_x"),
            ("STRIPE_API_BASE", base),
        ]))
    }

    #[test]
    fn stripe_base_defaults_to_stripe_and_drops_a_trailing_slash() {
        let env = Env::from_pairs([("STRIPE_SECRET_KEY", "sk_test_placeholder")]);
        assert_eq!(StripeConfig::from_env(&env).unwrap().api_base.as_str(), "https://api.stripe.com");
        let env = Env::from_pairs([
            ("STRIPE_SECRET_KEY", "sk_test_placeholder"),
            ("STRIPE_API_BASE", "http://127.0.0.1:12111/"),
        ]);
        assert_eq!(StripeConfig::from_env(&env).unwrap().api_base.as_str(), "http://127.0.0.1:12111");
    }

    #[test]
    fn the_stripe_budget_is_stripe_s_limits_with_no_ceiling_and_refuses_zero_negatives_and_words() {
        let env = Env::from_pairs([("STRIPE_SECRET_KEY", "sk_test_placeholder")]);
        let config = StripeConfig::from_env(&env).unwrap();
        assert_eq!(config.account_requests_per_second.0.get(), 100);
        assert_eq!(config.endpoint_requests_per_second.0.get(), 25);
        assert_eq!(config.max_requests_per_second, None);
        for name in [
            "STRIPE_ACCOUNT_REQUESTS_PER_SECOND",
            "STRIPE_ENDPOINT_REQUESTS_PER_SECOND",
            "STRIPE_MAX_REQUESTS_PER_SECOND",
        ] {
            for bad in ["0", "-5", "ten", "2.5", "10001"] {
                let env = Env::from_pairs([("STRIPE_SECRET_KEY", "sk_test_placeholder"), (name, bad)]);
                let error = StripeConfig::from_env(&env).unwrap_err();
                assert_eq!(error.variable(), name, "{bad}");
                assert!(!error.to_string().contains('\n'), "{error}");
            }
        }
        let env = Env::from_pairs([
            ("STRIPE_SECRET_KEY", "sk_test_placeholder"),
            ("STRIPE_MAX_REQUESTS_PER_SECOND", "7"),
            ("STRIPE_ENDPOINT_REQUESTS_PER_SECOND", "10"),
        ]);
        let config = StripeConfig::from_env(&env).unwrap();
        assert_eq!(config.max_requests_per_second.map(|r| r.0.get()), Some(7));
        assert_eq!(config.endpoint_requests_per_second.0.get(), 10);
    }

    #[test]
    fn secrets_do_not_print() {
        let env = Env::from_pairs([("STRIPE_SECRET_KEY", "sk_test_do_not_print")]);
        let config = StripeConfig::from_env(&env).unwrap();
        assert!(!format!("{config:?}").contains("do_not_print"));
    }

    #[test]
    fn stripe_on_another_machine_is_https_only() {
        assert!(stripe("https://api.stripe.com").is_ok());
        assert!(stripe("http://127.0.0.1:12111").is_ok());
        assert!(stripe("http://localhost:12111").is_ok());
        let error = stripe("http://api.stripe.com").unwrap_err().to_string();
        assert!(error.contains("STRIPE_API_BASE"), "{error}");
        assert!(stripe("http://10.0.0.7:12111").is_err());
    }
}
