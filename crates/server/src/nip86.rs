//! NIP-86 relay management: JSON-RPC over HTTP POST on the relay URL
//! (`Content-Type: application/nostr+json+rpc`), authorised by a NIP-98
//! `Authorization: Nostr <base64 event>` header signed by a pubkey in
//! `policy.admin_pubkeys`.
//!
//! NIP-98 checks, all required: kind 27235, a valid signature, `created_at`
//! within [`MAX_SKEW_SECS`] of now, a `method` tag `POST`, a `u` tag naming
//! this relay (`auth.relay_urls`, else the request's host, as for NIP-42),
//! and a `payload` tag equal to the SHA-256 of the body. Anything else is
//! 401. A change is made durable by the writer before the answer, logged with
//! the admin's pubkey and counted (`sluice_nip86_requests_total`).

use std::net::IpAddr;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use sluice_engine::access::list;
use sluice_proto::{Event, Filter, hex32};
use sluice_throttle::{BlockError, IpBlock};

use crate::AppState;
use crate::metrics_names as m;

/// The content type of a NIP-86 request.
pub const CONTENT_TYPE: &str = "application/nostr+json+rpc";
/// Largest request body read.
const MAX_BODY_BYTES: usize = 64 * 1024;
/// How far a NIP-98 event's `created_at` may be from now.
const MAX_SKEW_SECS: u64 = 60;
/// Kind of the NIP-98 HTTP auth event.
const HTTP_AUTH_KIND: u16 = 27235;

/// The methods this relay answers.
pub const METHODS: &[&str] = &[
    "supportedmethods",
    "banpubkey",
    "unbanpubkey",
    "purgepubkey",
    "listbannedpubkeys",
    "allowpubkey",
    "disallowpubkey",
    "listallowedpubkeys",
    "banevent",
    "allowevent",
    "listbannedevents",
    "allowkind",
    "disallowkind",
    "listallowedkinds",
    "blockip",
    "unblockip",
    "listblockedips",
    "changerelayname",
    "changerelaydescription",
    "deletefilter",
];

/// Whether a POST to `/` is a NIP-86 request.
pub fn is_rpc(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().starts_with(CONTENT_TYPE))
}

fn answer(status: StatusCode, result: Value, error: Option<&str>) -> Response {
    let body = json!({ "result": result, "error": error });
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn count(method: &str, result: &'static str) {
    let method = if METHODS.contains(&method) {
        method.to_string()
    } else {
        "unknown".to_string()
    };
    metrics::counter!(m::NIP86_REQUESTS_TOTAL, "method" => method, "result" => result).increment(1);
}

/// Serves one NIP-86 request.
pub async fn handle(st: Arc<AppState>, headers: HeaderMap, body: Body) -> Response {
    let Ok(body) = axum::body::to_bytes(body, MAX_BODY_BYTES).await else {
        count("unknown", "too_large");
        return answer(
            StatusCode::PAYLOAD_TOO_LARGE,
            Value::Null,
            Some("body too large"),
        );
    };
    let admin = match authorise(&st, &headers, &body) {
        Ok(pubkey) => pubkey,
        Err(why) => {
            count("unknown", "unauthorized");
            return answer(StatusCode::UNAUTHORIZED, Value::Null, Some(&why));
        }
    };
    let req: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(_) => {
            count("unknown", "bad_request");
            return answer(
                StatusCode::BAD_REQUEST,
                Value::Null,
                Some("body is not JSON"),
            );
        }
    };
    let method = req["method"].as_str().unwrap_or("").to_string();
    let params = req["params"].as_array().cloned().unwrap_or_default();
    match call(&st.engine, &method, &params).await {
        Ok((result, changed)) => {
            count(&method, "ok");
            if changed {
                let params = Value::Array(params).to_string();
                let admin = hex32::encode(&admin);
                tracing::info!(admin, method, params, "NIP-86 change");
            }
            answer(StatusCode::OK, result, None)
        }
        Err(why) => {
            count(&method, "error");
            answer(StatusCode::OK, Value::Null, Some(&why))
        }
    }
}

