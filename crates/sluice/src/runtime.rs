//! What the long-running commands share: the shutdown signals, and the
//! NIP-50 indexer of a command that writes to the store.

use sluice_engine::{Engine, StartError};
use sluice_search::SearchError;
use tokio_util::sync::CancellationToken;

/// Installs the SIGTERM and SIGINT handlers now, before the caller goes
/// on to serve (a signal that arrives after this call is never the
/// default action's, which ends the process), and spawns the task that
/// cancels `shutdown` on the first of them.
pub(crate) fn cancel_on_signal(shutdown: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers");
        return;
    };
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = int.recv() => tracing::info!("SIGINT: shutting down"),
        }
        shutdown.cancel();
    });
}

/// Starts the NIP-50 indexer of a command that writes to the store
/// (`import`, `sync`, `mirror`), so what it writes is searchable when it
/// ends. Beside a running relay the relay holds the index's writer and
/// indexes what is committed (it polls the store), so this one does not.
pub(crate) fn start_indexer(
    engine: &Engine,
    cfg: &sluice_search::SearchConfig,
    command: &str,
    workers: sluice_search::Workers,
) -> Result<(), StartError> {
    match engine.start_search(cfg.clone(), workers) {
        Ok(()) => Ok(()),
        Err(StartError::Search(SearchError::Busy { .. })) => {
            tracing::info!("a relay holds the search index: it indexes what {command} writes");
            Ok(())
        }
        Err(e) => Err(e),
    }
}
