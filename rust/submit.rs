// SPDX-License-Identifier: GPL-2.0

//! The submission engine (after idxd's `submit.c`): the one loop that runs the driver's copies
//! ([`run`]), and the writers every submission of a queue goes through.
//!
//! A submission is written under one hold of the queue lock, all or nothing: its pairs (as the
//! splitter, `split.rs`, cuts them), the buffer holds of a user's submission, and the fence
//! that rings the doorbells; if anything fails, everything it wrote is taken back
//! ([`Queue::all_or_nothing`]). The loop writes one submission per queue whenever that queue
//! has none in flight, waits for the fences and for room in a ring full of other callers'
//! submissions with the driver's one back-off ([`Backoff`]), and resets a queue on an engine
//! error or a stall by one rule; what differs between its callers (`MEMCPY` and `MEMSET`, the
//! scrub on one or several queues, the device-ring fill, the KUnit copies) is data: the
//! [`Policy`] (signals, timeout, what a timeout does) and a stop check. dmaengine's look (from
//! the completion engine) writes one submission at a time with [`submit`]; the user queues'
//! prepare calls with [`prepare`] and [`prepare_fenced`], or, checked in one pass with their
//! pairs written ahead, with [`publish`] and [`publish_fenced`].
//!
//! The engine is below the door: it works on the [`Queue`] a [`Door`] (the channel) lends it
//! under the queue lock, with the policy it is handed, and never names its caller.

use crate::{
    bar0::Bar0,
    counters::ResetCause,
    engine::{self, EngineErrors, EngineIo, QueueId},
    fence,
    holds::Holds,
    kfac::sched::{cpu_wanted, fatal_signal_pending},
    queue::{Copy, Doorbell, FenceState, Queue, Written},
    split::{self, Cut, Job, Move},
};
use core::fmt;
use kernel::{
    prelude::*,
    processor::cpu_relax,
    time::{delay::fsleep, Delta, Instant, Monotonic},
};

/// Default time a completion wait may take before the queue is declared stuck; on the
/// driver's shared H2T queue, only a wait at least this long resets the queue.
pub(crate) const DEFAULT_TIMEOUT: Delta = Delta::from_secs(10);
/// When a wait first reads the engine's error state (a device register read, slow on the
/// model), and how often afterwards: only a late fence costs register reads.
const STATE_CHECK_FIRST: Delta = Delta::from_millis(5);
/// Period of the engine state reads after [`STATE_CHECK_FIRST`].
pub(crate) const STATE_CHECK_EVERY: Delta = Delta::from_millis(20);
/// Most queues one [`run`] runs on.
pub(crate) const MAX_SPLIT: usize = 4;

/// How the engine reaches one queue: its lock (with the queue's doorbell, or with its engine's
/// registers) and its device. The channel (`channel.rs`) is the implementation; the engine
/// never calls back into anything else of it.
pub(crate) trait Door {
    /// The queue's doorbell ([`Doorbell`]).
    type Bell<'a>: Doorbell
    where
        Self: 'a;

    /// Runs `f` on the queue under its lock (no register access).
    ///
    /// # Errors
    ///
    /// `ECANCELED` if the queue was released, `ENODEV` if the device was unbound.
    fn locked<R>(&self, f: impl FnOnce(&mut Queue) -> Result<R>) -> Result<R>;

