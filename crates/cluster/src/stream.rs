//! The shared event stream: the publisher (this node's clients' events
//! out) and the consumer (the other nodes' events in).
//!
//! Entry: `n` = the publishing node's id, `e` = the event's JSON as its
//! client sent it. Each node reads in its own consumer group (named by its
//! node id) and acknowledges an entry only after its writer has committed
//! it, so a node killed at any moment re-reads (`XREADGROUP … 0`) what it
//! had not stored, and a node that was down resumes from where it was.

use std::sync::Arc;
use std::time::Duration;

use redis::Value;
use redis::aio::MultiplexedConnection;
use sluice_engine::writer::SubmitError;
use sluice_proto::{Event, KindClass};
use sluice_store::WriteOutcome;
use tokio::sync::mpsc::Receiver;

use crate::metrics_names as m;
use crate::{Shared, Task, now_ms};

/// Events sent to Redis in one pipeline.
const PUBLISH_BATCH: usize = 256;
/// Backoff between reconnects, doubling up to the max.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(2);

fn next_backoff(b: Duration) -> Duration {
    (b * 2).min(BACKOFF_MAX)
}

/// Drains the replication tap into the stream. While Redis is away the
/// current batch is held and retried; the tap's bounded channel holds the
/// rest (a full channel drops, counted by the engine).
pub(crate) async fn publish(sh: Arc<Shared>, mut rx: Receiver<Arc<Event>>) {
    // Each entry carries (epoch, seq): a consumer that sees a sequence
    // jump knows it missed entries (trimmed before it read them).
    let mut seq = Sequence {
        epoch: now_ms(),
        next: 1,
    };
    let mut conn: Option<MultiplexedConnection> = None;
    let mut batch: Vec<Arc<Event>> = Vec::new();
    let mut backoff = BACKOFF_MIN;
    let mut made = sh.generation();
    let mut tried_at_stop = false;
    loop {
        if batch.is_empty() {
            tokio::select! {
                biased;
                _ = sh.stop.cancelled() => break,
                ev = rx.recv() => match ev {
                    Some(ev) => batch.push(ev),
                    None => return,
                },
            }
        }
        while batch.len() < PUBLISH_BATCH {
            match rx.try_recv() {
                Ok(ev) => batch.push(ev),
                Err(_) => break,
            }
        }
        metrics::gauge!(m::CLUSTER_OUTBOUND_QUEUED).set((rx.len() + batch.len()) as f64);
        sh.drop_stale(&mut conn, &mut made);
        match send(&sh, &mut conn, &batch, &mut seq).await {
            Ok(()) => {
                batch.clear();
                backoff = BACKOFF_MIN;
                metrics::gauge!(m::CLUSTER_OUTBOUND_QUEUED).set(rx.len() as f64);
            }
            Err(()) if sh.stop.is_cancelled() => {
                // The stop came during this try: it was the last one (a
                // second would hold the exit for another command timeout).
                tried_at_stop = true;
                break;
            }
            Err(()) => {
                tokio::select! {
                    _ = sh.stop.cancelled() => break,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = next_backoff(backoff);
            }
        }
    }
    // Stopping: one last try for what is held (bounded by the command
    // timeout), so events stored just before a clean shutdown still leave.
    while let Ok(ev) = rx.try_recv() {
        batch.push(ev);
    }
    let mut replicated = !tried_at_stop;
    if replicated {
        sh.drop_stale(&mut conn, &mut made);
        for chunk in batch.chunks(PUBLISH_BATCH) {
            if send(&sh, &mut conn, chunk, &mut seq).await.is_err() {
                replicated = false;
                break;
            }
        }
    }
    if !replicated {
        tracing::warn!(
            events = batch.len(),
            "cluster: shutting down with events not replicated (peers repair them)"
        );
    }
    metrics::gauge!(m::CLUSTER_OUTBOUND_QUEUED).set(0.0);
}

/// The publisher's numbering: `epoch` (its start, unix ms) and the next
/// sequence number.
struct Sequence {
    epoch: u64,
    next: u64,
}

async fn send(
    sh: &Shared,
    conn: &mut Option<MultiplexedConnection>,
    batch: &[Arc<Event>],
    seq: &mut Sequence,
) -> Result<(), ()> {
    if conn.is_none() {
        match sh.connect(Duration::ZERO).await {
            Ok(c) => *conn = Some(c),
            Err(e) => {
                sh.report(Task::Publish, false, Some(&e));
                return Err(());
            }
        }
    }
    let Some(c) = conn.as_mut() else {
        return Err(());
    };
    let stream = sh.stream_key();
    let mut pipe = redis::pipe();
    for (i, ev) in batch.iter().enumerate() {
        pipe.cmd("XADD")
            .arg(&stream)
            .arg("MAXLEN")
            .arg("~")
            .arg(sh.cfg.stream_maxlen)
            .arg("*")
            .arg("n")
            .arg(&sh.node_id)
            .arg("s")
            .arg(format!("{}.{}", seq.epoch, seq.next + i as u64))
            .arg("e")
            .arg(ev.raw())
            .ignore();
    }
    match pipe.query_async::<()>(c).await {
        Ok(()) => {
            // A batch sent again after a failure keeps its numbers.
            seq.next += batch.len() as u64;
            metrics::counter!(m::CLUSTER_EVENTS_OUT_TOTAL).increment(batch.len() as u64);
            sh.report(Task::Publish, true, None);
            Ok(())
        }
        Err(e) => {
            sh.report(Task::Publish, false, Some(&e));
            *conn = None;
            Err(())
        }
    }
}

/// One stream entry.
struct Entry {
    id: String,
    node: String,
    /// The publisher's (epoch, sequence number).
    seq: Option<(u64, u64)>,
    raw: String,
}

/// The last sequence number seen per publishing node, to notice entries
/// trimmed from the stream before this node read them.
#[derive(Default)]
struct Seen {
    nodes: std::collections::HashMap<String, (u64, u64)>,
}

/// Nodes remembered, at most (a cluster has a handful).
const MAX_NODES_SEEN: usize = 4096;

impl Seen {
    /// Records `entry`; true when entries of its publisher were missed.
    fn gap(&mut self, node: &str, (epoch, seq): (u64, u64)) -> bool {
        match self.nodes.get_mut(node) {
            // First entry of this publisher since this consumer started:
            // what came before is the join check's business.
            None => {
                if self.nodes.len() < MAX_NODES_SEEN {
                    self.nodes.insert(node.to_string(), (epoch, seq));
                }
                false
            }
            Some(last) if epoch == last.0 => {
                let missed = seq > last.1 + 1;
                last.1 = last.1.max(seq);
                missed
            }
            // The publisher restarted: its new numbering starts at 1.
            Some(last) if epoch > last.0 => {
                *last = (epoch, seq);
                seq > 1
            }
            // An older epoch (a pending entry read again): nothing new.
            Some(_) => false,
        }
    }
}

/// Reads the other nodes' events and stores them here.
pub(crate) async fn consume(sh: Arc<Shared>) {
    let block = Duration::from_millis(sh.cfg.redis_timeout_ms);
    let mut backoff = BACKOFF_MIN;
    let mut seen = Seen::default();
    while !sh.stop.is_cancelled() {
        // The primary this connection goes to (a failover moves it).
        let made = sh.generation();
        let mut conn = match sh.connect(block).await {
            Ok(c) => c,
            Err(e) => {
                sh.report(Task::Consume, false, Some(&e));
                pause(&sh, &mut backoff).await;
                continue;
            }
        };
        if let Err(e) = join_group(&sh, &mut conn).await {
            sh.report(Task::Consume, false, Some(&e));
            pause(&sh, &mut backoff).await;
            continue;
        }
        sh.report(Task::Consume, true, None);
        backoff = BACKOFF_MIN;
        // First what this node read but had not acknowledged (it was
        // killed, or lost Redis, before its commit), then new entries.
        let mut cursor = "0";
        loop {
            if sh.generation() != made {
                // Failover: join the group again on the new primary (its
                // replicated position, or a new group and a repair).
                break;
            }
            let read = tokio::select! {
                biased;
                _ = sh.stop.cancelled() => return,
                r = read(&sh, &mut conn, cursor, block) => r,
            };
            let entries = match read {
                Ok(entries) => entries,
                Err(e) => {
                    // NOGROUP (Redis lost its data) or a broken connection:
                    // reconnect and join again.
                    sh.report(Task::Consume, false, Some(&e));
                    break;
                }
            };
            sh.report(Task::Consume, true, None);
            if entries.is_empty() {
                cursor = ">";
                continue;
            }
            if entries
                .iter()
                .filter(|e| e.node != sh.node_id)
                .filter_map(|e| Some((e.node.as_str(), e.seq?)))
                .fold(false, |gap, (node, seq)| seen.gap(node, seq) | gap)
            {
                tracing::warn!(
                    node = %sh.node_id,
                    "cluster: entries were trimmed from the stream before this node read them; \
                     repairing from the peers"
                );
                sh.want_repair();
            }
            match store_entries(&sh, entries).await {
                Ok(ids) => {
                    if let Err(e) = ack(&sh, &mut conn, &ids).await {
                        sh.report(Task::Consume, false, Some(&e));
                        break;
                    }
                }
                // The writer refused the batch (store error) or is gone:
                // unacknowledged, it is read again from the pending list.
                Err(()) => {
                    cursor = "0";
                    tokio::select! {
                        _ = sh.stop.cancelled() => return,
                        _ = tokio::time::sleep(BACKOFF_MAX) => {}
                    }
                }
            }
        }
        pause(&sh, &mut backoff).await;
    }
}

async fn pause(sh: &Shared, backoff: &mut Duration) {
    tokio::select! {
        _ = sh.stop.cancelled() => {}
        _ = tokio::time::sleep(*backoff) => {}
    }
    *backoff = next_backoff(*backoff);
}

/// Creates this node's consumer group if it does not exist, and asks for
/// a repair when its position is gone: the group is new while the stream
/// already holds entries (a new node, or Redis lost its data), or the
/// stream was trimmed past the group's last read entry. A new group starts
/// at the stream's first entry, not its end: after Redis comes back empty,
/// the events other nodes held through the outage may reach the stream
/// before this group exists, and must not be skipped (what this node
/// already has is a duplicate, at the cost of one id lookup).
async fn join_group(sh: &Shared, conn: &mut MultiplexedConnection) -> redis::RedisResult<()> {
    let stream = sh.stream_key();
    let created: redis::RedisResult<()> = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&stream)
        .arg(&sh.node_id)
        .arg("0")
        .arg("MKSTREAM")
        // Read from the start, counted from zero: without a count Redis
        // estimates the group's reads from the stream's length, and a
        // later trim past this group would not show as lag (Redis 7).
        .arg("ENTRIESREAD")
        .arg(0)
        .query_async(conn)
        .await;
    match created {
        Ok(()) => {
            tracing::info!(node = %sh.node_id, "cluster: joined the stream as a new consumer group");
            // Others may hold events this node never saw.
            sh.want_repair();
            return Ok(());
        }
        Err(e) if e.code() == Some("BUSYGROUP") => {}
        Err(e) => return Err(e),
    }
    // Known group: was the stream trimmed past its position? The entries
    // added since the group's position are more than the stream still
    // holds (trimming does not move `max-deleted-entry-id`).
    let info: Value = redis::cmd("XINFO")
        .arg("STREAM")
        .arg(&stream)
        .query_async(conn)
        .await?;
    let number = |v: Option<&Value>| v.and_then(text).and_then(|s| s.parse::<u64>().ok());
    let length = number(field(&info, "length"));
    let first = field(&info, "recorded-first-entry-id")
        .and_then(text)
        .and_then(|s| parse_id(&s));
    let groups: Value = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(&stream)
        .query_async(conn)
        .await?;
    // Redis' lag: entries added since the group's position (nil when it
    // cannot tell, e.g. the group never read and the stream was trimmed).
    let lag = number(group_field(&groups, &sh.node_id, "lag"));
    let last = group_field(&groups, &sh.node_id, "last-delivered-id")
        .and_then(text)
        .and_then(|s| parse_id(&s));
    let gap = match (lag, length) {
        (Some(lag), Some(length)) => lag > length,
        // Redis lost count: judge by ids (may repair once too often).
        _ => matches!((first, last), (Some(first), Some(last)) if first > last),
    };
    if gap {
        tracing::warn!(
            node = %sh.node_id,
            "cluster: the stream was trimmed past this node's position; repairing from a peer"
        );
        sh.want_repair();
    }
    Ok(())
}

