//! COUNT (NIP-45): admitted like a REQ (and counted against the same
//! `limits.max_subscriptions`), run as a query of its own, answered with
//! one COUNT or CLOSED when its query ends. Its query is owned by the
//! registry until then. A count cut off by `engine.max_count_rows` is
//! answered with `"approximate": true`.

use sluice_engine::reads::ReadEnd;
use sluice_engine::reads::ReadMsg;
use sluice_proto::{Filter, RelayMessage};

use super::Session;
use super::out::{Out, Step};
use super::refusal::Refusal;

impl Session {
    pub(super) async fn on_count(
        &mut self,
        out: &mut Out<'_>,
        sub_id: String,
        filters: Vec<Filter>,
    ) -> Step {
        if let Err(refusal) = self.admit_req(&sub_id, &filters, false) {
            return self.refuse_read(out, &sub_id, refusal).await;
        }
        let reads = self.st.engine.reads();
        let readers = self.auth.readers().clone();
        match reads.submit_count(
            &self.reads,
            self.principal(),
            filters,
            readers,
            &mut self.read_budget,
        ) {
            Ok(query) => {
                self.subs.start_count(sub_id, query);
                Ok(())
            }
            Err(e) => out.send(Refusal::from(e).closed(&sub_id)).await,
        }
    }

    /// A message of a running COUNT's query: only its end carries an answer.
    pub(super) async fn on_count_answer(&mut self, out: &mut Out<'_>, mut msg: ReadMsg) -> Step {
        let Some(end) = msg.end.take() else {
            return Ok(());
        };
        let Some(count) = self.subs.finish_count(msg.job) else {
            return Ok(());
        };
        match end {
            // A count that stopped at `engine.max_count_rows` is a lower
            // bound: NIP-45's `approximate`.
            ReadEnd::Count {
                count: n,
                truncated,
            } => {
                out.send(RelayMessage::count(&count.sub_id, n, truncated))
                    .await
            }
            other => {
                out.send(Refusal::of_count_end(&other).closed(&count.sub_id))
                    .await
            }
        }
    }
}
