//! Paced sending to another relay (docs/design.md#aimd-leaky-bucket-and-retry-budgets):
//! the arithmetic of Sluice's one uploader (`sluice sync --direction up`,
//! `[[mirror]]` up), pure, time passed in as `now_ns` (the caller's
//! monotonic clock), like the rest of this crate.
//!
//! - [`SendPace`], a leaky bucket whose rate an AIMD loop sets. A peer's
//!   only signal is its answers: a `rate-limited` OK or a rate NOTICE cuts
//!   the rate, an interval without one raises it. Slow start doubles the
//!   rate per interval until the first cut, so a fast peer is reached in
//!   seconds; after it, each interval adds a step of [`ADD_FRACTION`] of the
//!   rate set at the last cut, and past [`QUIET_BEFORE_PROBE`] intervals
//!   without a cut the step doubles per interval (never faster than slow
//!   start), so a pace cut far under the peer's limit by a refusal that was
//!   the peer's passing trouble climbs back within seconds. A cut (at least
//!   2% off) takes the rate to the larger of
//!   `decrease × rate` and [`ESTIMATE_MARGIN`] of the rate the peer was
//!   seen admitting over the last [`ESTIMATE_WINDOW_NS`] (its answers other
//!   than `rate-limited`): the peer's own measure of its limit, so the
//!   sawtooth stays close under it rather than averaging 75% of it as a
//!   pure halving does. One cut per congestion signal: a refusal of an
//!   event sent before the last cut does not cut again.
//! - [`RetryBudget`], retries (re-sends of refused or unanswered events)
//!   within a fraction of first sends over a sliding window, with a floor,
//!   so retries cannot amplify into a storm; when it is spent the caller
//!   waits ([`RetryBudget::wait_ns`]).
//! - [`Window`], counts over a sliding window in slots (admitted answers
//!   for the estimate, the accepted rate a caller reports).
//!
//! Invariants: the rate stays within `MIN_RATE_PER_S..=max_rate_per_s`;
//! over any interval `[t1, t2]` the bucket lets at most
//! `rate × (t2 − t1) + 1 + rate × SLACK_NS` sends go (the rate being the
//! highest it held meanwhile); a time going backwards changes nothing.

use crate::error::{ConfigError, check_range};

const NS_PER_S: f64 = 1e9;

/// The lowest pace: one EVENT every 10 s.
pub const MIN_RATE_PER_S: f64 = 0.1;
/// How often the AIMD loop raises the rate (when the interval saw no cut
/// and the pace, not the lack of events, held the sends back).
pub const INTERVAL_NS: u64 = 500_000_000;
/// Slow start: the rate is multiplied by this per interval until the
/// first cut.
pub const SLOW_START_GROWTH: f64 = 2.0;
/// Congestion avoidance: each interval adds this fraction of the rate set
/// at the last cut (additive: a fixed step until the next cut, scaled to
/// the peer so the same defaults serve 20/s and 2,000/s).
pub const ADD_FRACTION: f64 = 0.02;
/// Paced intervals after a cut before the step starts doubling (max
/// probing, after TCP BIC): a pace cut far under the peer's limit (a
/// refusal that was the peer's passing trouble, not our rate) climbs back
/// within seconds, while one near the limit meets its next refusal first.
pub const QUIET_BEFORE_PROBE: u32 = 8;
/// An interval counts as paced (and may raise the rate) when at least
/// this fraction of what the rate allowed was sent.
const USED_FRACTION: f64 = 0.5;
/// The window over which the peer's admitted rate is measured for a cut.
pub const ESTIMATE_WINDOW_NS: u64 = 2_000_000_000;
/// A cut goes no lower than `decrease × rate`, and no higher than this
/// fraction of the admitted rate (slightly under it, so the peer's bucket
/// refills a little before the next climb).
pub const ESTIMATE_MARGIN: f64 = 0.95;
/// A cut always takes at least this much off.
const LEAST_CUT: f64 = 0.98;
/// A NOTICE names no event: it cuts only when the last cut is this old.
pub const NOTICE_HOLD_NS: u64 = 1_000_000_000;
/// Schedule time the leaky bucket keeps for a late timer: sends may go
/// this much ahead of the exact schedule (at least one send).
pub const SLACK_NS: u64 = 20_000_000;

