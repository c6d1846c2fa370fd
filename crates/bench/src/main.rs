//! The `sluice-bench` command line: parses arguments, runs one command,
//! prints its summary and writes its JSON report.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use sluice_bench::generate::{self, GenConfig};
use sluice_bench::report::{unix_now, write_json};
use sluice_bench::{
    audience, connections, fanout, overload, plot, publish, query, readflood, soak, sybil,
    wirebytes,
};

#[derive(Parser)]
#[command(
    name = "sluice-bench",
    version,
    about = "Load generator and benchmark driver for Nostr relays"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write deterministic, realistic signed events as JSONL.
    Gen(GenArgs),
    /// Publish events from a JSONL file, closed or open loop.
    Publish(publish::PublishArgs),
    /// Run a REQ mix derived from a JSONL file; time to EOSE.
    Query(query::QueryArgs),
    /// M subscribers, P publishers: deliveries/s and publish-to-delivery latency.
    Fanout(fanout::FanoutArgs),
    /// One publisher and one watcher beside N idle subscribed connections:
    /// relay CPU per event as the audience grows.
    Audience(audience::AudienceArgs),
    /// Open N idle connections; the relay's memory per connection.
    Connections(connections::ConnectionsArgs),
    /// Bytes on the wire per served event, stored and live, with a client
    /// that offers permessage-deflate.
    Wire(wirebytes::WireArgs),
    /// Polite clients beside abusive clients ramping through multiples of capacity.
    Overload(overload::OverloadArgs),
    /// Polite clients beside abusive readers holding costly REQs open.
    Readflood(readflood::ReadfloodArgs),
    /// Ingest several times a store's size target at full speed, with polite
    /// clients beside: store size, retention deletions and polite latency
    /// over time, then checks that the newest and the exempt authors'
    /// events are still stored.
    Soak(soak::SoakArgs),
    /// Fresh keys from many addresses, each under its per-IP rate, beside
    /// polite clients the web of trust knows: spam accepted, polite
    /// success, the proof-of-work difficulty and the store's growth.
    Sybil(sybil::SybilArgs),
    /// Draw an overload, readflood, soak or sybil JSON report as an SVG chart.
    Plot(plot::PlotArgs),
}

#[derive(clap::Args)]
struct GenArgs {
    /// Number of events.
    #[arg(long, default_value_t = 10_000)]
    count: u64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Distinct authors (plus three zap services).
    #[arg(long, default_value_t = 1000)]
    authors: usize,
    /// created_at of the first event, unix seconds [default: now minus the span].
    #[arg(long)]
    start_time: Option<u64>,
    /// Seconds over which created_at is spread.
    #[arg(long, default_value_t = 7 * 86400)]
    span_secs: u64,
    /// Signing threads (does not change the output).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Output file [default: stdout].
    #[arg(long, short)]
    out: Option<PathBuf>,
    /// Write the report as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Gen(a) => gen_command(&a),
        Command::Publish(a) => {
            let r = publish::run(&a).await?;
            r.print();
            write_json(a.json.as_deref(), &r)
        }
        Command::Fanout(a) => {
            let r = fanout::run(&a).await?;
            r.print();
            write_json(a.json.as_deref(), &r)
        }
        Command::Audience(a) => {
            let r = audience::run(&a).await?;
            r.print();
            write_json(a.json.as_deref(), &r)
        }
        Command::Connections(a) => {
            let r = connections::run(&a).await?;
            r.print();
            write_json(a.json.as_deref(), &r)
        }
        Command::Wire(a) => {
            let r = wirebytes::run(&a).await?;
            r.print();
            write_json(a.json.as_deref(), &r)
        }
        Command::Overload(a) => {
            let r = overload::run(&a).await?;
            r.print();
            write_json(a.json.as_deref(), &r)
        }
        Command::Readflood(a) if a.role == readflood::Role::Abusers => {
            readflood::run_abusers_role(&a).await
        }
        Command::Readflood(a) => {
            let r = readflood::run(&a).await?;
            r.print();
            write_json(a.json.as_deref(), &r)
        }
        Command::Soak(a) if a.print_exempt => {
            soak::print_exempt(&a);
            Ok(())
        }
        Command::Soak(a) => {
            let r = soak::run(&a).await?;
            r.print();
            write_json(a.out.as_deref(), &r)?;
            if !r.verdict.pass {
                std::process::exit(1);
            }
            Ok(())
        }
        Command::Sybil(a) if a.spam_report.is_some() => sybil::run_spam_role(&a).await,
        Command::Sybil(a) if a.print_seed => {
            sybil::print_seed(&a);
            Ok(())
        }
        Command::Sybil(a) => {
            let r = sybil::run(&a).await?;
            r.print();
            write_json(a.json.as_deref(), &r)
        }
        Command::Plot(a) => plot::run(&a),
        Command::Query(a) => {
            let r = query::run(&a).await?;
            r.print();
            write_json(a.json.as_deref(), &r)
        }
    }
}

fn gen_command(a: &GenArgs) -> anyhow::Result<()> {
    let cfg = GenConfig {
        seed: a.seed,
        count: a.count,
        authors: a.authors,
        start_time: a
            .start_time
            .unwrap_or_else(|| unix_now().saturating_sub(a.span_secs)),
        span_secs: a.span_secs,
        threads: a.threads,
    };
    let report = match &a.out {
        Some(path) => {
            let file = std::fs::File::create(path)?;
            generate::write_jsonl(&cfg, &mut std::io::BufWriter::new(file))?
        }
        None => {
            generate::write_jsonl(&cfg, &mut std::io::BufWriter::new(std::io::stdout().lock()))?
        }
    };
    if a.out.is_some() {
        report.print();
    } else {
        eprintln!(
            "gen: {} events, mean {:.0} bytes",
            report.count, report.mean_event_bytes
        );
    }
    write_json(a.json.as_deref(), &report)
}
