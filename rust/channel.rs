// SPDX-License-Identifier: GPL-2.0

//! A queue channel: one queue of the device behind its lock, and the only door to it. Every
//! operation on a queue — prepare, start, fence-or-join, wait, reset, state snapshot — is a
//! method here; callers never see the [`Queue`] or the engine's registers.
//!
//! The door lends its queue, under the lock, to the submission engine below it (`submit.rs`,
//! through [`Door`]): every pair written, every wait for a fence and every reset runs there,
//! with the [`Policy`] the door's caller chose. `MEMCPY`, `MEMSET`, the device-memory scrub
//! and the KUnit copies run its loop ([`Channel::transfer`]); the dmaengine provider writes
//! one submission at a time ([`Channel::submit_pieces`]) from its completion work; the user
//! queues' prepare calls ([`Channel::prepare`]) write theirs. Who hears of completions
//! besides the waiters (the file's pollers, an eventfd, io_uring commands) is the child module
//! `channel/listeners.rs`.
//!
//! Data flows one way: `file.rs`, `h2t.rs`, `dmaengine.rs` -> here -> `submit.rs` ->
//! `split.rs`, `queue.rs` -> `ring.rs`, `engine.rs` (through `bar0.rs`); nothing here calls
//! back into its callers.

mod listeners;
mod prepare;
mod reset;

use crate::{
    bar0::Bar0,
    buffer::Buffer,
    charge::Charge,
    counters::{DeviceCounters, QueueObs},
    desc::{Desc, Dir},
    devring::Moves,
    engine::{self, DescCount, EngineErrors, EngineIo, QueueIndex, QueueRegs},
    events::FileEvents,
    kfac::trace::QueueTrace,
    queue::{Doorbell, Queue},
    regs::{M2s, S2m},
    resident::Resident,
    ring::RingState,
    split::{Cut, Move},
    submit::{self, Door},
};
use kernel::{
    new_mutex, new_spinlock,
    prelude::*,
    static_lock_class,
    sync::{
        atomic::{Atomic, Relaxed},
        Arc, Mutex, SpinLock,
    },
    time::{Delta, Instant, Monotonic},
};
use listeners::Listeners;

/// A queue of the device (engine and index), as callers name a channel.
pub(crate) use crate::engine::QueueId;
/// What became of a fence.
pub(crate) use crate::queue::FenceState;
/// What one copy moves (`split.rs`).
pub(crate) use crate::split::Job;
/// The submission engine's vocabulary, as the door's callers name it (`submit.rs`).
pub(crate) use crate::submit::{
    Finish, OnTimeout, Policy, SplitFinish, WaitMode, DEFAULT_TIMEOUT, MAX_SPLIT,
};
/// What happened on a queue since its events were last reported.
pub(crate) use listeners::QueueEvents;

/// Shortest timeout a caller may choose (shorter ones are raised to it), in milliseconds.
pub(crate) const MIN_TIMEOUT_MS: u32 = 10;

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

/// How long a call that may not sleep ([`Wait::Never`]) spins for a held queue lock.
pub(crate) const NONBLOCK_SPIN: Delta = Delta::from_micros(20);

/// Whether a call may sleep for the queue ([`Channel::prepare_fenced`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wait {
    /// It may: the queue lock is waited for.
    Block,
    /// It may not wait for the queue (io_uring's non-blocking issue): `EAGAIN` where it would
    /// (a queue lock held past a short spin, a doorbell that waits for a device-ring move).
    Never,
}

