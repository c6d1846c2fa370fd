//! Partitions and Redis failover, black box: every Sluice node, every
//! Redis server and every Sentinel in a network namespace of its own
//! (tests/support/netns.rs), the test talking to the nodes through the
//! bridge. A history of what the clients saw (every `OK true`, every
//! NIP-09 deletion, every NIP-62 vanish) is checked against each node's
//! full id set after the faults heal: nothing acknowledged missing,
//! nothing deleted or vanished present. The checker reads the history and
//! the nodes' answers, never the implementation.
//!
//! - the Redis primary SIGKILLed (Sentinel fails over to the replica)
//!   while three nodes take EVENTs: cross-node live delivery resumes
//!   within 10 s of the kill, and every acknowledged event is on every node
//!   within 30 s (`SLUICE_FAILOVER_ROUNDS`, default 2; `SLUICE_FAILOVER_RATE`
//!   EVENTs/s in all, default 50; crates/bench/scripts/failover.sh runs 20);
//! - one node cut from Redis and its peers while both sides publish, with
//!   a deletion and a vanish on the other side: healed within seconds;
//! - one node cut from its peers while Redis reaches every node; two nodes
//!   cut at once, healed one after the other; one node cut from everything
//!   while the Sentinels fail over without it; one node paused (SIGSTOP)
//!   past its heartbeat: each healed within 10 s;
//! - leased budgets: Redis cut from all three nodes while one address
//!   floods them all: the EVENTs accepted during the outage stay within
//!   1.3 × one node's limit over it (`SLUICE_LEASE_OUTAGE_SECS`, default
//!   10; crates/bench/scripts/lease.sh runs 30).
//!
//! Needs root, `ip` and `redis-server`; elsewhere skipped with the reason,
//! unless `PARTITION_TESTS_REQUIRE` is set (`.ci/run` sets it).

#[path = "support/netns.rs"]
mod netns;
#[path = "support/mod.rs"]
mod support;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use netns::{Host, Net, Proc};
use serde_json::{Value, json};
use sluice_proto::Event;
use support::{Client, ev, http_get, key, now};

/// What the clients saw.
#[derive(Default)]
struct History {
    /// Every `OK true`: id → (author, created_at).
    acked: HashMap<String, (String, u64)>,
    /// Ids a deletion the relay accepted named.
    deleted: HashSet<String>,
    /// Vanish requests accepted: (author, created_at).
    vanished: Vec<(String, u64)>,
}

impl History {
    fn ok(&mut self, e: &Event) {
        let v: Value = serde_json::from_str(e.raw()).unwrap();
        let author = v["pubkey"].as_str().unwrap().to_string();
        let at = v["created_at"].as_u64().unwrap();
        match v["kind"].as_u64() {
            Some(62) => self.vanished.push((author, at)),
            kind => {
                if kind == Some(5) {
                    for t in v["tags"].as_array().unwrap() {
                        if t[0] == "e" {
                            self.deleted.insert(t[1].as_str().unwrap().to_string());
                        }
                    }
                }
                self.acked.insert(e.id_hex(), (author, at));
            }
        }
    }

    /// What is wrong with a node holding `ids`.
    fn check(&self, ids: &HashSet<String>) -> Vec<String> {
        let mut bad = Vec::new();
        for (id, (author, at)) in &self.acked {
            let gone = self.deleted.contains(id)
                || self.vanished.iter().any(|(a, t)| a == author && at <= t);
            match (gone, ids.contains(id)) {
                (false, false) => bad.push(format!("acknowledged {id} missing")),
                (true, true) => bad.push(format!("deleted or vanished {id} present")),
                _ => {}
            }
        }
        bad.sort();
        bad
    }
}

/// Every event id the node at `url` serves (REQ pages of 5,000 by
/// `until`).
async fn all_ids(url: &str) -> HashSet<String> {
    let mut c = Client::connect(url).await;
    let mut ids = HashSet::new();
    let mut until = now() + 3600;
    for page in 0.. {
        let events = c
            .req(
                &format!("all{page}"),
                &[json!({"limit": 5000, "until": until})],
            )
            .await;
        let mut oldest = until;
        let mut fresh = 0;
        for raw in &events {
            let v: Value = serde_json::from_str(raw).unwrap();
            oldest = oldest.min(v["created_at"].as_u64().unwrap());
            fresh += ids.insert(v["id"].as_str().unwrap().to_string()) as usize;
        }
        if events.len() < 5000 || fresh == 0 {
            break;
        }
        until = oldest;
    }
    ids
}

