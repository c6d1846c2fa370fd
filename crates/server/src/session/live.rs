//! Live delivery: the engine's live index queues to this connection only
//! the events that match one of its subscriptions, naming which ones
//! (`LiveDelivery`). Each is held while that subscription's query runs (at
//! most `server.max_buffered_live_events`, past that the subscription is
//! CLOSED), or sent at once after its EOSE unless the query could already
//! see it.
//!
//! A delivery for a subscription closed or replaced since it was queued is
//! dropped here: CLOSE stops delivery at once. A connection whose queue
//! filled (`engine.live_buffer_events` / `live_buffer_bytes`) is ended as
//! a slow consumer.

use sluice_engine::live::LiveDelivery;
use sluice_engine::live::LiveEnd;
use sluice_proto::RelayMessage;

use super::Session;
use super::out::{CloseReason, Out, Step};
use super::refusal::Refusal;
use super::subs::Phase;

impl Session {
    pub(super) async fn on_live(
        &mut self,
        out: &mut Out<'_>,
        received: Result<LiveDelivery, LiveEnd>,
    ) -> Step {
        let delivery = match received {
            Ok(d) => d,
            Err(LiveEnd::Lagged) => return Err(CloseReason::SlowConsumer),
            // The loop winds the session down itself before it gets here.
            Err(LiveEnd::Stopped) => return Err(CloseReason::Shutdown),
        };
        let ev = delivery.event;
        let max_held = self.st.server.max_buffered_live_events;
        let mut overflowed = Vec::new();
        for handle in delivery.subs {
            let Some((sub_id, sub)) = self.subs.by_handle(handle) else {
                continue;
            };
            match &mut sub.phase {
                Phase::Held(held) if held.as_ref().map_or(0, |h| h.len()) >= max_held => {
                    overflowed.push(sub_id)
                }
                Phase::Held(held) => held.get_or_insert_default().push(ev.clone()),
                Phase::Live { snapshot_serial }
                    if ev.serial.is_some_and(|n| n < *snapshot_serial) => {}
                Phase::Live { .. } => {
                    let prefix = RelayMessage::event_prefix(&sub_id);
                    out.send_event(&prefix, ev.event.raw(), &ev.encoded).await?;
                    self.st.recorded.live_deliveries.get().increment(1);
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
