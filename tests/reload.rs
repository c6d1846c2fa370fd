//! SIGHUP, key by key: each reloadable section's keys take effect in the
//! running relay (an effect a client sees, not only a config echo), and a
//! file that does not validate, or one that fails when applied (the relay
//! cannot start the new web of trust's thread), changes no section at all.
//! The reload count on /metrics is the state each step waits for, never a
//! duration.

use crate::support;

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::*;

/// Writes `toml` as the config file, sends SIGHUP and waits until the
/// relay has counted one more reload with `result`.
async fn reload(relay: &Relay, file: &Path, toml: &str, result: &str) {
    let label = format!("result=\"{result}\"");
    let before = relay
        .metric_or_zero("sluice_config_reloads_total", &[&label])
        .await;
    std::fs::write(file, toml).unwrap();
    relay.signal("HUP");
    let deadline = Instant::now() + Duration::from_secs(30);
    while relay
        .metric_or_zero("sluice_config_reloads_total", &[&label])
        .await
        < before + 1.0
    {
        assert!(Instant::now() < deadline, "no {result} reload counted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn start(toml: &str) -> (Relay, tempfile::TempDir, std::path::PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("sluice.toml");
    std::fs::write(&file, toml).unwrap();
    let relay = Relay::start_with_config(&file, &[]);
    (relay, tmp, file)
}

/// A kind-1 note of key `n`, distinct per `i`.
fn note(n: u8, i: usize) -> sluice_proto::Event {
    ev(n, now(), 1, &[], &format!("note {i}"))
}

/// Publishes notes of key `n` until one is refused; returns how many were
/// accepted and the refusal (at most `max` tries).
async fn publish_until_refused(c: &mut Client, n: u8, from: usize, max: usize) -> (usize, String) {
    for i in 0..max {
        let (ok, msg) = c.publish(&note(n, from + i)).await;
        if !ok {
            return (i, msg);
        }
    }
    panic!("{max} notes accepted, none refused");
}

/// An address bucket that holds two EVENTs and refills one per 100 s: once
/// spent, it stays spent for the whole test at any machine speed.
const SLOW_IP: &str =
    "[throttle.clients.events_per_ip]\nrate_per_s = 0.01\nwindow_ms = 200000\ncatch_up_ms = 0\n";

#[tokio::test]
async fn a_reloaded_ip_rate_lets_a_spent_address_write_again() {
    let (relay, _tmp, file) = start(SLOW_IP);
    let mut c = relay.client().await;
    let (accepted, msg) = publish_until_refused(&mut c, 1, 0, 10).await;
    assert!(accepted >= 1, "the bucket let nothing through");
    assert!(msg.starts_with("rate-limited:"), "{msg}");
    // Still refused: nothing refills it within the test.
    let (ok, _) = c.publish(&note(1, 100)).await;
    assert!(!ok);
    reload(
        &relay,
        &file,
        "[throttle.clients.events_per_ip]\nrate_per_s = 1000\n",
        "applied",
    )
    .await;
    for i in 0..5 {
        let (ok, msg) = c.publish(&note(1, 200 + i)).await;
        assert!(ok, "after the reload: {msg}");
    }
    // And back: the slow rate binds again.
    reload(&relay, &file, SLOW_IP, "applied").await;
    let (accepted, msg) = publish_until_refused(&mut c, 1, 300, 10).await;
    assert!(accepted <= 3, "{accepted} accepted at the slow rate");
    assert!(msg.starts_with("rate-limited:"), "{msg}");
}

/// A kind-22242 event of key `n` for `challenge` on `relay`.
async fn authenticate(relay: &Relay, c: &mut Client, n: u8) {
    let challenge = c.challenge().await;
    let e = ev(
        n,
        now(),
        22242,
        &[&["relay", &relay.url()], &["challenge", &challenge]],
        "",
    );
    c.send_text(&format!("[\"AUTH\",{}]", e.raw())).await;
    let (ok, msg) = c.expect_ok(&e.id_hex()).await;
    assert!(ok, "AUTH refused: {msg}");
}

#[tokio::test]
async fn a_pubkey_listed_in_a_tier_by_reload_writes_on_its_own_bucket() {
    let (relay, _tmp, file) = start(SLOW_IP);
    // Key 7, authenticated but listed nowhere: charged to its pubkey and
    // to its address, both of which it spends.
    let mut c = relay.client().await;
    authenticate(&relay, &mut c, 7).await;
    let (_, msg) = publish_until_refused(&mut c, 7, 0, 10).await;
    assert!(msg.starts_with("rate-limited:"), "{msg}");
    // A second connection of key 7 from the same address is refused too.
    let mut again = relay.client().await;
    authenticate(&relay, &mut again, 7).await;
    let (ok, _) = again.publish(&note(7, 50)).await;
    assert!(!ok, "an unlisted pubkey wrote past its spent buckets");
    let listed = format!(
        "{SLOW_IP}[[throttle.tiers.listed]]\nname = \"friends\"\nweight = 2\nrate_multiplier = 2.0\npubkeys = [\"{}\"]\n",
        pubkey_hex(7)
    );
    reload(&relay, &file, &listed, "applied").await;
    // Listed now: charged to the tier's bucket of its pubkey only (a new,
    // full one), not to the spent address.
    let mut listed_conn = relay.client().await;
    authenticate(&relay, &mut listed_conn, 7).await;
    let (ok, msg) = listed_conn.publish(&note(7, 100)).await;
    assert!(ok, "a listed pubkey was refused: {msg}");
    // The address itself is still spent: an anonymous connection from it
    // is refused (the listed pubkey did not pass by a refill).
    let mut anonymous = relay.client().await;
    let (ok, msg) = anonymous.publish(&note(8, 101)).await;
    assert!(!ok, "the spent address was refilled");
    assert!(msg.starts_with("rate-limited:"), "{msg}");
}

async fn steps(relay: &Relay) -> f64 {
    relay.metric_or_zero("sluice_query_steps_total", &[]).await
}

#[tokio::test]
async fn a_reloaded_step_size_splits_a_query_into_more_steps() {
    let (relay, _tmp, file) = start("");
    let mut c = relay.client().await;
    for i in 0..24 {
        let (ok, msg) = c.publish(&note(2, i)).await;
        assert!(ok, "{msg}");
    }
    let before = steps(&relay).await;
    assert_eq!(c.req("a", &[json!({"kinds": [1]})]).await.len(), 24);
    let first = steps(&relay).await - before;
    assert!(first <= 2.0, "24 rows took {first} steps of 500 rows");
    reload(
        &relay,
        &file,
        "[throttle.queries]\nstep_rows = 1\n",
        "applied",
    )
    .await;
    let before = steps(&relay).await;
    assert_eq!(c.req("b", &[json!({"kinds": [1]})]).await.len(), 24);
    let deadline = Instant::now() + Duration::from_secs(30);
    while steps(&relay).await - before < 24.0 {
        assert!(
            Instant::now() < deadline,
            "steps of one row: only {} for 24 rows",
            steps(&relay).await - before
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_reloaded_policy_refuses_a_kind_then_takes_it_again() {
    let (relay, _tmp, file) = start("");
    let mut c = relay.client().await;
    let (ok, msg) = c.publish(&ev(3, now(), 7, &[], "+")).await;
    assert!(ok, "{msg}");
    reload(&relay, &file, "[policy]\ndeny_kinds = [7]\n", "applied").await;
    let (ok, msg) = c.publish(&ev(3, now(), 7, &[], "++")).await;
    assert!(!ok);
    assert!(msg.starts_with("blocked:"), "{msg}");
    // Notes are still taken, on the same connection.
    let (ok, msg) = c.publish(&note(3, 1)).await;
    assert!(ok, "{msg}");
    reload(&relay, &file, "", "applied").await;
    let (ok, msg) = c.publish(&ev(3, now(), 7, &[], "+++")).await;
    assert!(ok, "{msg}");
}

async fn nip11(relay: &Relay) -> Value {
    let (status, _, body) = http_get(&relay.addr, "/", Some("application/nostr+json")).await;
    assert_eq!(status, 200);
    serde_json::from_str(&body).unwrap()
}

/// Opens subscriptions `s0..` on `c` until one is CLOSED; returns how many
/// were answered with EOSE (at most `max`).
async fn open_subs(c: &mut Client, max: usize) -> usize {
    for i in 0..max {
        let sub = format!("s{i}");
        c.send(json!(["REQ", sub, {"kinds": [1], "limit": 1}]))
            .await;
        loop {
            let m = c.recv().await;
            if m[1] != sub.as_str() {
                continue;
            }
            match m[0].as_str() {
                Some("EOSE") => break,
                Some("CLOSED") => return i,
                _ => {}
            }
        }
    }
    max
}

#[tokio::test]
async fn reloaded_limits_show_in_nip11_and_bind_new_connections_only() {
    let (relay, _tmp, file) = start("[limits]\nmax_subscriptions = 3\n");
    assert_eq!(nip11(&relay).await["limitation"]["max_subscriptions"], 3);
    let mut old = relay.client().await;
    // The old connection has exchanged a message before the reload.
    assert_eq!(open_subs(&mut old, 1).await, 1);
    reload(
        &relay,
        &file,
        "[limits]\nmax_subscriptions = 1\n",
        "applied",
    )
    .await;
    assert_eq!(nip11(&relay).await["limitation"]["max_subscriptions"], 1);
    let mut new = relay.client().await;
    assert_eq!(open_subs(&mut new, 3).await, 1);
    // The connection opened before keeps the limits it started with (its
    // s0 is replaced, s1 and s2 are new).
    assert_eq!(open_subs(&mut old, 4).await, 3);
}

#[tokio::test]
async fn a_reloaded_relay_name_shows_in_nip11() {
    let (relay, _tmp, file) = start("[relay]\nname = \"before\"\n");
    assert_eq!(nip11(&relay).await["name"], "before");
    reload(
        &relay,
        &file,
        "[relay]\nname = \"after\"\ndescription = \"reloaded\"\n",
        "applied",
    )
    .await;
    let doc = nip11(&relay).await;
    assert_eq!(doc["name"], "after");
    assert_eq!(doc["description"], "reloaded");
}

#[tokio::test]
async fn a_refused_reload_changes_no_section() {
    let (relay, _tmp, file) = start("[relay]\nname = \"before\"\n");
    let mut c = relay.client().await;
    // Every reloadable section changed, and one key that does not
    // validate: nothing of it applies.
    reload(
        &relay,
        &file,
        "[relay]\nname = \"after\"\n[policy]\ndeny_kinds = [1]\n[limits]\nmax_subscriptions = 1\n\
         [throttle]\nmode = \"shadow\"\n[retention]\nmax_store_mb = \"nonsense\"\n",
        "refused",
    )
    .await;
    // The log line follows the count: wait for it.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !relay.log_text().contains("reload refused") {
        assert!(Instant::now() < deadline, "the refusal was not logged");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let doc = nip11(&relay).await;
    assert_eq!(doc["name"], "before");
    assert_eq!(doc["limitation"]["max_subscriptions"], 20);
    assert_eq!(relay.get_json("/api/throttle").await["mode"], "enforce");
    let (ok, msg) = c.publish(&note(4, 0)).await;
    assert!(ok, "{msg}");
    assert_eq!(
        relay
            .metric_or_zero("sluice_config_reloads_total", &["result=\"applied\""])
            .await,
        0.0
    );
}

/// Holds a relay at its thread limit: while clamped it can start no thread
/// (`pthread_create` fails with EAGAIN), as a relay does under a service's
/// task limit (systemd's `TasksMax`, a container's pids limit). As root: a
/// pids cgroup of its own (`pids.max`); as another user: its soft
/// `RLIMIT_NPROC` (`prlimit`; root is exempt from that one).
enum ThreadLimit {
    Cgroup {
        dir: std::path::PathBuf,
        home: std::path::PathBuf,
        pid: u32,
    },
    Nproc {
        pid: u32,
        soft: String,
    },
}

impl ThreadLimit {
    /// Where neither can be set, says so and returns `None` (the test
    /// skips).
    fn new(pid: u32) -> Option<ThreadLimit> {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let root = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().next())
            == Some("0");
        let limit = if root {
            ThreadLimit::cgroup(pid)
        } else {
            ThreadLimit::nproc(pid)
        };
        if limit.is_none() {
            eprintln!("SKIPPED: cannot limit the relay's threads here");
        }
        limit
    }

    /// A new pids cgroup under the relay's own (cgroup v1's pids
    /// hierarchy, or v2 where its parent delegates `pids`), holding it.
    fn cgroup(pid: u32) -> Option<ThreadLimit> {
        let own = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        for line in mounts.lines() {
            let fields: Vec<&str> = line.split(' ').collect();
            let Some(dash) = fields.iter().position(|f| *f == "-") else {
                continue;
            };
            let (Some(fstype), Some(options)) = (fields.get(dash + 1), fields.get(dash + 3)) else {
                continue;
            };
            let path = match *fstype {
                "cgroup" if options.split(',').any(|o| o == "pids") => own.lines().find_map(|l| {
                    let mut parts = l.splitn(3, ':');
                    let controllers = parts.nth(1)?;
                    let path = parts.next()?;
                    controllers.split(',').any(|c| c == "pids").then_some(path)
                }),
                "cgroup2" => own.lines().find_map(|l| l.strip_prefix("0::")),
                _ => None,
            };
            let Some(path) = path.and_then(|p| p.strip_prefix(fields[3].trim_end_matches('/')))
            else {
                continue;
            };
            let home = Path::new(fields[4]).join(path.trim_start_matches('/'));
            let dir = home.join(format!("sluice-reload-test-{pid}"));
            if std::fs::create_dir(&dir).is_err() {
                continue;
            }
            let moved = dir.join("pids.max").exists()
                && std::fs::write(dir.join("cgroup.procs"), pid.to_string()).is_ok();
            if moved {
                return Some(ThreadLimit::Cgroup { dir, home, pid });
            }
            let _ = std::fs::remove_dir(&dir);
        }
        None
    }

    fn nproc(pid: u32) -> Option<ThreadLimit> {
        let out = std::process::Command::new("prlimit")
            .args([
                "--pid",
                &pid.to_string(),
                "--nproc",
                "--output=SOFT",
                "--noheadings",
            ])
            .output()
            .ok()?;
        let soft = String::from_utf8(out.stdout).ok()?.trim().to_string();
        (out.status.success() && !soft.is_empty()).then_some(ThreadLimit::Nproc { pid, soft })
    }

    /// From now on the relay starts no thread.
    fn clamp(&self) {
        match self {
            ThreadLimit::Cgroup { dir, .. } => std::fs::write(dir.join("pids.max"), "1").unwrap(),
            ThreadLimit::Nproc { pid, .. } => prlimit_nproc(*pid, "1"),
        }
    }

    /// The relay may start threads again.
    fn release(&self) {
        match self {
            ThreadLimit::Cgroup { dir, .. } => std::fs::write(dir.join("pids.max"), "max").unwrap(),
            ThreadLimit::Nproc { pid, soft } => prlimit_nproc(*pid, soft),
        }
    }
}

fn prlimit_nproc(pid: u32, soft: &str) {
    let ok = std::process::Command::new("prlimit")
        .args(["--pid", &pid.to_string(), &format!("--nproc={soft}:")])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "prlimit --nproc={soft}: failed");
}

impl Drop for ThreadLimit {
    fn drop(&mut self) {
        match self {
            ThreadLimit::Cgroup { dir, home, pid } => {
                let _ = std::fs::write(dir.join("pids.max"), "max");
                let _ = std::fs::write(home.join("cgroup.procs"), pid.to_string());
                let _ = std::fs::remove_dir(&*dir);
            }
            ThreadLimit::Nproc { pid, soft } => {
                let _ = std::process::Command::new("prlimit")
                    .args(["--pid", &pid.to_string(), &format!("--nproc={soft}:")])
                    .status();
            }
        }
    }
}

/// Every reloadable section changed, and a new web of trust: all valid.
fn everything_changed() -> String {
    format!(
        "[relay]\nname = \"after\"\n[policy]\ndeny_kinds = [7]\n[limits]\nmax_subscriptions = 1\n\
         [throttle]\nmode = \"shadow\"\n[retention]\nmax_store_mb = 100\n\
         [trust]\nseed_pubkeys = [\"{}\"]\noutsider_writes = \"deny\"\n[pow]\nmin_difficulty = 8\n",
        pubkey_hex(9)
    )
}

#[tokio::test]
async fn a_reload_whose_web_of_trust_cannot_start_changes_no_section() {
    let (relay, _tmp, file) = start("[relay]\nname = \"before\"\n");
    let mut c = relay.client().await;
    let Some(limit) = ThreadLimit::new(relay.pid()) else {
        return;
    };
    // The file passes `Config::load`; what fails is starting the new web's
    // thread, after the throttle's and retention's parts were checked.
    limit.clamp();
    reload(&relay, &file, &everything_changed(), "refused").await;
    limit.release();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !relay
        .log_text()
        .lines()
        .any(|l| l.contains("reload refused") && l.contains("sluice-trust"))
    {
        assert!(
            Instant::now() < deadline,
            "the refusal and its reason were not logged:\n{}",
            relay.log_text()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Nothing of it applies: throttle, trust, pow, policy, limits, relay.
    assert_eq!(relay.get_json("/api/throttle").await["mode"], "enforce");
    let doc = nip11(&relay).await;
    assert_eq!(doc["name"], "before");
    assert_eq!(doc["limitation"]["max_subscriptions"], 20);
    assert_eq!(doc["limitation"]["min_pow_difficulty"], 0);
    let (ok, msg) = c.publish(&note(4, 0)).await;
    assert!(ok, "an outsider's note after the refused reload: {msg}");
    let (ok, msg) = c.publish(&ev(4, now(), 7, &[], "+")).await;
    assert!(ok, "a kind 7 after the refused reload: {msg}");
    assert_eq!(
        relay
            .metric_or_zero("sluice_config_reloads_total", &["result=\"applied\""])
            .await,
        0.0
    );
    // The same file, once the relay can start its thread: all of it.
    reload(&relay, &file, &everything_changed(), "applied").await;
    assert_eq!(relay.get_json("/api/throttle").await["mode"], "shadow");
    let doc = nip11(&relay).await;
    assert_eq!(doc["name"], "after");
    assert_eq!(doc["limitation"]["max_subscriptions"], 1);
    assert_eq!(doc["limitation"]["min_pow_difficulty"], 8);
    let (ok, msg) = c.publish(&note(4, 1)).await;
    assert!(!ok);
    assert_eq!(msg, "restricted: not in this relay's web of trust");
    eventually("the retention target of 100 MiB is in force", || async {
        relay
            .metric_or_zero("sluice_retention_target_bytes", &[])
            .await
            == 100.0 * 1024.0 * 1024.0
    })
    .await;
}

/// The signal handlers are in place by the time the relay reports its
/// address: a SIGHUP sent at once is a reload (counted), not the default
/// action that ends the process, and a SIGTERM sent at once is a clean
/// shutdown (exit 0).
#[tokio::test]
async fn signals_sent_as_soon_as_the_relay_reports_its_address_are_handled() {
    for _ in 0..5 {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("sluice.toml");
        std::fs::write(&file, "").unwrap();
        let relay = Relay::start_with_config(&file, &[]);
        relay.signal("HUP");
        let deadline = Instant::now() + Duration::from_secs(30);
        while relay
            .metric_or_zero("sluice_config_reloads_total", &["result=\"applied\""])
            .await
            < 1.0
        {
            assert!(Instant::now() < deadline, "no reload counted");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut relay = Relay::start_with_config(&file, &[]);
        let status = relay.stop();
        assert_eq!(status.code(), Some(0), "{}", relay.log_text());
    }
}
