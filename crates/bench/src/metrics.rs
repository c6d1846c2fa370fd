//! Reading a relay's own figures: a minimal HTTP/1.1 GET for its Prometheus
//! `/metrics` page (a text scrape needs no HTTP library), a parser for the
//! Prometheus text format, a process's memory from `/proc/<pid>/status` and
//! its CPU time from `/proc/<pid>/stat`. Responses are capped at
//! `MAX_RESPONSE_BYTES`.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const MAX_RESPONSE_BYTES: u64 = 16 << 20;
const HTTP_TIMEOUT: Duration = Duration::from_secs(5);

/// One sample: the series (name with its labels, as the page spells it) and its value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub series: String,
    pub value: f64,
}

/// `GET url` over plain HTTP/1.1; returns the body of a 200 response.
pub async fn http_get(url: &str) -> anyhow::Result<String> {
    tokio::time::timeout(HTTP_TIMEOUT, http_get_inner(url))
        .await
        .with_context(|| format!("GET {url} timed out"))?
}

async fn http_get_inner(url: &str) -> anyhow::Result<String> {
    let rest = url
        .strip_prefix("http://")
        .with_context(|| format!("not an http:// URL: {url}"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let addr = if authority.contains(':') {
        authority.to_owned()
    } else {
        format!("{authority}:80")
    };
    let mut stream = TcpStream::connect(&addr)
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut raw = Vec::new();
    stream
        .take(MAX_RESPONSE_BYTES)
        .read_to_end(&mut raw)
        .await?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .context("no end of HTTP headers")?;
    let status = head.lines().next().unwrap_or_default();
    if !status.contains(" 200") {
        bail!("GET {url}: {status}");
    }
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    Ok(if chunked {
        dechunk(body)?
    } else {
        body.to_owned()
    })
}

fn dechunk(mut body: &str) -> anyhow::Result<String> {
    let mut out = String::new();
    loop {
        let (size_line, rest) = body.split_once("\r\n").context("bad chunk header")?;
        let size_hex = size_line.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_hex, 16).context("bad chunk size")?;
        if size == 0 {
            return Ok(out);
        }
        out.push_str(rest.get(..size).context("truncated chunk")?);
        body = rest.get(size + 2..).context("truncated chunk")?;
    }
}

/// Parses the Prometheus text exposition format; comments and malformed
/// lines are skipped.
pub fn parse_prometheus(text: &str) -> Vec<Sample> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Sample> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    // The value follows the series; labels may contain spaces inside quotes.
    let series_end = match line.find('{') {
        Some(open) => open + line[open..].find('}')? + 1,
        None => line.find(char::is_whitespace)?,
    };
    let series = &line[..series_end];
    let value = line[series_end..].split_whitespace().next()?.parse().ok()?;
    let name = series.split('{').next()?.to_owned();
    Some(Sample {
        name,
        series: series.to_owned(),
        value,
    })
}

/// The declared type of each metric (`# TYPE name gauge` gives `name` ->
/// `gauge`).
pub fn metric_types(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| {
            let mut parts = l.trim().strip_prefix("# TYPE ")?.split_whitespace();
            Some((parts.next()?.to_owned(), parts.next()?.to_owned()))
        })
        .collect()
}

/// Whether a sample named `name` is a gauge: declared so, or undeclared and
/// not named like a counter or a histogram's parts.
pub fn is_gauge(types: &BTreeMap<String, String>, name: &str) -> bool {
    match types.get(name) {
        Some(t) => t == "gauge",
        None => !["_total", "_bucket", "_sum", "_count", "_created"]
            .iter()
            .any(|s| name.ends_with(s)),
    }
}

/// The value of the first series named exactly `name`.
pub fn first_value(samples: &[Sample], name: &str) -> Option<f64> {
    samples.iter().find(|s| s.name == name).map(|s| s.value)
}

/// The relay's resident memory from its /metrics, under the first of the usual names.
pub fn resident_memory(samples: &[Sample]) -> Option<(String, f64)> {
    [
        "sluice_process_resident_memory_bytes",
        "process_resident_memory_bytes",
    ]
    .iter()
    .find_map(|n| first_value(samples, n).map(|v| ((*n).to_owned(), v)))
}

/// Memory of a process from /proc/<pid>/status, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ProcMemory {
    pub rss_bytes: u64,
    /// Anonymous resident memory (heap and stacks), without file-backed
    /// pages such as an LMDB map.
    pub rss_anon_bytes: Option<u64>,
}

