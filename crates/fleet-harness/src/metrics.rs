//! Reading the fleet's own accounting: each process exports Prometheus text on `/metrics`;
//! this adds up a counter across processes, by label.

use std::collections::BTreeMap;

/// Sums `metric` over every series in `texts`, keyed by the value of `label`.
pub fn sum_by_label(texts: &[String], metric: &str, label: &str) -> BTreeMap<String, f64> {
    let mut sums = BTreeMap::new();
    for text in texts {
        for line in text.lines() {
            let Some(rest) = line.strip_prefix(metric) else { continue };
            let Some(rest) = rest.strip_prefix('{') else { continue };
            // The last brace: a label's value may hold one (`GET /v1/payment_intents/{id}`).
            let Some((labels, value)) = rest.rsplit_once('}') else { continue };
            let Ok(value) = value.trim().parse::<f64>() else { continue };
            let key = labels
                .split(',')
                .filter_map(|pair| pair.split_once('='))
                .find(|(k, _)| k.trim() == label)
                .map(|(_, v)| v.trim().trim_matches('"').to_owned())
                .unwrap_or_default();
            *sums.entry(key).or_insert(0.0) += value;
        }
    }
    sums
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_summed_across_processes_by_label() {
        let a = "# TYPE aws_requests_total counter\naws_requests_total{service=\"sqs\",operation=\"SendMessageBatch\"} 3\n".to_owned();
        let b = "aws_requests_total{operation=\"SendMessageBatch\",service=\"sqs\"} 2\naws_requests_total{operation=\"Publish\",service=\"sns\"} 1\n".to_owned();
        let sums = sum_by_label(&[a, b], "aws_requests_total", "operation");
        assert_eq!(sums["SendMessageBatch"], 5.0);
        assert_eq!(sums["Publish"], 1.0);
    }

    #[test]
    fn a_label_value_may_hold_braces() {
        let text =
            "stripe_rate_limited_total{endpoint=\"POST /v1/payment_intents/{id}/capture\"} 2\n".to_owned();
        let sums = sum_by_label(&[text], "stripe_rate_limited_total", "endpoint");
        assert_eq!(sums["POST /v1/payment_intents/{id}/capture"], 2.0);
    }
}
