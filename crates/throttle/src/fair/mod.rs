//! The fair query scheduler (docs/design.md#cost-based-fair-queuing): which
//! query runs its
//! next step on a free worker, which waits, and which is refused at once.
//! Pure bookkeeping: the engine owns the workers, the clock and the guards
//! that call [`FairQueue::cancel`] when a client goes away. Its bounds are
//! the `[throttle.queries]` table, [`QueriesConfig`].
//!
//! Model. A query runs as a sequence of bounded *steps* (a few hundred index
//! rows each), so an expensive scan never holds a worker for long. Between
//! steps a query is *queued* (runnable), *running* (a worker has it) or
//! *parked* (its client has not read the previous answer chunk yet; a slow
//! reader holds no worker). Clients, not queries, take turns:
//! - per client (an IP, or an IPv6 /64) a FIFO of runnable queries, served
//!   round robin within the client (a big query does not block the same
//!   client's small ones);
//! - between clients, deficit round robin over the cost each step actually
//!   spent (rows scanned and bytes sent): a client that ran a dear step sits
//!   out rounds in proportion; each round adds `quantum_units × weight`;
//! - a client with nothing queued, running or parked is a *new flow* (as in
//!   FQ-CoDel) and its first step is served before the round robin: a
//!   polite reader waits for at most the steps already running;
//! - a client runs at most `max_running_per_client` steps at once while
//!   another client has runnable work, so nobody takes every worker.
//!
//! Admission weighs cost, not requests (issue 13). Each query comes with
//! its estimated cost in units ([`crate::cost`]), and it is refused at once:
//! - when its client already has `max_open_units_per_client` units open
//!   (queued, running or parked), or all clients together
//!   `max_open_units`: many cheap lookups arriving together (tens of units
//!   each) fit where a client's pile of scans (thousands each) does not;
//! - when `max_queued_per_client` of its client's queries, or `max_queued`
//!   in all, wait for a step: memory bounds only, generous;
//! - when it would wait past the deadline for its first step
//!   (docs/design.md#adaptive-window):
//!   the work ahead of it in units (the first steps of the new flows; for a
//!   client with queries open, one step of each of its waiting queries and
//!   the other waiting clients' turns meanwhile) times the measured time
//!   per unit, over the slots. A query still waiting for its first step at
//!   its deadline is dropped (`expire`).
//!
//! A new flow is refused by the relay-wide bounds only when they are
//! reached twice over (the second half is its reserve, so a flood never
//! refuses a polite client), and never by its client's bounds: one query
//! alone is admitted whatever its estimate (the read budgets and the scan
//! budget bound it). A client of a tier weighing more than 1 (see
//! `tiers`) is refused by the relay-wide bounds only at three times them:
//! weight-1 clients, new or not, never take that last third.
//!
//! Invariants (checked by [`FairQueue::check_invariants`] in tests): every
//! submitted query is in exactly one state until it finishes or is
//! cancelled; `running <= slots`; counters and unit sums (open and queued,
//! per client and in all, the new flows' first steps) are those of the
//! queries in their states, so a cancel at any point leaves nothing
//! behind; a client entry exists only while it has a query. The bounds are
//! checked at admission: a query put back after a step or unparked is
//! never refused.
//!
//! Bookkeeping that cannot be half done: what a query weighs in its state
//! is one value ([`Load`], computed from the query alone), and a query
//! enters ([`FairQueue::submit_weighted`]), changes ([`FairQueue::update`])
//! or leaves ([`FairQueue::remove`]) in one place each, which looks up the
//! query and its client first and then moves its weight between the sums
//! (its client's and the relay's), its client's queue and the parked
//! index together. Nothing here panics: an unknown id changes nothing.

mod bookkeeping;
mod invariants;
mod job;
mod load;
mod rotation;
mod stats;
mod wait;

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::time::Duration;

use crate::config::QueriesConfig;
use crate::error::ConfigError;
use crate::refusal::{Cause, RateLimited};

pub use job::{AfterStep, JobId, StepFate};
pub use stats::FairStats;