/// The three settings an operator gives (`[[mirror]]`
/// `up_start_rate_per_s`, `up_max_rate_per_s`, `up_decrease`; `sluice sync`
/// `--up-start-rate`, `--up-max-rate`, `--up-decrease`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PaceConfig {
    /// The first rate, EVENTs per second, in `0.1..=1e6`.
    pub start_rate_per_s: f64,
    /// The highest rate, EVENTs per second, in `start_rate_per_s..=1e6`.
    pub max_rate_per_s: f64,
    /// The multiplicative decrease, in `0.1..=0.99`: a cut keeps at least
    /// this fraction of the rate.
    pub decrease: f64,
}

impl Default for PaceConfig {
    /// 10 EVENTs/s to start, at most 10,000/s, a cut keeps at least half.
    fn default() -> Self {
        PaceConfig {
            start_rate_per_s: 10.0,
            max_rate_per_s: 10_000.0,
            decrease: 0.5,
        }
    }
}

impl PaceConfig {
    /// Checks each setting against its range; the error names its key as
    /// `start_rate_per_s`, `max_rate_per_s` or `decrease`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_range(
            "start_rate_per_s",
            self.start_rate_per_s,
            MIN_RATE_PER_S,
            1e6,
            "in 0.1..=1000000",
        )?;
        check_range(
            "max_rate_per_s",
            self.max_rate_per_s,
            self.start_rate_per_s.max(MIN_RATE_PER_S),
            1e6,
            "at least the start rate and at most 1000000",
        )?;
        check_range("decrease", self.decrease, 0.1, 0.99, "in 0.1..=0.99")
    }
}

/// Counts over a sliding window of `slots` slots of `slot_ns` each; a slot
/// is reused once it falls out of the window. Fixed size: made once.
#[derive(Debug, Clone)]
pub struct Window {
    slot_ns: u64,
    counts: Box<[u64]>,
    /// The slot number (`now_ns / slot_ns`) of the newest slot written.
    head: u64,
}

impl Window {
    /// A window of `slots` (at least 1) slots of `slot_ns` (at least 1).
    pub fn new(slot_ns: u64, slots: usize) -> Window {
        Window {
            slot_ns: slot_ns.max(1),
            counts: vec![0; slots.max(1)].into_boxed_slice(),
            head: 0,
        }
    }

    /// The window's length.
    pub fn span_ns(&self) -> u64 {
        self.slot_ns * self.counts.len() as u64
    }

    fn advance(&mut self, now_ns: u64) {
        let slot = now_ns / self.slot_ns;
        if slot <= self.head {
            return;
        }
        let n = self.counts.len() as u64;
        let stale = (slot - self.head).min(n);
        for s in (slot - stale + 1)..=slot {
            self.counts[(s % n) as usize] = 0;
        }
        self.head = slot;
    }

    /// Counts `n` at `now_ns` (a time before the newest counts there).
    pub fn add(&mut self, now_ns: u64, n: u64) {
        self.advance(now_ns);
        let len = self.counts.len() as u64;
        self.counts[(self.head % len) as usize] += n;
    }

    /// The count over the window ending at `now_ns`.
    pub fn sum(&mut self, now_ns: u64) -> u64 {
        self.advance(now_ns);
        self.counts.iter().sum()
    }

    /// The count per second over the window ending at `now_ns`, or over
    /// the time since `since_ns` when that is shorter (a window not yet
    /// full is not diluted by time before it began).
    pub fn rate_per_s(&mut self, now_ns: u64, since_ns: u64) -> f64 {
        // The slots summed: the full ones before now's, and now's so far.
        let covered = self.span_ns() - self.slot_ns + now_ns % self.slot_ns;
        let span = covered.min(now_ns.saturating_sub(since_ns)).max(1);
        self.sum(now_ns) as f64 * NS_PER_S / span as f64
    }
}

/// The pace of one uploader: a leaky bucket at the rate an AIMD loop sets.
#[derive(Debug, Clone)]
pub struct SendPace {
    cfg: PaceConfig,
    rate: f64,
    slow_start: bool,
    /// Added per interval after slow start.
    step: f64,
    /// Paced intervals since the last cut (none in between).
    quiet: u32,
    /// The leaky bucket: schedule time of the next send.
    next_ns: u64,
    interval_start_ns: u64,
    sent_in_interval: u64,
    cut_in_interval: bool,
    /// When the last cut was (none yet: `None`).
    cut_ns: Option<u64>,
    /// Answers other than `rate-limited`: the rate the peer admits.
    admitted: Window,
    started_ns: u64,
    cuts: u64,
}

