//! The client's view of the fleet: what a buyer's client (and the operator seeding a sale)
//! does through the intake: tokens, posting orders and reading them back, at the intake's URLs.

use std::time::{Duration, Instant};

use orderfleet::domain::tokens;
use orderfleet_words::UserId;
use serde_json::Value;

use super::Fleet;

/// One answer of the intake.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The HTTP status.
    pub status: u16,
    /// Whether `Idempotent-Replayed: true` came back.
    pub replayed: bool,
    /// The `Retry-After` header, as sent.
    pub retry_after: Option<String>,
    /// The JSON body (`null` if none).
    pub body: Value,
    /// How long this one request took, from sending to the whole answer read.
    pub took: Duration,
}

impl Fleet {
    /// Seeds a product with `units` for sale in all (or sets its total, as `fleetctl product
    /// upsert --stock` does).
    pub async fn product(&self, id: &str, price_minor: i64, units: i32) -> anyhow::Result<()> {
        let product = orderfleet::domain::records::product::ProductUpsert {
            id: orderfleet_words::Sku::parse(id).map_err(anyhow::Error::msg)?,
            name: id.to_owned(),
            price_minor,
            currency: orderfleet_words::Currency::parse("usd").map_err(anyhow::Error::msg)?,
            units_total: units,
            max_per_buyer: None,
            opens_at: None,
            queue_opens_at: None,
            max_per_card: None,
        };
        let pool = crate::fleet_pool(&self.stack.database_url, 1).await?;
        orderfleet::domain::records::product::upsert(&pool, &product).await?;
        Ok(())
    }

    /// A token for `user` as `fleetctl token` makes it (the default issuer and audience).
    pub fn token(&self, user: &str) -> String {
        let config = orderfleet_runtime::config::AuthConfig {
            jwt_secret: secrecy::SecretString::from(self.jwt_secret.clone()),
            issuer: orderfleet_runtime::config::AuthConfig::DEFAULT_ISSUER.into(),
            audience: orderfleet_runtime::config::AuthConfig::DEFAULT_AUDIENCE.into(),
            jwks_url: None,
        };
        tokens::issue_token(&config, &UserId::parse(user).unwrap(), Duration::from_secs(600)).unwrap()
    }

    /// `POST /v1/orders` with a raw body.
    pub async fn post_raw(
        &self,
        user: Option<&str>,
        key: Option<&str>,
        body: &str,
    ) -> anyhow::Result<Answer> {
        self.post_raw_at(&self.intake_url, user, key, body).await
    }

    /// `POST /v1/orders` with a raw body, to the intake at `url`.
    async fn post_raw_at(
        &self,
        url: &str,
        user: Option<&str>,
        key: Option<&str>,
        body: &str,
    ) -> anyhow::Result<Answer> {
        let mut request = self
            .http
            .post(format!("{url}/v1/orders"))
            .header("content-type", "application/json")
            .body(body.to_owned());
        if let Some(user) = user {
            request = request.bearer_auth(self.token(user));
        }
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        let sent = Instant::now();
        let response = request.send().await?;
        let status = response.status().as_u16();
        let replayed = response.headers().get("idempotent-replayed").is_some_and(|v| v == "true");
        let retry_after = response.headers().get("retry-after").map(|v| v.to_str().unwrap_or("").to_owned());
        let body = response.json::<Value>().await.unwrap_or(Value::Null);
        Ok(Answer { status, replayed, retry_after, body, took: sent.elapsed() })
    }

    /// `POST /v1/orders` of `quantity` units of `product`, paid with `method`: `.await` sends it
    /// once; [`OrderPost::retrying`] sends it as a well-behaved client does. It owns its
    /// arguments, so it may outlive the loop that made it.
    pub fn post_order(
        &self,
        user: &str,
        key: &str,
        product: &str,
        quantity: i64,
        method: &str,
    ) -> OrderPost<'_> {
        let body =
            serde_json::json!({ "product_id": product, "quantity": quantity, "payment_method": method });
        OrderPost {
            fleet: self,
            url: self.intake_url.clone(),
            user: user.to_owned(),
            key: key.to_owned(),
            body: body.to_string(),
            sending: None,
        }
    }

    /// `GET /v1/orders/{order_id}` as `user`.
    pub async fn get_order(&self, user: &str, order_id: &str) -> anyhow::Result<reqwest::Response> {
        Ok(self
            .http
            .get(format!("{}/v1/orders/{order_id}", self.intake_url))
            .bearer_auth(self.token(user))
            .send()
            .await?)
    }
}

/// An order request ([`Fleet::post_order`]): a future that sends it once, or, with
/// [`OrderPost::retrying`], as a well-behaved client does.
pub struct OrderPost<'a> {
    fleet: &'a Fleet,
    /// The intake it goes to: the fleet's first, unless [`OrderPost::at`] says another.
    url: String,
    user: String,
    key: String,
    body: String,
    /// The one send, once polled.
    sending: Option<futures::future::BoxFuture<'a, anyhow::Result<Answer>>>,
}

impl<'a> OrderPost<'a> {
    /// Sent to the intake at `url` (one a test spawned beside the fleet's own).
    pub fn at(mut self, url: &str) -> Self {
        url.clone_into(&mut self.url);
        self
    }

    async fn send(&self) -> anyhow::Result<Answer> {
        self.fleet.post_raw_at(&self.url, Some(&self.user), Some(&self.key), &self.body).await
    }

    /// What a well-behaved client does: on `409 idempotency_key_in_use` (the same key in
    /// flight) or `503` (try again), wait as `Retry-After` says (at most a second here) and send
    /// the same request again. A `409 sold_out` is a final answer here.
    /// Returns the final answer and the statuses of the attempts before it.
    pub async fn retrying(self) -> anyhow::Result<(Answer, Vec<u16>)> {
        let mut earlier = Vec::new();
        loop {
            let answer = self.send().await?;
            let in_use = answer.status == 409 && answer.body["error"]["code"] == "idempotency_key_in_use";
            if !(in_use || answer.status == 503) || earlier.len() >= 30 {
                return Ok((answer, earlier));
            }
            let wait = answer.retry_after.as_deref().and_then(|s| s.parse::<u64>().ok()).unwrap_or(1).min(1);
            earlier.push(answer.status);
            tokio::time::sleep(Duration::from_secs(wait)).await;
        }
    }
}

impl Future for OrderPost<'_> {
    type Output = anyhow::Result<Answer>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let this = self.get_mut();
        let sending = this.sending.get_or_insert_with(|| {
            let (fleet, url, user, key, body) =
                (this.fleet, this.url.clone(), this.user.clone(), this.key.clone(), this.body.clone());
            Box::pin(async move { fleet.post_raw_at(&url, Some(&user), Some(&key), &body).await })
        });
        sending.as_mut().poll(cx)
    }
}
