//! What the terminal shows of a readflood report.

use super::report::{AfterFlood, ReadfloodReport};
use crate::driver::TallyReport;

impl ReadfloodReport {
    pub fn print(&self) {
        let s = &self.settings;
        println!(
            "readflood: {} {} polite clients from {} ({} REQ/s, {} EVENT/s each); {} abusive addresses x {} connection(s) x {} REQs open ({}){}",
            self.run.relay.as_deref().unwrap_or("?"),
            s.polite_clients,
            if self.distinct_source_ips {
                s.polite_addr.as_str()
            } else {
                "the default address"
            },
            s.polite_req_rate,
            s.polite_event_rate,
            s.abusive_addrs,
            s.abusive_conns_per_addr,
            s.abusive_subs,
            if s.abusive_search.is_empty() {
                format!("limit {} / #t", s.abusive_limit)
            } else {
                format!(
                    "search {}, limit {}",
                    s.abusive_search.join("|"),
                    s.abusive_limit
                )
            },
            if self.abusive.separate_process {
                ", abusers in a separate process"
            } else {
                ", abusers in this process"
            }
        );
        let abusers_cpu = self.abusive.cpu_secs.map_or(String::new(), |c| {
            format!("; abusers' process CPU {c:.1} s")
        });
        println!("  {}{abusers_cpu}", self.run.cpu_line());
        for p in &self.phases {
            println!(
                "  phase {} ({:.0}-{:.0} s):",
                p.name,
                p.start_secs,
                p.start_secs + p.secs
            );
            p.polite_reads.print("    ", "polite reads:  ");
            print_writes(&p.polite_writes);
            if p.abusive_reads.sent > 0 {
                p.abusive_reads.print("    ", "abusive reads: ");
            }
        }
        let a = &self.abusive;
        println!(
            "  abusive: {} connections, {} reconnects, connection errors: {}, notices: {}",
            a.connections, a.reconnects, a.connection_errors, a.notices
        );
        if self.polite_connection_errors.total() > 0 {
            println!(
                "  polite connection errors: {}",
                self.polite_connection_errors
            );
        }
        self.after_flood.print();
        if let Some(m) = &self.metrics {
            let series: std::collections::BTreeSet<&String> =
                m.points.iter().flat_map(|p| p.values.keys()).collect();
            println!(
                "  metrics: {} scrapes of {} ({} failed), {} series recorded",
                m.points.len(),
                if m.url.is_empty() { "/proc" } else { &m.url },
                m.failures,
                series.len()
            );
        }
    }
}

fn print_writes(w: &TallyReport) {
    println!(
        "    polite writes: sent {}, OK true {} ({:.1}%), refused {}, timeouts {}, lost {}, skipped {}",
        w.sent,
        w.accepted,
        w.success_ratio * 100.0,
        w.refused,
        w.timeouts,
        w.lost,
        w.skipped
    );
    println!(
        "                   OK latency (true): p50 {:.2} ms  p99 {:.2} ms  max {:.2} ms",
        w.accepted_latency.p50_ms, w.accepted_latency.p99_ms, w.accepted_latency.max_ms
    );
    if w.refused > 0 {
        println!(
            "                   refused by prefix: {}",
            w.refused_prefixes
        );
        for m in w.refusal_examples.0.values() {
            println!("                     e.g. {m:?}");
        }
    }
}

impl AfterFlood {
    fn print(&self) {
        println!(
            "  after the flood (at {:.1} s): fresh REQ {{\"limit\":5}}: {} in {:.1} ms ({} events, connect {:.1} ms){}",
            self.at_secs,
            self.probe.outcome,
            self.probe.time_ms,
            self.probe.events,
            self.probe.connect_ms,
            self.probe
                .message
                .as_ref()
                .map_or(String::new(), |m| format!(": {m:?}"))
        );
        if let Some(e) = &self.scrape_error {
            println!("    query gauges: not read ({e})");
        } else if !self.gauges.is_empty() {
            let g: Vec<String> = self
                .gauges
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect();
            println!("    query gauges: {}", g.join(", "));
        }
    }
}
