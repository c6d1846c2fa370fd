//! NIP-77 negentropy reconciliation on one connection: `NEG-OPEN` runs the
//! filter as a read through the same path as a REQ (policy, buckets, the
//! controller, the read budgets, the fair scheduler, the private-kind rule),
//! collects the `(created_at, id)` of the matching events, and answers the
//! client's first message; `NEG-MSG` continues; `NEG-CLOSE` ends it.
//!
//! Bounds: at most [`MAX_SESSIONS`] open per connection (each an owned
//! guard counted on `sluice_negentropy_sessions_open`), at most
//! `limits.max_negentropy_items` items (more: `NEG-ERR blocked:`), the scan
//! budget of a query (a filter that exhausts it: `NEG-ERR blocked:`), and
//! outgoing frames of at most [`FRAME_SIZE_LIMIT`] bytes. A bad message is
//! answered with `NEG-ERR`, never a panic; every `NEG-ERR` is a
//! [`NegError`] case (`refusal.rs`: prefix, wording, metrics).

use negentropy::{Id, Negentropy, NegentropyStorageVector};
use serde::Deserialize;
use sluice_engine::reads::ReadEnd;
use sluice_engine::reads::ReadGuard;
use sluice_engine::reads::ReadMsg;
use sluice_proto::{Filter, RelayMessage};
use sluice_throttle::JobId;

use super::Session;
use super::out::{Out, Step};
use super::refusal::{NegError, Refusal};
use crate::metrics_names as m;

/// Negentropy sessions one connection may hold open.
pub(super) const MAX_SESSIONS: usize = 4;
/// Largest negentropy message the relay sends (bytes, before hex).
const FRAME_SIZE_LIMIT: u64 = 60_000;

/// This connection's negentropy sessions.
#[derive(Default)]
pub(super) struct NegSessions {
    open: Open,
}

/// The open sessions by subscription id: a short list (at most
/// `MAX_SESSIONS`), empty and unallocated on most connections.
#[derive(Default)]
struct Open(Box<[(String, NegSession)]>);

impl Open {
    fn len(&self) -> usize {
        self.0.len()
    }

    fn iter(&self) -> impl Iterator<Item = (&String, &NegSession)> {
        self.0.iter().map(|(k, v)| (k, v))
    }

    fn get_mut(&mut self, sub_id: &str) -> Option<&mut NegSession> {
        self.0.iter_mut().find(|(k, _)| k == sub_id).map(|(_, v)| v)
    }

    fn remove(&mut self, sub_id: &str) -> Option<NegSession> {
        let at = self.0.iter().position(|(k, _)| k == sub_id)?;
        let (_, v) = super::subs::remove_at(&mut self.0, at);
        Some(v)
    }

    fn insert(&mut self, sub_id: String, session: NegSession) {
        self.remove(&sub_id);
        super::subs::push_exact(&mut self.0, (sub_id, session));
    }
}

struct NegSession {
    state: State,
    _open: sluice_engine::gauge::GaugeGuard,
}

enum State {
    /// The filter's query runs; its items so far, and the client's first
    /// message.
    Collecting {
        query: ReadGuard,
        items: Vec<(u64, [u8; 32])>,
        first: Vec<u8>,
    },
    Ready(Box<Negentropy<'static, NegentropyStorageVector>>),
}

impl NegSessions {
    pub(super) fn len(&self) -> usize {
        self.open.len()
    }

    /// The session whose query is `job`.
    pub(super) fn sub_of_query(&self, job: JobId) -> Option<String> {
        self.open.iter().find_map(|(id, s)| match &s.state {
            State::Collecting { query, .. } if query.job() == job => Some(id.clone()),
            _ => None,
        })
    }
}

/// The two fields an item needs, read without parsing the whole event.
#[derive(Deserialize)]
struct IdAndTime<'a> {
    id: &'a str,
    created_at: u64,
}

impl Session {
    pub(super) async fn on_neg_open(
        &mut self,
        out: &mut Out<'_>,
        sub_id: String,
        mut filter: Filter,
        message: String,
    ) -> Step {
        metrics::counter!(m::NEGENTROPY_MESSAGES_TOTAL, "type" => "open").increment(1);
        // A NEG-OPEN of an open id replaces it.
        self.neg().open.remove(&sub_id);
        if self.neg().len() >= MAX_SESSIONS {
            let error = NegError::TooManySessions { max: MAX_SESSIONS };
            return out.send(error.neg_err(&sub_id)).await;
        }
        let Ok(first) = hex::decode(&message) else {
            return out.send(NegError::NotHex.neg_err(&sub_id)).await;
        };
        if let Err(refusal) = self.admit_req(&sub_id, std::slice::from_ref(&filter), false) {
            let error = NegError::Refused(refusal);
            if error.asks_auth() {
                self.send_challenge(out).await?;
            }
            return out.send(error.neg_err(&sub_id)).await;
        }
        let max = self.front.limits.max_negentropy_items;
        // One more than allowed: its arrival says the set is too large.
        filter.limit = Some(max as u64 + 1);
        let readers = self.auth.readers().clone();
        let reads = self.st.engine.reads();
        match reads.submit_query(
            &self.reads,
            self.principal(),
            vec![filter],
            readers,
            &mut self.read_budget,
        ) {
            Ok(query) => {
                self.neg().open.insert(
                    sub_id,
                    NegSession {
                        state: State::Collecting {
                            query,
                            items: Vec::new(),
                            first,
                        },
                        _open: sluice_engine::gauge::GaugeGuard::hold(m::NEGENTROPY_SESSIONS_OPEN),
                    },
                );
                Ok(())
            }
            Err(e) => {
                let error = NegError::Refused(Refusal::from(e));
                out.send(error.neg_err(&sub_id)).await
            }
        }
    }

