//! The abusers' process: the driver runs this program again with a hidden
//! `--role abusers` and the flags that shape the flood, and reads the
//! report it writes at the end (or runs the abusers in a task of its own
//! with `--in-process`).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};

use super::abuse::{self, AbuseReport};
use super::args::ReadfloodArgs;
use super::clock::{instant_at_unix_ms, unix_ms_now};
use super::setup::Plan;
use crate::report::process_cpu_secs;

/// The child process's part: run the abusers and write their report.
pub async fn run_abusers_role(args: &ReadfloodArgs) -> anyhow::Result<()> {
    let path = args
        .abusers_report
        .as_deref()
        .context("--role abusers needs --abusers-report")?;
    let t0_ms = args
        .t0_unix_ms
        .context("--role abusers needs --t0-unix-ms")?;
    let plan = Plan::new(args)?;
    let cfg = plan.abuse_config(args, instant_at_unix_ms(t0_ms));
    let mut report = abuse::run(cfg).await;
    report.cpu_secs = process_cpu_secs();
    std::fs::write(path, serde_json::to_string(&report)?)
        .with_context(|| format!("writing {}", path.display()))
}

/// The abusers, running in a child process or in a task of this one.
pub(super) enum Abusers {
    Child {
        child: std::process::Child,
        report: PathBuf,
    },
    Task(tokio::task::JoinHandle<AbuseReport>),
}

impl Abusers {
    pub(super) fn start(args: &ReadfloodArgs, plan: &Plan, t0: Instant) -> anyhow::Result<Abusers> {
        if args.in_process {
            let cfg = plan.abuse_config(args, t0);
            return Ok(Abusers::Task(tokio::spawn(abuse::run(cfg))));
        }
        let report = std::env::temp_dir().join(format!(
            "sluice-bench-readflood-{}-{}.json",
            std::process::id(),
            unix_ms_now()
        ));
        let t0_ms = unix_ms_now() + t0.saturating_duration_since(Instant::now()).as_millis() as u64;
        let exe = std::env::current_exe().context("finding this program to run the abusers")?;
        let child = std::process::Command::new(exe)
            .args(child_args(args, &report, t0_ms))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .spawn()
            .context("starting the abusers' process")?;
        Ok(Abusers::Child { child, report })
    }

    /// Waits for the abusers to finish (at the end of the flood) and takes their report.
    pub(super) async fn finish(self) -> anyhow::Result<AbuseReport> {
        match self {
            Abusers::Task(handle) => Ok(handle.await?),
            Abusers::Child { mut child, report } => {
                let status = tokio::task::spawn_blocking(move || child.wait()).await??;
                let text = std::fs::read_to_string(&report);
                let _ = std::fs::remove_file(&report);
                if !status.success() {
                    bail!("the abusers' process failed ({status}); its errors are above");
                }
                let text = text.with_context(|| format!("reading {}", report.display()))?;
                serde_json::from_str(&text).context("the abusers' report is not valid")
            }
        }
    }
}

/// The arguments of the abusers' process: everything that shapes the flood.
pub(super) fn child_args(args: &ReadfloodArgs, report: &Path, t0_unix_ms: u64) -> Vec<String> {
    let mut v: Vec<String> = vec![
        "readflood".into(),
        args.relay.clone(),
        "--role".into(),
        "abusers".into(),
        "--abusers-report".into(),
        report.display().to_string(),
        "--t0-unix-ms".into(),
        t0_unix_ms.to_string(),
    ];
    let flags: [(&str, String); 10] = [
        ("--abusive-addrs", args.abusive_addrs.to_string()),
        ("--abusive-addr-base", args.abusive_addr_base.to_string()),
        (
            "--abusive-conns-per-addr",
            args.abusive_conns_per_addr.to_string(),
        ),
        ("--abusive-subs", args.abusive_subs.to_string()),
        ("--abusive-limit", args.abusive_limit.to_string()),
        ("--timeout-ms", args.timeout_ms.to_string()),
        ("--before-secs", args.before_secs.to_string()),
        ("--flood-secs", args.flood_secs.to_string()),
        ("--after-secs", args.after_secs.to_string()),
        ("--seed", args.seed.to_string()),
    ];
    for (flag, value) in flags {
        v.push(flag.into());
        v.push(value);
    }
    if args.same_source_ip {
        v.push("--same-source-ip".into());
    }
    if !args.abusive_search.is_empty() {
        v.push("--abusive-search".into());
        v.push(args.abusive_search.join(","));
    }
    v
}
