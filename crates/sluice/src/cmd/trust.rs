//! `sluice trust explain PUBKEY`: why a pubkey is or is not in the web of
//! trust, by the web read from the store now with the `[trust]` of the
//! config (the relay may be running; the store is not changed).

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use sluice_throttle::Explanation;

use crate::config::Config;

#[derive(Args)]
pub struct TrustArgs {
    #[command(subcommand)]
    command: TrustCommand,
}

#[derive(Subcommand)]
enum TrustCommand {
    /// Say why PUBKEY (64 hex) is or is not trusted: the chain of follow
    /// lists from a seed, or what is missing.
    Explain {
        pubkey: String,
        /// TOML configuration file (its `[trust]` and `store.path`).
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

pub fn run(args: TrustArgs) -> anyhow::Result<()> {
    let TrustCommand::Explain { pubkey, config } = args.command;
    let Some(pk) = sluice_proto::hex32::decode::<32>(&pubkey) else {
        bail!("{pubkey:?} is not a pubkey (64 lowercase hex characters)");
    };
    let cfg = Config::load(config.as_deref())?;
    if !cfg.trust.enabled() {
        println!(
            "no web of trust: trust.seed_pubkeys is empty, so every author is an outsider (outsider_writes = \"{}\")",
            cfg.trust.outsider_writes.as_str()
        );
        return Ok(());
    }
    let store = cfg.store.open().context("opening the store")?;
    let (why, graph) = sluice_engine::trust::Trust::explain(&cfg.trust, &store, &pk);
    store.close();
    let settings = sluice_engine::trust::TrustSettings::new(
        cfg.trust.clone(),
        cfg.pow.clone(),
        &cfg.throttle.tiers,
    );
    let tier = |d: u8| {
        settings
            .trust
            .distance_tiers
            .name(d)
            .map_or("no tier: the base author rate".to_string(), |t| {
                format!("tier {t:?}")
            })
    };
    let hex = |k: &[u8; 32]| sluice_proto::hex32::encode(k);
    match why {
        Explanation::Seed => println!(
            "{pubkey} is trusted: it is a seed (distance 0, {})",
            tier(0)
        ),
        Explanation::Followed { path } => {
            let d = (path.len() - 1) as u8;
            println!("{pubkey} is trusted at distance {d} ({}):", tier(d));
            for pair in path.windows(2) {
                println!("  {} follows {}", hex(&pair[0]), hex(&pair[1]));
            }
        }
        Explanation::Outside { truncated } => {
            println!(
                "{pubkey} is not trusted: no follow list of a pubkey within distance {} names it",
                cfg.trust.max_distance.saturating_sub(1)
            );
            if truncated {
                println!(
                    "  (the web stopped at trust.max_pubkeys = {}: pubkeys further out are not tracked)",
                    cfg.trust.max_pubkeys
                );
            }
            println!(
                "  its EVENTs meet outsider_writes = \"{}\"",
                cfg.trust.outsider_writes.as_str()
            );
        }
    }
    let (lists, follows) = graph.lists();
    println!(
        "web: {} pubkeys from {} seeds, {lists} follow lists holding {follows} follows",
        graph.len(),
        cfg.trust.seed_pubkeys.len()
    );
    Ok(())
}