    /// Runs `f` on the queue under its lock with the queue's doorbell, which takes the register
    /// guard only to ring (and may sleep before, while descriptors are moved).
    ///
    /// # Errors
    ///
    /// `ECANCELED` if the queue was released, `ENODEV` if the device was unbound.
    fn with_ringer<R>(&self, f: impl FnOnce(&mut Queue, Self::Bell<'_>) -> Result<R>) -> Result<R>;

    /// Runs `f` on the queue and its engine's registers, under the queue lock and inside the
    /// register guard (an RCU read section: `f` must not sleep or allocate).
    ///
    /// # Errors
    ///
    /// `ECANCELED` if the queue was released, `ENODEV` if the device was unbound.
    fn with_io<R>(&self, f: impl FnOnce(&mut Queue, EngineIo<'_>) -> Result<R>) -> Result<R>;

    /// The device's registers, generation and message rate limit.
    fn bar(&self) -> &Bar0;

    /// The queue's engine and index (for messages and register access).
    fn id(&self) -> QueueId;
}

/// How a wait treats signals.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WaitMode {
    /// Any signal ends the wait with `EINTR` (the copies go on).
    Interruptible,
    /// Only a fatal signal (SIGKILL) ends the wait with `EINTR`.
    Killable,
    /// Signals are ignored (driver-internal copies, bounded by their timeout).
    Uninterruptible,
}

impl WaitMode {
    /// Whether a signal of this kind is pending for the current task.
    fn interrupted(self) -> bool {
        match self {
            WaitMode::Interruptible => kernel::current!().signal_pending(),
            WaitMode::Killable => fatal_signal_pending(),
            WaitMode::Uninterruptible => false,
        }
    }
}

/// What a timed-out wait does to the queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OnTimeout {
    /// Reset it: the caller owns the queue and its timeout says the queue is stuck (the KUnit
    /// suites' own queues; every queue a user or another file shares resets only when stuck).
    #[cfg_attr(not(neuron_udma_kunit), allow(dead_code))]
    Reset,
    /// Reset it only if it made no progress for [`DEFAULT_TIMEOUT`] (a shared queue: other
    /// callers' copies go on otherwise).
    ResetIfStuck,
    /// As [`OnTimeout::ResetIfStuck`], but [`run`] then waits on: nothing of its copy may be
    /// left in flight, so only a stuck queue ends a wait. A ring full of other callers'
    /// submissions is waited for at most the timeout each time it is found full, and SIGKILL
    /// ends that wait (nothing of the copy in flight then): the moves of a device ring's
    /// descriptors on the shared H2T queue.
    WaitUnlessStuck,
}

/// How [`run`] and a wait treat signals and timeouts.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Policy {
    /// Which signals end a wait.
    pub(crate) signals: WaitMode,
    /// Bound of each submission's wait.
    pub(crate) timeout: Delta,
    /// What a timeout does to the queue.
    pub(crate) on_timeout: OnTimeout,
}

/// How a [`run`] on several queues ended.
#[must_use]
pub(crate) enum SplitFinish {
    /// Every byte of every part moved.
    Done,
    /// A part failed, and nothing of any part is in flight any more.
    Failed(Error),
    /// It ended early (`EINTR`, `ETIMEDOUT` without a reset, or any error that left a fence
    /// unsettled) with these submissions still in flight: `(part, fence)`; what the parts use
    /// must stay reserved until they settle.
    InFlight {
        err: Error,
        fences: [Option<(usize, u64)>; MAX_SPLIT],
    },
}

/// How a copy on one queue ended ([`transfer`]).
#[derive(Debug, PartialEq, Eq)]
#[must_use]
pub(crate) enum Finish {
    /// Every byte moved.
    Done,
    /// It failed, and nothing of it is in flight any more.
    Failed(Error),
    /// It ended early (`EINTR`, `ETIMEDOUT` without a reset, or any error that left the fence
    /// unsettled) while its last submission, covered by fence `seq`, is still in flight: what it
    /// uses must stay reserved until that fence is settled (`Channel::is_settled`; `orphan.rs`).
    InFlight {
        /// The error the call returns.
        err: Error,
        /// The fence that covers the submission.
        seq: u64,
    },
}

impl Finish {
    /// The call's result.
    #[cfg(neuron_udma_kunit)]
    pub(crate) fn result(&self) -> Result {
        match self {
            Finish::Done => Ok(()),
            Finish::Failed(e) | Finish::InFlight { err: e, .. } => Err(*e),
        }
    }
}

// ---- the writers: every data pair goes through them ----

/// Writes the pairs `copies` of one user prepare call, all or none, with `holds` keeping their
/// buffers busy until the engine is done with them; the largest copy among them took
/// `largest` pairs.
///
/// # Errors
///
/// `E2BIG` if that copy takes more pairs than the queue's empty rings hold (it can never fit:
/// not "wait first"), `ENOSPC` if the rings have no room for all of them now (after retiring
/// what completed), `ENOMEM`; nothing is written then.
#[inline]
pub(crate) fn prepare(q: &mut Queue, copies: &[Copy], largest: u32, holds: Holds) -> Result {
    if largest > q.capacity_pairs() {
        return Err(E2BIG);
    }
    q.retire();
    q.write_submission(copies, holds)
}

/// Writes the pairs `copies` as [`prepare`] does, then a fence after everything prepared, and
/// rings the doorbells through `bell`, as one step (the io_uring copy, which must not leave its
/// pairs prepared when no fence can follow them). Returns the fence.
///
/// # Errors
///
/// `EBUSY` (every completion slot in flight), those of [`prepare`] and of the doorbell;
/// nothing is written then.
pub(crate) fn prepare_fenced(
    q: &mut Queue,
    bell: impl Doorbell,
    copies: &[Copy],
    largest: u32,
    holds: Holds,
) -> Result<u64> {
    if largest > q.capacity_pairs() {
        return Err(E2BIG);
    }
    fenced(q, bell, |q| q.write_submission(copies, holds))
}

/// Publishes the pairs one prepare call checked and wrote ahead in one pass (`w`, of `bytes`
/// bytes: `Channel::prepare_in_line`) as [`prepare`] writes its pairs, after retiring what
/// completed (a retire only acks: the pairs written ahead stay in their slots). The copies took
/// a pair each, within the room the rings had before the retire: no `E2BIG`, no `ENOSPC`.
///
/// # Errors
///
/// `ENOMEM`; nothing is published then.
pub(crate) fn publish(q: &mut Queue, w: Written, holds: Holds, bytes: u64) -> Result {
    q.retire();
    q.publish(w, holds, || bytes)
}

/// [`publish`], then a fence after everything prepared, rung through `bell`, as one step (as
/// [`prepare_fenced`]). Returns the fence.
///
/// # Errors
///
/// `EBUSY` (every completion slot in flight), `ENOMEM`, those of the doorbell; nothing is
/// published then.
pub(crate) fn publish_fenced(
    q: &mut Queue,
    bell: impl Doorbell,
    w: Written,
    holds: Holds,
    bytes: u64,
) -> Result<u64> {
    fenced(q, bell, |q| q.publish(w, holds, || bytes))
}

/// What [`prepare_fenced`] and [`publish_fenced`] do with their pairs: after retiring what
/// completed, `write` them, then a fence after everything prepared, rung through `bell`, as one
/// step ([`Queue::all_or_nothing`]): if the fence cannot be added or rung, what `write` wrote is
/// taken back with it (and its holds dropped), so the copies of a failed call never run later.
/// Returns the fence.
///
/// # Errors
///
/// `EBUSY` (every completion slot in flight), those of `write` and of [`Queue::fence`];
/// nothing is written then.
fn fenced(
    q: &mut Queue,
    bell: impl Doorbell,
    write: impl FnOnce(&mut Queue) -> Result,
) -> Result<u64> {
    q.retire();
    if q.fences_full() {
        return Err(EBUSY);
    }
    q.all_or_nothing(|q| {
        write(q)?;
        q.fence(bell)
    })
}

/// Writes as many pairs of `cut` as one fenced submission may take now (the generation's final
/// barrier on the last, hardware.rst §6.1), then a fence, and rings the doorbells. Returns the
/// fence, or `None` when the rings have no room.
///
/// # Errors
///
/// `ERANGE` if a side of the copy ends before it does, `ECANCELED`, `ENODEV`; nothing is
/// written then.
pub(crate) fn submit<D: Door>(door: &D, cut: &mut Cut<'_>) -> Result<Option<u64>> {
    let last = door.bar().arch.final_barrier;
    door.with_ringer(|q, bell| {
        let room = q.submission_room();
        if room == 0 {
            return Ok(None);
        }
        // All or nothing: the pairs and the fence, or nothing written (the cut has moved on:
        // the copy fails as a whole).
        q.all_or_nothing(|q| {
            let (mut pairs, mut bytes) = (0u32, 0u64);
            split::submission(cut, room, last, |c| {
                q.prepare_one(c)?;
                pairs += 1;
                bytes += u64::from(c.len.bytes());
                Ok(())
            })?;
            q.trace_submit(pairs, bytes);
            q.fence(bell)
        })
        .map(Some)
    })
}

// ---- the loop ----

/// Copies `job` on `door`'s queue with `policy`, asking `stop` before each submission: an
/// error it returns ends the copy there, with nothing of it in flight. Splits the copy into
/// pairs (`split.rs`); writes at most 2032 of them plus one marker per doorbell and never more
/// than the free space; waits for each submission (the policy's timeout bounding each wait)
/// before the next. A full ring is waited for within the timeout, and reset when stuck.
pub(crate) fn transfer<D: Door>(
    door: &D,
    job: &Job<'_>,
    policy: &Policy,
    stop: impl Fn() -> Option<Error>,
) -> Finish {
    if job.size == 0 {
        return Finish::Failed(EINVAL);
    }
    match run(&mut [(door, Cut::job(job))], policy, stop) {
        SplitFinish::Done => Finish::Done,
        SplitFinish::Failed(e) => Finish::Failed(e),
        SplitFinish::InFlight { err, fences } => match fences[0] {
            Some((_, seq)) => Finish::InFlight { err, seq },
            None => Finish::Failed(err),
        },
    }
}

/// Runs the jobs of `parts`, each on its own queue, at the same time ([`run`]), asking `stop`
/// before each submission; at most [`MAX_SPLIT`] parts.
pub(crate) fn transfer_split<D: Door>(
    parts: &[(&D, Job<'_>)],
    policy: &Policy,
    stop: impl Fn() -> Option<Error>,
) -> SplitFinish {
    let n = parts.len().min(MAX_SPLIT);
    let Some(&(first, _)) = parts.first() else {
        return SplitFinish::Done;
    };
    let mut cuts: [(&D, Cut<'_>); MAX_SPLIT] = core::array::from_fn(|i| match parts.get(i) {
        Some((door, job)) => (*door, Cut::job(job)),
        None => (first, Cut::EMPTY),
    });
    run(&mut cuts[..n], policy, stop)
}

/// Makes the moves `moves` (device-fabric addresses) in order on `door`'s queue, in as few
/// fenced submissions as the rings allow, waiting for each: how the driver's shared H2T queue
/// moves the descriptors of a queue whose rings are in device memory (`devring.rs`). Nothing of
/// the move is in flight when this returns ([`OnTimeout::WaitUnlessStuck`]): the descriptors go
/// to device memory the queue gives back when it is released. The queue is reset only when it
/// is stuck (no progress for [`DEFAULT_TIMEOUT`]), never because it is merely slow or busy.
///
/// # Errors
///
/// `EIO` (an engine error; the queue was reset), `ETIMEDOUT` (stuck: the queue was reset; or
/// its ring full of other copies for [`DEFAULT_TIMEOUT`], nothing of this move in flight),
/// `EINTR` (SIGKILL while the ring was full, nothing of this move in flight), `ENODEV`.
pub(crate) fn copy_ranges<D: Door>(door: &D, moves: &[Move]) -> Result {
    let policy = Policy {
        signals: WaitMode::Uninterruptible,
        timeout: DEFAULT_TIMEOUT,
        on_timeout: OnTimeout::WaitUnlessStuck,
    };
    match run(&mut [(door, Cut::moves(moves))], &policy, || None) {
        SplitFinish::Done => Ok(()),
        SplitFinish::Failed(err) | SplitFinish::InFlight { err, .. } => Err(err),
    }
}

/// The submission loop: runs the copies `parts`, each on its own queue (at most
/// [`MAX_SPLIT`]), at the same time. Every queue gets a submission ([`submit`]) whenever it
/// has none in flight and `stop` has nothing to say, and the caller waits for them in turn
/// (`policy`'s timeout per wait). When every ring with work left is full of other callers'
/// submissions, it waits for room with back-off within the timeout (counted from the start,
/// or for [`OnTimeout::WaitUnlessStuck`] from when the ring was found full) and then resets the
/// queues that are stuck. A failure (or `stop`) ends new submissions; the call returns once nothing of
/// it is in flight, or at once with the fences still in flight when a wait ends early
/// (`EINTR`, or `ETIMEDOUT` without a reset).
pub(crate) fn run<D: Door>(
    parts: &mut [(&D, Cut<'_>)],
    policy: &Policy,
    stop: impl Fn() -> Option<Error>,
) -> SplitFinish {
    let n = parts.len().min(MAX_SPLIT);
    let patient = policy.on_timeout == OnTimeout::WaitUnlessStuck;
    let start = Instant::<Monotonic>::now();
    // Since when every ring with work left has been full (nothing of the copy in flight).
    let mut full_since = None;
    // The looks at rings full of other submissions.
    let mut backoff = Backoff::new();
    let mut inflight: [Option<u64>; MAX_SPLIT] = [None; MAX_SPLIT];
    let mut failed: Option<Error> = None;
    loop {
        let mut submitted = false;
        if failed.is_none() {
            for (i, (door, cut)) in parts[..n].iter_mut().enumerate() {
                if inflight[i].is_some() || cut.is_done() {
                    continue;
                }
                if let Some(e) = stop() {
                    failed = Some(e);
                    break;
                }
                match submit(*door, cut) {
                    Ok(Some(seq)) => {
                        inflight[i] = Some(seq);
                        submitted = true;
                    }
                    // Full of other submissions: again next round.
                    Ok(None) => {}
                    Err(e) => failed = Some(e),
                }
            }
        }
        if submitted {
            full_since = None;
            backoff.progress();
        }
        let busy = inflight.iter().any(Option::is_some);
        for i in 0..n {
            let Some(seq) = inflight[i] else { continue };
            let door = parts[i].0;
            let waited = loop {
                match wait(door, seq, policy) {
                    // Slow, not stuck: the copy is still in flight, so wait on.
                    // Not while a device reset is under way: its stop may be waiting for
                    // this caller's queue lock (a doorbell's move into device memory).
                    Err(e)
                        if patient
                            && e == ETIMEDOUT
                            && !is_settled(door, seq)
                            && !resetting(door) =>
                    {
                        continue
                    }
                    r => break r,
                }
            };
            match waited {
                Ok(()) => inflight[i] = None,
                // Still in flight (`EINTR`, `ETIMEDOUT` without a reset, any other error that
                // left the fence unsettled): nothing of the copy may be given back yet.
                Err(err) if !is_settled(door, seq) => {
                    let mut fences = [None; MAX_SPLIT];
                    for (f, (j, s)) in fences.iter_mut().zip(
                        inflight
                            .iter()
                            .enumerate()
                            .filter_map(|(j, s)| s.map(|s| (j, s))),
                    ) {
                        *f = Some((j, s));
                    }
                    return SplitFinish::InFlight { err, fences };
                }
                // Settled since the wait gave up: done (its marker arrived just after the
                // wait's last look), or failed (the queue was reset).
                Err(e) => {
                    inflight[i] = None;
                    if !matches!(door.locked(|q| q.state(seq)), Ok(FenceState::Done)) {
                        failed.get_or_insert(e);
                    }
                }
            }
        }
        if let Some(e) = failed {
            if inflight.iter().all(Option::is_none) {
                return SplitFinish::Failed(e);
            }
            continue;
        }
        if parts[..n].iter().all(|(_, cut)| cut.is_done()) {
            return SplitFinish::Done;
        }
        if !busy && !submitted {
            // Every ring with work left is full of other submissions.
            let since = if patient {
                *full_since.get_or_insert_with(Instant::<Monotonic>::now)
            } else {
                start
            };
            if since.elapsed() >= policy.timeout {
                // A queue whose slots are all held by submissions that no longer complete is
                // stuck: reset it, whoever waits.
                let mut err = None;
                for (door, _) in parts[..n].iter() {
                    if let Err(e) = reset_if_stuck(*door) {
                        err.get_or_insert(e);
                    }
                }
                return SplitFinish::Failed(err.unwrap_or(ETIMEDOUT));
            }
            if (patient || policy.signals != WaitMode::Uninterruptible) && fatal_signal_pending() {
                return SplitFinish::Failed(EINTR);
            }
            backoff.pause();
        }
    }
}

// ---- waits and the reset rule ----

/// The blocked waiters' way of polling (the fence waits and the wait for room in a full ring;
/// the completion engine, `completion.rs`, polls by each member's measured time instead): spin
/// [`Backoff::SPIN`] after the start or the last progress (a short copy completes within it,
/// and a sleep's wake-up alone costs more, Documentation/benchmarks.rst), then sleep from
/// [`Backoff::SLEEP_FIRST`], doubling up to [`Backoff::SLEEP_MAX`].
struct Backoff {
    since: Instant<Monotonic>,
    delay: Delta,
}

impl Backoff {
    /// How long to poll without sleeping.
    const SPIN: Delta = Delta::from_micros(50);
    /// First sleep after the spin.
    const SLEEP_FIRST: Delta = Delta::from_micros(10);
    /// Longest sleep between two looks: the latency the polling adds at most.
    const SLEEP_MAX: Delta = Delta::from_millis(1);

    /// Starts polling now.
    fn new() -> Self {
        Self {
            since: Instant::now(),
            delay: Self::SLEEP_FIRST,
        }
    }

    /// Progress was seen: spin again.
    fn progress(&mut self) {
        *self = Self::new();
    }

    /// Waits before the next look: a `cpu_relax()` while spinning, else a sleep. It spins only
    /// while no other task wants the CPU ([`cpu_wanted`]): a waiter's spin must not keep the
    /// completion engine or another waiter from running.
    fn pause(&mut self) {
        if self.since.elapsed() < Self::SPIN && !cpu_wanted() {
            cpu_relax();
            return;
        }
        fsleep(self.delay);
        self.delay = Delta::from_micros(
            (self.delay.as_micros_ceil() * 2).min(Self::SLEEP_MAX.as_micros_ceil()),
        );
    }
}

/// Whether fence `seq` is no longer in flight ([`Queue::is_settled`]); a released queue has
/// nothing in flight.
pub(crate) fn is_settled<D: Door>(door: &D, seq: u64) -> bool {
    door.locked(|q| Ok(q.is_settled(seq))).unwrap_or(true)
}

/// The engine's error state (a device register read).
fn engine_errors<D: Door>(door: &D) -> Result<EngineErrors> {
    let regs = door.bar().access()?;
    Ok(engine::engine_errors(regs.engine(door.id().eng)?))
}

/// Waits until fence `seq` is settled, with `policy`: polls the fence with back-off, reads the
/// engine state now and then (an abort resets the queue at once), and on a timeout resets the
/// queue as the policy says.
///
/// # Errors
///
/// `ETIMEDOUT` if the fence did not complete in time (the copies go on unless the queue was
/// reset), `EIO` if the fence failed (an engine error, or a reset dropped it), `ESTALE` if it
/// expired, `EINVAL` for a fence not submitted, `EINTR` on a signal the policy heeds (the
/// copies go on), `ECANCELED`, `ENODEV`.
pub(crate) fn wait<D: Door>(door: &D, seq: u64, policy: &Policy) -> Result {
    let start = Instant::<Monotonic>::now();
    let r = wait_engine(door, seq, policy);
    if r.is_ok() || !resetting(door) {
        return r;
    }
    // The register gate closed under the wait (a device reset, `device/reset.rs`): its `EIO` is
    // not the fence's outcome. A settled fence says what it is; else the reset's stop settles it.
    match door.locked(|q| q.state(seq)).map(fence::outcome) {
        Ok(Some(outcome)) => outcome,
        Ok(None) => settle_in_reset(door, seq, policy, start),
        Err(e) => Err(e),
    }
}

/// Whether a device reset is under way: the register gate is closed ([`Bar0::check`]).
fn resetting<D: Door>(door: &D) -> bool {
    door.bar().check().is_err()
}

/// Waits, without touching the registers, for the device reset under way to settle fence
/// `seq` (its stop fails every fence in flight within its pass over the queues), and returns
/// the fence's outcome; the wait that began at `start` keeps its timeout.
///
/// # Errors
///
/// As [`wait`]; `ETIMEDOUT` (the fence still in flight) if it did not settle within the
/// policy's timeout, `EINTR` on a signal the policy heeds.
fn settle_in_reset<D: Door>(
    door: &D,
    seq: u64,
    policy: &Policy,
    start: Instant<Monotonic>,
) -> Result {
    let mut backoff = Backoff::new();
    loop {
        if let Some(r) = fence::outcome(door.locked(|q| q.state(seq))?) {
            return r;
        }
        if policy.signals.interrupted() {
            return Err(EINTR);
        }
        if start.elapsed() >= policy.timeout {
            return Err(ETIMEDOUT);
        }
        backoff.pause();
    }
}

/// [`wait`] while the registers answer.
fn wait_engine<D: Door>(door: &D, seq: u64, policy: &Policy) -> Result {
    let start = Instant::<Monotonic>::now();
    let mut backoff = Backoff::new();
    let mut next_state_check = STATE_CHECK_FIRST;
    loop {
        if let Some(r) = fence::outcome(door.locked(|q| q.state(seq))?) {
            return r;
        }
        if policy.signals.interrupted() {
            // The copies go on; a later wait completes them.
            return Err(EINTR);
        }
        let elapsed = start.elapsed();
        if elapsed >= policy.timeout {
            break;
        }
        if elapsed >= next_state_check {
            // An engine abort stops the queue for good: look for it now and then (an MMIO
            // read is slow on the model, so not on every check).
            next_state_check = elapsed + STATE_CHECK_EVERY;
            let errors = engine_errors(door)?;
            if errors.aborted() {
                return fail(door, seq, EIO, &errors, policy.timeout);
            }
        }
        backoff.pause();
    }
    // TIMEOUT: one last look, so that a completion racing the deadline is not lost.
    if let Some(r) = fence::outcome(door.locked(|q| q.state(seq))?) {
        return r;
    }
    let errors = engine_errors(door)?;
    if errors.aborted() {
        return fail(door, seq, EIO, &errors, policy.timeout);
    }
    match policy.on_timeout {
        OnTimeout::Reset => fail(door, seq, ETIMEDOUT, &errors, policy.timeout),
        // A waiter that may not reset on its own timeout still resets a queue that has
        // made no progress for the default timeout: it is stuck, not just slow or busy.
        OnTimeout::ResetIfStuck | OnTimeout::WaitUnlessStuck
            if door.with_io(|q, io| Ok(q.stalled_for(io)))? < DEFAULT_TIMEOUT =>
        {
            Err(ETIMEDOUT)
        }
        // A stuck queue is an error whatever the caller's timeout.
        OnTimeout::ResetIfStuck | OnTimeout::WaitUnlessStuck => {
            fail(door, seq, ETIMEDOUT, &errors, DEFAULT_TIMEOUT)
        }
    }
}

/// Logs a failed wait (rate-limited; a caller-chosen timeout at debug level), resets the
/// queue (and an aborted engine) and returns fence `seq`'s outcome as the reset settled it.
///
/// The reset first retires the fences whose markers arrived and settles every fence still
/// in flight as lost, so exactly the waiters of the dropped fences see `err`.
///
/// # Errors
///
/// `err` (`EIO` for an engine error, `ETIMEDOUT` for a timeout) if the reset dropped fence
/// `seq`; `ECANCELED` if the queue was released, `ENODEV` if the device was unbound. `Ok(())`
/// if fence `seq` completed before the reset (its marker arrived after the waiter last
/// looked): its copies are done, whatever the engine did next.
pub(crate) fn fail<D: Door>(
    door: &D,
    seq: u64,
    err: Error,
    errors: &EngineErrors,
    timeout: Delta,
) -> Result {
    let what = if err == EIO {
        "failed: engine error"
    } else {
        "timed out"
    };
    if err == ETIMEDOUT && timeout < DEFAULT_TIMEOUT {
        log_reset(
            door,
            true,
            format_args!("fence {} timed out after {} ms", seq, timeout.as_millis()),
        );
    } else {
        log_reset(
            door,
            false,
            format_args!(
                "fence {} {} (m2s state {:#x} cause {:#x}, s2m state {:#x} cause {:#x})",
                seq, what, errors.m2s.state, errors.m2s.cause, errors.s2m.state, errors.s2m.cause
            ),
        );
    }
    if err == EIO {
        // The abort is counted under the same hold of the queue lock as the reset, and only
        // if the engine is still aborted: of several waiters that saw one abort, the first to
        // reset counts it (the others still reset, as before, and count their resets).
        door.with_io(|q, io| {
            let now = engine::engine_errors(io);
            if now.aborted() {
                note_abort(q, &now);
            }
            reset_queue(q, io, EIO, ResetCause::EngineError);
            Ok(())
        })?;
    } else {
        reset(door, err)?;
    }
    match door.locked(|q| q.state(seq))? {
        FenceState::Done => Ok(()),
        _ => Err(err),
    }
}

/// Logs why `door`'s queue is being reset: `what`, after the engine and queue, at debug level
/// (`debug`: a timeout the caller chose), or at error level within the device's rate limit
/// (user space can provoke these).
fn log_reset<D: Door>(door: &D, debug: bool, what: fmt::Arguments<'_>) {
    let (bar, eng, q) = (door.bar(), door.id().eng.get(), door.id().q.number());
    if debug {
        dev_dbg!(
            bar.pdev,
            "engine {eng} queue {q}: {what}; resetting the queue\n"
        );
    } else if bar.log_limit.allow() {
        dev_err!(
            bar.pdev,
            "engine {eng} queue {q}: {what}; resetting the queue\n"
        );
    }
}

/// Reports (counter, tracepoint) that queue `q` found its engine aborted with `errors`.
fn note_abort(q: &Queue, errors: &EngineErrors) {
    let (m2s, s2m) = (&errors.m2s, &errors.s2m);
    q.engine_aborted((m2s.state, m2s.cause), (s2m.state, s2m.cause));
}

/// Resets the queue if it made no progress for [`DEFAULT_TIMEOUT`] with fences in flight (a
/// hung queue); logged at error level, rate-limited.
///
/// # Errors
///
/// `ECANCELED` if the queue was released, `ENODEV` if the device was unbound.
pub(crate) fn reset_if_stuck<D: Door>(door: &D) -> Result {
    if door.with_io(|q, io| Ok(q.stalled_for(io)))? < DEFAULT_TIMEOUT {
        return Ok(());
    }
    log_reset(
        door,
        false,
        format_args!("no progress for {} s", DEFAULT_TIMEOUT.as_millis() / 1000),
    );
    reset(door, ETIMEDOUT)
}

/// Resets the queue (full queue init, ring id 1, buffer holds dropped, the fences in flight
/// failed with `why`: `EIO`, `ETIMEDOUT` or `ECANCELED`) and returns its engine to normal
/// operation if it is still aborted.
///
/// # Errors
///
/// `ECANCELED` if the queue was released, `ENODEV` if the device was unbound.
pub(crate) fn reset<D: Door>(door: &D, why: Error) -> Result {
    // Counted as a timeout for `ETIMEDOUT`; an engine error's reset goes through `fail` or
    // `recover`, so any other reset here is a terminate, a drain or a dropped fence.
    let cause = if why == ETIMEDOUT {
        ResetCause::Timeout
    } else {
        ResetCause::Other
    };
    door.with_io(|q, io| {
        reset_queue(q, io, why, cause);
        Ok(())
    })
}

/// Resets queue `q` for `why` (counted as `cause`) and recovers its engine if another queue's
/// error still aborts it.
fn reset_queue(q: &mut Queue, io: EngineIo<'_>, why: Error, cause: ResetCause) {
    q.reset(io, why, cause);
    // A queue reset clears an abort caused by this queue; if the engine is still aborted
    // (another queue's error), return it to normal operation too.
    let now = engine::engine_errors(io);
    if now.aborted() {
        engine::recover_engine(io, &now);
    }
}

/// Reads the engine state of a queue with fences in flight: an abort, or no progress for
/// [`DEFAULT_TIMEOUT`], is logged (rate-limited) and resets the queue (every fence in flight
/// then reads `Lost`). Returns the error that ended the fences, if any: `EIO` for an engine
/// error, `ETIMEDOUT` for a stall. For callers that poll fences from a work item. Reads nothing
/// (`None`) while a device reset is under way: its stop settles the fences.
///
/// # Errors
///
/// `ECANCELED` if the queue was released, `ENODEV` if the device was unbound.
pub(crate) fn recover<D: Door>(door: &D) -> Result<Option<Error>> {
    // During a device reset nothing is read: its stop settles the fences in flight.
    if resetting(door) {
        return Ok(None);
    }
    let r = door.with_io(|q, io| {
        let errors = engine::engine_errors(io);
        let (err, why, cause) = if errors.aborted() {
            note_abort(q, &errors);
            (EIO, "failed: engine error", ResetCause::EngineError)
        } else if q.stalled_for(io) >= DEFAULT_TIMEOUT {
            (ETIMEDOUT, "timed out", ResetCause::Timeout)
        } else {
            return Ok(None);
        };
        log_reset(door, false, format_args!("transfer {why}"));
        reset_queue(q, io, err, cause);
        Ok(Some(err))
    });
    match r {
        // The gate closed since the look above.
        Err(_) if resetting(door) => Ok(None),
        r => r,
    }
}
