// SPDX-License-Identifier: GPL-2.0

//! The driver's own H2T queue (NeuronCore 0's, hardware.rst §2.3), shared by everything the
//! driver copies itself: in-kernel copies, the `MEMCPY` and `MEMSET` ioctls of every open file,
//! and the scrub that zeroes device memory before it is handed out (those three striped over the
//! driver's queue of every H2T engine from [`STRIPE_BYTES`] on). Each of them is one run of the
//! submission engine's loop (`submit.rs`, through [`Channel::transfer`]); only its policy is
//! chosen here.
//!
//! A copy that returns early (timeout, SIGKILL) with its last submission still in flight
//! leaves what it used with the queue's orphans (`orphan.rs`) until that fence settles; each
//! file has at most one, so a caller with a tiny timeout cannot fill the shared queue.

use crate::{
    channel::{
        Channel, Finish, Job, OnTimeout, Policy, SplitFinish, WaitMode, DEFAULT_TIMEOUT, MAX_SPLIT,
    },
    kfac::sched::fatal_signal_pending,
    orphan::{Hold, Orphan, OrphanSlot, Orphans},
    pool::BufferPool,
    span::Span,
    split::{self, REPEAT_BYTES},
};
use kernel::{
    dma::Coherent,
    new_mutex,
    prelude::*,
    sync::{Arc, Mutex},
    time::{delay::fsleep, Delta, Instant, Monotonic},
};

/// Ring size of the driver's H2T queue, as in the reference (hardware.rst §3.7: 8192
/// descriptors).
pub(crate) const H2T_RING_DESCS: u32 = 8192;
/// Bytes of the zeroed host buffer that scrubs device memory: the source every pair of a scrub
/// reads from its start ([`REPEAT_BYTES`]).
pub(crate) const SCRUB_BYTES: usize = REPEAT_BYTES;
/// Ring size of the other H2T engines' scrub queues ([`Arch::scrub_queues`]): room for one
/// submission of 1016 pairs (64 MiB) and its marker while the previous one runs.
///
/// [`Arch::scrub_queues`]: crate::arch::Arch::scrub_queues
pub(crate) const SCRUB_RING_DESCS: u32 = 2048;
/// Copies (`MEMCPY`, `MEMSET`, scrubs) of at least this many bytes run on every H2T engine at
/// once, striped (smaller ones are not worth the extra doorbells and waits). What an early end
/// leaves on any of those queues is the orphans' ([`Orphans::reap`] resets an aborted one at
/// once), and a dma-buf revocation drains them all ([`Self::queues`]).
pub(crate) const STRIPE_BYTES: u64 = 4 << 20;
/// Sleep between two looks at a file's orphan that its next `MEMCPY` waits for.
const ORPHAN_SLEEP: Delta = Delta::from_micros(200);

/// How a copy on the H2T engines ended ([`H2t::run`]).
enum Ran {
    /// Every byte moved.
    Done,
    /// It failed with nothing of it in flight (what it held is released).
    Failed(Error),
    /// It ended early with submissions in flight: what it held is an orphan now.
    Orphaned(Error),
}

/// The shared H2T queue, the zeroed source of scrubs, and the orphans its copies leave.
#[pin_data]
pub(crate) struct H2t {
    chan: Arc<Channel>,
    /// The other H2T engines' queues (driver-owned), on which large copies and scrubs run
    /// their other stripes ([`STRIPE_BYTES`]).
    scrubbers: KVec<Arc<Channel>>,
    /// Zeroed host memory ([`SCRUB_BYTES`]) and its device-fabric address; `None` after
    /// [`Self::shutdown`] (freed while the device is still bound).
    #[pin]
    zeros: Mutex<Option<(Coherent<[u8]>, u64)>>,
    /// What returned copies left in flight.
    #[pin]
    orphans: Orphans,
}

impl H2t {
    /// Wraps the driver's queue `chan` and the zeroed block `zeros` at device-fabric address
    /// `zeros_addr`.
    ///
    /// # Errors
    ///
    /// `ENOMEM`.
    pub(crate) fn new(
        chan: Arc<Channel>,
        scrubbers: KVec<Arc<Channel>>,
        zeros: Coherent<[u8]>,
        zeros_addr: u64,
    ) -> Result<Arc<Self>> {
        Arc::pin_init(
            try_pin_init!(Self {
                chan,
                scrubbers,
                zeros <- new_mutex!(Some((zeros, zeros_addr))),
                orphans <- Orphans::new(),
            }),
            GFP_KERNEL,
        )
    }

    /// The shared queue itself (it moves the descriptors of queues whose rings are in device
    /// memory and filled by the engine, `devring.rs`).
    pub(crate) fn channel(&self) -> Arc<Channel> {
        self.chan.clone()
    }

