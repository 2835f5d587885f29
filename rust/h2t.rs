// SPDX-License-Identifier: GPL-2.0

//! The driver's own H2T queue (NeuronCore 0's, hardware.rst §2.3), shared by everything the
//! driver copies itself: in-kernel copies, the `MEMCPY` ioctl of every open file, and the scrub
//! that zeroes device memory before it is handed out.
//!
//! A copy that returns early (timeout, SIGKILL) with its last submission still in flight
//! leaves what it used with the buffer pool ([`Held`]) until that fence settles; each file has
//! at most one such copy, so a caller with a tiny timeout cannot fill the shared queue.

use crate::{
    channel::{Channel, WaitMode, DEFAULT_TIMEOUT},
    desc::MAX_DESC_BYTES,
    mem::{BufferPool, BusyGuard, Held, Hold},
    shim::fatal_signal_pending,
    span::Span,
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
/// Bytes of the zeroed host buffer that scrubs device memory (one 64 KiB descriptor).
pub(crate) const SCRUB_BYTES: usize = MAX_DESC_BYTES as usize;

/// The shared H2T queue and the zeroed source of scrubs.
#[pin_data]
pub(crate) struct H2t {
    chan: Arc<Channel>,
    /// Zeroed host memory ([`SCRUB_BYTES`]) and its device-fabric address; `None` after
    /// [`Self::shutdown`] (freed while the device is still bound).
    #[pin]
    zeros: Mutex<Option<(Coherent<[u8]>, u64)>>,
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
        zeros: Coherent<[u8]>,
        zeros_addr: u64,
    ) -> Result<Arc<Self>> {
        Arc::pin_init(
            try_pin_init!(Self {
                chan,
                zeros <- new_mutex!(Some((zeros, zeros_addr))),
            }),
            GFP_KERNEL,
        )
    }

    /// Frees the zeroed block (unbind, after the queue was paused).
    pub(crate) fn shutdown(&self) {
        let zeros = self.zeros.lock().take();
        drop(zeros);
    }

    /// Copies `size` bytes between device-fabric addresses ([`Channel::memcpy`]).
    ///
    /// # Errors
    ///
    /// See [`Channel::memcpy`].
    // Only the KUnit suites copy through it; the ioctl paths use `copy`.
    #[cfg(neuron_udma_kunit)]
    pub(crate) fn memcpy(&self, src: u64, dst: u64, size: u64, timeout: Delta) -> Result {
        self.chan.memcpy(src, dst, size, timeout)
    }

    /// The `MEMCPY` ioctl of the open file `file`: copies `size` bytes from `src` to `dst`
    /// (run by run for imported buffers), with `guards` keeping the two buffers busy. The wait
    /// ends on SIGKILL; a timeout resets the shared queue only when it made no progress for
    /// [`DEFAULT_TIMEOUT`] (other files' copies go on otherwise).
    /// When the call returns early (timeout, SIGKILL) with its last submission still in
    /// flight, the buffers stay busy until the engine is done with it, and the file's next
    /// `MEMCPY` first waits for that submission.
    ///
    /// # Errors
    ///
    /// `ETIMEDOUT` (also when the file's previous timed-out copy is still running), `EIO`
    /// (engine error: the queue was reset), `EINTR` (SIGKILL), `EINVAL` for size 0, `ENODEV`.
    #[expect(clippy::too_many_arguments)]
    pub(crate) fn memcpy_for_file(
        &self,
        pool: &BufferPool,
        file: u64,
        src: Span<'_>,
        dst: Span<'_>,
        size: u64,
        timeout: Delta,
        guards: [BusyGuard; 2],
    ) -> Result {
        let start = Instant::<Monotonic>::now();
        // One unfinished copy per file: a caller with a tiny timeout cannot fill the queue.
        loop {
            self.reap(pool);
            if !pool.held_by(file) {
                break;
            }
            if start.elapsed() >= timeout {
                // The earlier copy may be on a stuck queue that nobody else waits on.
                self.chan.reset_if_stuck()?;
                self.reap(pool);
                return Err(ETIMEDOUT);
            }
            if fatal_signal_pending() {
                return Err(EINTR);
            }
            fsleep(Delta::from_micros(200));
        }
        let remaining = timeout - start.elapsed();
        self.copy_or_hold(pool, src, dst, size, remaining, file, Hold::Buffers(guards))
            .0
    }

    /// Writes zeros over `size` bytes of device memory at `addr` with the engine. The wait
    /// ends on SIGKILL; a failed scrub resets the queue (so the engine no longer touches the
    /// range). Returns `false` when the range must not be given back yet: a SIGKILL left its
    /// last submission in flight, and the pool gives the range back when that is settled.
    pub(crate) fn scrub(&self, pool: &BufferPool, addr: u64, size: u64) -> (Result, bool) {
        let zeros = match &*self.zeros.lock() {
            Some((_, a)) => *a,
            None => return (Err(ENODEV), true),
        };
        let (r, held) = self.copy_or_hold(
            pool,
            Span::Repeat(zeros),
            Span::Linear(addr),
            size,
            DEFAULT_TIMEOUT,
            0,
            Hold::Dram(addr),
        );
        (r, !held)
    }

    /// Copies `size` bytes to `dst` with the policy of the shared queue's interruptible
    /// callers: the wait ends on SIGKILL, and a timeout resets the queue only when it made no
    /// progress for [`DEFAULT_TIMEOUT`], whatever `timeout`. When the call returns with its last
    /// submission still in flight, `hold` (of the open file `file`, 0 for the driver) is left
    /// with the pool until that submission is settled; otherwise it is dropped here. Returns the
    /// copy's result and whether `hold` was left with the pool.
    #[expect(clippy::too_many_arguments)]
    fn copy_or_hold(
        &self,
        pool: &BufferPool,
        src: Span<'_>,
        dst: Span<'_>,
        size: u64,
        timeout: Delta,
        file: u64,
        hold: Hold,
    ) -> (Result, bool) {
        let mut in_flight = None;
        let r = self.chan.copy(
            src,
            dst,
            size,
            timeout,
            WaitMode::Killable,
            false,
            &mut in_flight,
        );
        let held = match in_flight {
            Some(seq) => self.hold(pool, Held { seq, file, hold }),
            None => false,
        };
        (r, held)
    }

    /// Leaves `held`, whose submission is still in flight, with the pool. Returns `false` when
    /// there was no memory to record it: then this waits (uninterruptibly, bounded by the
    /// stuck-queue reset) until the fence is settled and drops `held` here.
    fn hold(&self, pool: &BufferPool, held: Held) -> bool {
        match pool.hold(held) {
            Ok(()) => true,
            Err(held) => {
                let _ = self.chan.wait_settled(held.seq);
                drop(held);
                false
            }
        }
    }

    /// Resets the shared queue if it made no progress for [`DEFAULT_TIMEOUT`] with fences in
    /// flight ([`Channel::reset_if_stuck`]).
    ///
    /// # Errors
    ///
    /// Those of [`Channel::reset_if_stuck`].
    pub(crate) fn reset_if_stuck(&self) -> Result {
        self.chan.reset_if_stuck()
    }

    /// Gives back what abandoned copies held once their fences are settled
    /// ([`BufferPool::reap`]). The queue lock is never taken inside the pool lock.
    pub(crate) fn reap(&self, pool: &BufferPool) {
        if !pool.has_held() {
            return;
        }
        let mut done = KVec::new();
        for seq in pool.held_fences() {
            if self.chan.is_settled(seq) && done.push(seq, GFP_KERNEL).is_err() {
                break;
            }
        }
        if !done.is_empty() {
            pool.reap(&done);
        }
    }
}