async fn read(
    sh: &Shared,
    conn: &mut MultiplexedConnection,
    cursor: &str,
    block: Duration,
) -> redis::RedisResult<Vec<Entry>> {
    let mut cmd = redis::cmd("XREADGROUP");
    cmd.arg("GROUP")
        .arg(&sh.node_id)
        .arg(&sh.node_id)
        .arg("COUNT")
        .arg(sh.cfg.consume_batch);
    if cursor == ">" {
        cmd.arg("BLOCK").arg(block.as_millis() as u64);
    }
    cmd.arg("STREAMS").arg(sh.stream_key()).arg(cursor);
    let v: Value = cmd.query_async(conn).await?;
    Ok(parse_read(v))
}

async fn ack(
    sh: &Shared,
    conn: &mut MultiplexedConnection,
    ids: &[String],
) -> redis::RedisResult<()> {
    if ids.is_empty() {
        return Ok(());
    }
    let mut cmd = redis::cmd("XACK");
    cmd.arg(sh.stream_key()).arg(&sh.node_id);
    for id in ids {
        cmd.arg(id);
    }
    cmd.query_async::<()>(conn).await
}

/// Checks, stores (or delivers, if ephemeral) the entries of other nodes;
/// returns every entry id to acknowledge, once the writer committed them.
async fn store_entries(sh: &Shared, entries: Vec<Entry>) -> Result<Vec<String>, ()> {
    let ids: Vec<String> = entries.iter().map(|e| e.id.clone()).collect();
    let now = now_ms();
    let delay = metrics::histogram!(m::CLUSTER_REPLICATION_DELAY_SECONDS);
    let theirs: Vec<(String, String)> = entries
        .into_iter()
        .filter(|e| e.node != sh.node_id && !e.raw.is_empty())
        .map(|e| {
            if let Some(ms) = parse_id(&e.id).map(|(ms, _)| ms) {
                delay.record(now.saturating_sub(ms) as f64 / 1000.0);
            }
            (e.id, e.raw)
        })
        .collect();
    if theirs.is_empty() {
        return Ok(ids);
    }
    // Parse and verify off the async workers: another node checked these,
    // but Redis is not trusted with what this node serves.
    let checked = tokio::task::spawn_blocking(move || {
        theirs
            .into_iter()
            .filter_map(|(_, raw)| {
                let ev = Event::parse(&raw).ok().filter(|ev| ev.verify().is_ok());
                if ev.is_none() {
                    metrics::counter!(m::CLUSTER_EVENTS_IN_TOTAL, "result" => "invalid")
                        .increment(1);
                }
                ev
            })
            .collect::<Vec<Event>>()
    })
    .await
    .map_err(|_| ())?;
    let mut waiting = Vec::with_capacity(checked.len());
    for ev in checked {
        let ev = Arc::new(ev);
        if KindClass::of(ev.kind) == KindClass::Ephemeral {
            sh.engine.deliver_replica_ephemeral(ev);
            metrics::counter!(m::CLUSTER_EVENTS_IN_TOTAL, "result" => "ephemeral").increment(1);
            continue;
        }
        // The writer's queue is shared with the clients: wait for room
        // rather than drop (the stream keeps the entry meanwhile).
        loop {
            match sh.engine.submit_replica(ev.clone()) {
                Ok(rx) => {
                    waiting.push(rx);
                    break;
                }
                Err(SubmitError::QueueFull) => {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                Err(SubmitError::Closed) => return Err(()),
            }
        }
    }
    let mut failed = false;
    for rx in waiting {
        let result = match rx.await {
            Ok(Ok(WriteOutcome::Stored { .. })) => "stored",
            Ok(Ok(WriteOutcome::Duplicate)) => "duplicate",
            Ok(Ok(_)) => "rejected",
            Ok(Err(e)) => {
                tracing::error!(error = %e, "cluster: storing a replicated event failed");
                failed = true;
                continue;
            }
            Err(_) => return Err(()),
        };
        metrics::counter!(m::CLUSTER_EVENTS_IN_TOTAL, "result" => result).increment(1);
    }
    if failed { Err(()) } else { Ok(ids) }
}

/// `(ms, seq)` of a stream id `ms-seq`.
pub(crate) fn parse_id(id: &str) -> Option<(u64, u64)> {
    let (ms, seq) = id.split_once('-')?;
    Some((ms.parse().ok()?, seq.parse().ok()?))
}

pub(crate) fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(i) => Some(i.to_string()),
        _ => None,
    }
}

