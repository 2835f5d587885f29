// SPDX-License-Identifier: GPL-2.0

//! The blocked waiters' way of polling: [`Backoff`]. Every wait in a call polls with it (the
//! submission engine's fence waits and its wait for room in a full ring), so a short copy is
//! seen within the spin and a long one costs a sleep between looks, never a busy CPU. The
//! completion engine (`completion.rs`) polls by each member's measured time instead.

use kernel::{
    processor::cpu_relax,
    time::{delay::fsleep, Delta, Instant, Monotonic},
};

/// Polling with back-off: spin [`Backoff::SPIN`] after the start or the last progress (a short
/// copy completes within it, and a sleep's wake-up alone costs more, Documentation/
/// benchmarks.rst), then sleep from [`Backoff::SLEEP_FIRST`], doubling up to
/// [`Backoff::SLEEP_MAX`].
pub(crate) struct Backoff {
    since: Instant<Monotonic>,
    delay: Delta,
}

impl Backoff {
    /// How long to poll without sleeping.
    pub(crate) const SPIN: Delta = Delta::from_micros(50);
    /// First sleep after the spin.
    pub(crate) const SLEEP_FIRST: Delta = Delta::from_micros(10);
    /// Longest sleep between two looks: the latency the polling adds at most.
    pub(crate) const SLEEP_MAX: Delta = Delta::from_millis(1);

    /// Starts polling now.
    pub(crate) fn new() -> Self {
        Self {
            since: Instant::now(),
            delay: Self::SLEEP_FIRST,
        }
    }

    /// Progress was seen: spin again.
    pub(crate) fn progress(&mut self) {
        *self = Self::new();
    }

    /// Waits before the next look: a `cpu_relax()` while spinning, else a sleep.
    pub(crate) fn pause(&mut self) {
        if self.since.elapsed() < Self::SPIN {
            cpu_relax();
            return;
        }
        fsleep(self.delay);
        self.delay = Delta::from_micros(
            (self.delay.as_micros_ceil() * 2).min(Self::SLEEP_MAX.as_micros_ceil()),
        );
    }
}
