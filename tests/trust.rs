//! Black-box tests of the web of trust (`[trust]`) and proof of work
//! (`[pow]`, NIP-13): distances from the seed's follow lists, updated when
//! a trusted pubkey follows or unfollows and rebuilt from the store after a
//! restart; each `outsider_writes` mode; PoW floors, and the adaptive
//! difficulty rising under an outsiders' flood and falling back. Each step
//! waits for a state (a metric, NIP-11), never for a duration.

use crate::support;

use std::time::{Duration, Instant};

use serde_json::Value;
use sluice_proto::Event;
use support::*;

const SEED: u8 = 1;

/// A kind-3 follow list of key `n`, created at `at`.
fn follows(n: u8, at: u64, whom: &[u8]) -> Event {
    let hex: Vec<String> = whom.iter().map(|k| pubkey_hex(*k)).collect();
    let tags: Vec<Vec<&str>> = hex.iter().map(|h| vec!["p", h.as_str()]).collect();
    let tags: Vec<&[&str]> = tags.iter().map(|t| t.as_slice()).collect();
    ev(n, at, 3, &tags, "")
}

/// A note of key `n` whose id has at least `bits` leading zero bits,
/// committing to `bits` in its nonce tag (NIP-13).
fn mined(n: u8, bits: u32, content: &str) -> Event {
    let target = bits.to_string();
    (0u64..)
        .map(|nonce| {
            let nonce = nonce.to_string();
            ev(n, now(), 1, &[&["nonce", &nonce, &target]], content)
        })
        .find(|e| sluice_proto::pow::leading_zero_bits(&e.id) >= bits)
        .unwrap()
}

fn note(n: u8, content: &str) -> Event {
    ev(n, now(), 1, &[], content)
}

