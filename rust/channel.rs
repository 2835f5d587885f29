// SPDX-License-Identifier: GPL-2.0

//! A queue channel: one queue behind its lock, and the policy of using it — fences, waits,
//! timeouts, error recovery (queue reset) and the copy loop of the driver's own copies.
//!
//! The COPY_WAIT path is `file.rs` (which fence) -> [`Channel::wait`] (poll, sleep, time out)
//! -> `queue.rs` (collect the fence's outcome) -> `engine.rs` (error state, reset): data flows
//! one way, and only this file decides when a queue is reset.

use crate::{
    bar0::Bar0,
    desc::{Barrier, DescLen, MAX_DESC_BYTES},
    engine::{self, EngineErrors, EngineIo},
    mem::Charge,
    queue::{self, FenceState, Queue},
    shim::fatal_signal_pending,
    span::{Pieces, Span},
};
use kernel::{
    new_mutex,
    prelude::*,
    processor::cpu_relax,
    sync::{Arc, Mutex},
    time::{delay::fsleep, Delta, Instant, Monotonic},
};

/// Default time a completion wait may take before the queue is declared stuck; on the
/// driver's shared H2T queue, only a wait at least this long resets the queue.
pub(crate) const DEFAULT_TIMEOUT: Delta = Delta::from_secs(10);
/// Shortest timeout a caller may choose (shorter ones are raised to it), in milliseconds.
pub(crate) const MIN_TIMEOUT_MS: u32 = 10;
/// How long a wait polls its fence without sleeping: a small copy completes within it, and a
/// sleep's wake-up alone costs more (Documentation/benchmarks.rst).
const SPIN: Delta = Delta::from_micros(50);
/// First sleep after the spin; each next one doubles, up to [`SLEEP_MAX`].
const SLEEP_FIRST: Delta = Delta::from_micros(10);
/// Longest sleep between two looks at the fence.
const SLEEP_MAX: Delta = Delta::from_millis(1);
/// When a wait first reads the engine's error state (a device register read, slow on the
/// model), and how often afterwards: only a late fence costs register reads.
const STATE_CHECK_FIRST: Delta = Delta::from_millis(5);
/// Period of the engine state reads after [`STATE_CHECK_FIRST`].
const STATE_CHECK_EVERY: Delta = Delta::from_millis(20);

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

/// Who owns a queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Owner {
    /// The driver (H2T queue, KUnit).
    Driver,
    /// An open file, identified by a unique id.
    File(u64),
}

/// One queue of the device in use, with its owner: the queue's software state (`None` once
/// released or after unbind) behind the queue lock, and its engine's registers.
#[pin_data]
pub(crate) struct Channel {
    /// Engine id.
    pub(crate) eng: u32,
    /// Queue id.
    pub(crate) qid: u32,
    /// Owner.
    pub(crate) owner: Owner,
    /// Registers of the device.
    bar: Arc<Bar0>,
    #[pin]
    inner: Mutex<Option<Queue>>,
    /// A file's queue memory (rings, completion slots, pair references) charged to the user
    /// who took it; given back when the queue is released.
    #[pin]
    charge: Mutex<Option<Charge>>,
}

impl Channel {
    /// Wraps queue `q` (engine `eng`, queue `qid`, already programmed) for `owner`, with the
    /// memory charge of a file's queue.
    ///
    /// # Errors
    ///
    /// `ENOMEM`.
    pub(crate) fn new(
        bar: Arc<Bar0>,
        eng: u32,
        qid: u32,
        owner: Owner,
        q: Queue,
        charge: Option<Charge>,
    ) -> Result<Arc<Self>> {
        Arc::pin_init(
            try_pin_init!(Self {
                eng,
                qid,
                owner,
                bar,
                inner <- new_mutex!(Some(q)),
                charge <- new_mutex!(charge),
            }),
            GFP_KERNEL,
        )
    }