use job::{Job, State};
use load::Load;
use rotation::{Client, List};

/// Weight of a new sample in the moving averages of step time and time
/// per unit.
const STEP_ALPHA: f64 = 0.1;
/// Step time assumed before any step was measured.
const INITIAL_STEP_NS: f64 = 1_000_000.0;
/// Time per cost unit assumed before any step was measured.
const INITIAL_UNIT_NS: f64 = 1_000.0;

/// The scheduler. See the module docs.
#[derive(Debug, Clone)]
pub struct FairQueue<K> {
    config: QueriesConfig,
    /// Cores the process may run on: what `slots = "auto"` counts.
    cores: usize,
    jobs: HashMap<JobId, Job<K>>,
    clients: HashMap<K, Client>,
    /// What all queries weigh.
    load: Load,
    /// Clients taking turns, with the generation of the client entry they
    /// were listed for (an entry of a client that left and came back is
    /// stale and skipped).
    new_flows: VecDeque<(K, u64)>,
    old_flows: VecDeque<(K, u64)>,
    /// First steps of the clients listed as new flows (their `first_step`).
    new_flow_units: u64,
    next_gen: u64,
    /// Queued jobs in admission order, for `expire`: (admitted_ns, id).
    /// Entries of jobs that started or left are skipped lazily.
    unstarted: VecDeque<(u64, JobId)>,
    /// Parked queries by the sink they wait on: exactly the parked ones.
    parked_by_sink: HashMap<u64, Vec<JobId>>,
    /// Emptied queues of clients that left, reused for new ones: clients
    /// come and go with every polite query, and this keeps them from
    /// allocating (bounded by `SPARE_QUEUES`).
    spare_queues: Vec<VecDeque<JobId>>,
    next_id: JobId,
    step_ns: f64,
    unit_ns: f64,
    /// The counters of [`FairStats`] (its sizes come from `load`).
    counters: FairStats,
}

impl<K: Hash + Eq + Clone> FairQueue<K> {
    /// An idle scheduler. Fails on an invalid config. `slots = "auto"`
    /// counts 2 cores until [`FairQueue::on_cores`] says more.
    pub fn new(config: QueriesConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(FairQueue {
            config,
            cores: 2,
            jobs: HashMap::new(),
            clients: HashMap::new(),
            load: Load::default(),
            new_flows: VecDeque::new(),
            old_flows: VecDeque::new(),
            new_flow_units: 0,
            unstarted: VecDeque::new(),
            parked_by_sink: HashMap::new(),
            spare_queues: Vec::new(),
            next_id: 0,
            next_gen: 0,
            step_ns: INITIAL_STEP_NS,
            unit_ns: INITIAL_UNIT_NS,
            counters: FairStats::default(),
        })
    }

    /// The scheduler of a process that may run on `cores` cores (what
    /// `slots = "auto"` counts).
    pub fn on_cores(mut self, cores: usize) -> Self {
        self.cores = cores;
        self
    }

    pub fn config(&self) -> &QueriesConfig {
        &self.config
    }

    /// Steps that may run at once.
    pub fn slots(&self) -> u32 {
        self.config.slots.count(self.cores)
    }

    /// Replaces the config (reload). Queries in progress are kept.
    pub fn set_config(&mut self, config: QueriesConfig) -> Result<(), ConfigError> {
        config.validate()?;
        self.config = config;
        Ok(())
    }

    /// Admits a query of `client` (weight 1) estimated at `units`, whose
    /// answers go to `sink`, or refuses it at once. See
    /// [`FairQueue::submit_weighted`].
    pub fn submit(
        &mut self,
        client: K,
        sink: u64,
        units: u64,
        now_ns: u64,
    ) -> Result<JobId, RateLimited> {
        self.submit_weighted(client, sink, units, 1, now_ns, true)
    }

    /// How long a new query of `client` would wait for its first step.
    pub fn estimated_wait(&self, client: &K) -> Duration {
        let is_new_flow = self.clients.get(client).is_none_or(|c| c.load.open == 0);
        Duration::from_nanos(self.estimate_wait_ns(client, is_new_flow))
    }

