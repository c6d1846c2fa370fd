//! Unit tests of the readflood command: the child's flags, the abusers'
//! addresses and the polite schedules.

use std::path::Path;
use std::time::{Duration, Instant};

use clap::Parser;

use super::args::{ReadfloodArgs, Role};
use super::child::child_args;
use super::schedule::{event_schedule, req_schedule};
use super::setup::Plan;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: ReadfloodArgs,
}

fn args(extra: &[&str]) -> ReadfloodArgs {
    let mut v = vec!["x", "ws://127.0.0.1:7777"];
    v.extend_from_slice(extra);
    Cli::parse_from(v).args
}

#[test]
fn the_child_gets_the_flood_flags_back() {
    let a = args(&[
        "--abusive-addrs",
        "3",
        "--flood-secs",
        "2.5",
        "--same-source-ip",
    ]);
    let child = child_args(&a, Path::new("/tmp/r.json"), 42);
    let mut v = vec!["x"];
    v.extend(child.iter().skip(1).map(String::as_str));
    let back = Cli::parse_from(v).args;
    assert_eq!(back.role, Role::Abusers);
    assert_eq!(back.t0_unix_ms, Some(42));
    assert_eq!((back.abusive_addrs, back.flood_secs), (3, 2.5));
    assert!(back.same_source_ip);
    assert_eq!(back.abusers_report.unwrap(), Path::new("/tmp/r.json"));
}

#[test]
fn abusers_get_one_address_each() {
    let a = args(&["--abusive-addrs", "3", "--abusive-conns-per-addr", "2"]);
    let plan = Plan::new(&a).unwrap();
    let cfg = plan.abuse_config(&a, Instant::now());
    let ips: Vec<String> = cfg.binds.iter().map(|b| b.unwrap().to_string()).collect();
    assert_eq!(
        ips,
        [
            "127.0.0.10",
            "127.0.0.10",
            "127.0.0.11",
            "127.0.0.11",
            "127.0.0.12",
            "127.0.0.12"
        ]
    );
    assert_eq!(cfg.stop - cfg.start, Duration::from_secs(30));
    let remote = args(&[]);
    let remote = ReadfloodArgs {
        relay: "ws://relay.example:7777".into(),
        ..remote
    };
    assert!(!Plan::new(&remote).unwrap().distinct_ips);
}

#[test]
fn polite_schedules_are_spread() {
    let a = args(&["--polite-clients", "2", "--polite-req-rate", "5"]);
    assert_eq!(req_schedule(&a, 1).0, Duration::from_millis(100));
    assert_eq!(event_schedule(&a, 0).0, Duration::from_millis(250));
    assert_eq!(req_schedule(&a, 0).1, Some(Duration::from_millis(200)));
}
