//! Bearer tokens: HS256 JWTs whose `sub` is the user (SPEC §4). `fleetctl token` issues them;
//! the intake verifies them.
//!
//! A token is bound to this service: it must carry exactly the configured `iss` and `aud`
//! (`AUTH_JWT_ISSUER`, `AUTH_JWT_AUDIENCE`), an `exp`, and is refused before its `nbf`. The
//! algorithm is pinned to HS256, so a token signed with `none` or another algorithm is refused
//! whatever its header says. Tokens live at most `MAX_TOKEN_TTL`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use secrecy::ExposeSecret;
use serde::{Deserialize, Serialize};

use crate::runtime::config::AuthConfig;

/// The longest a token may live: a leaked one is useless after a day at most.
pub(crate) const MAX_TOKEN_TTL: Duration = Duration::from_secs(24 * 3600);

pub use crate::domain::UserId;

#[derive(Debug, Serialize, Deserialize)]
struct Claims {
    sub: String,
    iss: String,
    aud: String,
    iat: u64,
    nbf: u64,
    exp: u64,
}

/// Issues a token for `user` from this service's issuer to its audience, valid from now for
/// `ttl` (at most `MAX_TOKEN_TTL`).
pub fn issue_token(config: &AuthConfig, user: &UserId, ttl: Duration) -> anyhow::Result<String> {
    anyhow::ensure!(
        !ttl.is_zero() && ttl <= MAX_TOKEN_TTL,
        "a token lives from 1 second to {} seconds (a day)",
        MAX_TOKEN_TTL.as_secs()
    );
    let now = SystemTime::now().duration_since(UNIX_EPOCH).context("the clock is before 1970")?;
    let claims = Claims {
        sub: user.as_str().to_owned(),
        iss: config.issuer.clone(),
        aud: config.audience.clone(),
        iat: now.as_secs(),
        nbf: now.as_secs(),
        exp: (now + ttl).as_secs(),
    };
    jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(config.jwt_secret.expose_secret().as_bytes()),
    )
    .context("failed to sign the token")
}

/// What the verifier reads of a token; `iss`, `aud` and `nbf` are checked by the library.
#[derive(Debug, Deserialize)]
struct Subject {
    sub: String,
    exp: u64,
}

/// Verifies an HS256 token (signature, expiry) and returns its user.
pub struct TokenVerifier {
    key: DecodingKey,
    validation: Validation,
}

impl TokenVerifier {
    /// A verifier for the configured secret, issuer and audience.
    pub fn new(config: &AuthConfig) -> Self {
        let mut validation = Validation::new(Algorithm::HS256);
        validation.set_required_spec_claims(&["exp", "sub", "iss", "aud"]);
        validation.set_issuer(&[&config.issuer]);
        validation.set_audience(&[&config.audience]);
        validation.validate_nbf = true;
        validation.leeway = 5;
        Self { key: DecodingKey::from_secret(config.jwt_secret.expose_secret().as_bytes()), validation }
    }

    /// The user a valid token is for, or why it is not valid.
    pub fn verify(&self, token: &str) -> Result<UserId, String> {
        let data =
            jsonwebtoken::decode::<Subject>(token, &self.key, &self.validation).map_err(|e| e.to_string())?;
        // A token made elsewhere with the same secret may not outlive what `fleetctl token` allows.
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map_err(|e| e.to_string())?.as_secs();
        if data.claims.exp > now + MAX_TOKEN_TTL.as_secs() + self.validation.leeway {
            return Err("the token lives longer than a day".into());
        }
        UserId::parse(&data.claims.sub)
    }
}

#[cfg(test)]
mod tests {
    use secrecy::SecretString;
    use serde_json::json;

    use super::*;

    fn config(secret: &str) -> AuthConfig {
        AuthConfig {
            jwt_secret: SecretString::from(secret.to_owned()),
            issuer: AuthConfig::DEFAULT_ISSUER.into(),
            audience: AuthConfig::DEFAULT_AUDIENCE.into(),
        }
    }

    fn now() -> u64 {
        SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
    }

