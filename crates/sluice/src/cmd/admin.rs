//! `sluice admin`: the NIP-86 management API from the command line, against
//! a running relay. The request is signed (NIP-98) with an admin's secret
//! key and sent as one HTTP/1.1 POST over plain TCP (run it on the relay's
//! host, or through a tunnel: no TLS here).
//!
//! `sluice admin --url http://127.0.0.1:7777/ --key-file admin.key banpubkey HEX "spam"`
//! prints the result as JSON; an error answer or a refused authorisation is
//! a failure with the relay's words.
//!
//! `sluice admin --store [--config FILE] METHOD ...` makes the same change
//! directly in the store of a relay that is not running (no key needed: it
//! takes access to the store's files), through an engine of its own, so
//! the writer rules are the same.

use std::path::PathBuf;

use anyhow::{Context, bail};
use base64::Engine as _;
use clap::Args;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use sluice_proto::{Event, hex32};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Where a NIP-86 call goes: a running relay (signed with an admin key),
/// or with `--store` the store itself, through an engine of its own.
#[derive(Args)]
pub struct Target {
    /// The relay's URL as its `auth.relay_urls` (or its host) name it,
    /// http:// or ws://; the request goes to its host and port.
    #[arg(long, default_value = "http://127.0.0.1:7777/")]
    url: String,
    /// The URL the NIP-98 `u` tag names, when the relay knows itself by
    /// another (one of its `auth.relay_urls`, e.g. https://relay.example.com/);
    /// default: --url.
    #[arg(long)]
    public_url: Option<String>,
    /// File holding the admin's secret key, 64 hex characters (else the
    /// SLUICE_ADMIN_KEY environment variable).
    #[arg(long)]
    key_file: Option<PathBuf>,
    /// Work on the store named by the config (`store.path`) directly,
    /// with the relay stopped, instead of through the API.
    #[arg(long)]
    store: bool,
    /// TOML configuration file, for `--store`.
    #[arg(long)]
    config: Option<PathBuf>,
}

#[derive(Args)]
pub struct AdminArgs {
    #[command(flatten)]
    target: Target,
    /// The NIP-86 method (e.g. banpubkey, listbannedpubkeys, allowkind,
    /// blockip, changerelayname, purgepubkey, deletefilter;
    /// `supportedmethods` lists them).
    method: String,
    /// Its parameters, in order; numbers are sent as numbers.
    params: Vec<String>,
}

/// `sluice delete`: removes the stored events matching a filter.
#[derive(Args)]
pub struct DeleteArgs {
    #[command(flatten)]
    target: Target,
    /// A NIP-01 filter as JSON, e.g. '{"kinds":[1],"until":1700000000}';
    /// its `limit`, if any, caps how many (the newest) go.
    #[arg(long)]
    filter: String,
    /// Count what would be removed; remove nothing.
    #[arg(long)]
    dry_run: bool,
}

pub fn run(args: AdminArgs) -> anyhow::Result<()> {
    let params = params_of(&args.params);
    let result = call(&args.target, &args.method, &params)?;
    println!("{}", serde_json::to_string_pretty(&result)?);
    Ok(())
}

pub fn delete(args: DeleteArgs) -> anyhow::Result<()> {
    let filter: Value = serde_json::from_str(&args.filter).context("--filter is not JSON")?;
    sluice_proto::Filter::from_value(&filter)
        .map_err(|e| anyhow::anyhow!("--filter is not a valid NIP-01 filter: {e}"))?;
    let mut params = vec![filter];
    if args.dry_run {
        params.push(json!("dry-run"));
    }
    let n = call(&args.target, "deletefilter", &params)?;
    if args.dry_run {
        println!("{n} events match; nothing removed (--dry-run)");
    } else {
        println!("{n} events removed");
    }
    Ok(())
}

