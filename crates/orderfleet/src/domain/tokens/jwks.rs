//! The buyers' identity provider's keys (`AUTH_JWKS_URL`, SPEC §3): a JSON Web Key Set, as
//! Amazon Cognito, Auth0 or any OpenID Connect provider publishes it
//! (`…/.well-known/jwks.json`), whose RS256 and ES256 keys the intake accepts tokens from,
//! each matched by its `kid`.
//!
//! - The set is fetched at start and kept.
//! - A token naming a `kid` the kept set does not hold fetches it again, at most once every
//!   [`KeySet::REFETCH_EVERY`] (a key rotation needs no restart; a flood of tokens with made-up
//!   `kid`s costs the provider one request a minute). Concurrent requests share that fetch.
//! - Each fetch replaces the kept set whole, so a key the provider has dropped is refused once
//!   the set has been fetched again.
//! - A fetch that fails (the provider unreachable, an answer that is not a key set) leaves the
//!   kept keys in use.

use std::collections::HashMap;
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use jsonwebtoken::jwk::{Jwk, KeyAlgorithm};
use jsonwebtoken::{Algorithm, DecodingKey};
use tokio::sync::{Mutex, RwLock};
use tokio::time::Instant;

/// How long a fetch may take before the kept keys are used as they are.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);

/// The largest key set read: a provider's holds a few keys, a few KiB.
const MOST_BYTES: usize = 256 * 1024;

/// A key of the set the intake accepts tokens under.
#[derive(Clone)]
pub(super) struct Key {
    pub(super) algorithm: Algorithm,
    pub(super) key: DecodingKey,
}

/// The provider's keys, by `kid`, fetched from its URL as tokens need them.
pub struct KeySet {
    url: hyper::Uri,
    http: Client<hyper_rustls::HttpsConnector<HttpConnector>, Empty<Bytes>>,
    keys: RwLock<HashMap<String, Key>>,
    /// When the set was last fetched (or tried), under the lock that makes one fetch at a time.
    fetched: Mutex<Option<Instant>>,
    refetch_every: Duration,
}

impl KeySet {
    /// The least time between two fetches for a `kid` the set does not hold.
    pub const REFETCH_EVERY: Duration = Duration::from_secs(60);

    /// The set at `url`, not fetched yet ([`KeySet::fetch`]).
    pub fn new(url: &str) -> anyhow::Result<Self> {
        Self::refetched_every(url, Self::REFETCH_EVERY)
    }

    /// [`KeySet::new`] with another spacing between fetches (tests).
    pub fn refetched_every(url: &str, refetch_every: Duration) -> anyhow::Result<Self> {
        orderfleet_runtime::install_crypto_provider();
        let url: hyper::Uri = url.parse().map_err(|e| anyhow::anyhow!("AUTH_JWKS_URL: {e}"))?;
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_webpki_roots()
            .https_or_http()
            .enable_http1()
            .build();
        let http = Client::builder(TokioExecutor::new()).build(connector);
        Ok(Self { url, http, keys: RwLock::default(), fetched: Mutex::default(), refetch_every })
    }

    /// Fetches the set now and keeps it; the kept keys stay in use if it fails, and the error
    /// says why.
    pub async fn fetch(&self) -> anyhow::Result<usize> {
        let mut fetched = self.fetched.lock().await;
        let count = self.fetch_locked().await?;
        *fetched = Some(Instant::now());
        Ok(count)
    }

    async fn fetch_locked(&self) -> anyhow::Result<usize> {
        let set = tokio::time::timeout(FETCH_TIMEOUT, self.get())
            .await
            .map_err(|_| anyhow::anyhow!("no answer within {FETCH_TIMEOUT:?}"))??;
        // Key by key: one the library cannot read (another curve, an encryption key) is left
        // out, never the whole set with it.
        let keys: HashMap<String, Key> = set
            .keys
            .into_iter()
            .filter_map(|key| serde_json::from_value::<Jwk>(key).ok())
            .filter_map(|jwk| usable(&jwk))
            .collect();
        let count = keys.len();
        *self.keys.write().await = keys;
        metrics::counter!(crate::metrics::INTAKE_JWKS_FETCHES.name, "outcome" => "fetched").increment(1);
        Ok(count)
    }

    async fn get(&self) -> anyhow::Result<RawSet> {
        let answer = self.http.get(self.url.clone()).await?;
        anyhow::ensure!(answer.status().is_success(), "the provider answered {}", answer.status());
        let body = http_body_util::Limited::new(answer.into_body(), MOST_BYTES)
            .collect()
            .await
            .map_err(|e| anyhow::anyhow!("reading the key set: {e}"))?
            .to_bytes();
        Ok(serde_json::from_slice(&body)?)
    }

    /// The key named `kid`: from the kept set, or from a fetch if the kept set does not hold it
    /// and the last fetch is at least [`KeySet::REFETCH_EVERY`] old.
    pub(super) async fn key(&self, kid: &str) -> Option<Key> {
        if let Some(key) = self.keys.read().await.get(kid) {
            return Some(key.clone());
        }
        let mut fetched = self.fetched.lock().await;
        // Another request may have fetched it while this one waited for the lock.
        if let Some(key) = self.keys.read().await.get(kid) {
            return Some(key.clone());
        }
        // Until a fetch has succeeded, every unknown `kid` may try (one at a time, each bounded
        // by the fetch's timeout): a provider away at start is not waited for a minute.
        if fetched.is_some_and(|at| at.elapsed() < self.refetch_every) {
            return None;
        }
        let tried = self.fetch_locked().await;
        if tried.is_ok() || fetched.is_some() {
            *fetched = Some(Instant::now());
        }
        if let Err(e) = tried {
            metrics::counter!(crate::metrics::INTAKE_JWKS_FETCHES.name, "outcome" => "failed").increment(1);
            tracing::warn!(
                error = format!("{e:#}"),
                "could not fetch the identity provider's keys; the kept ones stay in use"
            );
        }
        self.keys.read().await.get(kid).cloned()
    }
}

/// A key set as served: its keys read one by one ([`KeySet::fetch`]).
#[derive(serde::Deserialize)]
struct RawSet {
    keys: Vec<serde_json::Value>,
}

/// A key of the set the intake can verify with: one with a `kid`, for RS256 or ES256 (as its
/// `alg` says, or as its type implies when it names none).
fn usable(jwk: &Jwk) -> Option<(String, Key)> {
    use jsonwebtoken::jwk::{AlgorithmParameters, PublicKeyUse};
    if matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption)) {
        return None;
    }
    let kid = jwk.common.key_id.clone()?;
    let algorithm = match (jwk.common.key_algorithm, &jwk.algorithm) {
        (Some(KeyAlgorithm::RS256), _) | (None, AlgorithmParameters::RSA(_)) => Algorithm::RS256,
        (Some(KeyAlgorithm::ES256), _) | (None, AlgorithmParameters::EllipticCurve(_)) => Algorithm::ES256,
        _ => return None,
    };
    let key = DecodingKey::from_jwk(jwk).ok()?;
    Some((kid, Key { algorithm, key }))
}