    /// Every queue a copy of the H2T engines may run on: the shared one first, then the other
    /// engines' (the stripes of [`Self::run`], at most [`MAX_SPLIT`]).
    pub(crate) fn queues(&self) -> impl Iterator<Item = &Arc<Channel>> {
        Iterator::chain(core::iter::once(&self.chan), self.scrubbers.iter()).take(MAX_SPLIT)
    }

    /// Frees the zeroed block and drops the orphans (unbind, after the queue was paused).
    pub(crate) fn shutdown(&self) {
        let zeros = self.zeros.lock().take();
        drop(zeros);
        self.orphans.shutdown();
    }

    /// Copies `size` bytes between device-fabric addresses ([`Channel::memcpy`]).
    ///
    /// # Errors
    ///
    /// See [`Channel::memcpy`].
    #[cfg(neuron_udma_kunit)]
    pub(crate) fn memcpy(&self, src: u64, dst: u64, size: u64, timeout: Delta) -> Result {
        self.chan.memcpy(src, dst, size, timeout)
    }

    /// Fills `size` bytes at `dst` from the fill block at `block` ([`Channel::fill`]).
    ///
    /// # Errors
    ///
    /// See [`Channel::fill`].
    #[cfg(neuron_udma_kunit)]
    pub(crate) fn fill(&self, block: u64, dst: u64, size: u64, timeout: Delta) -> Result {
        self.chan.fill(block, dst, size, timeout)
    }

    /// The policy of the shared queue's interruptible callers: the wait ends on SIGKILL, and a
    /// timeout resets the queue only when it made no progress for [`DEFAULT_TIMEOUT`].
    fn policy(timeout: Delta) -> Policy {
        Policy {
            signals: WaitMode::Killable,
            timeout,
            on_timeout: OnTimeout::ResetIfStuck,
        }
    }

    /// The `MEMCPY` and `MEMSET` ioctls of the open file `file`: copies `job` (run by run for
    /// imported buffers; striped over every H2T engine from [`STRIPE_BYTES`] on, [`Self::run`]),
    /// with `hold` keeping what it reads and writes (the two buffers busy, or the destination
    /// busy and the fill block); `timeout` bounds the wait for the file's
    /// previous unfinished copy and each submission's wait. When the call returns early
    /// (timeout, SIGKILL) with its last submission still in flight, `hold` stays (an orphan)
    /// until the engine is done with it, and the file's next `MEMCPY` or `MEMSET` first waits
    /// for that submission.
    ///
    /// # Errors
    ///
    /// `ETIMEDOUT` (also when the file's previous timed-out copy is still running), `EIO`
    /// (engine error: the queue was reset), `EINTR` (SIGKILL), `ENXIO` (an imported dma-buf of
    /// `hold` was revoked by its exporter: no further submission names it), `EINVAL` for size
    /// 0, `ENOMEM`, `ENODEV`.
    pub(crate) fn copy_for_file(
        &self,
        pool: &BufferPool,
        file: u64,
        job: Job<'_>,
        timeout: Delta,
        hold: Hold,
    ) -> Result {
        let start = Instant::<Monotonic>::now();
        // One unfinished copy per file: a caller with a tiny timeout cannot fill the queue.
        loop {
            self.orphans.reap(pool);
            if !self.orphans.held_by(file) {
                break;
            }
            if hold.revoked() {
                return Err(ENXIO);
            }
            if start.elapsed() >= timeout {
                return Err(ETIMEDOUT);
            }
            if fatal_signal_pending() {
                return Err(EINTR);
            }
            fsleep(ORPHAN_SLEEP);
        }
        let slot = self.orphans.reserve()?;
        let left = timeout - start.elapsed();
        match self.run(job, &Self::policy(left), file, hold, slot) {
            Ran::Done => Ok(()),
            Ran::Failed(e) | Ran::Orphaned(e) => Err(e),
        }
    }

    /// How many queues a striped job of `size` bytes runs on: from [`STRIPE_BYTES`] on, the
    /// shared queue and every other H2T engine's (at most [`MAX_SPLIT`]); 1 below.
    fn stripes(&self, size: u64) -> usize {
        if size < STRIPE_BYTES {
            1
        } else {
            (1 + self.scrubbers.len()).min(MAX_SPLIT)
        }
    }

