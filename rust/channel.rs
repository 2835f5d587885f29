// SPDX-License-Identifier: GPL-2.0

//! A queue channel: one queue of the device behind its lock, and the only door to it. Every
//! operation on a queue — prepare, start, fence-or-join, wait, reset, state snapshot — is a
//! method here; callers never see the [`Queue`] or the engine's registers.
//!
//! It is also the driver's submission engine ([`Channel::transfer`], after idxd's
//! `idxd_submit_desc`): one loop that splits a copy into pairs (`span.rs`), writes them, rings
//! the doorbells with a fence, waits with back-off, and resets the queue on an engine error or
//! a stall. `MEMCPY`, the device-memory scrub and the KUnit copies run it; the dmaengine
//! provider uses its pieces ([`Channel::room`], [`Channel::submit_pieces`],
//! [`Channel::collect`], [`Channel::recover`]) from its completion work. A [`Policy`] says how signals and timeouts end a wait, and [`Finish`] what
//! is still in flight when a copy ends early.
//!
//! Data flows one way: `file.rs`, `h2t.rs`, `dmaengine.rs` -> here -> `queue.rs` -> `ring.rs`,
//! `engine.rs` (through `bar0.rs`); nothing here calls back into its callers.

use crate::{
    bar0::Bar0,
    buffer::{Buffer, Holds},
    charge::Charge,
    desc::{Barrier, Desc, DescLen, Dir, MAX_DESC_BYTES},
    devring::Moves,
    engine::{self, DescCount, EngineErrors, EngineIo, QueueIndex, QueueRegs},
    events::{EventFd, FileEvents, UringCmd},
    kfac::sched::fatal_signal_pending,
    queue::{self, Doorbell, Queue},
    regs::{M2s, S2m},
    ring::RingState,
    span::{Pieces, Span},
};
use kernel::{
    new_mutex, new_spinlock,
    prelude::*,
    processor::cpu_relax,
    static_lock_class,
    sync::{
        atomic::{Atomic, Relaxed},
        Arc, Mutex, SpinLock,
    },
    time::{delay::fsleep, Delta, Instant, Monotonic},
};

/// A queue of the device (engine and index), as callers name a channel.
pub(crate) use crate::engine::QueueId;
/// What became of a fence.
pub(crate) use crate::queue::FenceState;

/// Default time a completion wait may take before the queue is declared stuck; on the
/// driver's shared H2T queue, only a wait at least this long resets the queue.
pub(crate) const DEFAULT_TIMEOUT: Delta = Delta::from_secs(10);
/// Shortest timeout a caller may choose (shorter ones are raised to it), in milliseconds.
pub(crate) const MIN_TIMEOUT_MS: u32 = 10;
/// When a wait first reads the engine's error state (a device register read, slow on the
/// model), and how often afterwards: only a late fence costs register reads.
const STATE_CHECK_FIRST: Delta = Delta::from_millis(5);
/// Period of the engine state reads after [`STATE_CHECK_FIRST`].
const STATE_CHECK_EVERY: Delta = Delta::from_millis(20);
/// Sleep between two looks at a ring that has no room for a submission.
const FULL_RING_SLEEP: Delta = Delta::from_micros(50);

/// Polling with back-off: spin [`Backoff::SPIN`] after the start or the last progress (a short
/// copy completes within it, and a sleep's wake-up alone costs more, Documentation/
/// benchmarks.rst), then sleep from [`Backoff::SLEEP_FIRST`], doubling up to
/// [`Backoff::SLEEP_MAX`]. Every waiter of the driver polls this way.
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
}

/// How the submission loop ([`Channel::transfer`]) and a wait treat signals and timeouts.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Policy {
    /// Which signals end a wait.
    pub(crate) signals: WaitMode,
    /// Bound of each submission's wait.
    pub(crate) timeout: Delta,
    /// What a timeout does to the queue.
    pub(crate) on_timeout: OnTimeout,
}

/// Most queues one [`Channel::transfer_split`] runs on.
pub(crate) const MAX_SPLIT: usize = 4;

/// How a [`Channel::transfer_split`] ended.
#[must_use]
pub(crate) enum SplitFinish {
    /// Every byte of every part moved.
    Done,
    /// A part failed, and nothing of any part is in flight any more.
    Failed(Error),
    /// It ended early (`EINTR`, or `ETIMEDOUT` without a reset) with these submissions still in
    /// flight: `(part, fence)`; what the parts use must stay reserved until they settle.
    InFlight {
        err: Error,
        fences: [Option<(usize, u64)>; MAX_SPLIT],
    },
}

/// How a copy of the submission loop ended.
#[derive(Debug, PartialEq, Eq)]
#[must_use]
pub(crate) enum Finish {
    /// Every byte moved.
    Done,
    /// It failed, and nothing of it is in flight any more.
    Failed(Error),
    /// It ended early (`EINTR`, or `ETIMEDOUT` without a reset) while its last submission,
    /// covered by fence `seq`, is still in flight: what it uses must stay reserved until that
    /// fence is settled ([`Channel::is_settled`]; `orphan.rs`).
    InFlight {
        /// The error the call returns.
        err: Error,
        /// The fence that covers the submission.
        seq: u64,
    },
}

impl Finish {
    /// The call's result.
    pub(crate) fn result(&self) -> Result {
        match self {
            Finish::Done => Ok(()),
            Finish::Failed(e) | Finish::InFlight { err: e, .. } => Err(*e),
        }
    }
}

/// Who owns a queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Owner {
    /// The driver (H2T queue, dmaengine channels, KUnit).
    Driver,
    /// An open file, identified by a unique id.
    File(u64),
}

/// Register and software state of one queue, copied in one go under its lock
/// ([`Channel::snapshot`]).
#[derive(Clone, Copy)]
pub(crate) struct QueueSnapshot {
    /// Queue registers of the M2S (Tx) and S2M (Rx) directions.
    pub(crate) regs: [QueueRegs; 2],
    /// Software state of the Tx and Rx rings.
    pub(crate) sw: [RingState; 2],
    /// Prepared descriptors not yet doorbelled: `(tx, rx)`.
    pub(crate) pending: (u32, u32),
    /// Times the queue was reset.
    pub(crate) resets: u32,
    /// The engine's state and error causes.
    pub(crate) errors: EngineErrors,
}

/// One ring slot copied out of ring memory ([`Channel::ring_slots`]).
#[derive(Clone, Copy)]
pub(crate) struct RingSlot {
    /// The ring.
    pub(crate) dir: Dir,
    /// Slot index.
    pub(crate) idx: u32,
    /// Before the ack index (completed) rather than outstanding.
    pub(crate) done: bool,
    /// The 16 bytes of the slot.
    pub(crate) desc: Desc,
}

/// What a queue's events reported last (`QUEUE_EVENTS`).
#[derive(Clone, Copy, Default)]
struct Reported {
    done: u64,
    failed: u64,
}

/// What happened on a queue since its events were last reported ([`Channel::peek_events`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct QueueEvents {
    /// Fences completed: the newest done.
    pub(crate) completed: Option<u64>,
    /// A fence failed: the newest failed, and why.
    pub(crate) failed: Option<(u64, Error)>,
    /// The newest fence done (also when nothing new completed).
    pub(crate) done: u64,
}

