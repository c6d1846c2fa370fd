//! Redis high availability through Sentinel (`cluster.sentinels`): the
//! primary is the one the Sentinels name (`SENTINEL
//! get-master-addr-by-name`). The node asks them at start, whenever a Redis
//! command fails (a failover shows first as errors), and every few
//! seconds; and it listens on every Sentinel for `+switch-master`, which
//! they publish once a failover is done. A change moves
//! [`Shared::set_primary`]'s generation: the tasks drop their connections
//! and reconnect to the new primary, and a repair runs.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio_util::task::TaskTracker;

use crate::Shared;
use crate::metrics_names as m;

/// Ask the Sentinels at least this often, even without an error.
const ASK_EVERY: Duration = Duration::from_secs(5);
/// And at most this often (errors come in bursts).
const ASK_GAP: Duration = Duration::from_millis(200);
/// A subscription that heard nothing for this long is made again (a
/// Sentinel behind a silent partition never closes it).
const RESUBSCRIBE: Duration = Duration::from_secs(30);

pub(crate) fn spawn(tracker: &TaskTracker, sh: Arc<Shared>) {
    for s in &sh.cfg.sentinels {
        tracker.spawn(listen(sh.clone(), s.clone()));
    }
    tracker.spawn(ask_loop(sh));
}

/// The primary's URL: `template`'s scheme, user, password and database,
/// with `addr` (`host:port`, as the Sentinels name it) as host and port.
pub(crate) fn primary_url(template: &str, addr: &str) -> String {
    let rest = template.strip_prefix("redis://").unwrap_or("");
    let (auth, rest) = match rest.rfind('@') {
        Some(at) => (&rest[..=at], &rest[at + 1..]),
        None => ("", rest),
    };
    let path = rest.find(['/', '?']).map(|i| &rest[i..]).unwrap_or("");
    let addr = match addr.rsplit_once(':') {
        // An IPv6 address, unbracketed as Sentinel sends it.
        Some((host, port)) if host.contains(':') && !host.starts_with('[') => {
            format!("[{host}]:{port}")
        }
        _ => addr.to_string(),
    };
    format!("redis://{auth}{addr}{path}")
}

/// A Sentinel's URL, with `cluster.sentinel_password`.
fn sentinel_url(sh: &Shared, sentinel: &str) -> String {
    if sh.cfg.sentinel_password.is_empty() {
        return format!("redis://{sentinel}");
    }
    let pw: String = sh
        .cfg
        .sentinel_password
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    format!("redis://:{pw}@{sentinel}")
}

fn timeouts(sh: &Shared) -> redis::AsyncConnectionConfig {
    let t = Duration::from_millis(sh.cfg.redis_timeout_ms);
    redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(t))
        .set_response_timeout(Some(t))
}

/// Asks the Sentinels, in order, for the primary's address; the first
/// answer wins.
async fn ask(sh: &Shared) -> Option<String> {
    for s in &sh.cfg.sentinels {
        let answer: redis::RedisResult<Option<(String, u16)>> = async {
            let client = redis::Client::open(sentinel_url(sh, s))?;
            let mut c = client
                .get_multiplexed_async_connection_with_config(&timeouts(sh))
                .await?;
            redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(&sh.cfg.sentinel_master)
                .query_async(&mut c)
                .await
        }
        .await;
        match answer {
            Ok(Some((host, port))) => {
                metrics::counter!(m::CLUSTER_SENTINEL_EVENTS_TOTAL, "kind" => "asked").increment(1);
                return Some(format!("{host}:{port}"));
            }
            Ok(None) => {
                metrics::counter!(m::CLUSTER_SENTINEL_EVENTS_TOTAL, "kind" => "error").increment(1);
                tracing::warn!(sentinel = %s, master = %sh.cfg.sentinel_master, "cluster: the Sentinel does not know this master (cluster.sentinel_master)");
            }
            Err(e) => {
                metrics::counter!(m::CLUSTER_SENTINEL_EVENTS_TOTAL, "kind" => "error").increment(1);
                tracing::debug!(sentinel = %s, error = %e, "cluster: Sentinel unreachable");
            }
        }
    }
    None
}

async fn ask_loop(sh: Arc<Shared>) {
    let mut warned = false;
    loop {
        // Each Sentinel unreachable costs a connection timeout: a shutdown
        // does not wait for them.
        let answer = tokio::select! {
            biased;
            _ = sh.stop.cancelled() => return,
            a = ask(&sh) => a,
        };
        match answer {
            Some(addr) => {
                warned = false;
                sh.set_primary(&addr, "asked");
            }
            None if !warned => {
                warned = true;
                tracing::error!(
                    sentinels = ?sh.cfg.sentinels,
                    "cluster: no Sentinel answered; staying with the last primary known"
                );
            }
            None => {}
        }
        tokio::select! {
            biased;
            _ = sh.stop.cancelled() => return,
            _ = sh.sentinel_wake.notified() => {}
            _ = tokio::time::sleep(ASK_EVERY) => {}
        }
        tokio::select! {
            _ = sh.stop.cancelled() => return,
            _ = tokio::time::sleep(ASK_GAP) => {}
        }
    }
}

