//! The API as an OpenAPI 3.1 document (SPEC §4), served at `GET /openapi.json` and committed as
//! `docs/openapi.json` (a test fails when the two differ).
//!
//! The bodies' schemas are derived from the handlers' own types (`RawOrderRequest`, [`Accepted`],
//! [`OrderView`], [`OrderStatus`]); every refusal's status and `code` comes from [`ApiError`]
//! itself, so a new refusal is documented the moment it exists. The operations are written out
//! here, one function each, with the headers SPEC §4 names.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use axum::http::header;
use axum::response::IntoResponse;
use orderfleet::domain::words::status::OrderStatus;
use serde_json::json;
use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::link::LinkBuilder;
use utoipa::openapi::path::{
    HttpMethod, Operation, OperationBuilder, ParameterBuilder, ParameterIn, PathItem,
};
use utoipa::openapi::request_body::RequestBodyBuilder;
use utoipa::openapi::response::{Response, ResponseBuilder};
use utoipa::openapi::schema::{ObjectBuilder, Schema, SchemaType, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{
    ComponentsBuilder, ContentBuilder, InfoBuilder, OpenApi, OpenApiBuilder, PathsBuilder, Ref, RefOr,
    Required,
};
use utoipa::{PartialSchema, ToSchema};

use crate::error::ApiError;
use crate::request::RawOrderRequest;
use crate::views::{Accepted, OrderView};

/// The document, built once.
static DOCUMENT: LazyLock<String> =
    LazyLock::new(|| serde_json::to_string_pretty(&document()).expect("the document serializes") + "\n");

/// `GET /openapi.json`.
pub async fn serve() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], DOCUMENT.as_str())
}

/// The document as text, as served and as committed.
pub fn text() -> &'static str {
    &DOCUMENT
}

/// The API as an OpenAPI 3.1 document, built from the code's own types (`GET /openapi.json`).
pub fn document() -> OpenApi {
    let mut schemas: Vec<(String, RefOr<Schema>)> = Vec::new();
    <RawOrderRequest as ToSchema>::schemas(&mut schemas);
    <Accepted as ToSchema>::schemas(&mut schemas);
    <OrderView as ToSchema>::schemas(&mut schemas);
    let components = ComponentsBuilder::new()
        .schema("OrderRequest", RawOrderRequest::schema())
        .schema("Accepted", Accepted::schema())
        .schema("Order", OrderView::schema())
        .schema("OrderStatus", OrderStatus::schema())
        .schema(
            "Error",
            error_schema(&ApiError::one_of_each().iter().map(ApiError::code).collect::<Vec<_>>()),
        )
        .schemas_from_iter(schemas)
        .security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("JWT")
                    .description(Some("HS256; the user is the token's `sub` (`fleetctl token --user USER`)"))
                    .build(),
            ),
        )
        .build();
    let paths = PathsBuilder::new()
        .path("/v1/orders", PathItem::new(HttpMethod::Post, create_order()))
        .path("/v1/orders/{order_id}", PathItem::new(HttpMethod::Get, get_order()))
        .path("/webhooks/stripe", PathItem::new(HttpMethod::Post, receive_webhook()))
        .build();
    OpenApiBuilder::new()
        .info(
            InfoBuilder::new()
                .title("orderfleet order intake")
                .version(env!("CARGO_PKG_VERSION"))
                .description(Some(
                    "Takes orders for scarce products: promises units at the door, authorizes the \
                     payment (manual capture), and answers at once. Retry any request with the same \
                     `Idempotency-Key` and body: the first answer comes back, never a second order.",
                ))
                .build(),
        )
        .paths(paths)
        .components(Some(components))
        .security(Some([SecurityRequirement::new("bearer", Vec::<String>::new())]))
        .build()
}

