//! Stripe's minimum charge per currency: below it, Stripe refuses to create the payment
//! (`400 invalid_request_error`, code `amount_too_small`, `param` `amount`).
//!
//! The table is Stripe's, from "Minimum and maximum charge amounts" on
//! docs.stripe.com/currencies#minimum-and-maximum-charge-amounts (and the error code on
//! docs.stripe.com/error-codes#amount-too-small). Stripe states each minimum in the currency's
//! major units; here it is in the minor units API amounts are given in (docs.stripe.com/currencies,
//! "Minor units in API amounts"): cents for a two-decimal currency, yen for the zero-decimal
//! JPY. HUF is two-decimal in API amounts, as Stripe lists it.
//!
//! It lives here, beside the [`Currency`](crate::Currency) and the [`Money`](crate::Money) it
//! bounds, because two programs keep the rule: `fleetctl product upsert` refuses a price under
//! it (a product whose every order Stripe would refuse; the domain's records, which never call
//! Stripe, check it), and stripe-sim refuses a create under it as Stripe does. For a currency the table does not list, Stripe's
//! minimum is the equivalent of its account's own currency's minimum at the day's rate, which
//! neither can know: both let it through, and Stripe decides.

/// Stripe's minimum charge in one currency.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MinimumCharge {
    /// The currency, lower case as Stripe writes it (`usd`).
    pub currency: &'static str,
    /// The least amount Stripe charges, in the currency's minor units.
    pub minor: i64,
    /// How many decimals the currency's API amounts have (2 for `usd`, 0 for `jpy`).
    pub decimals: u32,
}

impl MinimumCharge {
    /// The minimum in the currency's major units, as a person reads it: `0.50`, `50`.
    pub fn major(&self) -> String {
        if self.decimals == 0 {
            return self.minor.to_string();
        }
        let scale = 10_i64.pow(self.decimals);
        let width = self.decimals as usize;
        format!("{}.{:0width$}", self.minor / scale, self.minor % scale)
    }
}

/// Stripe's table (docs.stripe.com/currencies), in its order, each minimum in minor units:
/// `usd` $0.50 is 50 cents, `jpy` ¥50 is 50 yen.
const TABLE: [MinimumCharge; 24] = [
    two_decimals("usd", 50),
    two_decimals("aed", 200),
    two_decimals("aud", 50),
    two_decimals("bgn", 100),
    two_decimals("brl", 50),
    two_decimals("cad", 50),
    two_decimals("chf", 50),
    two_decimals("czk", 1_500),
    two_decimals("dkk", 250),
    two_decimals("eur", 50),
    two_decimals("gbp", 30),
    two_decimals("hkd", 400),
    two_decimals("huf", 17_500),
    two_decimals("inr", 50),
    MinimumCharge { currency: "jpy", minor: 50, decimals: 0 },
    two_decimals("mxn", 1_000),
    two_decimals("myr", 200),
    two_decimals("nok", 300),
    two_decimals("nzd", 50),
    two_decimals("pln", 200),
    two_decimals("ron", 200),
    two_decimals("sek", 300),
    two_decimals("sgd", 50),
    two_decimals("thb", 1_000),
];

const fn two_decimals(currency: &'static str, minor: i64) -> MinimumCharge {
    MinimumCharge { currency, minor, decimals: 2 }
}

/// Stripe's minimum charge in `currency` (any case), if Stripe lists one for it.
pub fn minimum_charge(currency: &str) -> Option<MinimumCharge> {
    TABLE.iter().copied().find(|m| m.currency.eq_ignore_ascii_case(currency))
}

/// Every currency with a minimum, in Stripe's order.
pub fn minimum_charges() -> &'static [MinimumCharge] {
    &TABLE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_minimums_are_stripe_s_in_minor_units() {
        let minor = |c| minimum_charge(c).map(|m| m.minor);
        assert_eq!(minor("usd"), Some(50));
        assert_eq!(minor("EUR"), Some(50));
        assert_eq!(minor("gbp"), Some(30));
        assert_eq!(minor("jpy"), Some(50));
        assert_eq!(minor("huf"), Some(17_500));
        assert_eq!(minor("xyz"), None);
    }

    #[test]
    fn a_minimum_reads_in_major_units() {
        let major = |c| minimum_charge(c).map(|m| m.major());
        assert_eq!(major("usd").as_deref(), Some("0.50"));
        assert_eq!(major("czk").as_deref(), Some("15.00"));
        assert_eq!(major("jpy").as_deref(), Some("50"));
    }

    #[test]
    fn each_currency_is_listed_once_in_lower_case() {
        let mut seen: Vec<&str> = minimum_charges().iter().map(|m| m.currency).collect();
        assert!(seen.iter().all(|c| c.len() == 3 && c.chars().all(|ch| ch.is_ascii_lowercase())));
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), minimum_charges().len());
    }
}