/// The new primary in a `+switch-master` message (`name old-ip old-port
/// new-ip new-port`), if it is about this cluster's master.
pub(crate) fn switched_to(payload: &str, master: &str) -> Option<String> {
    let parts: Vec<&str> = payload.split_whitespace().collect();
    match parts.as_slice() {
        [name, _, _, ip, port] if *name == master => Some(format!("{ip}:{port}")),
        _ => None,
    }
}

/// Listens on one Sentinel for `+switch-master`; reconnects when it goes.
async fn listen(sh: Arc<Shared>, sentinel: String) {
    let mut backoff = Duration::from_millis(200);
    while !sh.stop.is_cancelled() {
        let sub = async {
            let client = redis::Client::open(sentinel_url(&sh, &sentinel))?;
            let mut ps = client.get_async_pubsub().await?;
            ps.subscribe("+switch-master").await?;
            redis::RedisResult::Ok(ps)
        };
        let sub = tokio::select! {
            _ = sh.stop.cancelled() => return,
            r = tokio::time::timeout(Duration::from_millis(sh.cfg.redis_timeout_ms) * 2, sub) => r,
        };
        let mut ps = match sub {
            Ok(Ok(ps)) => ps,
            _ => {
                tokio::select! {
                    _ = sh.stop.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        backoff = Duration::from_millis(200);
        let mut msgs = ps.on_message();
        loop {
            let msg = tokio::select! {
                _ = sh.stop.cancelled() => return,
                m = tokio::time::timeout(RESUBSCRIBE, msgs.next()) => m,
            };
            let Ok(Some(msg)) = msg else { break };
            let Ok(payload) = msg.get_payload::<String>() else {
                continue;
            };
            metrics::counter!(m::CLUSTER_SENTINEL_EVENTS_TOTAL, "kind" => "switch").increment(1);
            if let Some(addr) = switched_to(&payload, &sh.cfg.sentinel_master) {
                sh.set_primary(&addr, "+switch-master");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_primary_url_keeps_the_password_and_database() {
        assert_eq!(
            primary_url("redis://:s3cret@ignored:1/2", "10.0.0.3:6380"),
            "redis://:s3cret@10.0.0.3:6380/2"
        );
        assert_eq!(
            primary_url("redis://127.0.0.1:6379", "10.0.0.3:6379"),
            "redis://10.0.0.3:6379"
        );
        assert_eq!(primary_url("redis://h", "::1:6379"), "redis://[::1]:6379");
    }

    #[test]
    fn a_switch_is_read_for_this_master_only() {
        assert_eq!(
            switched_to("sluice 10.0.0.2 6379 10.0.0.3 6379", "sluice").as_deref(),
            Some("10.0.0.3:6379")
        );
        assert_eq!(switched_to("other 1.1.1.1 1 2.2.2.2 2", "sluice"), None);
    }

    #[test]
    fn the_sentinel_keys_are_checked_by_name() {
        let base = crate::ClusterConfig {
            enabled: true,
            ..Default::default()
        };
        let with = |f: &dyn Fn(&mut crate::ClusterConfig)| {
            let mut c = base.clone();
            f(&mut c);
            c.validate()
        };
        let e = with(&|c| c.sentinels = vec!["10.0.0.5:26379".into()]).unwrap_err();
        assert!(e.contains("cluster.sentinel_master"), "{e}");
        let e = with(&|c| c.sentinel_master = "m".into()).unwrap_err();
        assert!(e.contains("cluster.sentinels"), "{e}");
        let e = with(&|c| {
            c.sentinels = vec!["nohost".into()];
            c.sentinel_master = "m".into();
        })
        .unwrap_err();
        assert!(e.contains("cluster.sentinels"), "{e}");
        let e = with(&|c| {
            c.sentinels = vec!["s:26379".into()];
            c.sentinel_master = "m".into();
            c.redis_url = "unix:///run/redis.sock".into();
        })
        .unwrap_err();
        assert!(
            e.contains("cluster.redis_url") && e.contains("sentinels"),
            "{e}"
        );
        assert!(
            with(&|c| {
                c.sentinels = vec!["s1:26379".into(), "[::1]:26379".into()];
                c.sentinel_master = "m".into();
            })
            .is_ok()
        );
    }
}
