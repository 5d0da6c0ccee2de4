//! Property tests of what the intake parses from outside: the order body, the
//! `Idempotency-Key` and the bearer token. No input panics, and every refusal is an `ApiError`
//! with its status and a code from SPEC §4.

use order_intake::error::ApiError;
use order_intake::request::{IdempotencyKey, OrderRequest};
use orderfleet::domain::tokens::TokenVerifier;
use orderfleet_runtime::config::AuthConfig;
use proptest::prelude::*;

/// The codes a refused body may carry (SPEC §4).
const BODY_CODES: [&str; 6] = [
    "malformed_json",
    "unknown_field",
    "missing_field",
    "invalid_field",
    "invalid_quantity",
    "body_too_large",
];

fn assert_refusal(error: &ApiError, codes: &[&str]) {
    assert!(codes.contains(&error.code()), "unexpected code {}", error.code());
    assert!(error.status().is_client_error(), "{:?} is not a 4xx", error.status());
    assert!(!error.to_string().is_empty());
}

/// JSON objects near the real body: the right keys and others, values of every type.
fn body_like() -> impl Strategy<Value = Vec<u8>> {
    let key = prop_oneof![
        Just("product_id".to_owned()),
        Just("quantity".to_owned()),
        Just("payment_method".to_owned()),
        "[a-z_]{1,12}",
    ];
    let value = prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        any::<f64>().prop_map(|f| if f.is_finite() { f.to_string() } else { "1e400".to_owned() }),
        ".{0,40}".prop_map(|s| serde_json::to_string(&s).unwrap()),
        Just("null".to_owned()),
        Just("[]".to_owned()),
        Just("{}".to_owned()),
        Just("true".to_owned()),
    ];
    prop::collection::vec((key, value), 0..6).prop_map(|fields| {
        let inner: Vec<String> = fields.iter().map(|(k, v)| format!("{k:?}: {v}")).collect();
        format!("{{{}}}", inner.join(", ")).into_bytes()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn any_bytes_as_a_body_parse_or_are_refused_with_a_code(body in prop::collection::vec(any::<u8>(), 0..2048)) {
        if let Err(error) = OrderRequest::parse(&body) {
            assert_refusal(&error, &BODY_CODES);
        }
    }

    #[test]
    fn bodies_shaped_like_orders_parse_only_when_valid(body in body_like()) {
        match OrderRequest::parse(&body) {
            Ok(request) => {
                prop_assert!(OrderRequest::QUANTITY.contains(&i64::from(request.quantity)));
                prop_assert!(!request.product_id.as_str().is_empty() && !request.payment_method.is_empty());
            }
            Err(error) => assert_refusal(&error, &BODY_CODES),
        }
    }

    #[test]
    fn an_idempotency_key_is_1_to_255_visible_ascii_characters_or_refused(raw in ".{0,300}") {
        let valid = !raw.is_empty() && raw.len() <= 255 && raw.bytes().all(|b| b.is_ascii_graphic());
        match IdempotencyKey::parse(&raw) {
            Ok(key) => prop_assert!(valid && key.as_str() == raw),
            Err(error) => {
                prop_assert!(!valid);
                assert_refusal(&error, &["idempotency_key_invalid"]);
            }
        }
    }

    #[test]
    fn no_made_up_token_gets_in(token in prop_oneof![".{0,200}", "[A-Za-z0-9_-]{0,60}\\.[A-Za-z0-9_-]{0,120}\\.[A-Za-z0-9_-]{0,60}"]) {
        let config = AuthConfig {
            jwt_secret: "k".repeat(32).into(),
            issuer: AuthConfig::DEFAULT_ISSUER.into(),
            audience: AuthConfig::DEFAULT_AUDIENCE.into(),
            jwks_url: None,
        };
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let verified = runtime.block_on(TokenVerifier::new(&config).verify(&token));
        prop_assert!(verified.is_err());
    }
}
