// SPDX-License-Identifier: GPL-2.0

//! The driver's tracepoints (system `neuron_udma`, defined in `rust/kfac/trace_internal.h`):
//! Rust cannot define or fire a `TRACE_EVENT`, so `rust/kfac/trace.c` instantiates them and
//! wraps each in a function; this module calls those with the driver's types. A disabled event
//! costs the call and a static branch. Documentation/neuron-udma.rst lists the events, their
//! fields and an example.

use kernel::{device::Device, error::Error, pci, prelude::*, str::CStrExt, sync::aref::ARef};

super::generated! { include!("trace_generated.rs"); }

/// Where a queue's events come from: its device, engine, queue and instance (never reused, unlike
/// the engine and queue numbers).
#[derive(Clone)]
pub(crate) struct QueueTrace {
    dev: ARef<pci::Device>,
    engine: u32,
    queue: u32,
    instance: u64,
}

fn raw(dev: &pci::Device) -> *const kernel::bindings::device {
    let d: &Device = dev.as_ref();
    super::raw_device(d).cast_const()
}

impl QueueTrace {
    /// The events of queue `queue` of engine `engine`, instance `instance`, of `dev`.
    pub(crate) fn new(dev: ARef<pci::Device>, engine: u32, queue: u32, instance: u64) -> Self {
        Self {
            dev,
            engine,
            queue,
            instance,
        }
    }

    fn args(&self) -> (*const kernel::bindings::device, u32, u32, u64) {
        (raw(&self.dev), self.engine, self.queue, self.instance)
    }

    /// `neuron_udma_queue_init`: rings of `tx`/`rx` descriptors (in device memory if
    /// `device_rings`) for the open file `owner` (0: the driver).
    pub(crate) fn queue_init(&self, (tx, rx): (u32, u32), device_rings: bool, owner: u64) {
        let (d, e, q, i) = self.args();
        // SAFETY: `d` is the live device of `self.dev`; the call only reads it.
        unsafe { ffi::neuron_udma_trace_queue_init(d, e, q, i, tx, rx, device_rings, owner) }
    }

    /// `neuron_udma_queue_release`: the instance ended; its next one numbers fences from
    /// `next_fence`.
    pub(crate) fn queue_release(&self, next_fence: u64) {
        let (d, e, q, i) = self.args();
        // SAFETY: as in `queue_init`.
        unsafe { ffi::neuron_udma_trace_queue_release(d, e, q, i, next_fence) }
    }

    /// Whether `neuron_udma_submit` is enabled (its byte count costs a pass over the copies).
    pub(crate) fn submit_enabled() -> bool {
        // SAFETY: reads a static key.
        unsafe { ffi::neuron_udma_trace_submit_enabled() }
    }

    /// `neuron_udma_submit`: `pairs` descriptor pairs of `bytes` bytes written to the rings.
    pub(crate) fn submit(&self, pairs: u32, bytes: u64) {
        let (d, e, q, i) = self.args();
        // SAFETY: as in `queue_init`.
        unsafe { ffi::neuron_udma_trace_submit(d, e, q, i, pairs, bytes) }
    }

    /// `neuron_udma_fence`: fence `fence` appended after the work before it.
    pub(crate) fn fence(&self, fence: u64) {
        let (d, e, q, i) = self.args();
        // SAFETY: as in `queue_init`.
        unsafe { ffi::neuron_udma_trace_fence(d, e, q, i, fence) }
    }

    /// `neuron_udma_doorbell`: TDRTP_inc += `tx`, RDRTP_inc += `rx` (descriptors).
    pub(crate) fn doorbell(&self, tx: u32, rx: u32) {
        let (d, e, q, i) = self.args();
        // SAFETY: as in `queue_init`.
        unsafe { ffi::neuron_udma_trace_doorbell(d, e, q, i, tx, rx) }
    }

    /// `neuron_udma_fence_done`: fences up to `fence` retired, `fences` of them.
    pub(crate) fn fence_done(&self, fence: u64, fences: u32) {
        let (d, e, q, i) = self.args();
        // SAFETY: as in `queue_init`.
        unsafe { ffi::neuron_udma_trace_fence_done(d, e, q, i, fence, fences) }
    }

