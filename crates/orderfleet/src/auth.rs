//! Bearer tokens: HS256 JWTs whose `sub` is the user (SPEC §4). `fleetctl token` issues them;
//! the intake verifies them.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};

/// The user a request acts for, taken from a verified token's `sub`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct UserId(String);

impl UserId {
    pub const MAX_LEN: usize = 255;

    pub fn parse(raw: &str) -> Result<Self, String> {
        if raw.is_empty() || raw.len() > Self::MAX_LEN {
            return Err(format!("a user id is 1 to {} bytes long", Self::MAX_LEN));
        }
        if raw.chars().any(char::is_control) {
            return Err("a user id has no control characters".into());
        }
        Ok(Self(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Claims {
    sub: String,
    iat: u64,
    exp: u64,
}

/// Issues a token for `user`, valid for `ttl`.
pub fn issue_token(secret: &SecretString, user: &UserId, ttl: Duration) -> anyhow::Result<String> {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).context("the clock is before 1970")?;
    let claims = Claims { sub: user.as_str().to_owned(), iat: now.as_secs(), exp: (now + ttl).as_secs() };
    jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(secret.expose_secret().as_bytes()),
    )
    .context("failed to sign the token")
}

/// Verifies an HS256 token (signature, expiry) and returns its user.
pub struct TokenVerifier {
    key: DecodingKey,
    validation: Validation,
}

impl TokenVerifier {
    pub fn new(secret: &SecretString) -> Self {
        let mut validation = Validation::new(Algorithm::HS256);
        validation.set_required_spec_claims(&["exp", "sub"]);
        validation.leeway = 5;
        Self { key: DecodingKey::from_secret(secret.expose_secret().as_bytes()), validation }
    }

    pub fn verify(&self, token: &str) -> Result<UserId, String> {
        let data =
            jsonwebtoken::decode::<Claims>(token, &self.key, &self.validation).map_err(|e| e.to_string())?;
        UserId::parse(&data.claims.sub)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(s: &str) -> SecretString {
        SecretString::from(s.to_owned())
    }

    #[test]
    fn a_token_verifies_to_its_user() {
        let s = secret("0123456789abcdef0123456789abcdef");
        let user = UserId::parse("alice").unwrap();
        let token = issue_token(&s, &user, Duration::from_secs(60)).unwrap();
        assert_eq!(TokenVerifier::new(&s).verify(&token).unwrap(), user);
    }

    #[test]
    fn a_token_signed_with_another_secret_is_refused() {
        let user = UserId::parse("alice").unwrap();
        let token = issue_token(&secret("a".repeat(32).as_str()), &user, Duration::from_secs(60)).unwrap();
        assert!(TokenVerifier::new(&secret(&"b".repeat(32))).verify(&token).is_err());
    }

    #[test]
    fn an_expired_token_is_refused() {
        let s = secret(&"k".repeat(32));
        let user = UserId::parse("alice").unwrap();
        let claims = Claims { sub: "alice".into(), iat: 1, exp: 2 };
        let token = jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(s.expose_secret().as_bytes()),
        )
        .unwrap();
        assert!(TokenVerifier::new(&s).verify(&token).is_err());
        let _ = user;
    }
}