    /// A token with exactly `claims`, signed with `config`'s secret.
    fn signed(config: &AuthConfig, claims: serde_json::Value) -> String {
        let key = EncodingKey::from_secret(config.jwt_secret.expose_secret().as_bytes());
        jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &key).unwrap()
    }

    fn good_claims() -> serde_json::Value {
        json!({ "sub": "alice", "iss": "orderfleet", "aud": "orderfleet-api", "iat": now(), "nbf": now(), "exp": now() + 60 })
    }

    #[test]
    fn a_token_verifies_to_its_user() {
        let c = config(&"k".repeat(32));
        let user = UserId::parse("alice").unwrap();
        let token = issue_token(&c, &user, Duration::from_secs(60)).unwrap();
        assert_eq!(TokenVerifier::new(&c).verify(&token).unwrap(), user);
        assert_eq!(TokenVerifier::new(&c).verify(&signed(&c, good_claims())).unwrap(), user);
    }

    #[test]
    fn a_token_signed_with_another_secret_is_refused() {
        let user = UserId::parse("alice").unwrap();
        let token = issue_token(&config(&"a".repeat(32)), &user, Duration::from_secs(60)).unwrap();
        assert!(TokenVerifier::new(&config(&"b".repeat(32))).verify(&token).is_err());
    }

    #[test]
    fn an_expired_token_is_refused() {
        let c = config(&"k".repeat(32));
        let mut claims = good_claims();
        claims["exp"] = json!(2);
        assert!(TokenVerifier::new(&c).verify(&signed(&c, claims)).is_err());
    }

    #[test]
    fn a_token_without_or_with_another_issuer_or_audience_is_refused() {
        let c = config(&"k".repeat(32));
        let verifier = TokenVerifier::new(&c);
        for (claim, value) in
            [("iss", None), ("aud", None), ("iss", Some("someone-else")), ("aud", Some("another-api"))]
        {
            let mut claims = good_claims();
            match value {
                None => claims.as_object_mut().unwrap().remove(claim),
                Some(v) => claims.as_object_mut().unwrap().insert(claim.into(), json!(v)),
            };
            assert!(verifier.verify(&signed(&c, claims)).is_err(), "{claim} = {value:?} was accepted");
        }
    }

    #[test]
    fn a_token_before_its_not_before_time_is_refused() {
        let c = config(&"k".repeat(32));
        let mut claims = good_claims();
        claims["nbf"] = json!(now() + 600);
        assert!(TokenVerifier::new(&c).verify(&signed(&c, claims)).is_err());
    }

    #[test]
    fn a_token_signed_with_none_is_refused() {
        let c = config(&"k".repeat(32));
        let header = base64_url(r#"{"alg":"none","typ":"JWT"}"#);
        let token = format!("{header}.{}.", base64_url(&good_claims().to_string()));
        assert!(TokenVerifier::new(&c).verify(&token).is_err());
    }

    #[test]
    fn a_token_valid_for_longer_than_a_day_is_refused_wherever_it_was_made() {
        let c = config(&"k".repeat(32));
        let mut claims = good_claims();
        claims["exp"] = json!(now() + 2 * 24 * 3600);
        assert!(TokenVerifier::new(&c).verify(&signed(&c, claims)).is_err());
    }

    #[test]
    fn tokens_live_a_day_at_most() {
        let c = config(&"k".repeat(32));
        let user = UserId::parse("alice").unwrap();
        assert!(issue_token(&c, &user, MAX_TOKEN_TTL).is_ok());
        assert!(issue_token(&c, &user, MAX_TOKEN_TTL + Duration::from_secs(1)).is_err());
        assert!(issue_token(&c, &user, Duration::ZERO).is_err());
    }

    fn base64_url(s: &str) -> String {
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let bytes = s.as_bytes();
        let mut out = String::new();
        for chunk in bytes.chunks(3) {
            let n = chunk.iter().enumerate().fold(0u32, |n, (i, b)| n | (*b as u32) << (16 - 8 * i));
            for i in 0..=chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            }
        }
        out
    }
}