/// Refusals a `POST /v1/orders` can answer.
fn create_refusals() -> Vec<ApiError> {
    ApiError::one_of_each()
        .into_iter()
        .filter(|e| {
            !matches!(
                e,
                ApiError::OrderNotFound
                    | ApiError::NotFound
                    | ApiError::MethodNotAllowed
                    | ApiError::InvalidSignature(_)
                    | ApiError::WebhookUnavailable(_)
            )
        })
        .collect()
}

/// Refusals `POST /webhooks/stripe` can answer.
fn webhook_refusals() -> Vec<ApiError> {
    ApiError::one_of_each()
        .into_iter()
        .filter(|e| {
            matches!(
                e,
                ApiError::InvalidSignature(_)
                    | ApiError::MalformedJson(_)
                    | ApiError::BodyTooLarge
                    | ApiError::RequestTimeout
                    | ApiError::WebhookUnavailable(_)
                    | ApiError::Unexpected(_)
            )
        })
        .collect()
}

fn receive_webhook() -> Operation {
    let mut responses = refusals(&webhook_refusals());
    responses.insert("200".into(), webhook_applied());
    OperationBuilder::new()
        .operation_id(Some("receiveStripeWebhook"))
        .tag("webhooks")
        .summary(Some("Stripe's webhook endpoint"))
        .description(Some(
            "Stripe's signed events (no bearer token). Register this URL in Stripe's Dashboard for \
             `payment_intent.amount_capturable_updated`, `payment_intent.payment_failed`, \
             `payment_intent.canceled`, `charge.refunded` and `charge.dispute.created`, and put its \
             signing secret in `STRIPE_WEBHOOK_SECRET`. `200` once applied, `400` for a signature that \
             is missing, forged, stale or of an altered body, `503` when it cannot be applied now \
             (Stripe delivers it again).",
        ))
        .security(SecurityRequirement::default())
        .parameter(
            required(
                "Stripe-Signature",
                ParameterIn::Header,
                "`t=<unix time>,v1=<hex HMAC-SHA256 of \"{t}.{raw body}\">`, one `v1` per signing secret",
            )
            .schema(Some(ObjectBuilder::new().schema_type(Type::String))),
        )
        .request_body(Some(stripe_event()))
        .responses(utoipa::openapi::ResponsesBuilder::new().responses_from_iter(responses).build())
        .build()
}

/// A Stripe Event, as far as the document says: Stripe's own reference describes the rest.
fn stripe_event() -> utoipa::openapi::request_body::RequestBody {
    let event = ObjectBuilder::new()
        .schema_type(Type::Object)
        .description(Some("A Stripe Event object"))
        .property("id", ObjectBuilder::new().schema_type(Type::String))
        .property("type", ObjectBuilder::new().schema_type(Type::String));
    RequestBodyBuilder::new()
        .required(Some(Required::True))
        .content("application/json", ContentBuilder::new().schema(Some(event)).build())
        .build()
}

/// The `200` of the webhook endpoint.
fn webhook_applied() -> Response {
    ResponseBuilder::new()
        .description(
            "Applied, or found to change nothing (an event already applied, a type the fleet does not use)",
        )
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(
                    ObjectBuilder::new()
                        .schema_type(Type::Object)
                        .property("received", ObjectBuilder::new().schema_type(Type::Boolean))
                        .required("received")
                        .property(
                            "effect",
                            ObjectBuilder::new()
                                .schema_type(Type::String)
                                .description(Some("What applying it did, for operators")),
                        )
                        .required("effect"),
                ))
                .build(),
        )
        .build()
}

/// Refusals a `GET /v1/orders/{order_id}` can answer.
fn get_refusals() -> Vec<ApiError> {
    ApiError::one_of_each()
        .into_iter()
        .filter(|e| {
            matches!(
                e,
                ApiError::Unauthorized
                    | ApiError::RateLimited { .. }
                    | ApiError::RequestTimeout
                    | ApiError::OrderNotFound
                    // An id of `.` or `..`, which clients fold into the path before it leaves.
                    | ApiError::NotFound
                    | ApiError::Unavailable(_)
                    | ApiError::Unexpected(_)
            )
        })
        .collect()
}