/// One round of a `COPY_WAIT` ([`Channel::wait_all`]): the fence it waits for and the Tx
/// descriptors that fence's completion frees.
struct Ticket {
    seq: Option<u64>,
    /// No unfenced work is left after this fence.
    last: bool,
    /// Tx descriptors (markers included) from the ack position to where the fence's work ends
    /// (0 without a fence).
    pairs: u32,
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
    /// A file's queue: the driver-allocated buffers its copies named, held across its
    /// submissions (`resident.rs`); let go when the instance ends ([`Self::end_resident`]),
    /// and a buffer no submission uses at `MEM_FREE` ([`Self::evict`]).
    resident: Option<Pin<KBox<Resident>>>,
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
    /// Wraps queue `q` (`id`, already programmed) for `owner`, with the memory charge and the
    /// resident set of a file's queue; `mover` moves the descriptors of rings in device memory
    /// the engine fills.
    ///
    /// # Errors
    ///
    /// `ENOMEM`, `EINVAL` if `q`'s rings need a mover and none is given, or a driver's queue
    /// would need one.
    pub(crate) fn new(
        (bar, counters): (Arc<Bar0>, Arc<DeviceCounters>),
        (id, owner): (QueueId, Owner),
        q: Queue,
        mover: Option<Arc<Channel>>,
        (charge, resident): (Option<Charge>, Option<Pin<KBox<Resident>>>),
        file: Option<Arc<FileEvents>>,
    ) -> Result<Arc<Self>> {
        if q.engine_filled() && (mover.is_none() || owner == Owner::Driver) {
            return Err(EINVAL);
        }
        // Fences are numbered on from an earlier instance's: nothing before is news to anyone.
        let settled = q.settled();
        let instance = NEXT_INSTANCE.fetch_add(1, Relaxed);
        let mut q = q;
        let trace = QueueTrace::new(bar.pdev.clone(), id.eng.get(), id.q.number(), instance);
        q.set_obs(QueueObs::new(trace, counters));
        let sizes = (q.tx_state().size().descs(), q.rx_state().size().descs());
        let owner_id = match owner {
            Owner::Driver => 0,
            Owner::File(f) => f,
        };
        let device = q.device_range().map(|(_, len)| len);
        let bytes = (Queue::memory_bytes(sizes.0, sizes.1), device.unwrap_or(0));
        let class = match owner {
            Owner::Driver => static_lock_class!(),
            Owner::File(_) => static_lock_class!(),
        };
        let chan = Arc::pin_init(
            try_pin_init!(Self {
                id,
                owner,
                instance,
                gone: Atomic::new(0),
                bar,
                mover,
                inner <- Mutex::new(Some(q), kernel::c_str!("Channel::inner"), class),
                charge <- new_mutex!(charge),
                resident,
                listeners <- new_mutex!(Listeners {
                    file,
                    signalled: settled,
                    woken: settled,
                    ..Listeners::default()
                }),
                checked_at <- new_spinlock!(Instant::now()),
            }),
            GFP_KERNEL_ACCOUNT,
        )?;
        // Reported once the instance exists: its `queue_release` (`quiesce`) always follows.
        {
            let mut inner = chan.inner.lock();
            if let Some(o) = (*inner).as_mut().and_then(Queue::obs_mut) {
                o.init(sizes, device.is_some(), owner_id, bytes);
            }
        }
        Ok(chan)
    }

