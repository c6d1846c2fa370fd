//! The replication tap: where a cluster node's own clients' events (and
//! those its mirrors brought in) leave for the other nodes. The writer
//! offers each such event stored here (after its commit), the admission
//! path each such ephemeral event; the cluster's
//! publisher task drains the channel into the shared stream. Offering never
//! waits: the channel is bounded (`cluster.outbound_buffer`), and an event
//! that does not fit is dropped from replication and counted (the other
//! nodes' negentropy repair fetches it later). Events replicated in from
//! other nodes are never offered, so nothing loops.

use std::sync::{Arc, OnceLock};

use sluice_proto::Event;
use tokio::sync::mpsc::{Sender, error::TrySendError};

use crate::metrics_names as m;

#[derive(Default)]
pub(crate) struct Tap {
    tx: OnceLock<Sender<Arc<Event>>>,
}

impl Tap {
    pub(crate) fn attach(&self, tx: Sender<Arc<Event>>) {
        let _ = self.tx.set(tx);
    }

    pub(crate) fn attached(&self) -> bool {
        self.tx.get().is_some()
    }

    /// Hands `event` to the publisher, or drops and counts it.
    pub(crate) fn offer(&self, event: &Arc<Event>) {
        let Some(tx) = self.tx.get() else { return };
        match tx.try_send(event.clone()) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                metrics::counter!(m::CLUSTER_OUTBOUND_DROPPED_TOTAL, "reason" => "full")
                    .increment(1)
            }
            Err(TrySendError::Closed(_)) => {
                metrics::counter!(m::CLUSTER_OUTBOUND_DROPPED_TOTAL, "reason" => "closed")
                    .increment(1)
            }
        }
    }
}