/// The value of `name` in a reply that is a map or a flat
/// `[name, value, …]` array (RESP2 or RESP3).
pub(crate) fn field<'a>(v: &'a Value, name: &str) -> Option<&'a Value> {
    match v {
        Value::Array(items) => items
            .chunks(2)
            .find(|kv| kv.len() == 2 && text(&kv[0]).as_deref() == Some(name))
            .map(|kv| &kv[1]),
        Value::Map(pairs) => pairs
            .iter()
            .find(|(k, _)| text(k).as_deref() == Some(name))
            .map(|(_, v)| v),
        _ => None,
    }
}

/// `field` of the consumer group `group` in an `XINFO GROUPS` reply.
pub(crate) fn group_field<'a>(groups: &'a Value, group: &str, name: &str) -> Option<&'a Value> {
    let Value::Array(list) = groups else {
        return None;
    };
    list.iter()
        .find(|g| field(g, "name").and_then(text).as_deref() == Some(group))
        .and_then(|g| field(g, name))
}

/// The entries of an `XREADGROUP` reply for one stream (nil: none).
fn parse_read(v: Value) -> Vec<Entry> {
    let streams: Vec<Value> = match v {
        Value::Array(s) => s,
        Value::Map(pairs) => pairs
            .into_iter()
            .map(|(k, v)| Value::Array(vec![k, v]))
            .collect(),
        _ => return Vec::new(),
    };
    let mut out = Vec::new();
    for s in streams {
        let Value::Array(mut kv) = s else { continue };
        if kv.len() != 2 {
            continue;
        }
        let Value::Array(entries) = kv.pop().unwrap_or(Value::Nil) else {
            continue;
        };
        for e in entries {
            let Value::Array(parts) = e else { continue };
            let (Some(id), Some(fields)) = (parts.first().and_then(text), parts.get(1)) else {
                continue;
            };
            // A pending entry trimmed away reads as nil fields: nothing to
            // store, but it must be acknowledged.
            let node = field(fields, "n").and_then(text).unwrap_or_default();
            let raw = field(fields, "e").and_then(text).unwrap_or_default();
            let seq = field(fields, "s").and_then(text).and_then(|s| {
                let (e, n) = s.split_once('.')?;
                Some((e.parse().ok()?, n.parse().ok()?))
            });
            out.push(Entry { id, node, seq, raw });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn a_sequence_jump_is_a_gap_and_a_restart_is_not() {
        let mut s = Seen::default();
        assert!(!s.gap("a", (10, 5)), "first sight");
        assert!(!s.gap("a", (10, 6)));
        assert!(!s.gap("a", (10, 6)), "sent twice");
        assert!(s.gap("a", (10, 9)));
        assert!(!s.gap("a", (10, 7)), "older, read again");
        assert!(!s.gap("a", (20, 1)), "restarted");
        assert!(s.gap("a", (30, 4)), "restarted, first entries missed");
        assert!(!s.gap("b", (1, 100)));
    }

    #[test]
    fn a_read_reply_parses_into_entries_and_nil_is_empty() {
        let reply = Value::Array(vec![Value::Array(vec![
            bulk("sluice:events"),
            Value::Array(vec![
                Value::Array(vec![
                    bulk("1700000000000-0"),
                    Value::Array(vec![
                        bulk("n"),
                        bulk("a"),
                        bulk("s"),
                        bulk("17.3"),
                        bulk("e"),
                        bulk("{}"),
                    ]),
                ]),
                Value::Array(vec![bulk("1700000000001-3"), Value::Nil]),
            ]),
        ])]);
        let entries = parse_read(reply);
        assert_eq!(entries.len(), 2);
        assert_eq!(
            (
                entries[0].id.as_str(),
                entries[0].node.as_str(),
                entries[0].raw.as_str()
            ),
            ("1700000000000-0", "a", "{}")
        );
        assert_eq!(entries[0].seq, Some((17, 3)));
        assert_eq!(entries[1].raw, "");
        assert!(parse_read(Value::Nil).is_empty());
        assert_eq!(parse_id("17-3"), Some((17, 3)));
        assert_eq!(parse_id("x"), None);
    }
}