    /// Admits a query estimated at `units` cost units: it joins its
    /// client's queue and waits for its first step. Refused when the
    /// relay's or its client's bounds are reached, or (with
    /// `check_deadline`) when its estimated wait passes the deadline (see
    /// the module docs). `weight` (1..) scales the client's share of the
    /// rotation.
    pub fn submit_weighted(
        &mut self,
        client: K,
        sink: u64,
        units: u64,
        weight: u32,
        now_ns: u64,
        check_deadline: bool,
    ) -> Result<JobId, RateLimited> {
        let units = units.max(1);
        let own = self.clients.get(&client);
        let is_new_flow = own.is_none_or(|c| c.load.open == 0);
        let (own_queued, own_units) = own.map_or((0, 0), |c| (c.load.queued, c.load.open_units));
        // New flows have the relay-wide bounds twice over, clients of a
        // tier weighing more than 1 three times: a burst of weight-1 clients,
        // new or not, never takes the top third (no priority inversion).
        let reserve = if weight > 1 {
            3
        } else if is_new_flow {
            2
        } else {
            1
        };
        let cfg = &self.config;
        let wait_ns = self.estimate_wait_ns(&client, is_new_flow);
        let deadline_ns = cfg.deadline_ms.saturating_mul(1_000_000);
        let refusal = if self.load.open_units >= cfg.max_open_units.saturating_mul(reserve)
            || self.load.queued >= cfg.max_queued.saturating_mul(reserve as u32)
        {
            Some(Cause::QueueFull)
        } else if own_units >= cfg.max_open_units_per_client
            || own_queued >= cfg.max_queued_per_client
        {
            Some(Cause::ClientQueueFull)
        } else if check_deadline && wait_ns > deadline_ns {
            Some(Cause::Deadline)
        } else {
            None
        };
        if let Some(cause) = refusal {
            self.counters.refused_total += 1;
            let retry_after = Duration::from_nanos(wait_ns.max(deadline_ns));
            return Err(RateLimited::of(cause, retry_after));
        }
        self.next_id += 1;
        let id = self.next_id;
        let job = Job {
            client: client.clone(),
            sink,
            state: State::Queued,
            started: false,
            cancelled: false,
            units,
            remaining: units,
            next_step: units.min(self.step_cap()),
        };
        let load = Load::of(&job);
        let next_gen = &mut self.next_gen;
        let spare = &mut self.spare_queues;
        let c = self.clients.entry(client.clone()).or_insert_with(|| {
            *next_gen += 1;
            Client {
                queue: spare.pop().unwrap_or_default(),
                load: Load::default(),
                first_step: 0,
                deficit: 0,
                weight: 1,
                list: List::None,
                gen_id: *next_gen,
            }
        });
        c.weight = weight.max(1);
        c.load.shift(Load::default(), load);
        self.load.shift(Load::default(), load);
        c.queue.push_back(id);
        if c.list == List::None {
            if is_new_flow {
                c.list = List::New;
                c.deficit = 0;
                c.first_step = job.next_step;
                self.new_flow_units += job.next_step;
                self.new_flows.push_back((client, c.gen_id));
            } else {
                c.list = List::Old;
                self.old_flows.push_back((client, c.gen_id));
            }
        }
        self.jobs.insert(id, job);
        self.unstarted.push_back((now_ns, id));
        self.counters.admitted_total += 1;
        Ok(id)
    }

    /// Drops queries that have waited past the deadline for their first
    /// step; returns them (the caller answers them `rate-limited:`).
    pub fn expire(&mut self, now_ns: u64) -> Vec<JobId> {
        let deadline_ns = self.config.deadline_ms.saturating_mul(1_000_000);
        let mut expired = Vec::new();
        while let Some(&(admitted, id)) = self.unstarted.front() {
            let waiting = self
                .jobs
                .get(&id)
                .is_some_and(|j| !j.started && j.state == State::Queued);
            if !waiting {
                self.unstarted.pop_front();
                continue;
            }
            if now_ns.saturating_sub(admitted) < deadline_ns {
                break;
            }
            self.unstarted.pop_front();
            if self.remove(id).is_some() {
                self.counters.expired_total += 1;
                expired.push(id);
            }
        }
        expired
    }