/// Checks the NIP-98 header; the admin's pubkey, or why not.
fn authorise(st: &AppState, headers: &HeaderMap, body: &[u8]) -> Result<[u8; 32], String> {
    let value = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .ok_or("missing Authorization header (NIP-98)")?;
    let encoded = value
        .strip_prefix("Nostr ")
        .ok_or("Authorization must be `Nostr <base64 event>`")?;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .map_err(|_| "Authorization is not base64")?;
    let text = String::from_utf8(raw).map_err(|_| "Authorization event is not UTF-8")?;
    let ev = Event::parse(&text).map_err(|e| format!("Authorization event: {e}"))?;
    ev.verify()
        .map_err(|e| format!("Authorization event: {e}"))?;
    if ev.kind != HTTP_AUTH_KIND {
        return Err("Authorization event must be kind 27235".into());
    }
    if ev.created_at.abs_diff(sluice_engine::clock::unix_now()) > MAX_SKEW_SECS {
        return Err("Authorization event's created_at is too far from now".into());
    }
    if !ev
        .first_tag_value("method")
        .is_some_and(|m| m.eq_ignore_ascii_case("POST"))
    {
        return Err("Authorization event's method tag must be POST".into());
    }
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    let url = ev
        .first_tag_value("u")
        .ok_or("Authorization event has no u tag")?;
    if !sluice_proto::auth::relay_matches(url, &st.auth.relay_urls, host) {
        return Err("Authorization event's u tag does not name this relay".into());
    }
    let digest = hex32::encode(&Sha256::digest(body));
    if ev.first_tag_value("payload") != Some(digest.as_str()) {
        return Err("Authorization event's payload tag is not the body's SHA-256".into());
    }
    if !st.engine.policy().is_admin(&ev.pubkey) {
        return Err("this pubkey is not an admin of this relay".into());
    }
    Ok(ev.pubkey)
}

fn param_str<'a>(params: &'a [Value], i: usize, what: &str) -> Result<&'a str, String> {
    params
        .get(i)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("parameter {} must be {what}", i + 1))
}

fn param_hex(params: &[Value], i: usize, what: &str) -> Result<String, String> {
    let s = param_str(params, i, what)?;
    hex32::decode::<32>(s)
        .map(|b| hex32::encode(&b))
        .ok_or_else(|| format!("parameter {} must be {what}", i + 1))
}

/// Parameter 1 of `blockip`/`unblockip`: an address or block, one in
/// IPv4-mapped form as its IPv4 block (`crates/throttle/src/net.rs`).
fn param_block(params: &[Value]) -> Result<IpBlock, String> {
    let ip = param_str(params, 0, "an IP address or CIDR")?;
    IpBlock::parse(ip).map_err(|e| match e {
        BlockError::Syntax => "parameter 1 must be an IP address or CIDR".to_string(),
        e => format!("parameter 1: {e}"),
    })
}

/// How an older build stored an IPv4 block given to `blockip` in mapped
/// form (`::ffff:10.0.0.0/104`, matching nobody then): this one reads that
/// entry as the IPv4 block and lists it so, and `unblockip` of the IPv4
/// block removes it too.
fn mapped_spelling(net: IpBlock) -> Option<String> {
    match net.addr() {
        IpAddr::V4(v4) => {
            let v6 = v4.to_ipv6_mapped();
            Some(match net.prefix_len() {
                32 => v6.to_string(),
                n => format!("{v6}/{}", u16::from(n) + 96),
            })
        }
        IpAddr::V6(_) => None,
    }
}

