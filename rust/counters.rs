// SPDX-License-Identifier: GPL-2.0

//! A device's activity counters (sysfs `neuron_udma/`, `Documentation/ABI/testing/
//! sysfs-driver-neuron_udma`): copies and bytes user space submitted, fences completed and
//! failed, queue resets by cause, engine aborts, and the memory of the queues' rings, per device,
//! from bind to unbind (a file's close does not take anything back; the ring memory is a gauge).
//! And [`QueueObs`], what a queue reports to: these counters and its tracepoints
//! (`kfac/trace.rs`), named by its queue instance.

use crate::kfac::trace::QueueTrace;
use kernel::{
    error::Error,
    prelude::*,
    sync::{
        atomic::{Atomic, Relaxed},
        Arc,
    },
};

/// How many counters [`DeviceCounters::raw`] gives (in the order of `rust/kfac/sysfs.c`'s
/// names after the memory usage ones).
pub(crate) const COUNTERS_NR: usize = 12;

/// The activity counters of one device. Monotonic except the ring memory (bytes in use).
pub(crate) struct DeviceCounters {
    /// Copies user space submitted: each entry of `COPY_PREPARE`, `COPY_PREPARE_ONE` and
    /// io_uring `URING_COPY` when written to the rings, each `MEMCPY` and `MEMSET` when done.
    copies: Atomic<u64>,
    /// Their bytes.
    copy_bytes: Atomic<u64>,
    /// Fences retired as done, on every queue of the device (the driver's included).
    fences_completed: Atomic<u64>,
    /// Fences a reset failed (`EIO`, `ETIMEDOUT`); not those a release or unbind cancelled.
    fences_failed: Atomic<u64>,
    /// Queue resets for an engine error (`EIO`).
    resets_engine_error: Atomic<u64>,
    /// Queue resets for a timeout or stall (`ETIMEDOUT`).
    resets_timeout: Atomic<u64>,
    /// Queue resets for another cause: a dmaengine client's terminate, the drain of an imported
    /// dma-buf its exporter revoked, a dmaengine channel's dropped fence.
    resets_other: Atomic<u64>,
    /// Engine aborts a queue found (hardware.rst §3.5).
    engine_aborts: Atomic<u64>,
    /// Host memory of the queues in use (rings, staging rings, completion slots, fence records),
    /// bytes: [`Queue::memory_bytes`](crate::queue::Queue::memory_bytes).
    ring_host_bytes: Atomic<u64>,
    /// Device memory of the rings in device memory in use, bytes.
    ring_device_bytes: Atomic<u64>,
    /// Queue resets for a device reset (`EIO`): every queue in use when a reset began.
    resets_device: Atomic<u64>,
    /// Device resets: function-level resets (`reset_prepare`) and PCI error recoveries
    /// (`error_detected`), counted when they begin.
    device_resets: Atomic<u64>,
}

impl DeviceCounters {
    /// All zero.
    ///
    /// # Errors
    ///
    /// `ENOMEM`.
    pub(crate) fn new() -> Result<Arc<Self>> {
        let z = || Atomic::new(0);
        Ok(Arc::new(
            Self {
                copies: z(),
                copy_bytes: z(),
                fences_completed: z(),
                fences_failed: z(),
                resets_engine_error: z(),
                resets_timeout: z(),
                resets_other: z(),
                engine_aborts: z(),
                ring_host_bytes: z(),
                ring_device_bytes: z(),
                resets_device: z(),
                device_resets: z(),
            },
            GFP_KERNEL,
        )?)
    }

    /// Counts `copies` copies of `bytes` bytes submitted by user space.
    pub(crate) fn add_copies(&self, copies: u64, bytes: u64) {
        self.copies.fetch_add(copies, Relaxed);
        self.copy_bytes.fetch_add(bytes, Relaxed);
    }

    /// Device resets so far (KUnit).
    #[cfg(neuron_udma_kunit)]
    pub(crate) fn device_resets(&self) -> u64 {
        self.device_resets.load(Relaxed)
    }

    /// Counts a device reset that begins.
    pub(crate) fn add_device_reset(&self) {
        self.device_resets.fetch_add(1, Relaxed);
    }

    /// The counters as raw `u64`s for `rust/kfac/sysfs.c`: copies, copy bytes, fences
    /// completed and failed, resets for engine errors, for timeouts and for other causes, engine
    /// aborts, ring bytes in host and in device memory, resets for device resets, device
    /// resets.
    pub(crate) fn raw(&self) -> [*const u64; COUNTERS_NR] {
        let p = |a: &Atomic<u64>| a.as_ptr().cast_const();
        [
            p(&self.copies),
            p(&self.copy_bytes),
            p(&self.fences_completed),
            p(&self.fences_failed),
            p(&self.resets_engine_error),
            p(&self.resets_timeout),
            p(&self.resets_other),
            p(&self.engine_aborts),
            p(&self.ring_host_bytes),
            p(&self.ring_device_bytes),
            p(&self.resets_device),
            p(&self.device_resets),
        ]
    }
}