/// Waits until every node passes the checker; the time it took, or the
/// problems after `limit`.
async fn converge(history: &Mutex<History>, urls: &[String], limit: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let mut problems = Vec::new();
        for url in urls {
            let ids = all_ids(url).await;
            let bad = history.lock().unwrap().check(&ids);
            if !bad.is_empty() {
                problems.push(format!(
                    "{url}: {} problems, e.g. {:?}",
                    bad.len(),
                    &bad[..bad.len().min(3)]
                ));
            }
        }
        if problems.is_empty() {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < limit,
            "not converged in {limit:?}: {problems:#?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn repair_key_hex() -> String {
    hex::encode(key(99))
}

/// The body of `[throttle]` for a node without limits.
const THROTTLE_OFF: &str = "mode = \"off\"\n";

/// Nodes a, b and c on `hosts`, each with `cluster` (the Redis or
/// Sentinel lines) and `throttle` as the body of `[throttle]`.
fn three_nodes(net: &Net, hosts: &[Host], cluster: &str, throttle: &str) -> Vec<Proc> {
    ["a", "b", "c"]
        .iter()
        .zip(hosts)
        .map(|(name, h)| netns::node(net, h, name, &node_toml_throttled(name, cluster, throttle)))
        .collect()
}

/// A node's config: through the Sentinels, or one Redis; no throttle.
fn node_toml(name: &str, redis: &str) -> String {
    node_toml_throttled(name, redis, THROTTLE_OFF)
}

/// A node's config with `throttle` as the body of `[throttle]`; the test
/// (on the bridge) reads /metrics.
fn node_toml_throttled(name: &str, redis: &str, throttle: &str) -> String {
    format!(
        "[cluster]\nenabled = true\nnode_id = \"{name}\"\nredis_timeout_ms = 500\n\
         repair_secret_key = \"{}\"\n{redis}\n\
         [metrics]\nallow_from = [\"10.0.0.0/8\"]\n\
         [server]\nmax_pending_writes = 1000\n[throttle]\n{throttle}",
        repair_key_hex()
    )
}

fn url(h: &Host) -> String {
    format!("ws://{}:7000", h.ip)
}

/// Publishes on each of `nodes` in turn, `rate` EVENTs/s in all, until
/// `stop`; records every `OK true`.
fn load(
    nodes: &[Host],
    rate: u32,
    stop: Arc<AtomicBool>,
    history: Arc<Mutex<History>>,
    tag: &str,
) -> Vec<tokio::task::JoinHandle<()>> {
    let per = Duration::from_secs_f64(nodes.len() as f64 / rate.max(1) as f64);
    nodes
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let (url, stop, history, tag) =
                (url(h), stop.clone(), history.clone(), tag.to_string());
            tokio::spawn(async move {
                let mut c = Client::connect(&url).await;
                let mut tick = tokio::time::interval(per);
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    tick.tick().await;
                    n += 1;
                    let e = ev(
                        20 + i as u8,
                        now(),
                        1,
                        &[&["t", &tag]],
                        &format!("{tag} {i} {n}"),
                    );
                    let (ok, why) = c.publish(&e).await;
                    assert!(ok, "{url}: {why}");
                    history.lock().unwrap().ok(&e);
                }
            })
        })
        .collect()
}

/// The `[cluster]` lines that find Redis through `sentinels`.
fn via_sentinels(sentinels: &[Host]) -> String {
    let list: Vec<String> = sentinels
        .iter()
        .map(|h| format!("\"{}:26379\"", h.ip))
        .collect();
    format!(
        "sentinels = [{}]\nsentinel_master = \"sluice\"",
        list.join(", ")
    )
}

/// A Redis primary and its replica, three Sentinels watching them, and
/// namespaces for three nodes (not started): the failover tests' setup.
struct Sentinelled {
    net: Net,
    /// The primary, then the replica.
    r: Vec<Host>,
    s: Vec<Host>,
    n: Vec<Host>,
    redis: Vec<Proc>,
    sentinels: Vec<Proc>,
    /// The nodes' `[cluster]` lines: through the Sentinels.
    via: String,
}

impl Sentinelled {
    async fn start() -> Sentinelled {
        let mut net = Net::new();
        let r: Vec<Host> = (0..2).map(|_| net.host()).collect();
        let s: Vec<Host> = (0..3).map(|_| net.host()).collect();
        let n: Vec<Host> = (0..3).map(|_| net.host()).collect();
        let redis: Vec<Proc> = vec![
            netns::redis(&net, &r[0], None),
            netns::redis(&net, &r[1], Some(&r[0])),
        ];
        let sentinels: Vec<Proc> = s.iter().map(|h| netns::sentinel(&net, h, &r[0])).collect();
        wait_for(
            "the Sentinels see the replica",
            Duration::from_secs(30),
            || sentinels_settled(&s, &r[0], 1),
        )
        .await;
        let via = via_sentinels(&s);
        Sentinelled {
            net,
            r,
            s,
            n,
            redis,
            sentinels,
            via,
        }
    }
}

