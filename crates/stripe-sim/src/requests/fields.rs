//! Reading one form field as a type: a string, an integer, a positive integer, a boolean, one
//! of an enumeration's values. A malformed value is refused with Stripe's error naming the
//! parameter (`parameter_invalid_integer` for an integer that is not one).

use std::collections::BTreeMap;

use crate::error::StripeError;
use crate::form::Params;

/// An integer parameter, if given (any sign).
pub(super) fn integer(params: &Params, name: &'static str) -> Result<Option<i64>, StripeError> {
    match params.get(name).filter(|v| !v.is_empty()) {
        None => Ok(None),
        Some(raw) => raw.parse().map(Some).map_err(|_| {
            StripeError::invalid_param(name, format!("Invalid integer: {raw}"))
                .with_code("parameter_invalid_integer")
        }),
    }
}

pub(super) fn non_empty(params: &Params, name: &str) -> Option<String> {
    params.get(name).filter(|v| !v.is_empty()).map(str::to_owned)
}

pub(super) fn positive_integer(params: &Params, name: &'static str) -> Result<Option<i64>, StripeError> {
    let Some(raw) = params.get(name).filter(|v| !v.is_empty()) else { return Ok(None) };
    let value: i64 = raw.parse().map_err(|_| {
        StripeError::invalid_param(name, format!("Invalid integer: {raw}"))
            .with_code("parameter_invalid_integer")
    })?;
    if value < 1 {
        return Err(StripeError::invalid_param(name, "This value must be greater than or equal to 1.")
            .with_code("amount_too_small"));
    }
    Ok(Some(value))
}

pub(super) fn boolean(params: &Params, name: &'static str) -> Result<Option<bool>, StripeError> {
    match params.get(name) {
        None | Some("") => Ok(None),
        Some("true") => Ok(Some(true)),
        Some("false") => Ok(Some(false)),
        Some(raw) => Err(StripeError::invalid_param(name, format!("Invalid boolean: {raw}"))),
    }
}

pub(super) fn one_of<T: Copy>(
    params: &Params,
    name: &'static str,
    all: &[T],
    as_str: fn(T) -> &'static str,
) -> Result<Option<T>, StripeError> {
    let Some(raw) = params.get(name).filter(|v| !v.is_empty()) else { return Ok(None) };
    match all.iter().copied().find(|&value| as_str(value) == raw) {
        Some(value) => Ok(Some(value)),
        None => {
            let allowed: Vec<&str> = all.iter().map(|&value| as_str(value)).collect();
            Err(StripeError::invalid_param(
                name,
                format!("Invalid {name}: must be one of {}", allowed.join(", ")),
            ))
        }
    }
}

const MAX_METADATA_KEYS: usize = 50;
const MAX_METADATA_KEY_CHARS: usize = 40;
const MAX_METADATA_VALUE_CHARS: usize = 500;

/// `metadata[key]=value` pairs within Stripe's limits. An empty value unsets a key in Stripe,
/// which on a new object means leaving it out.
pub(super) fn metadata(params: &Params) -> Result<BTreeMap<String, String>, StripeError> {
    let mut metadata = params.hash("metadata");
    metadata.retain(|_, value| !value.is_empty());
    if metadata.len() > MAX_METADATA_KEYS {
        return Err(StripeError::invalid_param(
            "metadata",
            format!("You can specify up to {MAX_METADATA_KEYS} keys in metadata."),
        ));
    }
    for (key, value) in &metadata {
        if key.chars().count() > MAX_METADATA_KEY_CHARS {
            return Err(StripeError::invalid_param(
                "metadata",
                format!("Metadata keys can have up to {MAX_METADATA_KEY_CHARS} characters: {key:?}"),
            ));
        }
        if value.chars().count() > MAX_METADATA_VALUE_CHARS {
            return Err(StripeError::invalid_param(
                "metadata",
                format!("Metadata values can have up to {MAX_METADATA_VALUE_CHARS} characters (key {key:?})"),
            ));
        }
    }
    Ok(metadata)
}