    /// Runs `f` on the queue with its engine registers, under the queue lock.
    ///
    /// # Errors
    ///
    /// `ENODEV` if the queue was released or the device unbound.
    pub(crate) fn with<R>(
        &self,
        f: impl FnOnce(&mut Queue, EngineIo<'_>) -> Result<R>,
    ) -> Result<R> {
        let mut inner = self.inner.lock();
        let q = (*inner).as_mut().ok_or(ENODEV)?;
        self.bar.with_engine(self.eng, |io| f(q, io))
    }

    /// Waits for fence `seq` of the queue (one of the caller's registrations, see
    /// [`Queue::fence`]), sleeping between checks; bounded by `timeout`, with one last check
    /// after it. On a timeout or an engine error, logs the engine, queue and error causes and
    /// resets the queue so that it can be used again. Interruptible by any signal.
    ///
    /// # Errors
    ///
    /// `ETIMEDOUT` if the fence did not complete in time, `EIO` if the engine reported an error
    /// or a reset dropped the fence, `EINTR` on a signal (the copies go on), `ENODEV` after
    /// unbind.
    pub(crate) fn wait(&self, seq: u64, timeout: Delta) -> Result {
        self.wait_for(seq, timeout, WaitMode::Interruptible, true)
    }

    /// [`Self::wait`] with a signal policy, and whether a timeout resets the queue. On every
    /// return the caller's registration of `seq` is given back; without a reset, a fence that
    /// is still in flight stays so ([`Queue::is_settled`] tells when it is done).
    pub(crate) fn wait_for(
        &self,
        seq: u64,
        timeout: Delta,
        mode: WaitMode,
        reset_on_timeout: bool,
    ) -> Result {
        let mut collected = false;
        let r = self.wait_inner(seq, timeout, mode, reset_on_timeout, &mut collected);
        if r.is_err() && !collected {
            // Not collected (signal, timeout, engine error): give the registration back.
            let _ = self.with(|q, _| {
                q.abandon(seq);
                Ok(())
            });
        }
        r
    }

    fn wait_inner(
        &self,
        seq: u64,
        timeout: Delta,
        mode: WaitMode,
        reset_on_timeout: bool,
        collected: &mut bool,
    ) -> Result {
        let start = Instant::<Monotonic>::now();
        let mut delay = SLEEP_FIRST;
        let mut next_state_check = STATE_CHECK_FIRST;
        let mut collect = |dev: &Self| {
            let state = dev.with(|q, _| Ok(q.collect(seq)))?;
            *collected = state != FenceState::Pending;
            Ok::<_, Error>(state)
        };
        loop {
            match collect(self)? {
                FenceState::Done => return Ok(()),
                FenceState::Lost => return Err(EIO),
                FenceState::Pending => {}
            }
            let interrupted = match mode {
                WaitMode::Interruptible => kernel::current!().signal_pending(),
                WaitMode::Killable => fatal_signal_pending(),
                WaitMode::Uninterruptible => false,
            };
            if interrupted {
                // The copies go on; a later wait completes them.
                return Err(EINTR);
            }
            let elapsed = start.elapsed();
            if elapsed >= timeout {
                break;
            }
            if elapsed >= next_state_check {
                // An engine abort stops the queue for good: look for it now and then (an MMIO
                // read is slow on the model, so not on every check).
                next_state_check = elapsed + STATE_CHECK_EVERY;
                let errors = self
                    .bar
                    .with_engine(self.eng, |io| Ok(engine::engine_errors(io)))?;
                if errors.aborted() {
                    return self.fail(seq, EIO, &errors, timeout);
                }
            }
            if elapsed < SPIN {
                // A short copy completes within microseconds: poll the completion slot (host
                // memory, no device access) before giving the CPU away.
                cpu_relax();
                continue;
            }
            fsleep(delay);
            delay =
                Delta::from_micros((delay.as_micros_ceil() * 2).min(SLEEP_MAX.as_micros_ceil()));
        }
        // TIMEOUT: one last look, so that a completion racing the deadline is not lost.
        match collect(self)? {
            FenceState::Done => return Ok(()),
            FenceState::Lost => return Err(EIO),
            FenceState::Pending => {}
        }
        let errors = self
            .bar
            .with_engine(self.eng, |io| Ok(engine::engine_errors(io)))?;
        if errors.aborted() {
            return self.fail(seq, EIO, &errors, timeout);
        }
        // A waiter that may not reset on its own timeout still resets a queue that has made no
        // progress for the default timeout: it is stuck, not just slow or busy.
        if !reset_on_timeout && self.with(|q, _| Ok(q.stalled_for()))? < DEFAULT_TIMEOUT {
            return Err(ETIMEDOUT);
        }
        // A stuck shared queue is an error whatever the caller's timeout.
        let logged = if reset_on_timeout {
            timeout
        } else {
            DEFAULT_TIMEOUT
        };
        self.fail(seq, ETIMEDOUT, &errors, logged)
    }

    /// Logs a failed wait (rate-limited; a caller-chosen timeout at debug level) and resets
    /// the queue (and an aborted engine). The reset settles every fence in flight as lost, so
    /// exactly the waiters of the dropped fences see `EIO`.
    fn fail(&self, seq: u64, err: Error, errors: &EngineErrors, timeout: Delta) -> Result {
        let what = if err == EIO {
            "failed: engine error"
        } else {
            "timed out"
        };
        if err == ETIMEDOUT && timeout < DEFAULT_TIMEOUT {
            dev_dbg!(
                self.bar.pdev,
                "engine {} queue {}: fence {} timed out after {} ms; resetting the queue\n",
                self.eng,
                self.qid,
                seq,
                timeout.as_millis()
            );
        } else if self.bar.log_limit.allow() {
            dev_err!(
                self.bar.pdev,
                "engine {} queue {}: fence {} {} (m2s state {:#x} cause {:#x}, s2m state {:#x} cause {:#x}); resetting the queue\n",
                self.eng,
                self.qid,
                seq,
                what,
                errors.m2s_state,
                errors.m2s_cause,
                errors.s2m_state,
                errors.s2m_cause
            );
        }
        self.reset()?;
        Err(err)
    }

    /// Resets the queue if it made no progress for [`DEFAULT_TIMEOUT`] with fences
    /// in flight (a hung queue); logged at error level, rate-limited.
    pub(crate) fn reset_if_stuck(&self) -> Result {
        if self.with(|q, _| Ok(q.stalled_for()))? < DEFAULT_TIMEOUT {
            return Ok(());
        }
        if self.bar.log_limit.allow() {
            dev_err!(
                self.bar.pdev,
                "engine {} queue {}: no progress for {} s; resetting the queue\n",
                self.eng,
                self.qid,
                DEFAULT_TIMEOUT.as_millis() / 1000
            );
        }
        self.reset()
    }

    /// Resets the queue (full queue init, ring id 1, fences dropped) and returns its
    /// engine to normal operation if it is still aborted.
    pub(crate) fn reset(&self) -> Result {
        self.with(|q, io| {
            q.reset(io);
            // A queue reset clears an abort caused by this queue; if the engine is still
            // aborted (another queue's error), return it to normal operation too.
            let now = engine::engine_errors(io);
            if now.aborted() {
                engine::recover_engine(io, &now);
            }
            Ok(())
        })
    }

    /// Copies `size` bytes from device-fabric address `src` to `dst` on this queue, in 64 KiB
    /// pairs: at most 2032 data pairs plus one marker pair per doorbell and never more than the
    /// ring's free space, the generation's final barrier on the last data pair of each
    /// submission (hardware.rst §6.1), waiting (uninterruptibly, resetting the queue on a timeout)
    /// for each submission before the next.
    ///
    /// # Errors
    ///
    /// `EINVAL` for size 0; the errors of [`Self::wait`] but `EINTR`.
    // Only the KUnit suites copy through it; the ioctl paths use `copy`.
    #[cfg(neuron_udma_kunit)]
    pub(crate) fn memcpy(&self, src: u64, dst: u64, size: u64, timeout: Delta) -> Result {
        let mut in_flight = None;
        self.copy(
            Span::Linear(src),
            Span::Linear(dst),
            size,
            timeout,
            WaitMode::Uninterruptible,
            true,
            &mut in_flight,
        )
    }

    /// The copy loop of [`Self::memcpy`] from `src` to `dst` (split at the runs of imported
    /// buffers, [`Pieces`]), with the wait's signal and reset policy. `timeout` bounds each
    /// submission's wait. On an early return (`EINTR`, or `ETIMEDOUT` without a
    /// reset) `in_flight` names the fence still in flight.
    #[expect(clippy::too_many_arguments)]
    pub(crate) fn copy(
        &self,
        src: Span<'_>,
        dst: Span<'_>,
        size: u64,
        timeout: Delta,
        mode: WaitMode,
        reset_on_timeout: bool,
        in_flight: &mut Option<u64>,
    ) -> Result {
        if size == 0 {
            return Err(EINVAL);
        }
        let start = Instant::<Monotonic>::now();
        let mut pieces = Pieces::new(src, dst, size, MAX_DESC_BYTES);
        while pieces.remaining() != 0 {
            let seq = self.with(|q, io| {
                let room = q.submission_room();
                if room == 0 {
                    return Ok(None);
                }
                let mut pairs = 0;
                while pairs < room && pieces.remaining() != 0 {
                    // A span too short for `size` bytes (the callers check the ranges).
                    let (s, d, len) = pieces.next().ok_or(ERANGE)?;
                    let last = pieces.remaining() == 0 || pairs + 1 == room;
                    q.prepare_one(&queue::Copy {
                        src: s,
                        dst: d,
                        len: DescLen::new(len)?,
                        barrier: if last {
                            self.bar.arch.final_barrier
                        } else {
                            Barrier::None
                        },
                        set_dst_int: false,
                    })?;
                    pairs += 1;
                }
                Ok(Some(q.fence(io)?))
            })?;
            match seq {
                Some(seq) => {
                    let r = self.wait_for(seq, timeout, mode, reset_on_timeout);
                    if matches!(r, Err(e) if e == EINTR || e == ETIMEDOUT)
                        && !self.with(|q, _| Ok(q.is_settled(seq)))?
                    {
                        *in_flight = Some(seq);
                    }
                    r?;
                }
                // The ring is full of other submissions: wait for a slot to free up, within the
                // caller's time.
                None => {
                    if start.elapsed() >= timeout {
                        // A queue whose slots are all held by submissions that no longer
                        // complete is stuck: reset it, whoever waits.
                        self.reset_if_stuck()?;
                        return Err(ETIMEDOUT);
                    }
                    if mode != WaitMode::Uninterruptible && fatal_signal_pending() {
                        return Err(EINTR);
                    }
                    fsleep(Delta::from_micros(50));
                }
            }
        }
        Ok(())
    }

    /// Whether fence `seq` is no longer in flight ([`Queue::is_settled`]); a released queue
    /// has nothing in flight.
    pub(crate) fn is_settled(&self, seq: u64) -> bool {
        self.with(|q, _| Ok(q.is_settled(seq))).unwrap_or(true)
    }

    /// Waits (uninterruptibly) until fence `seq` is no longer in flight, resetting the queue
    /// after [`DEFAULT_TIMEOUT`].
    ///
    /// # Errors
    ///
    /// `ENODEV` if the queue was released or the device unbound.
    pub(crate) fn wait_settled(&self, seq: u64) -> Result {
        let start = Instant::<Monotonic>::now();
        while !self.with(|q, _| Ok(q.is_settled(seq)))? {
            if start.elapsed() >= DEFAULT_TIMEOUT {
                return self.reset();
            }
            fsleep(Delta::from_micros(200));
        }
        Ok(())
    }

    /// Stops the engine from using the queue's rings (pause) and drops its memory and charge;
    /// afterwards every operation on the channel fails with `ENODEV`.
    pub(crate) fn quiesce(&self) {
        let mut inner = self.inner.lock();
        if let Some(q) = (*inner).as_mut() {
            // A reset stops the engine from fetching from the rings before they are freed.
            let _ = self.bar.with_engine(self.eng, |io| {
                q.pause(io);
                Ok(())
            });
        }
        *inner = None;
        drop(inner);
        let charge = self.charge.lock().take();
        drop(charge);
    }
}
