//! Bearer tokens: JWTs whose `sub` is the user (SPEC §4). `fleetctl token` issues HS256 ones
//! under `AUTH_JWT_SECRET`; the intake verifies them, and, with `AUTH_JWKS_URL`, RS256 and
//! ES256 ones signed by a key of the buyers' identity provider ([`jwks`]).
//!
//! A token is bound to this service: it must carry exactly the configured `iss` and `aud`
//! (`AUTH_JWT_ISSUER`, `AUTH_JWT_AUDIENCE`), an `exp`, and is refused before its `nbf`. The
//! algorithm is pinned by the key, never taken from the token: HS256 under the secret, and
//! under a provider's key the algorithm of that key, so a token signed with `none`, or an HS256
//! one "signed" with a provider's public key, is refused whatever its header says. Tokens live
//! at most `MAX_TOKEN_TTL`.

pub mod jwks;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use secrecy::ExposeSecret;
use serde::{Deserialize, Serialize};

use orderfleet_runtime::config::AuthConfig;

/// The longest a token may live: a leaked one is useless after a day at most.
pub(crate) const MAX_TOKEN_TTL: Duration = Duration::from_secs(24 * 3600);

use orderfleet_words::UserId;

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

/// Verifies a token (signature, expiry, issuer, audience) and returns its user.
pub struct TokenVerifier {
    key: DecodingKey,
    validation: Validation,
    /// The identity provider's keys, with `AUTH_JWKS_URL`.
    provider: Option<std::sync::Arc<jwks::KeySet>>,
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
        let key = DecodingKey::from_secret(config.jwt_secret.expose_secret().as_bytes());
        Self { key, validation, provider: None }
    }

    /// This verifier, also accepting tokens signed by a key of `provider`'s set.
    pub fn with_provider(self, provider: std::sync::Arc<jwks::KeySet>) -> Self {
        Self { provider: Some(provider), ..self }
    }

    /// The user a valid token is for, or why it is not valid.
    pub async fn verify(&self, token: &str) -> Result<UserId, String> {
        let header = jsonwebtoken::decode_header(token).map_err(|e| e.to_string())?;
        let data = match (header.alg, &self.provider) {
            (Algorithm::HS256, _) => jsonwebtoken::decode::<Subject>(token, &self.key, &self.validation),
            (Algorithm::RS256 | Algorithm::ES256, Some(provider)) => {
                let kid = header.kid.ok_or("the token names no key (kid)")?;
                let key = provider
                    .key(&kid)
                    .await
                    .ok_or_else(|| format!("no key {kid:?} in the provider's set"))?;
                if key.algorithm != header.alg {
                    return Err(format!("key {kid:?} is for {:?}, not {:?}", key.algorithm, header.alg));
                }
                let mut validation = self.validation.clone();
                validation.algorithms = vec![key.algorithm];
                jsonwebtoken::decode::<Subject>(token, &key.key, &validation)
            }
            (alg, _) => return Err(format!("tokens signed with {alg:?} are not accepted")),
        }
        .map_err(|e| e.to_string())?;
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
            jwks_url: None,
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

    #[tokio::test]
    async fn a_token_verifies_to_its_user() {
        let c = config(&"k".repeat(32));
        let user = UserId::parse("alice").unwrap();
        let token = issue_token(&c, &user, Duration::from_secs(60)).unwrap();
        assert_eq!(TokenVerifier::new(&c).verify(&token).await.unwrap(), user);
        assert_eq!(TokenVerifier::new(&c).verify(&signed(&c, good_claims())).await.unwrap(), user);
    }

    #[tokio::test]
    async fn a_token_signed_with_another_secret_is_refused() {
        let user = UserId::parse("alice").unwrap();
        let token = issue_token(&config(&"a".repeat(32)), &user, Duration::from_secs(60)).unwrap();
        assert!(TokenVerifier::new(&config(&"b".repeat(32))).verify(&token).await.is_err());
    }

    #[tokio::test]
    async fn an_expired_token_is_refused() {
        let c = config(&"k".repeat(32));
        let mut claims = good_claims();
        claims["exp"] = json!(2);
        assert!(TokenVerifier::new(&c).verify(&signed(&c, claims)).await.is_err());
    }

    #[tokio::test]
    async fn a_token_without_or_with_another_issuer_or_audience_is_refused() {
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
            assert!(verifier.verify(&signed(&c, claims)).await.is_err(), "{claim} = {value:?} was accepted");
        }
    }

    #[tokio::test]
    async fn a_token_before_its_not_before_time_is_refused() {
        let c = config(&"k".repeat(32));
        let mut claims = good_claims();
        claims["nbf"] = json!(now() + 600);
        assert!(TokenVerifier::new(&c).verify(&signed(&c, claims)).await.is_err());
    }

    #[tokio::test]
    async fn a_token_signed_with_none_is_refused() {
        let c = config(&"k".repeat(32));
        let header = base64_url(r#"{"alg":"none","typ":"JWT"}"#);
        let token = format!("{header}.{}.", base64_url(&good_claims().to_string()));
        assert!(TokenVerifier::new(&c).verify(&token).await.is_err());
    }

    #[tokio::test]
    async fn a_token_valid_for_longer_than_a_day_is_refused_wherever_it_was_made() {
        let c = config(&"k".repeat(32));
        let mut claims = good_claims();
        claims["exp"] = json!(now() + 2 * 24 * 3600);
        assert!(TokenVerifier::new(&c).verify(&signed(&c, claims)).await.is_err());
    }

    #[tokio::test]
    async fn tokens_live_a_day_at_most() {
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

    /// An ES256 key of the provider's, named `kid`: its signing half, and the JWK it publishes.
    fn provider_key(kid: &str) -> (EncodingKey, jsonwebtoken::jwk::Jwk) {
        use aws_lc_rs::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair};
        let pair = EcdsaKeyPair::generate(&ECDSA_P256_SHA256_FIXED_SIGNING).unwrap();
        let signing = EncodingKey::from_ec_der(pair.to_pkcs8v1().unwrap().as_ref());
        let mut jwk = jsonwebtoken::jwk::Jwk::from_encoding_key(&signing, Algorithm::ES256).unwrap();
        jwk.common.key_id = Some(kid.to_owned());
        (signing, jwk)
    }

    fn provider_token(signing: &EncodingKey, kid: &str, claims: &serde_json::Value) -> String {
        let header = Header { kid: Some(kid.to_owned()), ..Header::new(Algorithm::ES256) };
        jsonwebtoken::encode(&header, claims, signing).unwrap()
    }

    /// A provider's key-set endpoint on a port of its own: what it serves (`None`: a 500), and
    /// how many times it was asked.
    struct Provider {
        url: String,
        set: std::sync::Arc<std::sync::Mutex<Option<Vec<jsonwebtoken::jwk::Jwk>>>>,
        asked: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    }

    impl Provider {
        async fn serving(keys: Vec<jsonwebtoken::jwk::Jwk>) -> Self {
            use std::sync::atomic::Ordering;
            let set = std::sync::Arc::new(std::sync::Mutex::new(Some(keys)));
            let asked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let (served, counted) = (set.clone(), asked.clone());
            let app = axum::Router::new().route(
                "/.well-known/jwks.json",
                axum::routing::get(move || {
                    let (served, counted) = (served.clone(), counted.clone());
                    async move {
                        counted.fetch_add(1, Ordering::SeqCst);
                        match served.lock().unwrap().clone() {
                            Some(keys) => Ok(axum::Json(json!({ "keys": keys }))),
                            None => Err(axum::http::StatusCode::INTERNAL_SERVER_ERROR),
                        }
                    }
                }),
            );
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let url = format!("http://{}/.well-known/jwks.json", listener.local_addr().unwrap());
            tokio::spawn(async move { axum::serve(listener, app).await });
            Self { url, set, asked }
        }

        fn serve(&self, keys: Option<Vec<jsonwebtoken::jwk::Jwk>>) {
            *self.set.lock().unwrap() = keys;
        }

        fn asked(&self) -> usize {
            self.asked.load(std::sync::atomic::Ordering::SeqCst)
        }
    }

    async fn verifier_of(provider: &Provider, refetch_every: Duration) -> TokenVerifier {
        let keys = jwks::KeySet::refetched_every(&provider.url, refetch_every).unwrap();
        keys.fetch().await.unwrap();
        TokenVerifier::new(&config(&"k".repeat(32))).with_provider(std::sync::Arc::new(keys))
    }

    #[tokio::test]
    async fn a_token_signed_by_a_key_of_the_provider_s_set_verifies_under_the_same_rules() {
        // Arrange
        let (signing, jwk) = provider_key("k1");
        let provider = Provider::serving(vec![jwk]).await;
        let verifier = verifier_of(&provider, Duration::ZERO).await;

        // Act
        let good = verifier.verify(&provider_token(&signing, "k1", &good_claims())).await;
        let mut other_issuer = good_claims();
        other_issuer["iss"] = json!("someone-else");
        let foreign = verifier.verify(&provider_token(&signing, "k1", &other_issuer)).await;
        let (stranger, _) = provider_key("k1");
        let forged = verifier.verify(&provider_token(&stranger, "k1", &good_claims())).await;
        let hs256 = verifier.verify(&signed(&config(&"k".repeat(32)), good_claims())).await;

        // Assert: the provider's token verifies; the iss, aud and exp rules hold for it; a token
        // signed by another key under the same kid is refused; HS256 ones still verify.
        assert_eq!(good.unwrap().as_str(), "alice");
        assert!(foreign.is_err(), "another issuer's token was accepted");
        assert!(forged.is_err(), "a token signed by a key outside the set was accepted");
        assert_eq!(hs256.unwrap().as_str(), "alice");
    }

    #[tokio::test]
    async fn a_rotated_key_is_fetched_and_a_dropped_one_is_refused() {
        // Arrange: the provider rotates from k1 to k2.
        let (old, old_jwk) = provider_key("k1");
        let (new, new_jwk) = provider_key("k2");
        let provider = Provider::serving(vec![old_jwk]).await;
        let verifier = verifier_of(&provider, Duration::ZERO).await;
        assert!(verifier.verify(&provider_token(&old, "k1", &good_claims())).await.is_ok());
        provider.serve(Some(vec![new_jwk]));

        // Act
        let rotated = verifier.verify(&provider_token(&new, "k2", &good_claims())).await;
        let dropped = verifier.verify(&provider_token(&old, "k1", &good_claims())).await;

        // Assert: no restart needed for the new key; the old one is gone with the new set.
        assert!(rotated.is_ok(), "{rotated:?}");
        assert!(dropped.is_err(), "a key the provider dropped was accepted");
    }

    #[tokio::test]
    async fn an_unknown_kid_fetches_at_most_once_a_minute_and_an_unreachable_set_keeps_the_keys() {
        // Arrange
        let (signing, jwk) = provider_key("k1");
        let provider = Provider::serving(vec![jwk]).await;
        let verifier = verifier_of(&provider, jwks::KeySet::REFETCH_EVERY).await;
        let eager = verifier_of(&provider, Duration::ZERO).await;
        assert_eq!(provider.asked(), 2, "each fetched at start");

        // Act: tokens naming keys the set does not hold; then, with the provider failing, one
        // more (a fetch that fails) and the kept key.
        for kid in ["x1", "x2", "x3"] {
            assert!(verifier.verify(&provider_token(&signing, kid, &good_claims())).await.is_err());
        }
        let asked_in_the_minute = provider.asked();
        provider.serve(None);
        assert!(eager.verify(&provider_token(&signing, "x4", &good_claims())).await.is_err());
        let kept = eager.verify(&provider_token(&signing, "k1", &good_claims())).await;

        // Assert: no fetch within the minute after the last; a failed fetch keeps the keys.
        assert_eq!(asked_in_the_minute, 2);
        assert_eq!(provider.asked(), 3, "the eager verifier tried");
        assert!(kept.is_ok(), "{kept:?}");
    }
}
