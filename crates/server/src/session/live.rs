//! Live delivery: each event the engine broadcasts (committed, or an
//! ephemeral event published) goes to every subscription of this
//! connection whose filters match it: held while the subscription's query
//! runs (at most `server.max_buffered_live_events`, past that the
//! subscription is CLOSED), sent at once after its EOSE unless the query
//! could already see it.
//!
//! The session holds a broadcast receiver only while it has subscriptions
//! (see `run`): a publisher-only connection is never woken per stored
//! event and can never fall behind. A receiver that falls more than
//! `engine.live_buffer_events` behind ends the connection (slow consumer).

use std::sync::Arc;

use sluice_engine::LiveEvent;
use sluice_proto::RelayMessage;
use tokio::sync::broadcast::Receiver;
use tokio::sync::broadcast::error::RecvError;

use super::Session;
use super::out::{Out, Step};
use super::refusal::Refusal;
use crate::metrics_names as m;

/// The next live event; pending while there is no receiver.
pub(super) async fn recv(
    live: &mut Option<Receiver<Arc<LiveEvent>>>,
) -> Result<Arc<LiveEvent>, RecvError> {
    match live {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

impl Session {
    pub(super) async fn on_live(
        &mut self,
        out: &mut Out,
        received: Result<Arc<LiveEvent>, RecvError>,
    ) -> Step {
        let ev = match received {
            Ok(ev) => ev,
            Err(RecvError::Lagged(_)) => return Err("slow_consumer"),
            Err(RecvError::Closed) => return Err("shutdown"),
        };
        let max_held = self.st.server.max_buffered_live_events;
        let mut overflowed = Vec::new();
        for (sub_id, sub) in self.subs.iter_mut() {
            if !sub.filters.iter().any(|f| f.matches(&ev.event)) {
                continue;
            }
            match &mut sub.pending {
                Some(held) if held.len() >= max_held => overflowed.push(sub_id.clone()),
                Some(held) => held.push(ev.clone()),
                None if ev.serial.is_some_and(|n| n < sub.snapshot_serial) => {}
                None => {
                    out.send(RelayMessage::event(sub_id, ev.event.raw()))
                        .await?;
                    metrics::counter!(m::LIVE_DELIVERIES_TOTAL).increment(1);
                }
            }
        }
        for sub_id in overflowed {
            self.subs.close(&sub_id);
            out.send(Refusal::LiveOverflow.closed(&sub_id)).await?;
        }
        Ok(())
    }
}
