//! Stripe's request bodies: `application/x-www-form-urlencoded` with bracketed keys for
//! nesting (`metadata[order_id]=…`, `payment_method_types[0]=card`, `expand[0]=…`).
//!
//! The body is kept as the flat list of decoded `(key, value)` pairs it arrived as, rather
//! than decoded into a struct, for two reasons: Stripe clients send parameters this simulator
//! has no use for (`payment_method_options[…]`, `statement_descriptor`) and those are
//! tolerated when the endpoint takes them (the `parameters` module refuses those it does not);
//! and idempotency compares *all* parameters of a request, including the ignored ones, so the
//! fingerprint has to see them.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

/// The decoded parameters of one request, in the order they arrived.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Params {
    pairs: Vec<(String, String)>,
}

impl Params {
    /// Decodes a form body. Never fails: a malformed escape is kept literally and invalid
    /// UTF-8 is replaced, which is what lenient servers (Stripe's included) do.
    pub(crate) fn parse(body: &[u8]) -> Self {
        let pairs = body
            .split(|&b| b == b'&')
            .filter(|segment| !segment.is_empty())
            .map(|segment| {
                let (key, value) = match segment.iter().position(|&b| b == b'=') {
                    Some(at) => (&segment[..at], &segment[at + 1..]),
                    None => (segment, &b""[..]),
                };
                (decode(key), decode(value))
            })
            .collect();
        Self { pairs }
    }

    /// The value of a scalar parameter; the last one wins when a key repeats.
    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.pairs.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    /// A hash parameter: `name[k]=v` pairs as a map from `k` to `v`.
    pub(crate) fn hash(&self, name: &str) -> BTreeMap<String, String> {
        self.pairs
            .iter()
            .filter_map(|(k, v)| Some((subscript(k, name)?, v)))
            .map(|(k, v)| (k.to_owned(), v.clone()))
            .collect()
    }

    /// An array parameter: `name[0]=a&name[1]=b` (or `name[]=a&name[]=b`), in index order.
    pub(crate) fn array(&self, name: &str) -> Vec<String> {
        let mut items: Vec<(Option<u64>, usize, &str)> = self
            .pairs
            .iter()
            .enumerate()
            .filter_map(|(position, (k, v))| {
                let index = subscript(k, name)?;
                Some((index.parse().ok(), position, v.as_str()))
            })
            .collect();
        items.sort_by_key(|&(index, position, _)| (index, position));
        items.into_iter().map(|(_, _, v)| v.to_owned()).collect()
    }

    /// The top-level name of each parameter, in the order they arrived: `metadata` for
    /// `metadata[order_id]`, `expand` for `expand[0]` and `expand[]`.
    pub(crate) fn top_names(&self) -> impl Iterator<Item = &str> {
        self.pairs.iter().map(|(key, _)| key.split_once('[').map_or(key.as_str(), |(top, _)| top))
    }

    /// What makes two requests "the same parameters" to the idempotency layer: every pair,
    /// independent of the order a client happened to encode them in.
    pub(crate) fn fingerprint(&self) -> String {
        let mut sorted: Vec<&(String, String)> = self.pairs.iter().collect();
        sorted.sort();
        let mut hasher = Sha256::new();
        for (k, v) in sorted {
            // Lengths first, so that `a=b&c=` and `a=b%26c%3D` cannot collide.
            hasher.update((k.len() as u64).to_be_bytes());
            hasher.update(k.as_bytes());
            hasher.update((v.len() as u64).to_be_bytes());
            hasher.update(v.as_bytes());
        }
        hex::encode(hasher.finalize())
    }
}

/// `metadata[order_id]` with name `metadata` → `order_id`; anything deeper or different → None.
fn subscript<'k>(key: &'k str, name: &str) -> Option<&'k str> {
    let inner = key.strip_prefix(name)?.strip_prefix('[')?.strip_suffix(']')?;
    (!inner.contains(['[', ']'])).then_some(inner)
}

fn decode(raw: &[u8]) -> String {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        match raw[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < raw.len() => match (hex_digit(raw[i + 1]), hex_digit(raw[i + 2])) {
                (Some(hi), Some(lo)) => {
                    out.push(hi << 4 | lo);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            other => out.push(other),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex_digit(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_keys_and_escapes_are_decoded() {
        let params = Params::parse(
            b"amount=2000&currency=usd&metadata%5Border_id%5D=o-1&metadata[note]=two+words%21&confirm=true",
        );
        assert_eq!(params.get("amount"), Some("2000"));
        assert_eq!(params.get("confirm"), Some("true"));
        let metadata = params.hash("metadata");
        assert_eq!(metadata.get("order_id").map(String::as_str), Some("o-1"));
        assert_eq!(metadata.get("note").map(String::as_str), Some("two words!"));
    }

    #[test]
    fn arrays_come_back_in_index_order() {
        let params = Params::parse(b"expand[1]=b&expand[0]=a&payment_method_types[]=card");
        assert_eq!(params.array("expand"), ["a", "b"]);
        assert_eq!(params.array("payment_method_types"), ["card"]);
        assert!(params.array("metadata").is_empty());
    }

    #[test]
    fn a_malformed_escape_is_kept_literally() {
        let params = Params::parse(b"description=100%&x=%zz&y=%4");
        assert_eq!(params.get("description"), Some("100%"));
        assert_eq!(params.get("x"), Some("%zz"));
        assert_eq!(params.get("y"), Some("%4"));
    }

    #[test]
    fn a_parameter_is_named_by_what_comes_before_its_first_bracket() {
        let params = Params::parse(b"amount=1&metadata[order_id]=o&expand[]=a&expand[0]=b&created[gte]=5");
        assert_eq!(
            params.top_names().collect::<Vec<_>>(),
            ["amount", "metadata", "expand", "expand", "created"]
        );
    }

    #[test]
    fn the_fingerprint_ignores_order_but_not_values() {
        let a = Params::parse(b"amount=1&currency=usd");
        let b = Params::parse(b"currency=usd&amount=1");
        let c = Params::parse(b"currency=usd&amount=2");
        assert_eq!(a.fingerprint(), b.fingerprint());
        assert_ne!(a.fingerprint(), c.fingerprint());
    }
}
