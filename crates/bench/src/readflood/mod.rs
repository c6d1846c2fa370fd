//! `readflood`: polite clients beside abusive readers, the read-side
//! counterpart of `overload`. Reproduces this measurement, against any relay:
//! a store already holding an import; abusive clients, each from its own
//! loopback address, keeping several costly REQs open (alternating
//! `{"limit":L}` and `{"kinds":[1],"#t":["<random>"]}`, CLOSE at EOSE, the
//! next REQ at once); beside them polite clients from one other address,
//! each sending cheap REQs `{"authors":[own],"limit":5}` and EVENTs on a
//! fixed schedule. Polite and abusive clients run in separate processes:
//! the command runs itself again with a hidden `--role abusers`, which
//! writes its report to a file the parent reads at the end.
//!
//! Three phases: `before` (polite only), `flood` (polite and abusive),
//! `after` (the abusers gone, polite continues). When the abusers have left
//! and `--settle-secs` passed, the relay's `sluice_query_*` gauges are read
//! once and one fresh REQ `{"limit":5}` is sent on a new connection: a
//! relay that recovered shows nothing in flight and answers it at once.
//! Reports per phase and class (polite reads, polite writes, abusive reads),
//! a per-second timeline, and the relay's series scraped over the run.
//!
//! The files: `args` (the command line), `plan` (what both processes derive
//! from it), `clock` (the time zero they share), `child` (the abusers'
//! process), `abuse` and `polite` (the two kinds of client), `schedule`
//! (when each polite client sends, and its events), `tally` (read
//! outcomes), `after_flood` (the gauges and the fresh REQ), `report` (what
//! the JSON report holds) and `print` (what the terminal shows); `run` here
//! ties them together.

mod abuse;
mod after_flood;
mod args;
mod child;
mod clock;
mod polite;
mod print;
mod report;
mod schedule;
mod setup;
mod tally;
#[cfg(test)]
mod tests;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

pub use abuse::{AbuseConfig, AbuseReport};
use after_flood::after_flood;
pub use args::{ReadfloodArgs, Role};
use child::Abusers;
pub use child::run_abusers_role;
pub(crate) use clock::{instant_at_unix_ms, unix_ms_now};
use polite::{PoliteClient, PoliteSinks};
pub use report::{
    AbusiveSide, AfterFlood, PhaseReport, Probe, ReadfloodReport, Settings, Timeline,
};
use schedule::{polite_config, sign_polite};
use setup::{Plan, metrics_url};
pub use tally::{ReadReport, ReadSecond};

use crate::report::{RunInfo, unix_now};
use crate::rng::Rng;
use crate::timeline::{PhasedRecorder, ScrapeTarget, scrape_loop};

/// Time between starting the clients and the run's time zero, so the
/// abusers' process is up before anything is due.
const STARTUP_LEAD: Duration = Duration::from_millis(1000);
/// Names of the phases, in order.
pub const PHASES: [&str; 3] = ["before", "flood", "after"];