    /// Picks the query whose step runs next on a free worker, and marks it
    /// running; `None` when every slot is busy or nothing is runnable.
    pub fn dispatch_next(&mut self) -> Option<JobId> {
        if self.load.running >= self.slots() {
            return None;
        }
        if let Some(id) = self.next_new_flow() {
            self.counters.new_flow_steps_total += 1;
            return self.start(id);
        }
        let others_waiting = self.waiting_clients() > 1;
        let cap = if others_waiting {
            self.config.max_running_per_client
        } else {
            u32::MAX
        };
        if let Some(id) = self.next_old_flow(cap) {
            return self.start(id);
        }
        // Every waiting client is at its cap: let one exceed it rather than
        // leave a worker idle.
        if cap != u32::MAX {
            return self.next_old_flow(u32::MAX).and_then(|id| self.start(id));
        }
        None
    }

    /// A step of `id` ended: it cost `cost_units` (rows and bytes, without
    /// the base) and took `step_ns` (0: it did not run). The query is
    /// queued again, parked or removed as `after` says (removed in any case
    /// if it was cancelled meanwhile).
    pub fn step_done(
        &mut self,
        id: JobId,
        cost_units: u64,
        step_ns: u64,
        after: AfterStep,
    ) -> StepFate {
        let Some(job) = self.jobs.get(&id) else {
            return StepFate::Removed;
        };
        debug_assert_eq!(job.state, State::Running, "step_done of a job not running");
        if job.state != State::Running {
            return StepFate::Removed;
        }
        let cancelled = job.cancelled;
        // A step costs its rows and bytes and the base (its read
        // transaction).
        let spent = cost_units
            .saturating_add(self.config.cost.base_units)
            .max(1);
        if step_ns > 0 {
            self.step_ns = self.step_ns * (1.0 - STEP_ALPHA) + step_ns as f64 * STEP_ALPHA;
            self.unit_ns =
                self.unit_ns * (1.0 - STEP_ALPHA) + step_ns as f64 / spent as f64 * STEP_ALPHA;
        }
        let cost = i64::try_from(cost_units).unwrap_or(i64::MAX);
        self.update(id, |job, c| {
            if step_ns > 0 {
                job.remaining = job.remaining.saturating_sub(spent).max(spent);
            }
            c.deficit = c.deficit.saturating_sub(cost);
        });
        if cancelled || after == AfterStep::Finished {
            self.remove(id);
            if cancelled {
                self.counters.cancelled_total += 1;
            } else {
                self.counters.finished_total += 1;
            }
            return StepFate::Removed;
        }
        if after == AfterStep::Park {
            self.update(id, |job, _| job.state = State::Parked);
            return StepFate::Parked;
        }
        self.requeue(id);
        StepFate::Queued
    }

    /// The client behind `sink` read a chunk: its parked queries may run.
    pub fn unpark(&mut self, sink: u64) {
        let Some(parked) = self.parked_by_sink.remove(&sink) else {
            return;
        };
        for id in parked {
            self.requeue(id);
        }
    }

    /// The client gave the query up (its guard was dropped). Queued and
    /// parked queries leave at once; a running one leaves when its step
    /// reports. Returns true if it left now. Unknown ids are ignored.
    pub fn cancel(&mut self, id: JobId) -> bool {
        let Some(job) = self.jobs.get_mut(&id) else {
            return false;
        };
        if job.state == State::Running {
            job.cancelled = true;
            return false;
        }
        let left = self.remove(id).is_some();
        if left {
            self.counters.cancelled_total += 1;
        }
        left
    }

    /// True when nothing is open: every count at its idle value.
    pub fn is_idle(&self) -> bool {
        self.jobs.is_empty()
            && self.clients.is_empty()
            && self.parked_by_sink.is_empty()
            && self.new_flow_units == 0
            && self.load == Load::default()
    }
}

#[cfg(test)]
mod tests;