fn reason(params: &[Value], i: usize) -> String {
    params
        .get(i)
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

fn param_kind(params: &[Value]) -> Result<u16, String> {
    params
        .first()
        .and_then(Value::as_u64)
        .and_then(|k| u16::try_from(k).ok())
        .ok_or_else(|| "parameter 1 must be a kind number".to_string())
}

/// Runs one method: its result, and whether it changed anything. Used by
/// the API and by `sluice admin --store` on a stopped relay's store.
pub async fn call(
    engine: &sluice_engine::Engine,
    method: &str,
    params: &[Value],
) -> Result<(Value, bool), String> {
    let set = |key: String, value: Option<String>| async move {
        engine
            .change_policy(key, value)
            .await
            .map(|()| (Value::Bool(true), true))
            .map_err(|e| format!("could not store the change: {e}"))
    };
    let rules = engine.policy().rules();
    let listed = |items: Vec<(String, String)>, field: &str| {
        Value::Array(
            items
                .into_iter()
                .map(|(item, why)| json!({ field: item, "reason": why }))
                .collect(),
        )
    };
    match method {
        "supportedmethods" => Ok((json!(METHODS), false)),
        "banpubkey" => {
            let pk = param_hex(params, 0, "a hex pubkey")?;
            set(
                format!("{}:{pk}", list::BAN_PUBKEY),
                Some(reason(params, 1)),
            )
            .await
        }
        // Not in NIP-86: removes every stored event of a pubkey.
        "purgepubkey" => {
            let pk = param_hex(params, 0, "a hex pubkey")?;
            let bytes = hex32::decode::<32>(&pk).ok_or("parameter 1 must be a hex pubkey")?;
            let removed = engine
                .remove_author_events(bytes)
                .await
                .map_err(|e| format!("could not remove its events: {e}"))?;
            Ok((json!(removed), true))
        }
        // Not in NIP-86: removes (or with a second parameter "dry-run",
        // counts) every stored event matching a NIP-01 filter, given as
        // an object or as its JSON text.
        "deletefilter" => {
            let filter = match params.first() {
                Some(Value::String(text)) => Filter::parse(text),
                Some(v @ Value::Object(_)) => Filter::from_value(v),
                _ => return Err("parameter 1 must be a NIP-01 filter".into()),
            }
            .map_err(|e| format!("parameter 1 is not a valid filter: {e}"))?;
            let dry_run = match params.get(1) {
                None => false,
                Some(Value::String(s)) if s == "dry-run" => true,
                Some(Value::Bool(b)) => *b,
                Some(_) => return Err("parameter 2 may only be \"dry-run\"".into()),
            };
            let n = engine
                .remove_matching(filter, dry_run)
                .await
                .map_err(|e| format!("could not remove the events: {e}"))?;
            Ok((json!(n), !dry_run))
        }
        "unbanpubkey" => {
            let pk = param_hex(params, 0, "a hex pubkey")?;
            set(format!("{}:{pk}", list::BAN_PUBKEY), None).await
        }
        "listbannedpubkeys" => Ok((listed(rules.banned_pubkeys(), "pubkey"), false)),
        "allowpubkey" => {
            let pk = param_hex(params, 0, "a hex pubkey")?;
            set(
                format!("{}:{pk}", list::ALLOW_PUBKEY),
                Some(reason(params, 1)),
            )
            .await
        }
        "disallowpubkey" => {
            let pk = param_hex(params, 0, "a hex pubkey")?;
            set(format!("{}:{pk}", list::ALLOW_PUBKEY), None).await
        }
        "listallowedpubkeys" => Ok((listed(rules.allowed_pubkeys(), "pubkey"), false)),
        "banevent" => {
            let id = param_hex(params, 0, "a hex event id")?;
            let out = set(format!("{}:{id}", list::BAN_EVENT), Some(reason(params, 1))).await?;
            if let Some(bytes) = hex32::decode::<32>(&id) {
                engine
                    .remove_event(bytes)
                    .await
                    .map_err(|e| format!("banned, but removing it failed: {e}"))?;
            }
            Ok(out)
        }
        "allowevent" => {
            let id = param_hex(params, 0, "a hex event id")?;
            set(format!("{}:{id}", list::BAN_EVENT), None).await
        }
        "listbannedevents" => Ok((listed(rules.banned_events(), "id"), false)),
        "allowkind" => {
            let k = param_kind(params)?;
            set(format!("{}:{k}", list::DENY_KIND), None).await?;
            set(format!("{}:{k}", list::ALLOW_KIND), Some(String::new())).await
        }
        "disallowkind" => {
            let k = param_kind(params)?;
            set(format!("{}:{k}", list::ALLOW_KIND), None).await?;
            set(format!("{}:{k}", list::DENY_KIND), Some(String::new())).await
        }
        "listallowedkinds" => Ok((json!(rules.allowed_kinds()), false)),
        "blockip" => {
            let net = param_block(params)?;
            set(format!("{}:{net}", list::BLOCK_IP), Some(reason(params, 1))).await
        }
        "unblockip" => {
            let net = param_block(params)?;
            if let Some(old) = mapped_spelling(net) {
                set(format!("{}:{old}", list::BLOCK_IP), None).await?;
            }
            set(format!("{}:{net}", list::BLOCK_IP), None).await
        }
        "listblockedips" => Ok((listed(rules.blocked_ips(), "ip"), false)),
        "changerelayname" => {
            let name = param_str(params, 0, "a name")?;
            set(format!("{}:name", list::RELAY), Some(name.to_string())).await
        }
        "changerelaydescription" => {
            let d = param_str(params, 0, "a description")?;
            set(format!("{}:description", list::RELAY), Some(d.to_string())).await
        }
        other => Err(format!("unsupported method {other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mapped_block_is_stored_as_its_ipv4_block_and_its_old_key_is_named() {
        let block = |s: &str| param_block(&[json!(s)]);
        assert_eq!(
            block("::ffff:10.0.0.0/104").unwrap().to_string(),
            "10.0.0.0/8"
        );
        assert_eq!(block("::ffff:10.0.0.9").unwrap().to_string(), "10.0.0.9");
        assert_eq!(
            block("10.0.0.0/33").unwrap_err(),
            "parameter 1 must be an IP address or CIDR"
        );
        assert!(
            block("::ffff:10.0.0.0/80")
                .unwrap_err()
                .contains("write the IPv4 block")
        );
        let old = |s: &str| mapped_spelling(block(s).unwrap());
        assert_eq!(old("10.0.0.0/8").as_deref(), Some("::ffff:10.0.0.0/104"));
        assert_eq!(old("::ffff:10.0.0.9").as_deref(), Some("::ffff:10.0.0.9"));
        assert_eq!(old("0.0.0.0/0").as_deref(), Some("::ffff:0.0.0.0/96"));
        assert_eq!(old("2001:db8::/32"), None);
        // What an older build wrote parses back to the same block.
        for s in ["10.0.0.0/8", "10.0.0.9", "0.0.0.0/0"] {
            assert_eq!(block(&old(s).unwrap()), block(s));
        }
    }
}