    /// Whether the instance ended (`quiesce`: released or unbound); set under the queue lock
    /// before `quiesce` takes the listeners' lock.
    fn ended(&self) -> bool {
        self.gone.load(Relaxed) != 0
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

    // ---- the user-queue operations (COPY_PREPARE(_ONE), COPY_START, COPY_WAIT, QUEUE_STATE) ----

    /// The resident set of a file's queue (`resident.rs`), through which its prepare calls
    /// hold the buffers they name.
    ///
    /// # Errors
    ///
    /// `EINVAL` for a driver's queue (none: it prepares no user copies).
    pub(crate) fn resident(&self) -> Result<&Resident> {
        self.resident.as_deref().ok_or(EINVAL)
    }

    /// Ends the resident set of an instance that [`Self::quiesce`] ended: no submission of it
    /// is left (their holds went with the queue), and a prepare call under way settles before
    /// the set's lock is free (it may be building a large batch: callers do not hold the
    /// device's state lock): every resident buffer goes back, and no call adds one after.
    /// Called before the file's close frees its buffers, and before unbind frees them all.
    pub(crate) fn end_resident(&self) {
        if let Some(r) = &self.resident {
            let stay = r.end(self.gone_error());
            kernel::warn_on!(stay != 0);
        }
    }

    /// Lets buffer `handle` leave the queue's resident set if no submission uses it
    /// ([`Resident::evict`]; `MEM_FREE`).
    pub(crate) fn evict(&self, handle: u64) {
        if let Some(r) = &self.resident {
            r.evict(handle);
        }
    }

    /// Rings the doorbells for `m2s_count` Tx and `s2m_count` Rx prepared descriptors
    /// ([`Queue::start`]).
    ///
    /// # Errors
    ///
    /// `EINVAL` (see [`Queue::start`]), `ENODEV`.
    pub(crate) fn start(&self, m2s_count: u32, s2m_count: u32) -> Result {
        self.with_ringer(|q, bell| {
            q.take_lost()?;
            q.start(bell, m2s_count, s2m_count)
        })
    }

    /// Fences the work no fence covers yet, or targets the newest fence (an interrupted wait
    /// leaves its fence behind: it is reused, not multiplied).
    fn fence_or_join(&self) -> Result<Ticket> {
        self.with_ringer(|q, bell| {
            q.take_lost()?;
            q.retire();
            let (resets, s) = (q.resets, *q.tx_state());
            // A ticket for the fence `seq` whose work ends at Tx position `end`.
            let ticket = |seq, last, end| Ticket {
                seq,
                last,
                pairs: s.size().distance(s.ack_index(), end),
                resets,
            };
            if q.unfenced() != 0 && q.can_fence() {
                let seq = q.fence(bell)?;
                // The fence covers everything written: up to the Tx tail after its marker.
                return Ok(ticket(Some(seq), true, q.tx_state().next_index()));
            }
            if q.busy() {
                let end = q.newest_fence_end().unwrap_or(s.ack_index());
                return Ok(ticket(Some(q.newest_fence()), q.unfenced() == 0, end));
            }
            if q.unfenced() == 0 {
                Ok(ticket(None, true, s.ack_index()))
            } else {
                Err(ENOSPC)
            }
        })
    }

    /// `COPY_WAIT`: waits (interruptibly, bounded by `timeout` in all) until everything prepared
    /// or started on the queue is done, fencing what no fence covers; returns the Tx
    /// descriptors (markers included) its fences freed, each round's from the ack position to
    /// its fence's end. A timeout resets the queue only when it made no progress for
    /// [`DEFAULT_TIMEOUT`].
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
            // The fence completed, and with it everything before it.
            completed += u64::from(t.pairs);
            if t.last {
                return Ok(completed);
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
            q.take_lost()?;
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
        submit::wait(
            self,
            seq,
            &Policy {
                signals: WaitMode::Interruptible,
                timeout,
                on_timeout: OnTimeout::ResetIfStuck,
            },
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

    // ---- resets (the engine's one reset rule, `submit.rs`) ----

    /// Resets the queue (full queue init, ring id 1, buffer holds dropped, the fences in flight
    /// failed with `why`: `EIO`, `ETIMEDOUT` or `ECANCELED`) and returns its engine to normal
    /// operation if it is still aborted.
    ///
    /// # Errors
    ///
    /// `ECANCELED` if the queue was released, `ENODEV` if the device was unbound.
    pub(crate) fn reset(&self, why: Error) -> Result {
        submit::reset(self, why)
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
        submit::recover(self)
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

    /// Whether a submission not yet retired (prepared, started or in flight) holds `buf` by a
    /// counted reference ([`Queue::holds`]: an import, which a revocation waits for; a resident
    /// buffer is held by the queue's resident set instead); `false` once released.
    pub(crate) fn holds(&self, buf: &Buffer) -> bool {
        self.locked(|q| {
            q.retire();
            Ok(q.holds(buf))
        })
        .unwrap_or(false)
    }

    /// Logs a failed wait, resets the queue and returns fence `seq`'s outcome as the reset
    /// settled it ([`submit::fail`]; KUnit: a waiter that saw `errors`).
    ///
    /// # Errors
    ///
    /// Those of [`submit::fail`].
    #[cfg(neuron_udma_kunit)]
    pub(crate) fn fail(
        &self,
        seq: u64,
        err: Error,
        errors: &EngineErrors,
        timeout: Delta,
    ) -> Result {
        submit::fail(self, seq, err, errors, timeout)
    }

    /// Whether fence `seq` is no longer in flight ([`Queue::is_settled`]); a released queue
    /// has nothing in flight.
    pub(crate) fn is_settled(&self, seq: u64) -> bool {
        submit::is_settled(self, seq)
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
            if let Ok(regs) = self.bar.access_always() {
                if let Ok(io) = regs.engine(self.id.eng) {
                    q.pause(io);
                }
            }
            out.range = q.device_range();
            out.next_fence = q.next_fence();
            if let Some(o) = q.obs_mut() {
                o.release(out.next_fence);
            }
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

    // ---- the driver's copies (the submission engine, `submit.rs`) ----

    /// Copies `job` with `policy` ([`submit::transfer`]): splits it into pairs, writes a
    /// submission, waits for it, and so on; a full ring is waited for within the timeout, and
    /// reset when stuck. (The driver's own copies go through [`Self::transfer_until`] and
    /// [`Self::transfer_split`]; this is the tests' and benchmarks' one-queue path.)
    #[cfg(any(neuron_udma_kunit, neuron_udma_bench))]
    pub(crate) fn transfer(&self, job: Job<'_>, policy: &Policy) -> Finish {
        submit::transfer(self, &job, policy, || None)
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
        submit::transfer(self, &job, policy, stop)
    }

    /// Runs the jobs of `parts`, each on its own queue, at the same time
    /// ([`submit::run`]'s rules: `policy`'s timeout per wait, a full ring waited for and reset
    /// when stuck; a failure, or an error `stop` returns before a submission, stops new
    /// submissions; an early end returns the fences in flight). At most [`MAX_SPLIT`] parts.
    pub(crate) fn transfer_split(
        parts: &[(&Channel, Job<'_>)],
        policy: &Policy,
        stop: impl Fn() -> Option<Error>,
    ) -> SplitFinish {
        submit::transfer_split(parts, policy, stop)
    }

    /// Makes the moves `moves` (device-fabric addresses) in order, nothing of them in flight
    /// when it returns: how the driver's H2T
    /// queue moves the descriptors of a queue whose rings are in device memory
    /// ([`submit::copy_ranges`]; `devring.rs`).
    ///
    /// # Errors
    ///
    /// Those of [`submit::copy_ranges`].
    pub(crate) fn copy_ranges(&self, moves: &[Move]) -> Result {
        submit::copy_ranges(self, moves)
    }

    /// Writes as many pairs of `cut` as one fenced submission may take now, then a fence, and
    /// rings the doorbells ([`submit::submit`]): dmaengine's completion work, which does not
    /// wait. Returns the fence, or `None` when the rings or the completion slots are full.
    ///
    /// # Errors
    ///
    /// Those of [`submit::submit`].
    pub(crate) fn submit(&self, cut: &mut Cut<'_>) -> Result<Option<u64>> {
        submit::submit(self, cut)
    }

    /// Copies `size` bytes from device-fabric address `src` to `dst` ([`Self::transfer`]),
    /// uninterruptibly, resetting the queue on a timeout (the KUnit suites' copies).
    ///
    /// # Errors
    ///
    /// `EINVAL` for size 0; those of [`submit::wait`] but `EINTR`.
    #[cfg(neuron_udma_kunit)]
    pub(crate) fn memcpy(&self, src: u64, dst: u64, size: u64, timeout: Delta) -> Result {
        self.run_to(crate::span::Span::Linear(src), dst, size, timeout)
    }

    /// Fills `size` bytes at device-fabric address `dst` from the fill block at `block`
    /// ([`PATTERN_BYTES`](crate::pattern::PATTERN_BYTES)), as [`Self::memcpy`] copies.
    ///
    /// # Errors
    ///
    /// Those of [`Self::memcpy`].
    #[cfg(neuron_udma_kunit)]
    pub(crate) fn fill(&self, block: u64, dst: u64, size: u64, timeout: Delta) -> Result {
        self.run_to(crate::span::Span::Repeat(block), dst, size, timeout)
    }

    /// Moves `size` bytes from `src` to device-fabric address `dst` ([`Self::transfer`]),
    /// uninterruptibly, resetting the queue on a timeout: [`Self::memcpy`] and [`Self::fill`].
    #[cfg(neuron_udma_kunit)]
    fn run_to(&self, src: crate::span::Span<'_>, dst: u64, size: u64, timeout: Delta) -> Result {
        let job = Job {
            src,
            dst: crate::span::Span::Linear(dst),
            size,
        };
        let policy = Policy {
            signals: WaitMode::Uninterruptible,
            timeout,
            on_timeout: OnTimeout::Reset,
        };
        self.transfer(job, &policy).result()
    }
}

impl Door for Channel {
    type Bell<'a> = Ringer<'a>;

    fn locked<R>(&self, f: impl FnOnce(&mut Queue) -> Result<R>) -> Result<R> {
        let mut inner = self.inner.lock();
        f((*inner).as_mut().ok_or_else(|| self.gone_error())?)
    }

    fn with_ringer<R>(&self, f: impl FnOnce(&mut Queue, Ringer<'_>) -> Result<R>) -> Result<R> {
        let mut inner = self.inner.lock();
        let q = (*inner).as_mut().ok_or_else(|| self.gone_error())?;
        // Before anything changes: a device reset (`EIO`) stops this queue under this lock
        // after it closed the gate, so a doorbell rung below comes before the reset's stop.
        self.bar.check()?;
        f(q, Ringer(self))
    }

    fn with_io<R>(&self, f: impl FnOnce(&mut Queue, EngineIo<'_>) -> Result<R>) -> Result<R> {
        let mut inner = self.inner.lock();
        let q = (*inner).as_mut().ok_or_else(|| self.gone_error())?;
        let regs = self.bar.access()?;
        f(q, regs.engine(self.id.eng)?)
    }

    fn bar(&self) -> &Bar0 {
        &self.bar
    }

    fn id(&self) -> QueueId {
        self.id
    }
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
        // The gate was passed under the queue lock, which is held (`with_ringer`).
        let regs = self.0.bar.access_always()?;
        engine::doorbell(regs.engine(self.0.id.eng)?, q, tx, rx);
        Ok(())
    }
}