/// Makes one NIP-86 call and returns its result.
fn call(target: &Target, method: &str, params: &[Value]) -> anyhow::Result<Value> {
    if target.store {
        return offline(target, method, params);
    }
    let key =
        match &target.key_file {
            Some(path) => std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?,
            None => std::env::var("SLUICE_ADMIN_KEY")
                .context("give --key-file or set SLUICE_ADMIN_KEY")?,
        };
    let secret: [u8; 32] = hex32::decode(key.trim())
        .context("the admin key must be 64 lowercase hex characters (a secret key)")?;
    if sluice_proto::event::try_public_key_of(&secret).is_none() {
        bail!(
            "the admin key is not a secp256k1 secret key (it is zero or not below the curve order)"
        );
    }
    let body = json!({ "method": method, "params": params }).to_string();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let public = target.public_url.as_deref().unwrap_or(&target.url);
    let (status, answer) = runtime.block_on(post(&target.url, public, &secret, &body))?;
    let mut v: Value = serde_json::from_str(&answer)
        .with_context(|| format!("HTTP {status}: the answer is not JSON: {answer}"))?;
    if let Some(err) = v["error"].as_str() {
        bail!("HTTP {status}: {err}");
    }
    Ok(v["result"].take())
}

/// Numbers are sent as numbers, the rest as strings.
fn params_of(args: &[String]) -> Vec<Value> {
    args.iter()
        .map(|p| match p.parse::<u64>() {
            Ok(n) => json!(n),
            Err(_) => json!(p),
        })
        .collect()
}

/// `--store`: the change made by an engine over the store itself.
fn offline(target: &Target, method: &str, params: &[Value]) -> anyhow::Result<Value> {
    let cfg = crate::config::Config::load(target.config.as_deref())?;
    let store = cfg.store.open()?;
    let engine = sluice_engine::Engine::start(store, cfg.engine.clone(), cfg.throttle.clone())?;
    engine.set_retention(cfg.retention_plan());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let result = runtime.block_on(async {
        engine
            .load_policy(cfg.policy.clone())
            .await
            .context("reading the runtime policy")?;
        sluice_server::nip86::call(&engine, method, params)
            .await
            .map_err(|e| anyhow::anyhow!(e))
    });
    engine.shutdown();
    let (value, _) = result?;
    Ok(value)
}

/// `host:port` and the path of an http:// or ws:// URL.
fn target(url: &str) -> anyhow::Result<(String, String)> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("ws://"))
        .context("--url must be http:// or ws:// (no TLS: run on the relay's host)")?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let authority = if authority.contains(':') {
        authority.to_string()
    } else {
        format!("{authority}:80")
    };
    Ok((authority, path.to_string()))
}

async fn post(
    url: &str,
    public_url: &str,
    secret: &[u8; 32],
    body: &str,
) -> anyhow::Result<(u16, String)> {
    let (authority, path) = target(url)?;
    let auth = Event::try_sign(
        secret,
        sluice_engine::clock::unix_now(),
        27235,
        vec![
            vec!["u".into(), public_url.into()],
            vec!["method".into(), "POST".into()],
            vec!["payload".into(), hex32::encode(&Sha256::digest(body))],
        ],
        "",
    )
    .context("the admin key is not a secp256k1 secret key")?;
    let header = base64::engine::general_purpose::STANDARD.encode(auth.raw());
    let host = authority.trim_end_matches(":80");
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/nostr+json+rpc\r\n\
         Authorization: Nostr {header}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut stream = tokio::net::TcpStream::connect(&authority)
        .await
        .with_context(|| format!("connecting to {authority}"))?;
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(30),
        stream.read_to_end(&mut response),
    )
    .await
    .context("no answer within 30 s")??;
    let text = String::from_utf8_lossy(&response);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .context("the relay's answer is not HTTP")?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("the relay's answer has no status")?;
    Ok((status, body.to_string()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn urls_give_the_address_and_path() {
        assert_eq!(
            super::target("http://127.0.0.1:7777/").unwrap(),
            ("127.0.0.1:7777".into(), "/".into())
        );
        assert_eq!(
            super::target("ws://relay.local").unwrap(),
            ("relay.local:80".into(), "/".into())
        );
        assert!(super::target("https://relay.example.com").is_err());
    }
}