/// Whether every Sentinel names `primary` and sees every replica healthy
/// (so that the next failover can happen).
fn sentinels_settled(sentinels: &[Host], primary: &Host, replicas: usize) -> bool {
    sentinels.iter().all(|s| {
        let named = netns::redis_cli(
            &s.ip,
            26379,
            &["SENTINEL", "get-master-addr-by-name", "sluice"],
        );
        let reps = netns::redis_cli(&s.ip, 26379, &["SENTINEL", "replicas", "sluice"]);
        let lines: Vec<&str> = reps.lines().collect();
        let flags: Vec<&str> = lines
            .windows(2)
            .filter(|w| w[0] == "flags")
            .map(|w| w[1])
            .collect();
        named.lines().next() == Some(primary.ip.as_str())
            && flags.len() == replicas
            && flags.iter().all(|f| *f == "slave")
    })
}

async fn wait_for(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let started = Instant::now();
    while !cond() {
        assert!(started.elapsed() < limit, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn readyz(h: &Host) -> String {
    http_get(&format!("{}:7000", h.ip), "/readyz", None).await.2
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_follows_a_sentinel_failover() {
    if !netns::available() {
        return;
    }
    let env = |k: &str, d: u32| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let rounds = env("SLUICE_FAILOVER_ROUNDS", 2);
    let rate = env("SLUICE_FAILOVER_RATE", 50);
    let Sentinelled {
        net,
        r,
        s,
        n,
        mut redis,
        sentinels: _sentinels,
        via,
    } = Sentinelled::start().await;
    let nodes: Vec<Proc> = three_nodes(&net, &n, &via, THROTTLE_OFF);
    for h in &n {
        let want = format!("Redis primary {}:6379", r[0].ip);
        let mut last = String::new();
        let started = Instant::now();
        while !last.contains(&want) {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "/readyz: {last}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
            last = readyz(h).await;
        }
    }
    let history = Arc::new(Mutex::new(History::default()));
    let urls: Vec<String> = n.iter().map(url).collect();
    let mut watcher = Client::connect(&urls[0]).await;
    watcher
        .send(json!(["REQ", "probe", {"kinds": [1], "#t": ["probe"], "limit": 0}]))
        .await;
    assert_eq!(watcher.recv().await[0], "EOSE");
    let mut prober = Client::connect(&urls[1]).await;
    let mut primary = 0;
    let mut results = Vec::new();
    for round in 0..rounds {
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = load(
            &n,
            rate,
            stop.clone(),
            history.clone(),
            &format!("load{round}"),
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        // The fault.
        let killed = Instant::now();
        redis[primary].kill();
        // Probes published on b after the kill, until one reaches a.
        let mut probes = HashSet::new();
        let mut i = 0;
        let resumed = 'resume: loop {
            assert!(
                killed.elapsed() < Duration::from_secs(10),
                "round {round}: cross-node delivery did not resume within 10 s of the kill\n{}",
                nodes[0].log_text()
            );
            i += 1;
            let p = ev(
                30,
                now(),
                1,
                &[&["t", "probe"]],
                &format!("probe {round} {i}"),
            );
            let (ok, why) = prober.publish(&p).await;
            assert!(ok, "{why}");
            history.lock().unwrap().ok(&p);
            probes.insert(p.id_hex());
            let until = Instant::now() + Duration::from_millis(250);
            while let Some(m) = watcher
                .try_recv(until.saturating_duration_since(Instant::now()))
                .await
            {
                if m[0] == "EVENT" && m[2]["id"].as_str().is_some_and(|id| probes.contains(id)) {
                    break 'resume killed.elapsed();
                }
            }
        };
        tokio::time::sleep(Duration::from_secs(2)).await;
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            t.await.unwrap();
        }
        let healed = converge(
            &history,
            &urls,
            Duration::from_secs(30).saturating_sub(killed.elapsed()),
        )
        .await;
        let complete = killed.elapsed();
        let new = 1 - primary;
        for h in &n {
            let body = readyz(h).await;
            assert!(
                body.contains(&format!("Redis primary {}:6379", r[new].ip)),
                "{body}"
            );
        }
        eprintln!(
            "failover round {}: delivery resumed {:.2} s after the kill; every acknowledged \
             event on every node {:.2} s after it ({} acknowledged in all)",
            round + 1,
            resumed.as_secs_f64(),
            complete.as_secs_f64(),
            history.lock().unwrap().acked.len()
        );
        let _ = healed;
        results.push(resumed);
        // The killed server comes back as the new primary's replica, for
        // the next round.
        if round + 1 < rounds {
            redis[primary] = netns::redis(&net, &r[primary], Some(&r[new]));
            wait_for(
                "the old primary back as a replica",
                Duration::from_secs(40),
                || {
                    netns::redis_cli(&r[primary].ip, 6379, &["INFO", "replication"])
                        .contains("master_link_status:up")
                        && sentinels_settled(&s, &r[new], 1)
                },
            )
            .await;
        }
        primary = new;
    }
    assert_eq!(results.len(), rounds as usize);
    drop(nodes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_from_redis_and_its_peers_heals_in_seconds() {
    if !netns::available() {
        return;
    }
    let mut net = Net::new();
    let r = net.host();
    let n: Vec<Host> = (0..3).map(|_| net.host()).collect();
    let _redis = netns::redis(&net, &r, None);
    let to = format!("redis_url = \"redis://{}:6379\"", r.ip);
    let _nodes: Vec<Proc> = three_nodes(&net, &n, &to, THROTTLE_OFF);
    let urls: Vec<String> = n.iter().map(url).collect();
    let history = Mutex::new(History::default());
    let mut a = Client::connect(&urls[0]).await;
    let mut c = Client::connect(&urls[2]).await;
    let at = now() - 10;
    // Before: authors 11 and 12 publish on a, all nodes have it.
    let mut before = Vec::new();
    for i in 0..20 {
        for author in [11, 12] {
            let e = ev(author, at, 1, &[], &format!("before {author} {i}"));
            let (ok, why) = a.publish(&e).await;
            assert!(ok, "{why}");
            history.lock().unwrap().ok(&e);
            before.push(e);
        }
    }
    converge(&history, &urls, Duration::from_secs(20)).await;
    // The fault: c loses Redis and both peers; the test still reaches it.
    net.cut_from(&n[2], &[&r, &n[0], &n[1]]);
    let publish = async |client: &mut Client, e: Event| {
        let (ok, why) = client.publish(&e).await;
        assert!(ok, "{why}");
        history.lock().unwrap().ok(&e);
    };
    for i in 0..20 {
        publish(&mut c, ev(13, now(), 1, &[], &format!("cut side {i}"))).await;
        publish(&mut a, ev(14, now(), 1, &[], &format!("majority side {i}"))).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // On a's side: author 11 deletes 5 of its events, author 12 vanishes.
    let ids: Vec<String> = before
        .iter()
        .filter(|e| e.raw().contains("before 11 "))
        .take(5)
        .map(|e| e.id_hex())
        .collect();
    let tags: Vec<[&str; 2]> = ids.iter().map(|id| ["e", id.as_str()]).collect();
    let tags: Vec<&[&str]> = tags.iter().map(|t| &t[..]).collect();
    publish(&mut a, ev(11, now(), 5, &tags, "")).await;
    publish(&mut a, ev(12, now(), 62, &[&["relay", "ALL_RELAYS"]], "")).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    net.heal_from(&n[2], &[&r, &n[0], &n[1]]);
    let healed = converge(&history, &urls, Duration::from_secs(20)).await;
    eprintln!(
        "partition: every node matches the history {:.2} s after the heal",
        healed.as_secs_f64()
    );
    assert!(healed < Duration::from_secs(10), "healed in {healed:?}");
}

/// A node whose Redis and Sentinels hang (SIGSTOP: connections open, no
/// answer), with a client publishing, stops promptly on SIGTERM: no task
/// waits out its Redis timeouts, let alone one after the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_redis_and_sentinels_hang_stops_promptly() {
    if !netns::available() {
        return;
    }
    let mut net = Net::new();
    let r = net.host();
    let s: Vec<Host> = (0..3).map(|_| net.host()).collect();
    let n = net.host();
    let redis = netns::redis(&net, &r, None);
    let sentinels: Vec<Proc> = s.iter().map(|h| netns::sentinel(&net, h, &r)).collect();
    let via = via_sentinels(&s);
    // Redis timeouts of 2 s: waited out one after the other (a Sentinel,
    // the next, the next), they would hold the exit for 6 s and more.
    let toml = node_toml("a", &via).replace("redis_timeout_ms = 500", "redis_timeout_ms = 2000");
    let mut node = netns::node(&net, &n, "a", &toml);
    let want = format!("Redis primary {}:6379", r.ip);
    let started = Instant::now();
    while !readyz(&n).await.contains(&want) {
        assert!(started.elapsed() < Duration::from_secs(20), "no primary");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut c = Client::connect(&url(&n)).await;
    redis.signal("STOP");
    for p in &sentinels {
        p.signal("STOP");
    }
    // The node's client still publishes while its Redis commands time out.
    for i in 0..20 {
        let (ok, why) = c
            .publish(&ev(21, now(), 1, &[], &format!("hung {i}")))
            .await;
        assert!(ok, "{why}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The client leaves first: with a client that does not answer the
    // close, the relay waits `server.shutdown_grace_ms` (5 s) for it.
    drop(c);
    let took = node.terminate(Duration::from_secs(30));
    eprintln!("shutdown with Redis and the Sentinels hung: {took:?}");
    redis.signal("CONT");
    for p in &sentinels {
        p.signal("CONT");
    }
    // The publisher's last flush is bounded by one `redis_timeout_ms`;
    // every other wait on Redis or a Sentinel ends at the stop.
    let took = took.expect("the node did not exit within 30 s of SIGTERM");
    assert!(took < Duration::from_secs(4), "exit took {took:?}");
}

/// One series of a node's /metrics (summed over its labels), if present.
async fn metric(h: &Host, name: &str) -> Option<f64> {
    let (status, _, body) = http_get(&format!("{}:7000", h.ip), "/metrics", None).await;
    assert_eq!(status, 200, "/metrics on {}: {body}", h.ip);
    support::series_sum(&body, name, &[])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_while_redis_is_unreachable_takes_about_one_node_s_limit() {
    if !netns::available() {
        return;
    }
    // The outage (crates/bench/scripts/lease.sh runs 30 s).
    let outage = Duration::from_secs(
        std::env::var("SLUICE_LEASE_OUTAGE_SECS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(10),
    );
    // One per-address bucket, global: 20 EVENTs/s, an active pool of
    // 250 ms (5 EVENTs), no catch-up (burst_ratio 1), a debt cap of 10
    // minutes (what the reconcile's lag lets through is owed, not lost).
    let rate = 20.0;
    let pool = rate * 0.25;
    let throttle = "mode = \"enforce\"\n\
        [throttle.clients.events_per_ip]\nrate_per_s = 20.0\nburst_ratio = 1.0\n\
        window_ms = 250\ncatch_up_ms = 600000\n\
        [throttle.clients.events_per_pubkey]\nrate_per_s = 100000.0\nburst_ratio = 1.0\n\
        window_ms = 1000\ncatch_up_ms = 0\n";
    let mut net = Net::new();
    let r = net.host();
    let n: Vec<Host> = (0..3).map(|_| net.host()).collect();
    let _redis = netns::redis(&net, &r, None);
    let to = format!("redis_url = \"redis://{}:6379\"", r.ip);
    let _nodes: Vec<Proc> = three_nodes(&net, &n, &to, throttle);
    // Every node has seen the three heartbeats: a lease divides by 3.
    let started = Instant::now();
    for h in &n {
        while metric(h, "sluice_cluster_lease_nodes").await != Some(3.0) {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "{}: not 3 nodes",
                h.ip
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    // One address (the test, on the bridge) floods every node, each from
    // one connection; every answer is kept with the time its EVENT left.
    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let tasks: Vec<_> = n
        .iter()
        .enumerate()
        .map(|(k, h)| {
            let (url, stop) = (url(h), stop.clone());
            tokio::spawn(async move {
                let mut c = Client::connect(&url).await;
                let mut answers: Vec<(Duration, bool)> = Vec::new();
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let e = ev(70 + k as u8, now(), 1, &[], &format!("flood {k} {i}"));
                    let sent = t0.elapsed();
                    let (ok, why) = c.publish(&e).await;
                    assert!(ok || why.starts_with("rate-limited:"), "{url}: {why}");
                    answers.push((sent, ok));
                }
                answers
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let cut = t0.elapsed();
    net.cut_link(&r);
    tokio::time::sleep(outage).await;
    let healed = t0.elapsed();
    net.heal_link(&r);
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    let mut during = Vec::new();
    for t in tasks {
        let answers = t.await.unwrap();
        let out: Vec<bool> = answers
            .iter()
            .filter(|(at, _)| (cut..healed).contains(at))
            .map(|(_, ok)| *ok)
            .collect();
        during.push((
            out.iter().filter(|ok| **ok).count(),
            out.iter().filter(|ok| !**ok).count(),
        ));
    }
    let accepted: usize = during.iter().map(|(ok, _)| ok).sum();
    let secs = (healed - cut).as_secs_f64();
    // What one node's bucket alone lets through over the outage.
    let one = rate * secs + pool;
    eprintln!(
        "leases: Redis unreachable for {secs:.1} s, one address flooding 3 nodes: {accepted} \
         EVENTs accepted ({:.2} x one node's limit of {one:.0}); per node (accepted, refused) \
         {during:?}",
        accepted as f64 / one
    );
    for (k, (ok, refused)) in during.iter().enumerate() {
        assert!(
            *refused > 0,
            "node {k} refused nothing in the outage ({ok} accepted)"
        );
    }
    assert!(
        accepted as f64 <= 1.3 * one,
        "{accepted} accepted in a {secs:.1} s outage: more than 1.3 x one node's limit ({one:.0})"
    );
    // A share, not a lockout: together the nodes still take the rate.
    assert!(
        accepted as f64 >= 0.5 * rate * secs,
        "{accepted} accepted in a {secs:.1} s outage: far below the global rate"
    );
    // Counted, and back to the shared counters once Redis answers.
    for h in &n {
        assert!(metric(h, "sluice_cluster_leases_total").await >= Some(1.0));
        assert!(metric(h, "sluice_cluster_lease_ops_total").await > Some(0.0));
        let started = Instant::now();
        while metric(h, "sluice_cluster_lease_share").await != Some(1.0) {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "{}: still leasing after the heal",
                h.ip
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// Three nodes on one Redis, each in its namespace.
struct Three {
    net: Net,
    redis: Host,
    n: Vec<Host>,
    nodes: Vec<Proc>,
    urls: Vec<String>,
    history: Mutex<History>,
}

impl Three {
    fn start() -> Three {
        let mut net = Net::new();
        let redis = net.host();
        let n: Vec<Host> = (0..3).map(|_| net.host()).collect();
        let to = format!("redis_url = \"redis://{}:6379\"", redis.ip);
        let mut nodes = vec![netns::redis(&net, &redis, None)];
        nodes.extend(three_nodes(&net, &n, &to, THROTTLE_OFF));
        let urls = n.iter().map(url).collect();
        Three {
            net,
            redis,
            n,
            nodes,
            urls,
            history: Mutex::new(History::default()),
        }
    }

    async fn publish(&self, c: &mut Client, e: Event) -> Event {
        let (ok, why) = c.publish(&e).await;
        assert!(ok, "{why}");
        self.history.lock().unwrap().ok(&e);
        e
    }

    /// Before the fault: authors 11 and 12 publish 10 events each on
    /// `c`, and every node holds them.
    async fn seed(&self, c: &mut Client) -> Vec<Event> {
        let at = now() - 10;
        let mut before = Vec::new();
        for i in 0..10 {
            for author in [11, 12] {
                let e = ev(author, at, 1, &[], &format!("before {author} {i}"));
                before.push(self.publish(c, e).await);
            }
        }
        converge(&self.history, &self.urls, Duration::from_secs(20)).await;
        before
    }

    /// On each side (a client per side): `k` events by author 13 + side.
    async fn both_sides(&self, sides: &mut [&mut Client], k: usize) {
        for i in 0..k {
            for (s, c) in sides.iter_mut().enumerate() {
                let e = ev(13 + s as u8, now(), 1, &[], &format!("side {s} {i}"));
                self.publish(c, e).await;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Author 11 deletes 5 of its events (NIP-09) on `del`; author 12
    /// vanishes (NIP-62) on `van`.
    async fn delete_and_vanish(&self, del: &mut Client, van: &mut Client, before: &[Event]) {
        let ids: Vec<String> = before
            .iter()
            .filter(|e| e.raw().contains("before 11 "))
            .take(5)
            .map(|e| e.id_hex())
            .collect();
        let tags: Vec<[&str; 2]> = ids.iter().map(|id| ["e", id.as_str()]).collect();
        let tags: Vec<&[&str]> = tags.iter().map(|t| &t[..]).collect();
        self.publish(del, ev(11, now(), 5, &tags, "")).await;
        self.publish(van, ev(12, now(), 62, &[&["relay", "ALL_RELAYS"]], ""))
            .await;
    }

    /// Every node matches the history within 10 s of the heal.
    async fn converged(&self, what: &str) {
        let healed = converge(&self.history, &self.urls, Duration::from_secs(20)).await;
        eprintln!(
            "{what}: every node matches the history {:.2} s after the heal",
            healed.as_secs_f64()
        );
        assert!(
            healed < Duration::from_secs(10),
            "{what}: healed in {healed:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_reachable_from_a_node_whose_peers_are_not() {
    if !netns::available() {
        return;
    }
    let t = Three::start();
    let mut a = Client::connect(&t.urls[0]).await;
    let mut c = Client::connect(&t.urls[2]).await;
    let before = t.seed(&mut a).await;
    // c loses its peers, not Redis: the stream still carries both ways,
    // the repairs between them fail.
    t.net.cut_from(&t.n[2], &[&t.n[0], &t.n[1]]);
    t.both_sides(&mut [&mut a, &mut c], 15).await;
    t.delete_and_vanish(&mut c, &mut a, &before).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    t.net.heal_from(&t.n[2], &[&t.n[0], &t.n[1]]);
    t.converged("peers cut, Redis reachable").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_cut_at_once_heal_in_either_order() {
    if !netns::available() {
        return;
    }
    // The deletion is made on b's side, the vanish on c's; the sides come
    // back c first, then b first.
    for c_first in [true, false] {
        let t = Three::start();
        let mut a = Client::connect(&t.urls[0]).await;
        let mut b = Client::connect(&t.urls[1]).await;
        let mut c = Client::connect(&t.urls[2]).await;
        let before = t.seed(&mut a).await;
        // b and c each alone: no Redis, no peer; the test reaches all three.
        let (r, n) = (&t.redis, &t.n);
        t.net.cut_from(&n[1], &[r, &n[0], &n[2]]);
        t.net.cut_from(&n[2], &[r, &n[0], &n[1]]);
        t.both_sides(&mut [&mut a, &mut b, &mut c], 10).await;
        t.delete_and_vanish(&mut b, &mut c, &before).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (first, second) = if c_first { (2, 1) } else { (1, 2) };
        let rest = |i: usize| -> Vec<&Host> {
            std::iter::once(r)
                .chain((0..3).filter(|&j| j != i).map(|j| &n[j]))
                .collect()
        };
        t.net.heal_from(&n[first], &rest(first));
        tokio::time::sleep(Duration::from_secs(1)).await;
        t.net.heal_from(&n[second], &rest(second));
        let order = if c_first { "c then b" } else { "b then c" };
        t.converged(&format!("two nodes cut, healed {order}")).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_paused_past_its_heartbeat_catches_up() {
    if !netns::available() {
        return;
    }
    let t = Three::start();
    let mut a = Client::connect(&t.urls[0]).await;
    let mut b = Client::connect(&t.urls[1]).await;
    let mut c = Client::connect(&t.urls[2]).await;
    let before = t.seed(&mut c).await;
    // c stopped longer than a heartbeat stays fresh (10 s): the others
    // count it gone, and when it comes back, repair from it.
    let node_c = &t.nodes[3];
    let c_url = t.urls[2].clone();
    let repaired_from_c = |log: &str| {
        log.lines()
            .filter(|l| l.contains("cluster: repair done") && l.contains(&c_url))
            .count()
    };
    let before_pause = repaired_from_c(&t.nodes[1].log_text());
    node_c.signal("STOP");
    let paused = Instant::now();
    t.both_sides(&mut [&mut a, &mut b], 10).await;
    t.delete_and_vanish(&mut a, &mut b, &before).await;
    // Past c's heartbeat: a counts two nodes alive (c's share of a lease
    // reclaimed), at most a heartbeat after c's aged out.
    while paused.elapsed() < Duration::from_secs(12)
        || metric(&t.n[0], "sluice_cluster_lease_nodes").await != Some(2.0)
    {
        assert!(
            paused.elapsed() < Duration::from_secs(20),
            "a still counts {:?} nodes 20 s into c's pause",
            metric(&t.n[0], "sluice_cluster_lease_nodes").await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    node_c.signal("CONT");
    // And c's own clients go on: what it takes now reaches the others.
    t.both_sides(&mut [&mut c], 3).await;
    t.converged("a node paused 12 s").await;
    // c is back in the registry: counted again, and repaired from at once
    // (it may hold what never reached the stream).
    let resumed = Instant::now();
    while repaired_from_c(&t.nodes[1].log_text()) == before_pause
        || metric(&t.n[0], "sluice_cluster_lease_nodes").await != Some(3.0)
    {
        assert!(
            resumed.elapsed() < Duration::from_secs(10),
            "a did not repair from c, or count it again, within 10 s of its return:\n{}",
            t.nodes[1].log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_during_a_sentinel_failover_heals_in_seconds() {
    if !netns::available() {
        return;
    }
    let Sentinelled {
        net,
        r,
        s,
        n,
        mut redis,
        sentinels: _sentinels,
        via,
    } = Sentinelled::start().await;
    let _nodes: Vec<Proc> = three_nodes(&net, &n, &via, THROTTLE_OFF);
    let urls: Vec<String> = n.iter().map(url).collect();
    let history = Mutex::new(History::default());
    let mut a = Client::connect(&urls[0]).await;
    let mut c = Client::connect(&urls[2]).await;
    let publish = async |client: &mut Client, e: Event| {
        let (ok, why) = client.publish(&e).await;
        assert!(ok, "{why}");
        history.lock().unwrap().ok(&e);
        e
    };
    let mut before = Vec::new();
    for i in 0..10 {
        for author in [11, 12] {
            let e = ev(author, now() - 10, 1, &[], &format!("before {author} {i}"));
            before.push(publish(&mut a, e).await);
        }
    }
    converge(&history, &urls, Duration::from_secs(20)).await;
    // c cut from everything but the test (both Redis servers, the
    // Sentinels, its peers); then the primary killed: the failover
    // happens without c.
    let all: Vec<&Host> = r.iter().chain(&s).chain(&n[..2]).collect();
    net.cut_from(&n[2], &all);
    redis[0].kill();
    for i in 0..10 {
        publish(&mut a, ev(13, now(), 1, &[], &format!("majority {i}"))).await;
        publish(&mut c, ev(14, now(), 1, &[], &format!("cut side {i}"))).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_for(
        "the Sentinels promote the replica",
        Duration::from_secs(30),
        || {
            s.iter().all(|h| {
                netns::redis_cli(
                    &h.ip,
                    26379,
                    &["SENTINEL", "get-master-addr-by-name", "sluice"],
                )
                .lines()
                .next()
                    == Some(r[1].ip.as_str())
            })
        },
    )
    .await;
    let ids: Vec<String> = before
        .iter()
        .filter(|e| e.raw().contains("before 11 "))
        .take(5)
        .map(|e| e.id_hex())
        .collect();
    let tags: Vec<[&str; 2]> = ids.iter().map(|id| ["e", id.as_str()]).collect();
    let tags: Vec<&[&str]> = tags.iter().map(|t| &t[..]).collect();
    publish(&mut a, ev(11, now(), 5, &tags, "")).await;
    publish(&mut c, ev(12, now(), 62, &[&["relay", "ALL_RELAYS"]], "")).await;
    for i in 0..5 {
        publish(
            &mut a,
            ev(13, now(), 1, &[], &format!("after failover {i}")),
        )
        .await;
    }
    net.heal_from(&n[2], &all);
    let healed = converge(&history, &urls, Duration::from_secs(20)).await;
    eprintln!(
        "partition during a failover: every node matches the history {:.2} s after the heal",
        healed.as_secs_f64()
    );
    assert!(healed < Duration::from_secs(10), "healed in {healed:?}");
    let body = readyz(&n[2]).await;
    assert!(
        body.contains(&format!("Redis primary {}:6379", r[1].ip)),
        "{body}"
    );
    drop(redis);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cut_from_one_node_only_its_clients_events_cross_once_it_reconnects() {
    if !netns::available() {
        return;
    }
    let t = Three::start();
    let mut a = Client::connect(&t.urls[0]).await;
    let mut c = Client::connect(&t.urls[2]).await;
    let before = t.seed(&mut a).await;
    // c loses Redis only: its peers (and their repairs) stay reachable.
    t.net.cut_from(&t.n[2], &[&t.redis]);
    t.both_sides(&mut [&mut a, &mut c], 15).await;
    t.delete_and_vanish(&mut c, &mut a, &before).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    t.net.heal_from(&t.n[2], &[&t.redis]);
    t.converged("Redis cut from one node").await;
}

/// One node cut from Redis and its peers, `SLUICE_PARTITION_ROUNDS` times
/// (default 1) for `SLUICE_PARTITION_CUT_SECS` each (default 2): both sides
/// publish throughout, one side deletes (NIP-09) and the other vanishes an
/// author (NIP-62), the sides swapping each round; after each heal every
/// node holds exactly the history's events within 10 s
/// (`crates/bench/scripts/partition.sh` runs 20 rounds of 30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_node_partitioned_round_after_round_heals_every_time() {
    if !netns::available() {
        return;
    }
    let env = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let rounds = env("SLUICE_PARTITION_ROUNDS", 1);
    let cut_secs = env("SLUICE_PARTITION_CUT_SECS", 2);
    assert!(
        rounds <= 40,
        "at most 40 rounds (authors are numbered per round)"
    );
    let t = Three::start();
    let mut a = Client::connect(&t.urls[0]).await;
    let mut c = Client::connect(&t.urls[2]).await;
    let (r, n) = (&t.redis, &t.n);
    let cut = [r, &n[0], &n[1]];
    let mut worst = Duration::ZERO;
    for round in 0..rounds {
        // Authors of this round: one deletes, one vanishes, one per side.
        let base = 100 + (round as u8) * 4;
        let at = now() - 10;
        let mut mine = Vec::new();
        for i in 0..5 {
            for author in [base, base + 1] {
                let e = ev(
                    author,
                    at,
                    1,
                    &[],
                    &format!("round {round} before {author} {i}"),
                );
                mine.push(t.publish(&mut a, e).await);
            }
        }
        converge(&t.history, &t.urls, Duration::from_secs(20)).await;
        t.net.cut_from(&n[2], &cut);
        let started = Instant::now();
        let mut i = 0;
        while started.elapsed() < Duration::from_secs(cut_secs) {
            for (s, cl) in [&mut a, &mut c].into_iter().enumerate() {
                let e = ev(
                    base + 2 + s as u8,
                    now(),
                    1,
                    &[],
                    &format!("round {round} side {s} {i}"),
                );
                t.publish(cl, e).await;
            }
            i += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // The deletion on one side, the vanish on the other, swapping.
        let ids: Vec<String> = mine
            .iter()
            .filter(|e| e.raw().contains(&format!("before {base} ")))
            .take(3)
            .map(|e| e.id_hex())
            .collect();
        let tags: Vec<[&str; 2]> = ids.iter().map(|id| ["e", id.as_str()]).collect();
        let tags: Vec<&[&str]> = tags.iter().map(|t| &t[..]).collect();
        let (del, van) = if round % 2 == 0 {
            (&mut c, &mut a)
        } else {
            (&mut a, &mut c)
        };
        t.publish(del, ev(base, now(), 5, &tags, "")).await;
        t.publish(
            van,
            ev(base + 1, now(), 62, &[&["relay", "ALL_RELAYS"]], ""),
        )
        .await;
        t.net.heal_from(&n[2], &cut);
        let healed = converge(&t.history, &t.urls, Duration::from_secs(20)).await;
        eprintln!(
            "partition round {}/{rounds} ({cut_secs} s cut, {i} events a side): every node \
             matches the history {:.2} s after the heal",
            round + 1,
            healed.as_secs_f64()
        );
        assert!(
            healed < Duration::from_secs(10),
            "round {round}: healed in {healed:?}"
        );
        worst = worst.max(healed);
    }
    eprintln!(
        "partition: {rounds} of {rounds} rounds healed, the slowest {:.2} s after its heal",
        worst.as_secs_f64()
    );
}