    /// Runs `job` for `file` (0: the driver) with `hold` keeping what it reads and writes: on
    /// the shared queue, or, from [`STRIPE_BYTES`] on, striped over every H2T engine (one part
    /// per queue, whole pairs, [`split::share`]; all parts at once,
    /// [`Channel::transfer_split`]; a part that fails fails the whole job). Asks `hold` before
    /// each submission whether an imported dma-buf was revoked (`ENXIO`). When it ends early
    /// with submissions in flight, `hold` stays in `slot` (an orphan) until every queue's fence
    /// that covers them is settled.
    fn run(
        &self,
        job: Job<'_>,
        policy: &Policy,
        file: u64,
        hold: Hold,
        slot: OrphanSlot<'_>,
    ) -> Ran {
        let revoked = || hold.revoked().then_some(ENXIO);
        let parts = self.stripes(job.size);
        if parts == 1 {
            return match self.chan.transfer_until(job, policy, revoked) {
                Finish::Done => Ran::Done,
                Finish::Failed(e) => Ran::Failed(e),
                Finish::InFlight { err, seq } => {
                    self.orphans
                        .adopt(slot, Orphan::new(self.chan.clone(), seq, file, hold));
                    Ran::Orphaned(err)
                }
            };
        }
        // CAST: at most MAX_SPLIT.
        let per = split::share(job.size, parts as u64);
        let mut list: [(&Channel, Job<'_>); MAX_SPLIT] = [(&*self.chan, Job::EMPTY); MAX_SPLIT];
        let mut k = 0;
        for (i, ch) in self.queues().take(parts).enumerate() {
            // CAST: at most MAX_SPLIT.
            let off = per * i as u64;
            if off >= job.size {
                break;
            }
            list[k] = (&**ch, job.part(off, per.min(job.size - off)));
            k += 1;
        }
        match Channel::transfer_split(&list[..k], policy, revoked) {
            SplitFinish::Done => Ran::Done,
            SplitFinish::Failed(e) => Ran::Failed(e),
            SplitFinish::InFlight { err, fences } => {
                let chan_of = |i: usize| -> Arc<Channel> {
                    match i.checked_sub(1) {
                        Some(j) => self.scrubbers[j].clone(),
                        None => self.chan.clone(),
                    }
                };
                let mut left = fences.iter().flatten();
                // Not empty: a wait ended early on a fence in flight.
                let Some(&(i0, s0)) = left.next() else {
                    return Ran::Failed(err);
                };
                let mut orphan = Orphan::new(chan_of(i0), s0, file, hold);
                for (m, &(i, s)) in orphan.more.iter_mut().zip(left) {
                    *m = Some((chan_of(i), s));
                }
                self.orphans.adopt(slot, orphan);
                Ran::Orphaned(err)
            }
        }
    }

    /// Writes zeros over `size` bytes of device memory at `addr` with the engine. The wait ends
    /// on SIGKILL; a failed scrub resets the queue (so the engine no longer touches the range).
    /// On error the range is no longer the caller's: it went back to `pool`'s allocator, or, if
    /// a SIGKILL left its last submission in flight, it stays reserved (an orphan) until that
    /// submission is settled.
    ///
    /// # Errors
    ///
    /// `EIO`, `ETIMEDOUT`, `EINTR` (SIGKILL), `ENOMEM`, `ENODEV`.
    pub(crate) fn scrub(&self, pool: &BufferPool, addr: u64, size: u64) -> Result {
        let r = self.scrub_range(pool, addr, size);
        // CAST: at most MAX_SPLIT.
        pool.trace_scrub(addr, size, self.stripes(size) as u32, &r);
        r
    }

    /// [`Self::scrub`]: zeros from the zeroed block, striped from [`STRIPE_BYTES`] on.
    fn scrub_range(&self, pool: &BufferPool, addr: u64, size: u64) -> Result {
        let give_back = |e| {
            pool.free_dram(addr);
            Err(e)
        };
        let zeros = match &*self.zeros.lock() {
            Some((_, a)) => *a,
            None => return give_back(ENODEV),
        };
        let slot = match self.orphans.reserve() {
            Ok(s) => s,
            Err(e) => return give_back(e),
        };
        let job = Job {
            src: Span::Repeat(zeros),
            dst: Span::Linear(addr),
            size,
        };
        match self.run(
            job,
            &Self::policy(DEFAULT_TIMEOUT),
            0,
            Hold::Dram(addr),
            slot,
        ) {
            Ran::Done => Ok(()),
            // Nothing of it in flight: the range goes back now.
            Ran::Failed(e) => give_back(e),
            // The orphan gives the range back when the engine is done.
            Ran::Orphaned(e) => Err(e),
        }
    }

    /// The shared queue, the device-fabric address of the zeroed block (`None` after
    /// [`Self::shutdown`]) and the number of H2T engines a large scrub runs on: what the
    /// benchmark suite's scrub rows (`tests/bench/kernel/bench.rs`) need to time the
    /// one-engine path against [`Self::scrub`].
    #[cfg(neuron_udma_bench)]
    pub(crate) fn scrub_parts(&self) -> (&Arc<Channel>, Option<u64>, usize) {
        let zeros = self.zeros.lock().as_ref().map(|(_, a)| *a);
        (&self.chan, zeros, self.stripes(STRIPE_BYTES))
    }

    /// Gives back what settled orphans held ([`Orphans::reap`]); returns the orphans left.
    pub(crate) fn reap(&self, pool: &BufferPool) -> usize {
        self.orphans.reap(pool)
    }

    /// Whether any orphan is left (no lock taken).
    pub(crate) fn has_orphans(&self) -> bool {
        self.orphans.any()
    }
}
