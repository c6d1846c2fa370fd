//! A query in the scheduler: its handle ([`JobId`]), what becomes of it
//! after a step ([`AfterStep`], [`StepFate`]), and its state and entry.

/// A query's handle inside the scheduler.
pub type JobId = u64;

/// What became of a query after a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterStep {
    /// It has more to do and its client can take more: queued again.
    Continue,
    /// It has more to do but its client has not read the last chunk: parked
    /// until [`FairQueue::unpark`](super::FairQueue::unpark).
    Park,
    /// It is done: removed.
    Finished,
}

/// Where a query went after [`FairQueue::step_done`](super::FairQueue::step_done).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepFate {
    Queued,
    Parked,
    /// Removed: finished, or cancelled while its step ran.
    Removed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    Queued,
    Running,
    Parked,
}

#[derive(Debug, Clone)]
pub(super) struct Job<K> {
    pub(super) client: K,
    pub(super) sink: u64,
    pub(super) state: State,
    /// Set once its first step has been dispatched.
    pub(super) started: bool,
    /// Cancelled while its step ran: removed when the step reports.
    pub(super) cancelled: bool,
    /// Its estimated cost at admission: what it weighs in the bounds until
    /// it leaves.
    pub(super) units: u64,
    /// Estimated cost still to run: the estimate less what its steps cost,
    /// never less than its last step's (a query that goes on after a step
    /// is expected to cost as much again).
    pub(super) remaining: u64,
    /// What its next step is expected to cost, set when it is queued: what
    /// it adds to the wait of the queries behind it.
    pub(super) next_step: u64,
}