impl SendPace {
    /// A pace at `cfg.start_rate_per_s` in slow start; `cfg` is clamped to
    /// its ranges (validate it first to refuse a bad one).
    pub fn new(cfg: PaceConfig, now_ns: u64) -> SendPace {
        let max = clamp_rate(cfg.max_rate_per_s);
        let cfg = PaceConfig {
            start_rate_per_s: clamp_rate(cfg.start_rate_per_s).min(max),
            max_rate_per_s: max,
            decrease: clamp_finite(cfg.decrease, 0.1, 0.99, 0.5),
        };
        SendPace {
            cfg,
            rate: cfg.start_rate_per_s,
            slow_start: true,
            step: cfg.start_rate_per_s * ADD_FRACTION,
            quiet: 0,
            next_ns: now_ns,
            interval_start_ns: now_ns,
            sent_in_interval: 0,
            cut_in_interval: false,
            cut_ns: None,
            admitted: Window::new(ESTIMATE_WINDOW_NS / 20, 20),
            started_ns: now_ns,
            cuts: 0,
        }
    }

    /// The rate now, EVENTs per second.
    pub fn rate_per_s(&mut self, now_ns: u64) -> f64 {
        self.advance(now_ns);
        self.rate
    }

    /// Whether the first cut is yet to come.
    pub fn in_slow_start(&self) -> bool {
        self.slow_start
    }

    /// Cuts so far.
    pub fn cuts(&self) -> u64 {
        self.cuts
    }

    /// The rate the peer was seen admitting over the estimate window.
    pub fn admitted_per_s(&mut self, now_ns: u64) -> f64 {
        self.admitted.rate_per_s(now_ns, self.started_ns)
    }

    /// Nanoseconds until the next send may go (0: now).
    pub fn wait_ns(&mut self, now_ns: u64) -> u64 {
        self.advance(now_ns);
        self.next_ns.saturating_sub(now_ns)
    }

    /// One EVENT went at `now_ns` (the caller checked [`SendPace::wait_ns`]).
    pub fn sent(&mut self, now_ns: u64) {
        self.advance(now_ns);
        // Late: the schedule catches up, but keeps no more than the slack.
        let floor = now_ns.saturating_sub(SLACK_NS);
        self.next_ns = self.next_ns.max(floor) + self.interval_ns();
        self.sent_in_interval += 1;
    }

    /// The peer answered an EVENT with anything but `rate-limited`
    /// (accepted, already there, or a final refusal): it admitted it.
    pub fn admitted(&mut self, now_ns: u64) {
        self.advance(now_ns);
        self.admitted.add(now_ns, 1);
    }

    /// The peer answered `rate-limited` to an EVENT sent at `sent_ns`.
    /// Cuts unless the event went before the last cut (that congestion was
    /// answered already). Whether it cut.
    pub fn rate_limited(&mut self, now_ns: u64, sent_ns: u64) -> bool {
        self.advance(now_ns);
        if self.cut_ns.is_some_and(|c| sent_ns < c) {
            return false;
        }
        self.cut(now_ns);
        true
    }

    /// The peer sent a NOTICE about our rate: cuts unless the last cut is
    /// younger than [`NOTICE_HOLD_NS`]. Whether it cut.
    pub fn rate_notice(&mut self, now_ns: u64) -> bool {
        self.advance(now_ns);
        if self
            .cut_ns
            .is_some_and(|c| now_ns.saturating_sub(c) < NOTICE_HOLD_NS)
        {
            return false;
        }
        self.cut(now_ns);
        true
    }

    fn interval_ns(&self) -> u64 {
        (NS_PER_S / self.rate).round().max(1.0) as u64
    }

    fn cut(&mut self, now_ns: u64) {
        let admitted = self.admitted.rate_per_s(now_ns, self.started_ns);
        let floor = self.rate * self.cfg.decrease;
        let estimate = admitted * ESTIMATE_MARGIN;
        let rate = floor.max(estimate.min(self.rate * LEAST_CUT));
        self.rate = clamp_rate(rate).min(self.cfg.max_rate_per_s);
        self.step = (self.rate * ADD_FRACTION).max(MIN_RATE_PER_S * ADD_FRACTION);
        self.slow_start = false;
        self.cut_ns = Some(now_ns);
        self.cut_in_interval = true;
        self.quiet = 0;
        self.cuts += 1;
        // The next send waits a whole interval at the new rate: the peer's
        // bucket, empty now, refills first.
        self.next_ns = self.next_ns.max(now_ns + self.interval_ns());
    }