/// Why a queue is reset, for the counters (the errno its dropped fences report is separate: a
/// revoked import's drain fails them with `EIO` without an engine error).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ResetCause {
    /// The engine aborted (an engine error found by a waiter or the completion engine).
    EngineError,
    /// A timeout, or no progress for the default timeout.
    Timeout,
    /// Anything else: a dmaengine terminate, a revoked import's drain, a dropped fence.
    Other,
    /// A reset of the whole device (function-level reset, PCI error recovery).
    Device,
}

/// What one queue instance reports to: its device's counters and its tracepoints.
pub(crate) struct QueueObs {
    trace: QueueTrace,
    counters: Arc<DeviceCounters>,
    /// The memory of its rings counted in the ring gauges: host bytes, device bytes.
    ring_bytes: (u64, u64),
}

impl QueueObs {
    /// The reports of the queue whose events `trace` names, to `counters`.
    pub(crate) fn new(trace: QueueTrace, counters: Arc<DeviceCounters>) -> Self {
        Self {
            trace,
            counters,
            ring_bytes: (0, 0),
        }
    }

    /// The instance took rings of `sizes` (Tx, Rx descriptors), in device memory if
    /// `device_rings`, for the open file `owner` (0: the driver), holding `host_bytes` of host
    /// and `device_bytes` of device memory.
    pub(crate) fn init(
        &mut self,
        sizes: (u32, u32),
        device_rings: bool,
        owner: u64,
        (host_bytes, device_bytes): (u64, u64),
    ) {
        self.ring_bytes = (host_bytes, device_bytes);
        self.counters.ring_host_bytes.fetch_add(host_bytes, Relaxed);
        self.counters
            .ring_device_bytes
            .fetch_add(device_bytes, Relaxed);
        self.trace.queue_init(sizes, device_rings, owner);
    }

    /// The instance ended; its next one numbers fences from `next_fence`. Once only.
    pub(crate) fn release(&mut self, next_fence: u64) {
        let (host, device) = core::mem::take(&mut self.ring_bytes);
        self.counters.ring_host_bytes.fetch_sub(host, Relaxed);
        self.counters.ring_device_bytes.fetch_sub(device, Relaxed);
        self.trace.queue_release(next_fence);
    }

    /// The tracepoints of the instance.
    pub(crate) fn trace(&self) -> &QueueTrace {
        &self.trace
    }

    /// Fences up to `fence` retired as done, `fences` of them.
    pub(crate) fn fence_done(&self, fence: u64, fences: u32) {
        self.counters
            .fences_completed
            .fetch_add(u64::from(fences), Relaxed);
        self.trace.fence_done(fence, fences);
    }

    /// Fences `first..=last` dropped with `why` (`ECANCELED`: cancelled, not failed).
    pub(crate) fn fences_dropped(&self, first: u64, last: u64, why: Error) {
        if why != ECANCELED {
            self.counters
                .fences_failed
                .fetch_add(last - first + 1, Relaxed);
        }
        self.trace.fence_failed(first, last, why);
    }

    /// The queue was reset for `cause`; its fences in flight fail with `why`.
    pub(crate) fn reset(&self, why: Error, cause: ResetCause) {
        let counter = match cause {
            ResetCause::EngineError => &self.counters.resets_engine_error,
            ResetCause::Timeout => &self.counters.resets_timeout,
            ResetCause::Other => &self.counters.resets_other,
            ResetCause::Device => &self.counters.resets_device,
        };
        counter.fetch_add(1, Relaxed);
        self.trace.queue_reset(why);
    }

    /// The queue found its engine aborted (the directions' state and cause registers).
    pub(crate) fn engine_abort(&self, m2s: (u32, u32), s2m: (u32, u32)) {
        self.counters.engine_aborts.fetch_add(1, Relaxed);
        self.trace.engine_abort(m2s, s2m);
    }
}

impl Drop for QueueObs {
    /// An instance dropped without [`QueueObs::release`] (its creation failed after the
    /// counting) gives its ring memory back to the gauges.
    fn drop(&mut self) {
        let (host, device) = self.ring_bytes;
        self.counters.ring_host_bytes.fetch_sub(host, Relaxed);
        self.counters.ring_device_bytes.fetch_sub(device, Relaxed);
    }
}