pub fn proc_memory(pid: u32) -> anyhow::Result<ProcMemory> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    parse_proc_status(&text).with_context(|| format!("no VmRSS in {path}"))
}

fn parse_proc_status(text: &str) -> Option<ProcMemory> {
    let kb = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
            .map(|v| v * 1024)
    };
    Some(ProcMemory {
        rss_bytes: kb("VmRSS:")?,
        rss_anon_bytes: kb("RssAnon:"),
    })
}

/// Clock ticks per second in `/proc/<pid>/stat` (Linux's `USER_HZ`, 100 on
/// every architecture this runs on).
const USER_HZ: f64 = 100.0;

/// User plus system CPU seconds a process has used so far, all its threads
/// together, from `/proc/<pid>/stat`.
pub fn proc_cpu_secs(pid: u32) -> anyhow::Result<f64> {
    let path = format!("/proc/{pid}/stat");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let ticks = parse_stat_cpu_ticks(&text).with_context(|| format!("no utime/stime in {path}"))?;
    Ok(ticks as f64 / USER_HZ)
}

/// utime + stime (fields 14 and 15) of a `/proc/<pid>/stat` line, in clock
/// ticks. The command name (field 2) is in parentheses and may hold spaces
/// and parentheses, so fields are counted from the last `)`.
pub fn parse_stat_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = stat.get(stat.rfind(')')? + 1..)?;
    let mut fields = rest.split_whitespace().skip(11); // fields 3..=13
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_lines_parse() {
        let text = "# HELP x y\n# TYPE x gauge\nprocess_resident_memory_bytes 1.5e6\n\
                    sluice_throttle_delay_ms{direction=\"write\",note=\"a b\"} 12 1700000000\n\
                    bad line here\n";
        let s = parse_prometheus(text);
        assert_eq!(s.len(), 2);
        assert_eq!(
            first_value(&s, "process_resident_memory_bytes"),
            Some(1.5e6)
        );
        assert_eq!(s[1].name, "sluice_throttle_delay_ms");
        assert_eq!(
            s[1].series,
            "sluice_throttle_delay_ms{direction=\"write\",note=\"a b\"}"
        );
        assert_eq!(s[1].value, 12.0);
        assert_eq!(
            resident_memory(&s),
            Some(("process_resident_memory_bytes".into(), 1.5e6))
        );
    }

    #[test]
    fn gauges_are_told_from_counters() {
        let text = "# TYPE q_in_flight gauge\n# TYPE q_total counter\n# TYPE q_seconds histogram\n\
                    q_in_flight 2\nq_total 5\nq_seconds_sum 1\nq_other 3\n";
        let types = metric_types(text);
        assert_eq!(types["q_in_flight"], "gauge");
        let gauges: Vec<String> = parse_prometheus(text)
            .into_iter()
            .filter(|s| is_gauge(&types, &s.name))
            .map(|s| s.name)
            .collect();
        assert_eq!(gauges, vec!["q_in_flight", "q_other"]);
    }

    #[test]
    fn chunked_bodies_decode() {
        assert_eq!(
            dechunk("5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n").unwrap(),
            "hello world"
        );
    }

    #[test]
    fn proc_status_parses() {
        let m = parse_proc_status("Name:\tx\nVmRSS:\t  2048 kB\nRssAnon:\t 1024 kB\n").unwrap();
        assert_eq!(
            m,
            ProcMemory {
                rss_bytes: 2048 * 1024,
                rss_anon_bytes: Some(1024 * 1024)
            }
        );
        assert!(proc_memory(std::process::id()).unwrap().rss_bytes > 0);
    }

    #[test]
    fn proc_stat_cpu_parses() {
        // A command name with a space and a parenthesis, as the kernel writes it.
        let line = "4242 (my (relay) x) S 1 4242 4242 0 -1 4194560 900 0 0 0 \
                    1234 567 0 0 20 0 9 0 100 1000000 200 18446744073709551615";
        assert_eq!(parse_stat_cpu_ticks(line), Some(1234 + 567));
        assert_eq!(parse_stat_cpu_ticks("1 (x) S 1 2 3"), None);
        assert_eq!(parse_stat_cpu_ticks("no parenthesis"), None);
        assert!(proc_cpu_secs(std::process::id()).unwrap() >= 0.0);
        assert!(proc_cpu_secs(u32::MAX).is_err());
    }
}
