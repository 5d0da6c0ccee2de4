//! Reading one form field as a type: a string, an integer, a positive integer, a boolean, one
//! of an enumeration's values. A malformed value is refused with Stripe's error naming the
//! parameter (`parameter_invalid_integer` for an integer that is not one).

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
