//! `sluice retention --dry-run`: what each `[retention]` rule would remove
//! now, counted in short read transactions (the relay may be running; the
//! store is not changed).

use std::path::PathBuf;

use anyhow::bail;
use clap::Args;

use crate::config::Config;

#[derive(Args)]
pub struct RetentionArgs {
    /// Count what each rule would remove now; remove nothing (the only
    /// mode: retention itself runs inside `sluice serve`).
    #[arg(long)]
    dry_run: bool,
    /// TOML configuration file (its `[retention]` and `store.path`).
    #[arg(long)]
    config: Option<PathBuf>,
}

pub fn run(args: RetentionArgs) -> anyhow::Result<()> {
    if !args.dry_run {
        bail!(
            "retention runs inside `sluice serve`; use --dry-run to see what it would remove now"
        );
    }
    let cfg = Config::load(args.config.as_deref())?;
    let store = cfg.store.open()?;
    let plan = cfg.retention_plan();
    let now = sluice_engine::clock::unix_now();
    let report = plan.dry_run(&store, now)?;
    store.close();
    if cfg.retention.rules.is_empty() && plan.target_bytes == 0 {
        println!("no retention rules and no size target: nothing is removed");
    }
    for (i, (rule, (aged, counted))) in cfg.retention.rules.iter().zip(&report.rules).enumerate() {
        let kinds = if rule.kinds.is_empty() {
            "every kind".to_string()
        } else {
            format!("kinds {:?}", rule.kinds)
        };
        let mut parts = Vec::new();
        if let Some(age) = rule.max_age_secs {
            parts.push(format!("{aged} older than {age} s"));
        }
        if let Some(keep) = rule.keep_per_author {
            parts.push(format!("{counted} beyond the newest {keep} per author"));
        }
        println!("rule {i} ({kinds}): would remove {}", parts.join(", "));
    }
    let mb = |b: u64| b as f64 / 1048576.0;
    if plan.target_bytes > 0 {
        if report.used_bytes > plan.target_bytes {
            println!(
                "size: the store uses {:.1} MiB, over its target of {:.1} MiB: would remove about {} of the oldest events (down to {:.1} MiB)",
                mb(report.used_bytes),
                mb(plan.target_bytes),
                report.size_events,
                mb(plan.low_bytes)
            );
        } else {
            println!(
                "size: the store uses {:.1} MiB of its {:.1} MiB target: nothing to remove",
                mb(report.used_bytes),
                mb(plan.target_bytes)
            );
        }
    }
    Ok(())
}
