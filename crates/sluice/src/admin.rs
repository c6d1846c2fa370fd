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

#[derive(Args)]
pub struct AdminArgs {
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
    /// The NIP-86 method (e.g. banpubkey, listbannedpubkeys, allowkind,
    /// blockip, changerelayname, purgepubkey; `supportedmethods` lists them).
    method: String,
    /// Its parameters, in order; numbers are sent as numbers.
    params: Vec<String>,
}

pub fn run(args: AdminArgs) -> anyhow::Result<()> {
    let params = params_of(&args.params);
    if args.store {
        return offline(&args, &params);
    }
    let key =
        match &args.key_file {
            Some(path) => std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?,
            None => std::env::var("SLUICE_ADMIN_KEY")
                .context("give --key-file or set SLUICE_ADMIN_KEY")?,
        };
    let secret: [u8; 32] = hex32::decode(key.trim())
        .context("the admin key must be 64 lowercase hex characters (a secret key)")?;
    let body = json!({ "method": args.method, "params": params }).to_string();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let public = args.public_url.as_deref().unwrap_or(&args.url);
    let (status, answer) = runtime.block_on(post(&args.url, public, &secret, &body))?;
    let v: Value = serde_json::from_str(&answer)
        .with_context(|| format!("HTTP {status}: the answer is not JSON: {answer}"))?;
    if let Some(err) = v["error"].as_str() {
        bail!("HTTP {status}: {err}");
    }
    println!("{}", serde_json::to_string_pretty(&v["result"])?);
    Ok(())
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
fn offline(args: &AdminArgs, params: &[Value]) -> anyhow::Result<()> {
    let cfg = crate::config::Config::load(args.config.as_deref())?;
    let store = cfg.store.open()?;
    let engine = sluice_engine::Engine::start(store, cfg.engine.clone(), cfg.throttle.clone());
    engine.set_retention(cfg.retention_plan());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let result = runtime.block_on(async {
        engine
            .load_policy(cfg.policy.clone())
            .await
            .context("reading the runtime policy")?;
        sluice_server::nip86::call(&engine, &args.method, params)
            .await
            .map_err(|e| anyhow::anyhow!(e))
    });
    engine.shutdown();
    let (value, _) = result?;
    println!("{}", serde_json::to_string_pretty(&value)?);
    Ok(())
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
    let auth = Event::sign(
        secret,
        sluice_engine::unix_now(),
        27235,
        vec![
            vec!["u".into(), public_url.into()],
            vec!["method".into(), "POST".into()],
            vec!["payload".into(), hex32::encode(&Sha256::digest(body))],
        ],
        "",
    );
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