impl QueueEvents {
    fn since(r: &Reported, done: u64, failed: Option<(u64, Error)>) -> Option<Self> {
        let completed = (done > r.done).then_some(done);
        let failed = failed.filter(|f| f.0 > r.failed);
        (completed.is_some() || failed.is_some()).then_some(Self {
            completed,
            failed,
            done,
        })
    }
}

/// Who hears of the queue's completions besides its waiters (`events.rs`).
#[derive(Default)]
struct Listeners {
    /// What `QUEUE_EVENTS` reported last.
    reported: Reported,
    /// The owning file's poll wait queue.
    file: Option<Arc<FileEvents>>,
    /// The queue's eventfd, and the fences settled when it was last signalled.
    eventfd: Option<EventFd>,
    signalled: u64,
    /// io_uring commands waiting for fences.
    uring: KVec<UringCmd>,
    /// The fences settled when the file's pollers were last woken.
    woken: u64,
}

/// Descriptors one `COPY_WAIT` completed, by the Tx ack position it started from
/// ([`Channel::wait_all`]).
struct Ticket {
    seq: Option<u64>,
    /// No unfenced work is left after this fence.
    last: bool,
    ack_before: u32,
    /// The Tx position where the fence's work ends (`ack_before` without a fence).
    end: u32,
    /// The queue's resets when the ticket was taken: a reset during the wait re-initialised
    /// the rings (the ack position starts again) and dropped the work no fence covered.
    resets: u32,
}

/// One queue of the device in use, with its owner: the queue's software state (`None` once
/// released or after unbind) behind the queue lock, and its engine's registers.
#[pin_data]
pub(crate) struct Channel {
    /// Engine and queue.
    pub(crate) id: QueueId,
    /// Owner.
    pub(crate) owner: Owner,
    /// This queue instance, unique for the module's lifetime (never reused, unlike `id`):
    /// what a command that outlives its call (an IOPOLL io_uring command) names.
    pub(crate) instance: u64,
    /// Why the queue is gone once [`Self::quiesce`] ran: [`Gone::Released`] or
    /// [`Gone::Unbound`] (as `u32`), 0 before.
    gone: Atomic<u32>,
    /// Registers of the device.
    bar: Arc<Bar0>,
    /// The queue that moves descriptors into this queue's rings in device memory when the
    /// engine fills them (the driver's H2T queue, `devring.rs`).
    mover: Option<Arc<Channel>>,
    /// The queue (`None` once released or after unbind). A file's queue whose rings the H2T
    /// queue fills holds this lock while the H2T queue takes its own, so the driver's queues and
    /// the files' have lock classes of their own, a file's always taken first.
    #[pin]
    inner: Mutex<Option<Queue>>,
    /// A file's queue memory (rings, completion slots, fence records) charged to the user
    /// who took it; given back when the queue is released.
    #[pin]
    charge: Mutex<Option<Charge>>,
    /// Who hears of completions besides the waiters; taken before `inner` when both are.
    #[pin]
    listeners: Mutex<Listeners>,
    /// When a poller last read the engine state ([`Self::poll_fence`]).
    #[pin]
    checked_at: SpinLock<Instant<Monotonic>>,
}

/// Why a queue instance ended ([`Channel::quiesce`]); its operations fail with the errno.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Gone {
    /// `QUEUE_RELEASE`, the release of its re-init, or the owning file's release:
    /// `ECANCELED`.
    Released = 1,
    /// The device was unbound: `ENODEV`.
    Unbound = 2,
}

/// What [`Channel::quiesce`] leaves of an ended queue instance.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Quiesced {
    /// The device memory of rings in device memory, `(device address, bytes)`, which the
    /// engine no longer uses: the caller gives it back.
    pub(crate) range: Option<(u64, u64)>,
    /// The fence number the instance would have given next: a later instance of the same
    /// queue id of the same file numbers its fences from here (never reusing a number).
    pub(crate) next_fence: u64,
}

/// Source of queue instance numbers ([`Channel::instance`]); 64 bits never wrap.
static NEXT_INSTANCE: Atomic<u64> = Atomic::new(1);

impl Channel {
    /// Wraps queue `q` (`id`, already programmed) for `owner`, with the memory charge of a
    /// file's queue; `mover` moves the descriptors of rings in device memory the engine fills.
    ///
    /// # Errors
    ///
    /// `ENOMEM`, `EINVAL` if `q`'s rings need a mover and none is given, or a driver's queue
    /// would need one.
    pub(crate) fn new(
        bar: Arc<Bar0>,
        (id, owner): (QueueId, Owner),
        q: Queue,
        mover: Option<Arc<Channel>>,
        charge: Option<Charge>,
        file: Option<Arc<FileEvents>>,
    ) -> Result<Arc<Self>> {
        if q.engine_filled() && (mover.is_none() || owner == Owner::Driver) {
            return Err(EINVAL);
        }
        // Fences are numbered on from an earlier instance's: nothing before is news to anyone.
        let settled = q.settled();
        let class = match owner {
            Owner::Driver => static_lock_class!(),
            Owner::File(_) => static_lock_class!(),
        };
        Arc::pin_init(
            try_pin_init!(Self {
                id,
                owner,
                instance: NEXT_INSTANCE.fetch_add(1, Relaxed),
                gone: Atomic::new(0),
                bar,
                mover,
                inner <- Mutex::new(Some(q), kernel::c_str!("Channel::inner"), class),
                charge <- new_mutex!(charge),
                listeners <- new_mutex!(Listeners {
                    file,
                    signalled: settled,
                    woken: settled,
                    ..Listeners::default()
                }),
                checked_at <- new_spinlock!(Instant::now()),
            }),
            GFP_KERNEL_ACCOUNT,
        )
    }

    /// Runs `f` on the queue under its lock (no register access).
    ///
    /// # Errors
    ///
    /// `ECANCELED` if the queue was released, `ENODEV` if the device was unbound.
    fn locked<R>(&self, f: impl FnOnce(&mut Queue) -> Result<R>) -> Result<R> {
        let mut inner = self.inner.lock();
        f((*inner).as_mut().ok_or_else(|| self.gone_error())?)
    }

    /// Why the queue is gone ([`Self::quiesce`]): `ECANCELED` after a release, `ENODEV` after
    /// an unbind.
    fn gone_error(&self) -> Error {
        if self.gone.load(Relaxed) == Gone::Released as u32 {
            ECANCELED
        } else {
            ENODEV
        }
    }