fn create_order() -> Operation {
    let accepted = body_of(
        "Accepted and authorized: the units are the order's; the payment is held, to be captured. \
         Or, in a product's pre-queue, `queued`: no unit and no payment yet, `position` null until \
         the opening draws the queue",
        "Accepted",
    )
    .header("Idempotent-Replayed", replayed_header())
    .link(
        "GetOrder",
        LinkBuilder::new()
            .operation_id("getOrder")
            .parameter("order_id", "$response.body#/order_id")
            .description("The order this answer accepted")
            .build(),
    )
    .build();
    let mut responses = refusals(&create_refusals());
    responses.insert("202".into(), accepted);
    operation(
        "createOrder",
        "Place an order",
        "The amount is the product's price times the quantity, computed by the server. A buyer who \
         gets no unit is answered `409 sold_out` at once, before any payment call; before a \
         product opens, `409 not_open` (or, in its pre-queue, `202 queued`).",
    )
    .parameter(
        required(
            "Idempotency-Key",
            ParameterIn::Header,
            "1–255 visible ASCII characters; the same key and body again answers the first answer",
        )
        .schema(Some(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .min_length(Some(1))
                .max_length(Some(255))
                .pattern(Some("^[\\x21-\\x7E]+$"))
                .examples([json!("order-2026-11-23-0001")]),
        )),
    )
    .parameter(traceparent())
    .request_body(Some(
        RequestBodyBuilder::new()
            .required(Some(Required::True))
            .content(
                "application/json",
                ContentBuilder::new()
                    .schema(Some(Ref::from_schema_name("OrderRequest")))
                    .example(Some(
                        json!({"product_id": "sku-1", "quantity": 2, "payment_method": "pm_card_visa"}),
                    ))
                    .build(),
            )
            .build(),
    ))
    .responses(utoipa::openapi::ResponsesBuilder::new().responses_from_iter(responses).build())
    .build()
}

fn get_order() -> Operation {
    let found = body_of("The order, as it is now", "Order").build();
    let mut responses = refusals(&get_refusals());
    responses.insert("200".into(), found);
    operation(
        "getOrder",
        "Read one of your orders",
        "Another user's order, or an id that names none, is `404 order_not_found`.",
    )
    .parameter(
        required("order_id", ParameterIn::Path, "The `order_id` a `202` answered").schema(Some(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .format(Some(utoipa::openapi::SchemaFormat::KnownFormat(utoipa::openapi::KnownFormat::Uuid))),
        )),
    )
    .parameter(traceparent())
    .responses(utoipa::openapi::ResponsesBuilder::new().responses_from_iter(responses).build())
    .build()
}

/// An operation on orders, under the `orders` tag.
fn operation(id: &str, summary: &str, description: &str) -> OperationBuilder {
    OperationBuilder::new()
        .operation_id(Some(id))
        .tag("orders")
        .summary(Some(summary))
        .description(Some(description))
}

/// A required parameter.
fn required(name: &str, at: ParameterIn, description: &str) -> ParameterBuilder {
    ParameterBuilder::new()
        .name(name)
        .parameter_in(at)
        .required(Required::True)
        .description(Some(description))
}

/// A success answer whose JSON body is the schema named `schema`.
fn body_of(description: &str, schema: &str) -> ResponseBuilder {
    ResponseBuilder::new().description(description).content(
        "application/json",
        ContentBuilder::new().schema(Some(Ref::from_schema_name(schema))).build(),
    )
}