    /// A chunk (and/or the end) of a negentropy session's query.
    pub(super) async fn on_neg_read(
        &mut self,
        out: &mut Out<'_>,
        sub_id: String,
        msg: ReadMsg,
    ) -> Step {
        let max = self.front.limits.max_negentropy_items;
        let Some(session) = self.neg().open.get_mut(&sub_id) else {
            return Ok(());
        };
        let State::Collecting { items, .. } = &mut session.state else {
            return Ok(());
        };
        for raw in msg.events.iter() {
            let Ok(it) = serde_json::from_str::<IdAndTime>(raw) else {
                continue;
            };
            if let Some(id) = sluice_proto::hex32::decode::<32>(it.id) {
                items.push((it.created_at, id));
            }
        }
        if items.len() > max {
            self.neg().open.remove(&sub_id);
            let error = NegError::TooManyItems { max };
            return out.send(error.neg_err(&sub_id)).await;
        }
        match &msg.end {
            None => Ok(()),
            Some(ReadEnd::Eose {
                truncated: true, ..
            }) => {
                self.neg().open.remove(&sub_id);
                out.send(NegError::Truncated.neg_err(&sub_id)).await
            }
            Some(ReadEnd::Eose { .. }) => self.neg_start(out, &sub_id).await,
            Some(end) => {
                self.neg().open.remove(&sub_id);
                let error = NegError::Refused(Refusal::of_query_end(end));
                out.send(error.neg_err(&sub_id)).await
            }
        }
    }

    /// The items are in: build the set and answer the first message.
    async fn neg_start(&mut self, out: &mut Out<'_>, sub_id: &str) -> Step {
        let Some(session) = self.neg().open.get_mut(sub_id) else {
            return Ok(());
        };
        let State::Collecting { items, first, .. } = &mut session.state else {
            return Ok(());
        };
        let items = std::mem::take(items);
        let first = std::mem::take(first);
        metrics::counter!(m::NEGENTROPY_ITEMS_TOTAL).increment(items.len() as u64);
        let built = (|| {
            let mut storage = NegentropyStorageVector::with_capacity(items.len());
            for (created_at, id) in items {
                storage.insert(created_at, Id::from_byte_array(id))?;
            }
            storage.seal()?;
            let mut neg = Negentropy::owned(storage, FRAME_SIZE_LIMIT)?;
            let reply = neg.reconcile(&first)?;
            Ok::<_, negentropy::Error>((neg, reply))
        })();
        match built {
            Ok((neg, reply)) => {
                session.state = State::Ready(Box::new(neg));
                out.send(RelayMessage::neg_msg(sub_id, &hex::encode(reply)))
                    .await
            }
            Err(e) => {
                self.neg().open.remove(sub_id);
                out.send(NegError::Protocol(e.to_string()).neg_err(sub_id))
                    .await
            }
        }
    }

    pub(super) async fn on_neg_msg(
        &mut self,
        out: &mut Out<'_>,
        sub_id: String,
        message: String,
    ) -> Step {
        metrics::counter!(m::NEGENTROPY_MESSAGES_TOTAL, "type" => "msg").increment(1);
        let session = self
            .extra
            .as_mut()
            .and_then(|x| x.neg.open.get_mut(&sub_id));
        let Some(session) = session else {
            return out.send(NegError::Unknown.neg_err(&sub_id)).await;
        };
        let State::Ready(neg) = &mut session.state else {
            return out.send(NegError::Early.neg_err(&sub_id)).await;
        };
        let answer = hex::decode(&message)
            .map_err(|_| "message is not hex".to_string())
            .and_then(|q| neg.reconcile(&q).map_err(|e| e.to_string()));
        match answer {
            Ok(reply) => {
                out.send(RelayMessage::neg_msg(&sub_id, &hex::encode(reply)))
                    .await
            }
            Err(e) => {
                self.neg().open.remove(&sub_id);
                out.send(NegError::Protocol(e).neg_err(&sub_id)).await
            }
        }
    }

    pub(super) fn on_neg_close(&mut self, sub_id: &str) -> Step {
        metrics::counter!(m::NEGENTROPY_MESSAGES_TOTAL, "type" => "close").increment(1);
        if let Some(x) = self.extra.as_mut() {
            x.neg.open.remove(sub_id);
        }
        Ok(())
    }
}