    /// `neuron_udma_fence_failed`: fences `first..=last` failed with `why`.
    pub(crate) fn fence_failed(&self, first: u64, last: u64, why: Error) {
        let (d, e, q, i) = self.args();
        // SAFETY: as in `queue_init`.
        unsafe { ffi::neuron_udma_trace_fence_failed(d, e, q, i, first, last, why.to_errno()) }
    }

    /// `neuron_udma_engine_abort`: the queue found its engine aborted; the directions' `state`
    /// and error-cause registers (hardware.rst §3.5), `(state, cause)` each.
    pub(crate) fn engine_abort(&self, m2s: (u32, u32), s2m: (u32, u32)) {
        let (d, e, q, _) = self.args();
        // SAFETY: as in `queue_init`.
        unsafe { ffi::neuron_udma_trace_engine_abort(d, e, q, m2s.0, m2s.1, s2m.0, s2m.1) }
    }

    /// `neuron_udma_queue_reset`: the queue was reset; `cause` is the errno its dropped fences
    /// report (`EIO`: an engine error or a revoked import's drain, `ETIMEDOUT`: a timeout or
    /// stall, `ECANCELED`: a dmaengine client's terminate).
    pub(crate) fn queue_reset(&self, cause: Error) {
        let (d, e, q, i) = self.args();
        // SAFETY: as in `queue_init`.
        unsafe { ffi::neuron_udma_trace_queue_reset(d, e, q, i, cause.to_errno()) }
    }
}

/// What happened to a buffer ([`buffer`]).
#[derive(Clone, Copy)]
pub(crate) enum BufferEvent {
    /// `neuron_udma_buffer_alloc` (`MEM_ALLOC`).
    Alloc = 0,
    /// `neuron_udma_buffer_import` (`MEM_IMPORT`, `DMABUF_IMPORT`).
    Import = 1,
    /// `neuron_udma_buffer_free` (`MEM_FREE`, the owner's release, unbind).
    Free = 2,
    /// `neuron_udma_dmabuf_export` (`DMABUF_EXPORT`).
    Export = 3,
}

/// A buffer event of `dev`: buffer `handle` of `size` bytes of the open file `owner`; `kind`
/// `host`, `device`, `pages` (`MEM_IMPORT`) or `dmabuf` (`DMABUF_IMPORT`).
pub(crate) fn buffer(
    dev: &pci::Device,
    what: BufferEvent,
    (handle, size): (u64, u64),
    kind: &'static CStr,
    owner: u64,
) {
    // CAST: the enum's discriminants are 0..=3 (`rust/kfac/trace.c` switches on them).
    let what = what as u32;
    // SAFETY: `dev` is borrowed for the call, `kind` is a NUL-terminated static string.
    unsafe {
        ffi::neuron_udma_trace_buffer(raw(dev), what, handle, size, kind.as_char_ptr(), owner)
    }
}

/// `neuron_udma_scrub`: `size` bytes of device memory at `addr` zeroed by `engines` H2T engines
/// before their reuse; `result` its outcome.
pub(crate) fn scrub(dev: &pci::Device, addr: u64, size: u64, engines: u32, result: &Result) {
    let error = match result {
        Ok(()) => 0,
        Err(e) => e.to_errno(),
    };
    // SAFETY: `dev` is borrowed for the call, which only reads it.
    unsafe { ffi::neuron_udma_trace_scrub(raw(dev), addr, size, engines, error) }
}

/// `neuron_udma_device_reset`: the device stopped its `queues` queues in use for `what`
/// (`reset`, `error`, `shutdown`), or restarted them (`restart`) with outcome `result`.
pub(crate) fn device_reset(dev: &pci::Device, what: &CStr, queues: u32, result: &Result) {
    let error = match result {
        Ok(()) => 0,
        Err(e) => e.to_errno(),
    };
    // SAFETY: `dev` and `what` are borrowed for the call, which only reads them.
    unsafe { ffi::neuron_udma_trace_device_reset(raw(dev), what.as_char_ptr(), queues, error) }
}