async fn wait_for(what: &str, mut cond: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cond().await {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn nip11(relay: &Relay) -> Value {
    let (status, _, body) = http_get(&relay.addr, "/", Some("application/nostr+json")).await;
    assert_eq!(status, 200);
    serde_json::from_str(&body).unwrap()
}

fn trust_toml(mode: &str, extra: &str) -> String {
    format!(
        "[trust]\nseed_pubkeys = [\"{}\"]\noutsider_writes = \"{mode}\"\n{extra}",
        pubkey_hex(SEED)
    )
}

#[tokio::test]
async fn trust_follows_the_seeds_lists_two_hops_out_updates_on_unfollow_and_survives_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let toml = trust_toml("deny", "");
    let mut relay = Relay::start_in_with_toml(tmp.path(), &toml, &[]);
    let mut c = relay.client().await;
    // Outsiders are refused before anything is followed.
    let (ok, msg) = c.publish(&note(2, "before")).await;
    assert!(!ok);
    assert_eq!(msg, "restricted: not in this relay's web of trust");
    // The seed writes; its list makes 2 trusted, 2's list makes 3 trusted.
    let t = now() - 100;
    assert!(c.publish(&follows(SEED, t, &[2])).await.0);
    wait_for("2 trusted", async || c.publish(&note(2, "in")).await.0).await;
    assert!(c.publish(&follows(2, t, &[3])).await.0);
    wait_for("3 trusted", async || c.publish(&note(3, "in")).await.0).await;
    // Three hops is past max_distance (2): 3's list does not count.
    assert!(c.publish(&follows(3, t, &[4])).await.0);
    assert_eq!(relay.metric("sluice_trust_pubkeys", &[]).await, 3.0);
    let (ok, msg) = c.publish(&note(4, "far")).await;
    assert!(!ok, "{msg}");
    // The seed unfollows 2: 2 and 3 are outsiders again.
    assert!(c.publish(&follows(SEED, t + 1, &[5])).await.0);
    wait_for("only the seed and 5", async || {
        relay.metric("sluice_trust_pubkeys", &[]).await == 2.0
    })
    .await;
    for n in [2, 3] {
        let (ok, msg) = c.publish(&note(n, "after")).await;
        assert!(!ok && msg.starts_with("restricted:"), "{n}: {msg}");
    }
    // Followed again, then a restart: the web is read back from the store
    // before the first client is served.
    assert!(c.publish(&follows(SEED, t + 2, &[2])).await.0);
    relay.stop();
    let relay = Relay::start_in_with_toml(tmp.path(), &toml, &[]);
    assert_eq!(relay.metric("sluice_trust_pubkeys", &[]).await, 3.0);
    let mut c = relay.client().await;
    let (ok, msg) = c.publish(&note(3, "after restart")).await;
    assert!(ok, "{msg}");
    // `sluice trust explain` reads the same web from the store, beside the
    // running relay.
    let explain = |who: u8| {
        let out = std::process::Command::new(BIN)
            .args(["trust", "explain", &pubkey_hex(who), "--config"])
            .arg(tmp.path().with_extension("toml"))
            .env("SLUICE_STORE__PATH", tmp.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let three = explain(3);
    assert!(three.contains("is trusted at distance 2"), "{three}");
    assert!(
        three.contains(&format!("{} follows {}", pubkey_hex(SEED), pubkey_hex(2)))
            && three.contains(&format!("{} follows {}", pubkey_hex(2), pubkey_hex(3))),
        "{three}"
    );
    assert!(explain(SEED).contains("it is a seed"));
    let four = explain(4);
    assert!(four.contains("is not trusted"), "{four}");
    assert!(four.contains("outsider_writes = \"deny\""), "{four}");
}

#[tokio::test]
async fn each_outsider_mode_does_what_it_says_and_the_web_writes_anyway() {
    // allow: anyone writes.
    let relay = Relay::start_with_toml(&trust_toml("allow", ""), &[]);
    let mut c = relay.client().await;
    assert!(c.publish(&note(9, "stranger")).await.0);
    drop(relay);

    // pow: an outsider must mine min_difficulty; the seed need not.
    let relay = Relay::start_with_toml(&trust_toml("pow", "[pow]\nmin_difficulty = 8\n"), &[]);
    let mut c = relay.client().await;
    let (ok, msg) = c.publish(&note(9, "lazy")).await;
    assert!(!ok);
    assert_eq!(msg, "pow: difficulty 8 required");
    // Work without a committed target does not count.
    let lucky = (0u64..)
        .map(|i| ev(9, now(), 1, &[], &format!("lucky {i}")))
        .find(|e| sluice_proto::pow::leading_zero_bits(&e.id) >= 8)
        .unwrap();
    assert!(!c.publish(&lucky).await.0);
    let (ok, msg) = c.publish(&mined(9, 8, "worked")).await;
    assert!(ok, "{msg}");
    assert!(c.publish(&note(SEED, "seed")).await.0);
    assert_eq!(nip11(&relay).await["limitation"]["min_pow_difficulty"], 8);
    drop(relay);

    // limited: two outsider EVENTs a second between all outsiders, whoever
    // signs them; the seed is not counted against it.
    let relay = Relay::start_with_toml(&trust_toml("limited", "outsider_events_per_s = 2\n"), &[]);
    let mut c = relay.client().await;
    let mut accepted = 0;
    let mut refusal = None;
    for n in 20..40u8 {
        let (ok, msg) = c.publish(&note(n, "fresh key")).await;
        if ok {
            accepted += 1;
        } else {
            refusal = Some(msg);
            break;
        }
    }
    let refusal = refusal.expect("twenty fresh keys all taken");
    assert!(
        (1..=3).contains(&accepted),
        "{accepted} before the budget ran out"
    );
    assert!(refusal.starts_with("rate-limited:"), "{refusal}");
    assert!(c.publish(&note(SEED, "seed writes")).await.0);
    assert!(
        relay
            .metric(
                "sluice_throttle_refusals_total",
                &["layer=\"outsider_budget\""]
            )
            .await
            >= 1.0
    );
    drop(relay);

    // deny.
    let relay = Relay::start_with_toml(&trust_toml("deny", ""), &[]);
    let mut c = relay.client().await;
    let (ok, msg) = c.publish(&note(9, "no")).await;
    assert!(!ok);
    assert!(msg.starts_with("restricted:"), "{msg}");
    assert!(c.publish(&note(SEED, "yes")).await.0);
}

#[tokio::test]
async fn nip11_lists_nip13_and_a_per_kind_floor_applies_to_its_kind() {
    let relay = Relay::start_with_toml("[pow]\nmin_difficulty = 4\nkinds = { \"7\" = 0 }\n", &[]);
    let doc = nip11(&relay).await;
    assert!(
        doc["supported_nips"]
            .as_array()
            .unwrap()
            .contains(&Value::from(13))
    );
    assert_eq!(doc["limitation"]["min_pow_difficulty"], 4);
    let mut c = relay.client().await;
    // Without a web every author is an outsider: notes need the work,
    // reactions (kind 7, floor 0) do not.
    let (ok, msg) = c.publish(&note(9, "note")).await;
    assert_eq!((ok, msg.as_str()), (false, "pow: difficulty 4 required"));
    assert!(c.publish(&ev(9, now(), 7, &[], "+")).await.0);
    assert!(c.publish(&mined(9, 4, "note")).await.0);
}

#[tokio::test]
async fn the_adaptive_difficulty_rises_under_an_outsider_flood_and_falls_back_when_calm() {
    let toml = trust_toml(
        "limited",
        "outsider_events_per_s = 5\n[pow]\nadaptive = true\nmax_difficulty = 6\n\
         raise_every_ms = 10\nlower_every_ms = 10\n",
    );
    // Addresses' buckets out of the way: only the outsiders' budget binds.
    let relay = Relay::start_with_toml(
        &toml,
        &[(
            "SLUICE_THROTTLE__CLIENTS__EVENTS_PER_IP__RATE_PER_S",
            "100000",
        )],
    );
    assert_eq!(nip11(&relay).await["limitation"]["min_pow_difficulty"], 0);
    let difficulty = async |relay: &Relay| {
        nip11(relay).await["limitation"]["min_pow_difficulty"]
            .as_u64()
            .unwrap()
    };
    // Outsiders asking far past their budget: fresh keys until the
    // difficulty has climbed to its max.
    let mut c = Client::connect_from(&relay.url(), "127.0.0.3").await;
    let mut n = 0u32;
    wait_for("the difficulty at its max", async || {
        for _ in 0..20 {
            n += 1;
            let e = ev(30 + (n % 200) as u8, now(), 1, &[], &format!("flood {n}"));
            c.send_event(&e).await;
        }
        difficulty(&relay).await == 6
    })
    .await;
    assert_eq!(relay.metric("sluice_pow_difficulty", &[]).await, 6.0);
    // While pressed, a refused outsider is asked for the work, and the work
    // passes the spent budget.
    let mut asked = Client::connect_from(&relay.url(), "127.0.0.4").await;
    let (ok, msg) = asked.publish(&note(250, "unmined")).await;
    if !ok {
        assert!(
            msg.starts_with("pow: difficulty ") || msg.starts_with("rate-limited:"),
            "{msg}"
        );
    }
    let (ok, msg) = asked.publish(&mined(251, 6, "mined")).await;
    assert!(ok, "{msg}");
    // Calm again: it steps back down to the floor.
    drop(c);
    wait_for("the difficulty back at 0", async || {
        difficulty(&relay).await == 0
    })
    .await;
}

#[tokio::test]
async fn a_flood_of_reactions_spends_the_reaction_bucket_not_the_authors_notes() {
    // Reactions and reposts: two per author back to back, one per 100 s
    // after that (nothing refills within the test at any speed).
    let relay = Relay::start_with_toml(
        "[[throttle.clients.kinds]]\nname = \"reactions\"\nkinds = [7, 6]\nrate_per_s = 0.01\n\
         window_ms = 200000\ncatch_up_ms = 0\n",
        &[],
    );
    let mut c = relay.client().await;
    let mut taken = 0;
    let refusal = loop {
        let (ok, msg) = c.publish(&ev(5, now(), 7, &[], &format!("+{taken}"))).await;
        if !ok {
            break msg;
        }
        taken += 1;
        assert!(taken < 10, "ten reactions taken");
    };
    assert!(refusal.starts_with("rate-limited:"), "{refusal}");
    let (ok, _) = c.publish(&ev(5, now(), 6, &[], "repost")).await;
    assert!(!ok, "a repost is in the same class");
    // The same author's notes have their own (general) bucket.
    for i in 0..5 {
        let (ok, msg) = c.publish(&note(5, &format!("note {i}"))).await;
        assert!(ok, "note {i}: {msg}");
    }
    // Another author's reactions are theirs.
    assert!(c.publish(&ev(6, now(), 7, &[], "+")).await.0);
}

#[tokio::test]
async fn an_authenticated_pubkey_in_the_web_reads_in_its_distance_tier() {
    let toml = format!(
        "{}distance_tiers = [\"friends\"]\n[[throttle.tiers.listed]]\nname = \"friends\"\nweight = 3\n",
        trust_toml("allow", "")
    );
    let relay = Relay::start_with_toml(&toml, &[]);
    let mut c = relay.client().await;
    assert!(c.publish(&follows(SEED, now() - 10, &[2])).await.0);
    wait_for("2 in the web", async || {
        relay.metric("sluice_trust_pubkeys", &[]).await == 2.0
    })
    .await;
    // Key 2 (distance 1, tier "friends") and key 3 (outside: authenticated).
    for (key, tier) in [(2u8, "friends"), (3, "authenticated")] {
        let mut conn = relay.client().await;
        let challenge = conn.challenge().await;
        let auth = ev(
            key,
            now(),
            22242,
            &[&["relay", &relay.url()], &["challenge", &challenge]],
            "",
        );
        conn.send_text(&format!("[\"AUTH\",{}]", auth.raw())).await;
        let (ok, msg) = conn.expect_ok(&auth.id_hex()).await;
        assert!(ok, "{msg}");
        let label = format!("tier=\"{tier}\"");
        assert_eq!(relay.metric("sluice_auth_tier_total", &[&label]).await, 1.0);
    }
}
