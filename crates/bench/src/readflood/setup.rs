//! What both processes derive from the arguments: the relay, whether each
//! client binds its own loopback address, the phases, the abusers' setup
//! and the metrics page.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use anyhow::bail;

use super::abuse::AbuseConfig;
use super::args::ReadfloodArgs;
use crate::wire::RelayUrl;

/// What both processes derive from the arguments.
pub(super) struct Plan {
    pub(super) relay: RelayUrl,
    pub(super) distinct_ips: bool,
    pub(super) phase_secs: Vec<f64>,
    pub(super) total: Duration,
}

impl Plan {
    pub(super) fn new(args: &ReadfloodArgs) -> anyhow::Result<Plan> {
        let relay = RelayUrl::parse(&args.relay)?;
        let phase_secs = vec![args.before_secs, args.flood_secs, args.after_secs];
        let finite = |v: f64| v.is_finite() && v >= 0.0;
        if !phase_secs.iter().all(|s| finite(*s)) || !finite(args.settle_secs) {
            bail!("phase and settle seconds must be non-negative numbers");
        }
        if !finite(args.polite_req_rate) || !finite(args.polite_event_rate) {
            bail!("polite rates must be non-negative numbers");
        }
        Ok(Plan {
            distinct_ips: !args.same_source_ip && relay.host.starts_with("127."),
            relay,
            total: Duration::from_secs_f64(phase_secs.iter().sum()),
            phase_secs,
        })
    }

    pub(super) fn bind(&self, addr: Ipv4Addr) -> Option<IpAddr> {
        self.distinct_ips.then_some(IpAddr::V4(addr))
    }

    pub(super) fn flood_window(&self, t0: Instant) -> (Instant, Instant) {
        let start = t0 + Duration::from_secs_f64(self.phase_secs[0]);
        (start, start + Duration::from_secs_f64(self.phase_secs[1]))
    }

    pub(super) fn abuse_config(&self, args: &ReadfloodArgs, t0: Instant) -> AbuseConfig {
        let base = u32::from(args.abusive_addr_base);
        let binds = (0..args.abusive_addrs)
            .flat_map(|i| {
                let addr = Ipv4Addr::from(base.wrapping_add(i as u32));
                std::iter::repeat_n(self.bind(addr), args.abusive_conns_per_addr)
            })
            .collect();
        let (start, stop) = self.flood_window(t0);
        AbuseConfig {
            relay: self.relay.clone(),
            binds,
            subs: args.abusive_subs,
            limit: args.abusive_limit,
            search: args.abusive_search.clone(),
            timeout: Duration::from_millis(args.timeout_ms),
            t0,
            phase_secs: self.phase_secs.clone(),
            start,
            stop,
            seed: args.seed ^ 0xab05e,
        }
    }
}

pub(super) fn metrics_url(args: &ReadfloodArgs, plan: &Plan) -> Option<String> {
    (!args.no_metrics).then(|| {
        args.metrics_url
            .clone()
            .unwrap_or_else(|| format!("{}/metrics", plan.relay.http_base()))
    })
}