    /// Runs `f` on the queue under its lock with the queue's doorbell ([`Ringer`]), which takes
    /// the register guard only to ring (and, for rings in device memory filled by the engine,
    /// may sleep before, while the H2T queue moves the descriptors).
    ///
    /// # Errors
    ///
    /// `ECANCELED` if the queue was released, `ENODEV` if the device was unbound.
    fn with_ringer<R>(&self, f: impl FnOnce(&mut Queue, Ringer<'_>) -> Result<R>) -> Result<R> {
        let mut inner = self.inner.lock();
        f(
            (*inner).as_mut().ok_or_else(|| self.gone_error())?,
            Ringer(self),
        )
    }

    /// Runs `f` on the queue and its engine's registers, under the queue lock and inside the
    /// register guard (an RCU read section: `f` must not sleep or allocate).
    ///
    /// # Errors
    ///
    /// `ECANCELED` if the queue was released, `ENODEV` if the device was unbound.
    fn with_io<R>(&self, f: impl FnOnce(&mut Queue, EngineIo<'_>) -> Result<R>) -> Result<R> {
        let mut inner = self.inner.lock();
        let q = (*inner).as_mut().ok_or_else(|| self.gone_error())?;
        let regs = self.bar.access()?;
        f(q, regs.engine(self.id.eng)?)
    }

    /// Runs `f` on the queue and its engine's registers (KUnit and the benchmark suite:
    /// hand-made sequences).
    ///
    /// # Errors
    ///
    /// `ECANCELED` if the queue was released, `ENODEV` if the device was unbound; those of `f`.
    #[cfg(any(neuron_udma_kunit, neuron_udma_bench))]
    pub(crate) fn with<R>(
        &self,
        f: impl FnOnce(&mut Queue, EngineIo<'_>) -> Result<R>,
    ) -> Result<R> {
        self.with_io(f)
    }

    /// The engine's error state (a device register read).
    fn engine_errors(&self) -> Result<EngineErrors> {
        let regs = self.bar.access()?;
        Ok(engine::engine_errors(regs.engine(self.id.eng)?))
    }

    // ---- the user-queue operations (COPY_PREPARE(_ONE), COPY_START, COPY_WAIT, QUEUE_STATE) ----

    /// Writes the pairs `copies` of one prepare call, all or none, with `holds` keeping their
    /// buffers busy until the engine is done with them; the largest copy among them took
    /// `largest` pairs.
    ///
    /// # Errors
    ///
    /// `E2BIG` if that copy takes more pairs than the queue's empty rings hold (it can never
    /// fit: not "wait first"), `ENOSPC` if the rings have no room for all of them now (after
    /// retiring what completed), `ENOMEM`, `ENODEV`; nothing is written then.
    pub(crate) fn prepare(&self, copies: &[queue::Copy], largest: u32, holds: Holds) -> Result {
        self.locked(|q| {
            if largest > q.capacity_pairs() {
                return Err(E2BIG);
            }
            q.retire();
            q.write_submission(copies, holds)
        })
    }

    /// Writes the pairs `copies` of one prepare call as [`Self::prepare`] does, then a fence
    /// after everything prepared, and rings the doorbells, all under one hold of the queue lock:
    /// the io_uring copy, which must not leave its pairs prepared when no fence can follow them
    /// (another thread of the file may have taken the last fence slot since it looked).
    /// Returns the fence.
    ///
    /// # Errors
    ///
    /// `EBUSY` ([`queue::FENCE_SLOTS`] fences in flight), those of [`Self::prepare`], and of
    /// the doorbell (`ENODEV`, or an error moving a device ring's descriptors); nothing is
    /// written then ([`Queue::write_fenced`]).
    pub(crate) fn prepare_fenced(
        &self,
        copies: &[queue::Copy],
        largest: u32,
        holds: Holds,
    ) -> Result<u64> {
        self.with_ringer(|q, bell| {
            if largest > q.capacity_pairs() {
                return Err(E2BIG);
            }
            q.retire();
            if q.fences_full() {
                return Err(EBUSY);
            }
            q.write_fenced(copies, holds, bell)
        })
    }

    /// Rings the doorbells for `m2s_count` Tx and `s2m_count` Rx prepared descriptors
    /// ([`Queue::start`]).
    ///
    /// # Errors
    ///
    /// `EINVAL` (see [`Queue::start`]), `ENODEV`.
    pub(crate) fn start(&self, m2s_count: u32, s2m_count: u32) -> Result {
        self.with_ringer(|q, bell| q.start(bell, m2s_count, s2m_count))
    }

    /// Fences the work no fence covers yet, or targets the newest fence (an interrupted wait
    /// leaves its fence behind: it is reused, not multiplied).
    fn fence_or_join(&self) -> Result<Ticket> {
        self.with_ringer(|q, bell| {
            q.retire();
            let ack_before = q.tx_state().ack_index();
            let ticket = |q: &Queue, seq, last| Ticket {
                seq,
                last,
                ack_before,
                end: q.newest_fence_end().unwrap_or(ack_before),
                resets: q.resets,
            };
            if q.unfenced() != 0 && q.can_fence() {
                let seq = q.fence(bell)?;
                return Ok(ticket(q, Some(seq), true));
            }
            if q.busy() {
                return Ok(ticket(q, Some(q.newest_fence()), q.unfenced() == 0));
            }
            if q.unfenced() == 0 {
                Ok(ticket(q, None, true))
            } else {
                Err(ENOSPC)
            }
        })
    }

    /// `COPY_WAIT`: waits (interruptibly, bounded by `timeout` in all) until everything prepared
    /// or started on the queue is done, fencing what no fence covers; returns the Tx
    /// descriptors the wait completed. A timeout resets the queue only when it made no
    /// progress for [`DEFAULT_TIMEOUT`].
    ///
    /// # Errors
    ///
    /// Those of [`Self::wait_fence`]; `ENOSPC` when unfenced work exists and no marker fits;
    /// `EIO` when a queue reset (an engine error or a stall, seen by this wait or another
    /// thread) came while the wait went on and may have dropped work it waited for: between two
    /// of its rounds, or during a round whose fence had work after it. Only a reset during the
    /// last round, after which its fence turned out done, leaves nothing of the wait dropped.
    pub(crate) fn wait_all(&self, timeout: Delta) -> Result<u64> {
        let start = Instant::<Monotonic>::now();
        let mut completed = 0u64;
        let mut resets = None;
        loop {
            let t = self.fence_or_join()?;
            // A reset since the first round's ticket may have dropped work the wait covers (a
            // fence written for it meanwhile, or work after a joined fence).
            if *resets.get_or_insert(t.resets) != t.resets {
                return Err(EIO);
            }
            if let Some(seq) = t.seq {
                let left = timeout - start.elapsed();
                self.wait_fence(seq, left.max(Delta::from_millis(0)))?;
            }
            let (done, reset) = self.locked(|q| {
                let s = q.tx_state();
                if q.resets == t.resets {
                    Ok((s.size().distance(t.ack_before, s.ack_index()), false))
                } else {
                    // The fence completed (the wait succeeded), so its work did; the ack
                    // position was restarted by the reset.
                    Ok((s.size().distance(t.ack_before, t.end), true))
                }
            })?;
            completed += u64::from(done);
            if t.last {
                return Ok(completed);
            }
            if reset {
                // The work after the fence had no fence of its own: the reset dropped it.
                return Err(EIO);
            }
        }
    }

    /// `COPY_SUBMIT`: rings the doorbells for everything prepared and appends a fence, with one
    /// doorbell; returns it. With nothing unfenced, returns the newest fence (0 for none).
    ///
    /// # Errors
    ///
    /// `ENOSPC` (no room for the marker pair), `EBUSY` ([`queue::FENCE_SLOTS`] fences in
    /// flight), `ENODEV`.
    pub(crate) fn submit_fence(&self) -> Result<u64> {
        self.with_ringer(|q, bell| {
            q.retire();
            if q.unfenced() == 0 {
                return Ok(q.newest_fence());
            }
            q.fence(bell)
        })
    }

    /// The state of fence `seq`, the newest fence known done and the newest fence
    /// (`FENCE_STATUS`).
    ///
    /// # Errors
    ///
    /// `EINVAL` for fence 0 or one not yet submitted, `ENODEV`.
    pub(crate) fn fence_state(&self, seq: u64) -> Result<(FenceState, u64, u64)> {
        self.locked(|q| {
            let state = q.state(seq)?;
            Ok((state, q.outcomes().0, q.newest_fence()))
        })
    }

    /// `FENCE_WAIT` (and each step of `COPY_WAIT`): waits interruptibly, bounded by `timeout`,
    /// until fence `seq` is settled. A timeout resets the queue only when it made no progress
    /// for [`DEFAULT_TIMEOUT`] (it is stuck); an engine error resets it at once.
    ///
    /// # Errors
    ///
    /// `ETIMEDOUT` if the fence did not complete in time (the copies go on unless the queue was
    /// stuck), `EIO` if the fence failed (an engine error, or a reset dropped it), `ESTALE` if
    /// it expired, `EINVAL` for a fence not submitted, `EINTR` on a signal (the copies go on),
    /// `ENODEV` after unbind.
    pub(crate) fn wait_fence(&self, seq: u64, timeout: Delta) -> Result {
        self.wait_for(
            seq,
            &Policy {
                signals: WaitMode::Interruptible,
                timeout,
                on_timeout: OnTimeout::ResetIfStuck,
            },
        )
    }

    /// The queue's completions and failures not reported yet (`QUEUE_EVENTS`), or `None` when
    /// there is nothing new. Nothing is marked reported: [`Self::mark_reported`] does that once
    /// the record reached user space, so a failed copy-out loses no event.
    ///
    /// # Errors
    ///
    /// `ECANCELED` if the queue was released, `ENODEV` if the device was unbound.
    pub(crate) fn peek_events(&self) -> Result<Option<QueueEvents>> {
        let (done, failed) = self.locked(|q| {
            q.retire();
            Ok(q.outcomes())
        })?;
        Ok(QueueEvents::since(
            &self.listeners.lock().reported,
            done,
            failed,
        ))
    }

    /// Marks what `ev` ([`Self::peek_events`]) holds as reported; what happened since stays
    /// pending (a report never moves back).
    pub(crate) fn mark_reported(&self, ev: &QueueEvents) {
        let mut l = self.listeners.lock();
        l.reported.done = l.reported.done.max(ev.done);
        if let Some((f, _)) = ev.failed {
            l.reported.failed = l.reported.failed.max(f);
        }
    }

    /// Whether the queue has completions or failures not reported yet: `(completed, failed)`
    /// (for `poll()`).
    pub(crate) fn pending_events(&self) -> (bool, bool) {
        let Ok((done, failed)) = self.locked(|q| {
            q.retire();
            Ok(q.outcomes())
        }) else {
            return (false, false);
        };
        let l = self.listeners.lock();
        (
            done > l.reported.done,
            failed.is_some_and(|f| f.0 > l.reported.failed),
        )
    }

    /// A copy of the queue's registers and software state.
    ///
    /// # Errors
    ///
    /// `ECANCELED` if the queue was released, `ENODEV` if the device was unbound.
    pub(crate) fn snapshot(&self) -> Result<QueueSnapshot> {
        self.with_io(|q, io| {
            Ok(QueueSnapshot {
                regs: [
                    engine::queue_regs::<M2s>(io, q.q()),
                    engine::queue_regs::<S2m>(io, q.q()),
                ],
                sw: [*q.tx_state(), *q.rx_state()],
                pending: q.pending(),
                resets: q.resets,
                errors: engine::engine_errors(io),
            })
        })
    }

    /// Copies slots of ring `dir` into `out` (which has the capacity): the `history` last
    /// completed ones and at most `outstanding` of the outstanding ones, each with its index
    /// and whether it completed. Returns the ring's state.
    ///
    /// # Errors
    ///
    /// `ECANCELED` if the queue was released, `ENODEV` if the device was unbound, `ENOMEM` if `out` is full.
    pub(crate) fn ring_slots(
        &self,
        dir: Dir,
        history: u32,
        outstanding: u32,
        out: &mut KVec<RingSlot>,
    ) -> Result<RingState> {
        self.locked(|q| {
            let ring = q.ring(dir);
            let st = *ring.state();
            let ack = st.ack_index();
            let history = history.min(st.size().descs() - st.outstanding());
            let mut push = |idx: u32, done: bool| -> Result {
                out.push_within_capacity(RingSlot {
                    dir,
                    idx,
                    done,
                    desc: ring.read(idx)?,
                })
                .map_err(|_| ENOMEM)
            };
            for k in (1..=history).rev() {
                push(st.size().index(ack.wrapping_sub(k)), true)?;
            }
            for i in st.size().slots(ack, st.outstanding().min(outstanding)) {
                push(i, false)?;
            }
            Ok(st)
        })
    }

    /// Retires what the engine completed (acks, buffer holds dropped): `MEM_FREE` looks first.
    ///
    /// # Errors
    ///
    /// `ECANCELED` if the queue was released, `ENODEV` if the device was unbound.
    pub(crate) fn retire(&self) -> Result {
        self.locked(|q| {
            q.retire();
            Ok(())
        })
    }

    /// Whether the queue holds work the engine may still run: fences in flight, or pairs that
    /// no fence covers yet (prepared or started).
    ///
    /// # Errors
    ///
    /// `ECANCELED` if the queue was released, `ENODEV` if the device was unbound.
    pub(crate) fn has_work(&self) -> Result<bool> {
        self.locked(|q| Ok(q.busy() || q.unfenced() != 0))
    }

    // ---- waits ----

    /// Waits until fence `seq` is settled, with `policy`.
    fn wait_for(&self, seq: u64, policy: &Policy) -> Result {
        let start = Instant::<Monotonic>::now();
        let mut backoff = Backoff::new();
        let mut next_state_check = STATE_CHECK_FIRST;
        let settled = |s: FenceState| -> Option<Result> {
            match s {
                FenceState::Pending => None,
                FenceState::Done => Some(Ok(())),
                FenceState::Failed(_) => Some(Err(EIO)),
                FenceState::Expired => Some(Err(ESTALE)),
            }
        };
        loop {
            if let Some(r) = settled(self.locked(|q| q.state(seq))?) {
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
                let errors = self.engine_errors()?;
                if errors.aborted() {
                    return self.fail(seq, EIO, &errors, policy.timeout);
                }
            }
            backoff.pause();
        }
        // TIMEOUT: one last look, so that a completion racing the deadline is not lost.
        if let Some(r) = settled(self.locked(|q| q.state(seq))?) {
            return r;
        }
        let errors = self.engine_errors()?;
        if errors.aborted() {
            return self.fail(seq, EIO, &errors, policy.timeout);
        }
        match policy.on_timeout {
            OnTimeout::Reset => self.fail(seq, ETIMEDOUT, &errors, policy.timeout),
            // A waiter that may not reset on its own timeout still resets a queue that has
            // made no progress for the default timeout: it is stuck, not just slow or busy.
            OnTimeout::ResetIfStuck
                if self.with_io(|q, io| Ok(q.stalled_for(io)))? < DEFAULT_TIMEOUT =>
            {
                Err(ETIMEDOUT)
            }
            // A stuck queue is an error whatever the caller's timeout.
            OnTimeout::ResetIfStuck => self.fail(seq, ETIMEDOUT, &errors, DEFAULT_TIMEOUT),
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
    /// `seq`; `ECANCELED` if the queue was released, `ENODEV` if the device was unbound. `Ok(())` if fence `seq`
    /// completed before the reset (its marker arrived after the waiter last looked): its copies
    /// are done, whatever the engine did next.
    pub(crate) fn fail(
        &self,
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
            dev_dbg!(
                self.bar.pdev,
                "engine {} queue {}: fence {} timed out after {} ms; resetting the queue\n",
                self.id.eng.get(),
                self.id.q.number(),
                seq,
                timeout.as_millis()
            );
        } else if self.bar.log_limit.allow() {
            dev_err!(
                self.bar.pdev,
                "engine {} queue {}: fence {} {} (m2s state {:#x} cause {:#x}, s2m state {:#x} cause {:#x}); resetting the queue\n",
                self.id.eng.get(),
                self.id.q.number(),
                seq,
                what,
                errors.m2s_state,
                errors.m2s_cause,
                errors.s2m_state,
                errors.s2m_cause
            );
        }
        self.reset(err)?;
        match self.locked(|q| q.state(seq))? {
            FenceState::Done => Ok(()),
            _ => Err(err),
        }
    }

    /// Resets the queue if it made no progress for [`DEFAULT_TIMEOUT`] with fences
    /// in flight (a hung queue); logged at error level, rate-limited.
    ///
    /// # Errors
    ///
    /// `ECANCELED` if the queue was released, `ENODEV` if the device was unbound.
    pub(crate) fn reset_if_stuck(&self) -> Result {
        if self.with_io(|q, io| Ok(q.stalled_for(io)))? < DEFAULT_TIMEOUT {
            return Ok(());
        }
        if self.bar.log_limit.allow() {
            dev_err!(
                self.bar.pdev,
                "engine {} queue {}: no progress for {} s; resetting the queue\n",
                self.id.eng.get(),
                self.id.q.number(),
                DEFAULT_TIMEOUT.as_millis() / 1000
            );
        }
        self.reset(ETIMEDOUT)
    }

    /// Resets the queue (full queue init, ring id 1, buffer holds dropped, the fences in flight
    /// failed with `why`: `EIO` or `ETIMEDOUT`) and returns its engine to normal operation if it
    /// is still aborted.
    ///
    /// # Errors
    ///
    /// `ECANCELED` if the queue was released, `ENODEV` if the device was unbound.
    pub(crate) fn reset(&self, why: Error) -> Result {
        self.with_io(|q, io| {
            Self::reset_queue(q, io, why);
            Ok(())
        })
    }

    fn reset_queue(q: &mut Queue, io: EngineIo<'_>, why: Error) {
        q.reset(io, why);
        // A queue reset clears an abort caused by this queue; if the engine is still aborted
        // (another queue's error), return it to normal operation too.
        let now = engine::engine_errors(io);
        if now.aborted() {
            engine::recover_engine(io, &now);
        }
    }

    /// Fences completed and failed on the queue since it was taken (fdinfo); `(0, 0)` once
    /// released.
    pub(crate) fn fence_counts(&self) -> (u64, u64) {
        self.locked(|q| {
            q.retire();
            Ok((q.fences_done, q.fences_failed))
        })
        .unwrap_or((0, 0))
    }

    /// Bytes of the queue's memory charged to the owner's locked memory.
    pub(crate) fn charged(&self) -> u64 {
        self.charge.lock().as_ref().map_or(0, |c| c.bytes())
    }

    /// Whether a submission not yet retired (prepared, started or in flight) names `buf`
    /// ([`Queue::holds`]); `false` once released.
    pub(crate) fn holds(&self, buf: &Buffer) -> bool {
        self.locked(|q| {
            q.retire();
            Ok(q.holds(buf))
        })
        .unwrap_or(false)
    }

    /// Whether fence `seq` is no longer in flight ([`Queue::is_settled`]); a released queue
    /// has nothing in flight.
    pub(crate) fn is_settled(&self, seq: u64) -> bool {
        self.locked(|q| Ok(q.is_settled(seq))).unwrap_or(true)
    }

    /// Ends the queue instance for `why`: stops the engine from using the queue's rings (pause)
    /// and drops its memory and charge; afterwards every operation on the channel fails with
    /// `why`'s errno (`ECANCELED` or `ENODEV`), and every io_uring command waiting on it
    /// completes with `-ECANCELED`. Returns what the caller gives back or keeps ([`Quiesced`]).
    #[must_use]
    pub(crate) fn quiesce(&self, why: Gone) -> Quiesced {
        let mut inner = self.inner.lock();
        let mut out = Quiesced {
            range: None,
            next_fence: 1,
        };
        if let Some(q) = (*inner).as_mut() {
            // A reset stops the engine from fetching from the rings before they are freed.
            if let Ok(regs) = self.bar.access() {
                if let Ok(io) = regs.engine(self.id.eng) {
                    q.pause(io);
                }
            }
            out.range = q.device_range();
            out.next_fence = q.next_fence();
        }
        // Under the queue lock, before the queue goes: whoever finds it gone reads why. Only
        // the first end counts (a release racing an unbind finds the queue already gone).
        if inner.is_some() {
            self.gone.store(why as u32, Relaxed);
        }
        *inner = None;
        drop(inner);
        let charge = self.charge.lock().take();
        drop(charge);
        // Nothing completes any more: the waiting io_uring commands complete as cancelled, the
        // eventfd is given back, and pollers see the queue's failure.
        let (eventfd, uring, file) = {
            let mut l = self.listeners.lock();
            (
                l.eventfd.take(),
                core::mem::take(&mut l.uring),
                l.file.clone(),
            )
        };
        drop(eventfd);
        drop(uring);
        if let Some(f) = file {
            f.wake();
        }
        out
    }

    // ---- listeners (`events.rs`) and the completion worker's step (`watch.rs`) ----

    /// Registers `eventfd` (or unregisters with `None`): signalled once per fence that settles
    /// from now on.
    ///
    /// # Errors
    ///
    /// `ECANCELED` if the queue was released, `ENODEV` if the device was unbound.
    pub(crate) fn set_eventfd(&self, eventfd: Option<EventFd>) -> Result {
        let settled = self.locked(|q| {
            q.retire();
            Ok(q.settled())
        })?;
        let old = {
            let mut l = self.listeners.lock();
            l.signalled = settled;
            core::mem::replace(&mut l.eventfd, eventfd)
        };
        drop(old);
        Ok(())
    }

    /// Queues `cmd`, which waits for one of this queue's fences, to be completed by the
    /// completion worker when the fence settles.
    ///
    /// # Errors
    ///
    /// `ENOMEM`, `ECANCELED` (released), `ENODEV` (unbound); the command is handed back then (not queued).
    pub(crate) fn add_uring(&self, cmd: UringCmd) -> core::result::Result<(), (Error, UringCmd)> {
        let mut l = self.listeners.lock();
        if self.inner.lock().is_none() {
            return Err((self.gone_error(), cmd));
        }
        if l.uring.reserve(1, GFP_KERNEL_ACCOUNT).is_err() {
            return Err((ENOMEM, cmd));
        }
        // Cannot fail: capacity was reserved.
        l.uring.push_within_capacity(cmd).map_err(|e| (ENOMEM, e.0))
    }

    /// Whether a fence can be submitted now (a free completion slot and room for its marker).
    ///
    /// # Errors
    ///
    /// `ECANCELED` if the queue was released, `ENODEV` if the device was unbound.
    pub(crate) fn can_submit(&self) -> Result<bool> {
        self.locked(|q| {
            q.retire();
            Ok(q.can_fence())
        })
    }

    /// The state of fence `seq` for a caller that polls it (an IOPOLL io_uring ring): the
    /// engine state is read at most every [`STATE_CHECK_EVERY`] while it is pending (an engine
    /// error or a stall resets the queue, failing the fence).
    ///
    /// # Errors
    ///
    /// `EINVAL` for a fence not submitted, `ENODEV`.
    pub(crate) fn poll_fence(&self, seq: u64) -> Result<FenceState> {
        let state = self.state(seq)?;
        if state != FenceState::Pending {
            return Ok(state);
        }
        let now = Instant::<Monotonic>::now();
        let due = {
            let mut last = self.checked_at.lock();
            if now - *last >= STATE_CHECK_EVERY {
                *last = now;
                true
            } else {
                false
            }
        };
        if due {
            self.recover()?;
            return self.state(seq);
        }
        Ok(state)
    }

    /// Every fence up to this one is settled (0 for a released queue).
    pub(crate) fn settled_fences(&self) -> u64 {
        self.locked(|q| Ok(q.settled())).unwrap_or(0)
    }

    /// The queue's listeners for debugfs: io_uring commands waiting, whether the file is
    /// polled, whether an eventfd is set, and the fences settled when the eventfd was last
    /// signalled and the pollers last woken.
    pub(crate) fn listeners(&self) -> (usize, bool, bool, u64, u64) {
        let l = self.listeners.lock();
        (
            l.uring.len(),
            l.file.as_ref().is_some_and(|f| f.is_polled()),
            l.eventfd.is_some(),
            l.signalled,
            l.woken,
        )
    }

    /// Whether anybody but a blocked waiter listens for this queue's completions (a polled
    /// file, an eventfd, io_uring commands): then the completion worker watches it while fences
    /// are in flight.
    pub(crate) fn has_listeners(&self) -> bool {
        let l = self.listeners.lock();
        l.file.as_ref().is_some_and(|f| f.is_polled()) || l.eventfd.is_some() || !l.uring.is_empty()
    }

    /// One round of the completion worker on this queue: retires what completed, then wakes the
    /// file's pollers, signals the eventfd (once per fence settled since the last signal) and
    /// completes the io_uring commands whose fence settled (0, `-EIO` for a failed fence,
    /// `-ESTALE` for an expired one). With `check`, also reads the engine state of a busy queue
    /// (an engine error or a stall resets it, failing its fences: the next round reports them).
    /// Returns whether the queue still has fences in flight that somebody listens for.
    pub(crate) fn notify(&self, check: bool) -> bool {
        let busy = {
            let mut l = self.listeners.lock();
            let mut inner = self.inner.lock();
            let Some(q) = (*inner).as_mut() else {
                return false;
            };
            q.retire();
            let settled = q.settled();
            if settled > l.signalled {
                if let Some(e) = l.eventfd.as_ref() {
                    e.signal(settled - l.signalled);
                }
                l.signalled = settled;
            }
            // Every command against the one retire above: the commands are queued in the order
            // io_uring issued them, not by fence, and a retire between two of them could settle
            // a fence of a command already passed over as pending while `busy` below then says
            // nothing is in flight, and the worker would stop watching with commands queued.
            let mut i = 0;
            while i < l.uring.len() {
                let res = match q.state_retired(l.uring[i].seq) {
                    Ok(FenceState::Pending) => {
                        i += 1;
                        continue;
                    }
                    Ok(FenceState::Done) => 0,
                    Ok(FenceState::Failed(_)) => EIO.to_errno(),
                    Ok(FenceState::Expired) => ESTALE.to_errno(),
                    Err(e) => e.to_errno(),
                };
                if let Ok(cmd) = l.uring.remove(i) {
                    cmd.complete(res);
                }
            }
            if settled > l.woken {
                l.woken = settled;
                if let Some(f) = l.file.as_ref() {
                    f.wake();
                }
            }
            q.busy()
        };
        if busy && check {
            let _ = self.recover();
        }
        busy && self.has_listeners()
    }

    // ---- the submission engine ----

    /// Writes as many pairs of `pieces` as one fenced submission may take now (the generation's
    /// final barrier on the last, hardware.rst §6.1), then a fence, and rings the doorbells.
    /// Returns the fence (with one waiter registered), or `None` when the rings have no room.
    ///
    /// # Errors
    ///
    /// `ERANGE` if a side of the copy ends before `pieces` does (the callers check the ranges),
    /// `ENODEV`.
    pub(crate) fn submit(&self, pieces: &mut Pieces<'_>) -> Result<Option<u64>> {
        let barrier = self.bar.arch.final_barrier;
        self.with_ringer(|q, bell| {
            let room = q.submission_room();
            if room == 0 {
                return Ok(None);
            }
            q.all_or_nothing(|q| {
                let mut pairs = 0;
                while pairs < room && pieces.remaining() != 0 {
                    let (s, d, len) = pieces.next().ok_or(ERANGE)?;
                    let last = pieces.remaining() == 0 || pairs + 1 == room;
                    q.prepare_one(&queue::Copy {
                        src: s,
                        dst: d,
                        len: DescLen::new(len)?,
                        barrier: if last { barrier } else { Barrier::None },
                    })?;
                    pairs += 1;
                }
                q.fence(bell)
            })
            .map(Some)
        })
    }

    /// Pairs one fenced submission may take now ([`Queue::submission_room`]): 0 when the
    /// rings or the completion slots are full.
    ///
    /// # Errors
    ///
    /// `ECANCELED` if the queue was released, `ENODEV` if the device was unbound.
    pub(crate) fn room(&self) -> Result<u32> {
        self.locked(|q| Ok(q.submission_room()))
    }

    /// Writes one pair per piece `(source, destination, bytes)` of `pieces` (at most
    /// [`Self::room`], the generation's final barrier on the last), then a fence, and rings the
    /// doorbells. Returns the fence (with one waiter registered).
    ///
    /// # Errors
    ///
    /// `ENOSPC` if the rings have no room for them, `EINVAL` for an empty list or a piece of
    /// 0 or more than 64 KiB bytes; nothing is written then. `ENODEV`.
    pub(crate) fn submit_pieces(&self, pieces: &[(u64, u64, u32)]) -> Result<u64> {
        if pieces.is_empty() || pieces.iter().any(|p| DescLen::new(p.2).is_err()) {
            return Err(EINVAL);
        }
        let barrier = self.bar.arch.final_barrier;
        self.with_ringer(|q, bell| {
            if (q.submission_room() as usize) < pieces.len() {
                return Err(ENOSPC);
            }
            q.all_or_nothing(|q| {
                for (i, &(src, dst, len)) in pieces.iter().enumerate() {
                    q.prepare_one(&queue::Copy {
                        src,
                        dst,
                        len: DescLen::new(len)?,
                        barrier: if i + 1 == pieces.len() {
                            barrier
                        } else {
                            Barrier::None
                        },
                    })?;
                }
                q.fence(bell)
            })
        })
    }

    /// The state of fence `seq` (a fence of this queue).
    ///
    /// # Errors
    ///
    /// `EINVAL` for a fence not submitted, `ENODEV` if the queue was released or the device
    /// unbound.
    pub(crate) fn state(&self, seq: u64) -> Result<FenceState> {
        self.locked(|q| q.state(seq))
    }

    /// Reads the engine state of a queue with fences in flight: an abort, or no progress for
    /// [`DEFAULT_TIMEOUT`], is logged (rate-limited) and resets the queue (every fence in
    /// flight then reads `Lost`). Returns the error that ended the fences, if any: `EIO` for
    /// an engine error, `ETIMEDOUT` for a stall. For callers that poll fences from a work item.
    ///
    /// # Errors
    ///
    /// `ECANCELED` if the queue was released, `ENODEV` if the device was unbound.
    pub(crate) fn recover(&self) -> Result<Option<Error>> {
        self.with_io(|q, io| {
            let errors = engine::engine_errors(io);
            let (err, why) = if errors.aborted() {
                (EIO, "failed: engine error")
            } else if q.stalled_for(io) >= DEFAULT_TIMEOUT {
                (ETIMEDOUT, "timed out")
            } else {
                return Ok(None);
            };
            if self.bar.log_limit.allow() {
                dev_err!(
                    self.bar.pdev,
                    "engine {} queue {}: transfer {}; resetting the queue\n",
                    self.id.eng.get(),
                    self.id.q.number(),
                    why
                );
            }
            Self::reset_queue(q, io, err);
            Ok(Some(err))
        })
    }

    /// Copies `job` with `policy`: the submission loop. Splits the copy into pairs of at most
    /// 64 KiB, each within one run of each side (`span.rs`); writes at most 2032 of them plus
    /// one marker per doorbell and never more than the free space, the generation's final
    /// barrier on the last data pair of each submission (hardware.rst §6.1); waits for each
    /// submission (the policy's timeout bounding each wait) before the next. A full ring is
    /// waited for within the timeout, and reset when stuck.
    pub(crate) fn transfer(&self, job: Job<'_>, policy: &Policy) -> Finish {
        self.transfer_until(job, policy, || None)
    }

    /// [`Self::transfer`], asking `stop` before each submission: an error it returns ends the
    /// copy there, with nothing of it in flight (`MEMCPY` and `MEMSET` stop so when the exporter
    /// of an imported dma-buf they name revokes it).
    pub(crate) fn transfer_until(
        &self,
        job: Job<'_>,
        policy: &Policy,
        stop: impl Fn() -> Option<Error>,
    ) -> Finish {
        if job.size == 0 {
            return Finish::Failed(EINVAL);
        }
        let start = Instant::<Monotonic>::now();
        let mut pieces = Pieces::new(job.src, job.dst, job.size, MAX_DESC_BYTES);
        while pieces.remaining() != 0 {
            if let Some(e) = stop() {
                return Finish::Failed(e);
            }
            let seq = match self.submit(&mut pieces) {
                Ok(Some(seq)) => seq,
                Ok(None) => {
                    // The ring is full of other submissions: wait for room within the timeout.
                    if start.elapsed() >= policy.timeout {
                        // A queue whose slots are all held by submissions that no longer
                        // complete is stuck: reset it, whoever waits.
                        return Finish::Failed(self.reset_if_stuck().err().unwrap_or(ETIMEDOUT));
                    }
                    if policy.signals != WaitMode::Uninterruptible && fatal_signal_pending() {
                        return Finish::Failed(EINTR);
                    }
                    fsleep(FULL_RING_SLEEP);
                    continue;
                }
                Err(e) => return Finish::Failed(e),
            };
            if let Err(err) = self.wait_for(seq, policy) {
                if (err == EINTR || err == ETIMEDOUT) && !self.is_settled(seq) {
                    return Finish::InFlight { err, seq };
                }
                return Finish::Failed(err);
            }
        }
        Finish::Done
    }

    /// Runs the jobs of `parts`, each on its own queue, at the same time: every queue gets a
    /// submission of its job whenever it has none in flight, and the caller waits for them in
    /// turn ([`Self::transfer`]'s rules for each: `policy`'s timeout per wait, a full ring
    /// waited for and reset when stuck). At most [`MAX_SPLIT`] parts. A failure stops new
    /// submissions; the call returns once nothing of it is in flight, or at once with the
    /// fences still in flight when a wait ends early (`EINTR`, or `ETIMEDOUT` without a reset).
    pub(crate) fn transfer_split(parts: &[(&Channel, Job<'_>)], policy: &Policy) -> SplitFinish {
        let n = parts.len().min(MAX_SPLIT);
        let start = Instant::<Monotonic>::now();
        let mut pieces: [Option<Pieces<'_>>; MAX_SPLIT] = [const { None }; MAX_SPLIT];
        for (p, (_, job)) in pieces.iter_mut().zip(&parts[..n]) {
            *p = Some(Pieces::new(job.src, job.dst, job.size, MAX_DESC_BYTES));
        }
        let mut inflight: [Option<u64>; MAX_SPLIT] = [None; MAX_SPLIT];
        let mut failed: Option<Error> = None;
        loop {
            let mut submitted = false;
            if failed.is_none() {
                for i in 0..n {
                    let Some(p) = pieces[i].as_mut() else {
                        continue;
                    };
                    if inflight[i].is_some() || p.remaining() == 0 {
                        continue;
                    }
                    match parts[i].0.submit(p) {
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
            let busy = inflight.iter().any(Option::is_some);
            for i in 0..n {
                let Some(seq) = inflight[i] else { continue };
                match parts[i].0.wait_for(seq, policy) {
                    Ok(()) => inflight[i] = None,
                    Err(err)
                        if (err == EINTR || err == ETIMEDOUT) && !parts[i].0.is_settled(seq) =>
                    {
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
                    // Settled (the queue was reset, or the wait failed after the fence did).
                    Err(e) => {
                        inflight[i] = None;
                        failed.get_or_insert(e);
                    }
                }
            }
            if let Some(e) = failed {
                if inflight.iter().all(Option::is_none) {
                    return SplitFinish::Failed(e);
                }
                continue;
            }
            let left = pieces[..n].iter().flatten().any(|p| p.remaining() != 0);
            if !left {
                return SplitFinish::Done;
            }
            if !busy && !submitted {
                // Every ring with work left is full of other submissions.
                if start.elapsed() >= policy.timeout {
                    for (ch, _) in &parts[..n] {
                        let _ = ch.reset_if_stuck();
                    }
                    return SplitFinish::Failed(ETIMEDOUT);
                }
                if policy.signals != WaitMode::Uninterruptible && fatal_signal_pending() {
                    return SplitFinish::Failed(EINTR);
                }
                fsleep(FULL_RING_SLEEP);
            }
        }
    }

    /// Copies the byte ranges `ranges` (`(source, destination, bytes)`, device-fabric addresses)
    /// in order, in as few fenced submissions as the rings allow (the generation's final barrier
    /// on the last pair of each), waiting for each: how the driver's H2T queue moves the
    /// descriptors of a queue whose rings are in device memory (`devring.rs`). Nothing of the
    /// copy is in flight when this returns, so the wait for a submission is uninterruptible: the
    /// descriptors go to device memory the queue gives back when it is released. This queue is shared with
    /// other files' `MEMCPY`s, so it is reset only when it is stuck (no progress for
    /// [`DEFAULT_TIMEOUT`], the watchdog's rule), never because it is merely slow or busy: that
    /// bounds the wait without failing another file's copy.
    ///
    /// # Errors
    ///
    /// `EIO` (an engine error; the queue was reset), `ETIMEDOUT` (stuck: the queue was reset;
    /// or its ring full of other copies for [`DEFAULT_TIMEOUT`], nothing of this move in
    /// flight), `EINTR` (SIGKILL while the ring was full, nothing of this move in flight),
    /// `ENODEV`. Once a part of the move is in flight, the wait for it is bounded only by what
    /// the shared queue holds before it (FIFO) or by the watchdog's reset of a stuck queue.
    pub(crate) fn copy_ranges(&self, ranges: &[(u64, u64, u64)]) -> Result {
        let policy = Policy {
            signals: WaitMode::Uninterruptible,
            timeout: DEFAULT_TIMEOUT,
            on_timeout: OnTimeout::ResetIfStuck,
        };
        let barrier = self.bar.arch.final_barrier;
        let total: u64 = ranges.iter().map(|r| r.2).sum();
        // The next range, the bytes of it already copied, and the bytes of all.
        let (mut i, mut off, mut done) = (0usize, 0u64, 0u64);
        // Since when the ring has been full of other files' copies (nothing of ours in flight).
        let mut full_since = None;
        while done < total {
            let seq = self.with_ringer(|q, bell| {
                let room = q.submission_room();
                if room == 0 {
                    return Ok(None);
                }
                // On failure the move fails as a whole: its progress counters no longer matter.
                q.all_or_nothing(|q| {
                    let mut pairs = 0;
                    while pairs < room && done < total {
                        let &(src, dst, len) = ranges.get(i).ok_or(ERANGE)?;
                        let n = (len - off).min(u64::from(MAX_DESC_BYTES));
                        if n != 0 {
                            let last = done + n == total || pairs + 1 == room;
                            q.prepare_one(&queue::Copy {
                                src: src + off,
                                dst: dst + off,
                                // CAST: at most MAX_DESC_BYTES.
                                len: DescLen::new(n as u32)?,
                                barrier: if last { barrier } else { Barrier::None },
                            })?;
                            pairs += 1;
                        }
                        (off, done) = (off + n, done + n);
                        if off == len {
                            (i, off) = (i + 1, 0);
                        }
                    }
                    q.fence(bell)
                })
                .map(Some)
            })?;
            match seq {
                Some(seq) => {
                    full_since = None;
                    loop {
                        match self.wait_for(seq, &policy) {
                            // Slow, not stuck: the move is still in flight, so wait on.
                            Err(e) if e == ETIMEDOUT && !self.is_settled(seq) => continue,
                            r => break r?,
                        }
                    }
                }
                // Full of other files' copies, and nothing of this move in flight: give up
                // after the default timeout (a stuck queue is reset) or on SIGKILL.
                None => {
                    let since = *full_since.get_or_insert_with(Instant::<Monotonic>::now);
                    if since.elapsed() >= DEFAULT_TIMEOUT {
                        return Err(self.reset_if_stuck().err().unwrap_or(ETIMEDOUT));
                    }
                    if fatal_signal_pending() {
                        return Err(EINTR);
                    }
                    fsleep(FULL_RING_SLEEP);
                }
            }
        }
        Ok(())
    }

    /// Copies `size` bytes from device-fabric address `src` to `dst` ([`Self::transfer`]),
    /// uninterruptibly, resetting the queue on a timeout (the KUnit suites' copies).
    ///
    /// # Errors
    ///
    /// `EINVAL` for size 0; those of [`Self::wait`] but `EINTR`.
    #[cfg(neuron_udma_kunit)]
    pub(crate) fn memcpy(&self, src: u64, dst: u64, size: u64, timeout: Delta) -> Result {
        let job = Job {
            src: Span::Linear(src),
            dst: Span::Linear(dst),
            size,
        };
        self.run_job(job, timeout)
    }

    /// Fills `size` bytes at device-fabric address `dst` from the fill block at `block`
    /// ([`PATTERN_BYTES`](crate::pattern::PATTERN_BYTES)), as [`Self::memcpy`] copies.
    ///
    /// # Errors
    ///
    /// Those of [`Self::memcpy`].
    #[cfg(neuron_udma_kunit)]
    pub(crate) fn fill(&self, block: u64, dst: u64, size: u64, timeout: Delta) -> Result {
        let job = Job {
            src: Span::Repeat(block),
            dst: Span::Linear(dst),
            size,
        };
        self.run_job(job, timeout)
    }

    #[cfg(neuron_udma_kunit)]
    fn run_job(&self, job: Job<'_>, timeout: Delta) -> Result {
        let policy = Policy {
            signals: WaitMode::Uninterruptible,
            timeout,
            on_timeout: OnTimeout::Reset,
        };
        self.transfer(job, &policy).result()
    }
}

/// What one copy of the submission loop moves: `size` bytes from `src` to `dst`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Job<'a> {
    /// Where the bytes come from.
    pub(crate) src: Span<'a>,
    /// Where they go.
    pub(crate) dst: Span<'a>,
    /// Bytes.
    pub(crate) size: u64,
}

impl Job<'static> {
    /// Nothing to move (a placeholder in arrays of jobs).
    pub(crate) const EMPTY: Self = Self {
        src: Span::Linear(0),
        dst: Span::Linear(0),
        size: 0,
    };
}

/// The doorbell of a channel's queue: moves the descriptors of rings in device memory the engine
/// fills (through the channel's mover, waiting for it), then rings the registers.
pub(crate) struct Ringer<'a>(&'a Channel);

impl Doorbell for Ringer<'_> {
    fn ring(self, q: QueueIndex, moves: Option<&Moves>, tx: DescCount, rx: DescCount) -> Result {
        if let Some(m) = moves {
            self.0
                .mover
                .as_ref()
                .ok_or(ENODEV)?
                .copy_ranges(m.ranges())?;
        }
        let regs = self.0.bar.access()?;
        regs.engine(self.0.id.eng)?.ring(q, None, tx, rx)
    }
}