pub async fn run(args: &ReadfloodArgs) -> anyhow::Result<ReadfloodReport> {
    let plan = Plan::new(args)?;
    let mut run = RunInfo::new("readflood", Some(&args.relay));
    let mut rng = Rng::new(args.seed ^ unix_now());
    let identities = sign_polite(args, &plan, &mut rng);
    let t0 = Instant::now() + STARTUP_LEAD;
    let abusers = Abusers::start(args, &plan, t0)?;
    let separate = !args.in_process;
    println!(
        "readflood: {:.0} s before, {:.0} s flood, {:.0} s after; running...",
        args.before_secs, args.flood_secs, args.after_secs
    );

    let (stop_tx, stop_rx) = watch::channel(false);
    let target = ScrapeTarget {
        url: metrics_url(args, &plan),
        prefixes: args.series_prefix.clone(),
        pid: args.pid,
    };
    let scraper = (target.url.is_some() || target.pid.is_some()).then(|| {
        let every = Duration::from_millis(args.scrape_ms.max(50));
        tokio::spawn(scrape_loop(target, t0, every, stop_rx))
    });

    let sinks = PoliteSinks {
        reads: Arc::new(tally::ReadRecorder::new(t0, &plan.phase_secs)),
        writes: Arc::new(PhasedRecorder::new(t0, &plan.phase_secs)),
        connection_errors: Arc::new(Mutex::default()),
        notices: Arc::new(Mutex::default()),
    };
    let polite_tasks: Vec<_> = identities
        .into_iter()
        .enumerate()
        .map(|(i, id)| {
            let cfg = polite_config(args, &plan, t0, i, id);
            tokio::spawn(PoliteClient::new(cfg, sinks.clone()).run())
        })
        .collect();

    let abuse = abusers.finish().await?;
    let gone = Instant::now().max(plan.flood_window(t0).1);
    tokio::time::sleep_until((gone + Duration::from_secs_f64(args.settle_secs)).into()).await;
    let after_flood = after_flood(args, &plan, t0).await;
    for t in polite_tasks {
        t.await?;
    }
    stop_tx.send(true).ok();
    let metrics = match scraper {
        Some(h) => Some(h.await?),
        None => None,
    };
    run.finish();
    let abusive = AbusiveSide {
        connections: abuse.connections,
        source_ips: plan
            .abuse_config(args, t0)
            .binds
            .iter()
            .map(|b| b.map(|ip| ip.to_string()).unwrap_or_default())
            .collect(),
        separate_process: separate,
        pid: abuse.pid,
        cpu_secs: if separate { abuse.cpu_secs } else { None },
        reconnects: abuse.reconnects,
        connection_errors: abuse.connection_errors.clone(),
        notices: abuse.notices.clone(),
    };
    Ok(ReadfloodReport {
        run,
        settings: settings(args),
        distinct_source_ips: plan.distinct_ips,
        phases: phase_reports(&plan, &sinks, &abuse),
        abusive,
        polite_connection_errors: sinks.connection_errors.lock().expect("lock").clone(),
        polite_notices: sinks.notices.lock().expect("lock").clone(),
        after_flood,
        timeline: Timeline {
            polite_reads: sinks.reads.seconds(),
            polite_writes: sinks.writes.seconds(),
            abusive_reads: abuse.seconds,
        },
        metrics,
    })
}

fn settings(args: &ReadfloodArgs) -> Settings {
    Settings {
        polite_clients: args.polite_clients,
        polite_addr: args.polite_addr.to_string(),
        polite_req_rate: args.polite_req_rate,
        polite_event_rate: args.polite_event_rate,
        polite_limit: args.polite_limit,
        abusive_addrs: args.abusive_addrs,
        abusive_conns_per_addr: args.abusive_conns_per_addr,
        abusive_subs: args.abusive_subs,
        abusive_limit: args.abusive_limit,
        abusive_search: args.abusive_search.clone(),
        timeout_ms: args.timeout_ms,
        before_secs: args.before_secs,
        flood_secs: args.flood_secs,
        after_secs: args.after_secs,
        settle_secs: args.settle_secs,
    }
}

fn phase_reports(plan: &Plan, sinks: &PoliteSinks, abuse: &AbuseReport) -> Vec<PhaseReport> {
    let reads = sinks.reads.phase_reports();
    let writes = sinks.writes.phase_reports(&plan.phase_secs);
    let mut start = 0.0;
    (0..PHASES.len())
        .map(|i| {
            let secs = plan.phase_secs[i];
            let p = PhaseReport {
                name: PHASES[i].to_owned(),
                start_secs: start,
                secs,
                polite_reads: reads[i].clone(),
                polite_writes: writes[i].clone(),
                abusive_reads: abuse.phases.get(i).cloned().unwrap_or_default(),
            };
            start += secs;
            p
        })
        .collect()
}
