//! REQ and CLOSE, and the answers of this connection's queries: a REQ's
//! stored events in chunks, its EOSE, then the live events it held back.
//!
//! Invariant (live delivery without gaps or repeats): a REQ's subscription
//! is registered in the engine's live index before its query is
//! submitted, so every event committed after the query's snapshot is seen
//! live; live matches are held until EOSE, then only those with a serial at
//! or above the snapshot are sent (the query sent the others, or cut them
//! by its limit).

use sluice_engine::reads::ReadEnd;
use sluice_engine::reads::ReadMsg;
use sluice_proto::{Filter, RelayMessage};
use sluice_throttle::Verdict;
use sluice_throttle::admission::Op;

use super::Session;
use super::out::{Out, Step};
use super::refusal::Refusal;
use super::subs::Phase;

impl Session {
    pub(super) async fn on_req(
        &mut self,
        out: &mut Out<'_>,
        sub_id: String,
        mut filters: Vec<Filter>,
    ) -> Step {
        if let Err(refusal) = self.admit_req(&sub_id, &filters, true) {
            return self.refuse_read(out, &sub_id, refusal).await;
        }
        let lim = &self.front.limits;
        for f in &mut filters {
            f.limit = Some(f.limit.unwrap_or(lim.default_limit).min(lim.max_limit));
        }
        // A search matches only indexed kinds, live as stored.
        self.st.engine.reads().scope_search(&mut filters);
        // In the live index before the query can take its snapshot: no gap.
        // Replacing a REQ drops the old one's guards: its query is
        // cancelled and it leaves the index.
        let live = self.live.subscribe(&filters);
        self.subs.open(&sub_id, live);
        let reads = self.st.engine.reads();
        let readers = self.auth.readers().clone();
        match reads.submit_query(
            &self.reads,
            self.principal(),
            filters,
            readers,
            &mut self.read_budget,
        ) {
            Ok(guard) => {
                if let Some(sub) = self.subs.get_mut(&sub_id) {
                    sub.query = Some(guard);
                }
                Ok(())
            }
            Err(e) => {
                self.subs.close(&sub_id);
                out.send(Refusal::from(e).closed(&sub_id)).await
            }
        }
    }

    /// A REQ or COUNT refused before its query: CLOSED, after the AUTH
    /// challenge when the refusal asks for authentication.
    pub(super) async fn refuse_read(
        &mut self,
        out: &mut Out<'_>,
        sub_id: &str,
        refusal: Refusal,
    ) -> Step {
        let closed = refusal.closed(sub_id);
        if refusal.asks_auth() {
            return self.send_asking_auth(out, closed).await;
        }
        out.send(closed).await
    }

    pub(super) fn on_close(&mut self, sub_id: &str) -> Step {
        self.subs.close(sub_id);
        Ok(())
    }

    /// The checks a REQ (`replaces`: it may replace the subscription of the
    /// same id) or a COUNT passes before its query is submitted: the
    /// protocol limits, the subscription limit, the IP's request bucket and
    /// the read controller. A throttle refusal also ends the subscription
    /// of the same id.
    pub(super) fn admit_req(
        &mut self,
        sub_id: &str,
        filters: &[Filter],
        replaces: bool,
    ) -> Result<(), Refusal> {
        let lim = &self.front.limits;
        if sub_id.chars().count() > lim.max_subid_length {
            return Err(Refusal::SubIdTooLong {
                max: lim.max_subid_length,
            });
        }
        if filters.is_empty() {
            return Err(Refusal::NoFilters);
        }
        if filters.len() > lim.max_filters {
            return Err(Refusal::TooManyFilters {
                len: filters.len(),
                max: lim.max_filters,
            });
        }
        let policy = self.st.engine.policy().rules();
        if let Err(denial) = policy.check_read(self.ip, self.auth.pubkeys()) {
            self.subs.close(sub_id);
            return Err(Refusal::Policy(denial));
        }
        if let Err(refusal) = self.check_private_read(filters) {
            self.subs.close(sub_id);
            return Err(refusal);
        }
        let replacing = replaces && self.subs.contains(sub_id);
        if !replacing && self.subs.open_len() >= lim.max_subscriptions {
            return Err(Refusal::TooManySubscriptions {
                max: lim.max_subscriptions,
            });
        }
        match self
            .st
            .engine
            .limiter()
            .admit(Op::Request, &self.principal(), &mut self.read_adm)
        {
            // Reads are never delayed (see `sluice_throttle::ConnPacer`).
            Verdict::Allow | Verdict::Delay(_) => Ok(()),
            Verdict::Refuse(r) => {
                self.subs.close(sub_id);
                Err(r.into())
            }
        }
    }

    /// A chunk (and/or the end) of one of this connection's queries. The
    /// message's credit goes back when it is dropped, after the events are
    /// written: the next chunk is read only once this one is on its way.
    pub(super) async fn on_read(&mut self, out: &mut Out<'_>, mut msg: Box<ReadMsg>) -> Step {
        let throttle = self.st.engine.limiter();
        throttle.settle_connection_read_cost(&mut self.read_budget, msg.settle_units);
        if self.subs.is_count(msg.job) {
            return self.on_count_answer(out, *msg).await;
        }
        let neg = self
            .extra
            .as_ref()
            .and_then(|x| x.neg.sub_of_query(msg.job));
        if let Some(sub_id) = neg {
            return self.on_neg_read(out, sub_id, *msg).await;
        }
        let Some(sub_id) = self.subs.sub_of_query(msg.job) else {
            // A query closed or replaced since: its answer is dropped.
            return Ok(());
        };
        let n = msg.events.len();
        // The chunk (and its EOSE and held live events) is fed, held until
        // the flush or send that ends every path below: one write.
        if n > 0 {
            let prefix = RelayMessage::event_prefix(&sub_id);
            for raw in msg.events.iter() {
                out.feed_event(&prefix, raw).await?;
            }
        }
        match msg.end.take() {
            None if n > 0 => out.flush().await,
            None => Ok(()),
            Some(ReadEnd::Eose {
                snapshot_serial, ..
            }) => self.on_eose(out, &sub_id, snapshot_serial).await,
            Some(end) => {
                self.subs.close(&sub_id);
                if n > 0 {
                    out.flush().await?;
                }
                out.send(Refusal::of_query_end(&end).closed(&sub_id)).await
            }
        }
    }

    /// EOSE, then the live events held while the query ran that it could
    /// not have seen.
    async fn on_eose(&mut self, out: &mut Out<'_>, sub_id: &str, snapshot_serial: u64) -> Step {
        out.feed(RelayMessage::eose(sub_id)).await?;
        let held = match self.subs.get_mut(sub_id) {
            Some(sub) => {
                sub.query = None;
                match std::mem::replace(&mut sub.phase, Phase::Live { snapshot_serial }) {
                    Phase::Held(held) => held.map(|h| *h).unwrap_or_default(),
                    Phase::Live { .. } => Vec::new(),
                }
            }
            None => Vec::new(),
        };
        // Events committed after the query's snapshot were not in it.
        let prefix = if held.is_empty() {
            String::new()
        } else {
            RelayMessage::event_prefix(sub_id)
        };
        for ev in held {
            if ev.serial.is_none_or(|s| s >= snapshot_serial) {
                out.feed_event(&prefix, ev.event.raw()).await?;
                self.st.recorded.live_deliveries.get().increment(1);
            }
        }
        out.flush().await
    }
}