    /// Closes the intervals that ended by `now_ns`, raising the rate for
    /// each that was paced and saw no cut.
    fn advance(&mut self, now_ns: u64) {
        if now_ns < self.interval_start_ns + INTERVAL_NS {
            return;
        }
        let allowed = self.rate * INTERVAL_NS as f64 / NS_PER_S;
        let paced = self.sent_in_interval as f64 >= (allowed * USED_FRACTION).max(1.0);
        if paced && !self.cut_in_interval {
            let raised = if self.slow_start {
                self.rate * SLOW_START_GROWTH
            } else {
                // Probing: past a quiet spell the step doubles per interval,
                // never faster than slow start.
                let boost = self.quiet.saturating_sub(QUIET_BEFORE_PROBE).min(40);
                let step = self.step * f64::from(1u32 << boost.min(30));
                (self.rate + step).min(self.rate * SLOW_START_GROWTH)
            };
            self.quiet = self.quiet.saturating_add(1);
            self.rate = raised.min(self.cfg.max_rate_per_s);
        }
        // Later intervals had no sends (the caller was idle).
        let elapsed = (now_ns - self.interval_start_ns) / INTERVAL_NS;
        self.interval_start_ns += elapsed * INTERVAL_NS;
        self.sent_in_interval = 0;
        self.cut_in_interval = false;
    }
}

fn clamp_finite(v: f64, lo: f64, hi: f64, otherwise: f64) -> f64 {
    if v.is_finite() {
        v.clamp(lo, hi)
    } else {
        otherwise
    }
}

fn clamp_rate(r: f64) -> f64 {
    clamp_finite(r, MIN_RATE_PER_S, 1e6, MIN_RATE_PER_S)
}

/// Retries (re-sends) per window: at most `ratio` of the first sends in
/// the window, and never fewer than `floor` (so a transfer's last refused
/// events still go again). P77-6 of docs/design.md#aimd-leaky-bucket-and-retry-budgets.
#[derive(Debug, Clone)]
pub struct RetryBudget {
    ratio: f64,
    floor: u64,
    firsts: Window,
    retries: Window,
}

/// The retry budget's window.
pub const RETRY_WINDOW_NS: u64 = 10_000_000_000;
/// Retries allowed per window as a fraction of its first sends.
pub const RETRY_RATIO: f64 = 0.2;
/// Retries allowed per window whatever the first sends.
pub const RETRY_FLOOR: u64 = 10;

impl Default for RetryBudget {
    fn default() -> Self {
        RetryBudget::new(RETRY_RATIO, RETRY_FLOOR, RETRY_WINDOW_NS)
    }
}

impl RetryBudget {
    /// A budget of `ratio` (clamped to `0..=1`) of first sends, at least
    /// `floor`, per `window_ns` (in ten slots).
    pub fn new(ratio: f64, floor: u64, window_ns: u64) -> RetryBudget {
        let slot = (window_ns / 10).max(1);
        RetryBudget {
            ratio: clamp_finite(ratio, 0.0, 1.0, 0.0),
            floor,
            firsts: Window::new(slot, 10),
            retries: Window::new(slot, 10),
        }
    }

    /// A first send went at `now_ns`.
    pub fn first_sent(&mut self, now_ns: u64) {
        self.firsts.add(now_ns, 1);
    }

    /// Retries the window allows at `now_ns`.
    pub fn allowed(&mut self, now_ns: u64) -> u64 {
        let by_ratio = (self.firsts.sum(now_ns) as f64 * self.ratio) as u64;
        by_ratio.max(self.floor)
    }

    /// Retries left in the window at `now_ns`.
    pub fn left(&mut self, now_ns: u64) -> u64 {
        self.allowed(now_ns)
            .saturating_sub(self.retries.sum(now_ns))
    }

    /// Takes one retry if the budget has one. Whether it had.
    pub fn try_retry(&mut self, now_ns: u64) -> bool {
        if self.left(now_ns) == 0 {
            return false;
        }
        self.retries.add(now_ns, 1);
        true
    }

    /// Nanoseconds until the window slides by a slot (when a spent budget
    /// may have room again): what a caller with retries waiting sleeps.
    pub fn wait_ns(&self, now_ns: u64) -> u64 {
        let slot = self.retries.slot_ns;
        slot - now_ns % slot
    }
}

#[cfg(test)]
mod tests;
