//! Stripe's authentication: the secret key as a bearer token
//! (`Authorization: Bearer sk_test_…`), or as the user name of HTTP Basic auth (what
//! `curl -u sk_test_…:` sends).
//!
//! The simulator is a test-mode account, so any test-mode key is accepted and keys a live
//! account would use are refused; the key then scopes idempotency keys, as Stripe's account
//! does.

use axum::http::HeaderMap;
use axum::http::header::AUTHORIZATION;

use crate::error::StripeError;

/// Test-mode secret keys, and test-mode restricted keys (the fleet accepts both).
const TEST_KEY_PREFIXES: [&str; 2] = ["sk_test_", "rk_test_"];

/// The API key a request authenticates with.
pub(crate) fn authenticate(headers: &HeaderMap) -> Result<String, StripeError> {
    let Some(header) = headers.get(AUTHORIZATION) else { return Err(no_key()) };
    let header = header.to_str().map_err(|_| invalid_key("(not visible ASCII)"))?.trim();
    let key = if let Some(token) = strip_scheme(header, "Bearer") {
        token.trim().to_owned()
    } else if let Some(credentials) = strip_scheme(header, "Basic") {
        let decoded =
            base64_decode(credentials.trim()).ok_or_else(|| invalid_key("(malformed Basic credentials)"))?;
        let decoded = String::from_utf8_lossy(&decoded).into_owned();
        decoded.split_once(':').map_or(decoded.as_str(), |(user, _)| user).to_owned()
    } else {
        return Err(StripeError::authentication(
            "Invalid authorization header. Use Bearer auth (e.g. 'Authorization: Bearer sk_test_…').",
        ));
    };
    if key.is_empty() {
        return Err(no_key());
    }
    let is_test_key =
        TEST_KEY_PREFIXES.iter().any(|prefix| key.len() > prefix.len() && key.starts_with(prefix));
    if !is_test_key {
        return Err(invalid_key(&redact(&key)));
    }
    Ok(key)
}

fn strip_scheme<'h>(header: &'h str, scheme: &str) -> Option<&'h str> {
    let (given, rest) = header.split_once(' ')?;
    given.eq_ignore_ascii_case(scheme).then_some(rest)
}

fn no_key() -> StripeError {
    StripeError::authentication(
        "You did not provide an API key. You need to provide your API key in the Authorization header, \
         using Bearer auth (e.g. 'Authorization: Bearer YOUR_SECRET_KEY').",
    )
}

fn invalid_key(shown: &str) -> StripeError {
    StripeError::authentication(format!(
        "Invalid API Key provided: {shown}. stripe-sim accepts any test-mode key (sk_test_…)."
    ))
}

/// Like Stripe, show only enough of a key to recognise it.
fn redact(key: &str) -> String {
    let chars: Vec<char> = key.chars().collect();
    if chars.len() <= 12 {
        return "*".repeat(chars.len());
    }
    let head: String = chars[..8].iter().collect();
    let tail: String = chars[chars.len() - 4..].iter().collect();
    format!("{head}****{tail}")
}

/// Standard base64 with optional padding; `None` on any other character.
fn base64_decode(input: &str) -> Option<Vec<u8>> {
    fn value(c: u8) -> Option<u32> {
        match c {
            b'A'..=b'Z' => Some(u32::from(c - b'A')),
            b'a'..=b'z' => Some(u32::from(c - b'a') + 26),
            b'0'..=b'9' => Some(u32::from(c - b'0') + 52),
            b'+' => Some(62),
            b'/' => Some(63),
            _ => None,
        }
    }
    let digits = input.trim_end_matches('=').as_bytes();
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    for chunk in digits.chunks(4) {
        if chunk.len() == 1 {
            return None;
        }
        let mut bits = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            bits |= value(c)? << (18 - 6 * i);
        }
        let bytes = bits.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn headers(authorization: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(AUTHORIZATION, HeaderValue::from_str(authorization).unwrap());
        headers
    }

    #[test]
    fn a_bearer_test_key_authenticates() {
        assert_eq!(authenticate(&headers("Bearer sk_test_abc")).unwrap(), "sk_test_abc");
    }

    #[test]
    fn a_basic_test_key_authenticates() {
        // base64("sk_test_abc:")
        assert_eq!(authenticate(&headers("Basic c2tfdGVzdF9hYmM6")).unwrap(), "sk_test_abc");
    }

    #[test]
    fn missing_live_and_odd_keys_are_refused_without_echoing_them() {
        assert!(authenticate(&HeaderMap::new()).unwrap_err().message.contains("did not provide"));
        let live = authenticate(&headers("Bearer sk_live_0123456789abcdef")).unwrap_err();
        assert_eq!(live.status.as_u16(), 401);
        assert!(!live.message.contains("0123456789ab"), "{}", live.message);
        assert!(authenticate(&headers("Bearer sk_test_")).is_err());
        assert!(authenticate(&headers("Token sk_test_abc")).is_err());
    }

    #[test]
    fn base64_decodes_with_and_without_padding() {
        assert_eq!(base64_decode("YQ==").unwrap(), b"a");
        assert_eq!(base64_decode("YWI").unwrap(), b"ab");
        assert_eq!(base64_decode("YWJj").unwrap(), b"abc");
        assert_eq!(base64_decode("Y"), None);
        assert_eq!(base64_decode("Y!=="), None);
    }
}