/// One response per status the refusals answer, its `code` an enum of theirs, with the headers
/// each carries.
fn refusals(errors: &[ApiError]) -> BTreeMap<String, Response> {
    let mut by_status: BTreeMap<u16, Vec<&ApiError>> = BTreeMap::new();
    for error in errors {
        by_status.entry(error.status().as_u16()).or_default().push(error);
    }
    by_status
        .into_iter()
        .map(|(status, errors)| {
            let codes: Vec<&str> = errors.iter().map(|e| e.code()).collect();
            let reason = axum::http::StatusCode::from_u16(status).ok().and_then(|s| s.canonical_reason());
            let mut response = ResponseBuilder::new()
                .description(format!("{}: `{}`", reason.unwrap_or("refused"), codes.join("`, `")))
                .content(
                    "application/json",
                    ContentBuilder::new()
                        .schema(Some(error_schema(&codes)))
                        .example(Some(errors[0].body()))
                        .build(),
                );
            // Headers: those every answer of the status carries are required (a sold-out
            // answer carries Retry-After only while units may come back).
            let waits = |e: &&ApiError| e.retry_after().is_some();
            if errors.iter().any(waits) {
                let always = errors.iter().all(|e| waits(e) && !matches!(e, ApiError::SoldOut { .. }));
                response = response.header("Retry-After", retry_after_header(always));
            }
            if status == 401 {
                response = response.header(
                    "WWW-Authenticate",
                    HeaderBuilder::new()
                        .schema(Some(ObjectBuilder::new().schema_type(Type::String)))
                        .description(Some("`Bearer`; always sent"))
                        .build(),
                );
            }
            if errors.iter().any(|e| matches!(e, ApiError::PaymentDeclined | ApiError::OrderRefused)) {
                response = response.header("Idempotent-Replayed", replayed_header());
            }
            (status.to_string(), response.build())
        })
        .collect()
}

/// `{"error": {"code", "message"}}`, the code one of `codes`.
fn error_schema(codes: &[&str]) -> Schema {
    let detail = ObjectBuilder::new()
        .schema_type(Type::Object)
        .property("code", ObjectBuilder::new().schema_type(Type::String).enum_values(Some(codes.to_vec())))
        .required("code")
        .property(
            "message",
            ObjectBuilder::new().schema_type(Type::String).description(Some("For people; never parse it")),
        )
        .required("message");
    Schema::Object(
        ObjectBuilder::new()
            .schema_type(SchemaType::new(Type::Object))
            .property("error", detail)
            .required("error")
            .build(),
    )
}

fn replayed_header() -> utoipa::openapi::header::Header {
    HeaderBuilder::new()
        .schema(Some(ObjectBuilder::new().schema_type(Type::String).enum_values(Some(["true"]))))
        .description(Some("`true` when this is the first answer to this key, sent again"))
        .build()
}

fn retry_after_header(always: bool) -> utoipa::openapi::header::Header {
    let when = if always { "always sent" } else { "sent while waiting may help" };
    HeaderBuilder::new()
        .schema(Some(ObjectBuilder::new().schema_type(Type::String).pattern(Some("^[0-9]+$"))))
        .description(Some(format!("Seconds to wait before sending the same request again; {when}")))
        .build()
}

fn traceparent() -> ParameterBuilder {
    ParameterBuilder::new()
        .name("traceparent")
        .parameter_in(ParameterIn::Header)
        .required(Required::False)
        .description(Some(
            "W3C trace context. By default the intake starts its own trace and keeps this one's id \
             as a link (`INTAKE_CALLER_TRACE`)",
        ))
        .schema(Some(ObjectBuilder::new().schema_type(Type::String)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `docs/openapi.json` is this document; `UPDATE_OPENAPI=1` rewrites it.
    #[test]
    fn the_committed_document_is_the_generated_one() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/openapi.json");
        if std::env::var_os("UPDATE_OPENAPI").is_some() {
            std::fs::write(&path, text()).unwrap();
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == text(),
            "docs/openapi.json differs from the code's document: run `UPDATE_OPENAPI=1 cargo test -p order-intake openapi` and commit it"
        );
    }

    #[test]
    fn every_refusal_is_documented_with_its_code() {
        let document = serde_json::to_value(document()).unwrap();
        let text = document.to_string();
        for error in ApiError::one_of_each() {
            assert!(text.contains(&format!("\"{}\"", error.code())), "{} is not documented", error.code());
        }
        assert_eq!(document["openapi"], "3.1.0");
    }
}
