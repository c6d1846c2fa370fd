//! `plot`: draws an overload, readflood or soak JSON report (told apart by
//! `run.command`) as an SVG chart of panels sharing the time axis, with the
//! phase boundaries marked.
//!
//! overload: offered load and goodput, success ratio per class, p99 latency
//! per class (log scale), and the relay's controller series (each scaled to
//! its own maximum). readflood: polite time to EOSE (log scale), polite
//! success, abusive REQs answered and refused per second, the relay's
//! anonymous memory, and its query window (in flight, queued). soak: the
//! store's used and file bytes against the target, events accepted and
//! deleted by retention per second, polite OK latency (log scale),
//! acceptance per sample, and the writer's share of time in retention;
//! marks where the ingested bytes pass each multiple of the target.
//!
//! The SVG is written by hand: a few elements do not justify a plotting library.
//!
//! One file per chart kind builds its panels from its report (`overload`,
//! `readflood`, `soak`, `sybil`); `panel` holds what a chart is made of
//! (panels of named lines, phase marks) and `svg` draws it.

mod overload;
mod panel;
mod readflood;
mod soak;
mod svg;
mod sybil;

use std::path::PathBuf;

use anyhow::Context;

pub use overload::render;
pub use readflood::render_readflood;
pub use soak::render_soak;
pub use sybil::render_sybil;

use crate::overload::OverloadReport;
use crate::readflood::ReadfloodReport;
use crate::soak::SoakReport;

#[derive(Debug, Clone, clap::Args)]
pub struct PlotArgs {
    /// A report written with `overload --json`, `readflood --json` or `soak --out`.
    pub input: PathBuf,
    /// The SVG file to write.
    #[arg(long, short)]
    pub out: PathBuf,
    /// Most controller series drawn (those that vary most).
    #[arg(long, default_value_t = 8)]
    pub max_series: usize,
}

pub fn run(args: &PlotArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.input)
        .with_context(|| format!("reading {}", args.input.display()))?;
    let value: serde_json::Value = serde_json::from_str(&text).context("not a JSON report")?;
    let svg = match value["run"]["command"].as_str() {
        Some("readflood") => {
            let report: ReadfloodReport =
                serde_json::from_value(value).context("not a readflood report")?;
            render_readflood(&report)
        }
        Some("soak") => {
            let report: SoakReport = serde_json::from_value(value).context("not a soak report")?;
            render_soak(&report)
        }
        Some("sybil") => {
            let report: crate::sybil::SybilReport =
                serde_json::from_value(value).context("not a sybil report")?;
            render_sybil(&report)
        }
        _ => {
            let report: OverloadReport =
                serde_json::from_value(value).context("not an overload report")?;
            render(&report, args.max_series)
        }
    };
    std::fs::write(&args.out, svg).with_context(|| format!("writing {}", args.out.display()))?;
    println!("wrote {}", args.out.display());
    Ok(())
}
