// SPDX-License-Identifier: GPL-2.0

//! `MEMCPY` and `MEMSET` of an open file: one call at a time per file on the driver's shared
//! H2T queue (`h2t.rs`), bounded by the call's timeout; a call that ends early leaves its
//! submission to the orphans (`orphan.rs`), which hold its buffers until the engine is done.

use super::{reserved_zero, timeout, OpenFile};
use crate::{channel::Job, kfac::sched, orphan::Hold, span::Span, uapi};
use kernel::{prelude::*, sync::atomic::Relaxed, time::Delta};

impl OpenFile {
    /// Waits for this file's slot on the shared H2T queue: one `MEMCPY` or `MEMSET` of a file
    /// at a time (the wait counts against `limit` from `start` and ends on SIGKILL).
    fn h2t_slot(
        &self,
        start: kernel::time::Instant<kernel::time::Monotonic>,
        limit: Delta,
    ) -> Result<kernel::sync::MutexGuard<'_, ()>> {
        loop {
            if let Some(g) = self.memcpy_slot.try_lock() {
                return Ok(g);
            }
            if start.elapsed() >= limit {
                return Err(ETIMEDOUT);
            }
            if sched::fatal_signal_pending() {
                return Err(EINTR);
            }
            kernel::time::delay::fsleep(Delta::from_micros(200));
        }
    }

    /// Runs `job` for this file on the shared H2T queue with what is left of `limit` since
    /// `start` (`hold` kept until the engine is done with it), and counts its bytes: the end
    /// of a `MEMCPY` or `MEMSET`, which holds the file's slot ([`Self::h2t_slot`]).
    fn h2t_run(
        &self,
        job: Job<'_>,
        hold: Hold,
        start: kernel::time::Instant<kernel::time::Monotonic>,
        limit: Delta,
    ) -> Result {
        let size = job.size;
        let left = limit - start.elapsed();
        self.dev
            .h2t()?
            .copy_for_file(&self.dev.pool, self.id, job, left, hold)?;
        self.copy_bytes.fetch_add(size, Relaxed);
        self.dev.counters.add_copies(1, size);
        Ok(())
    }

    /// `MEMCPY`: copies a range of one buffer of this file to another through the engine and
    /// waits for it, bounded by `timeout_ms` (the wait for the file's slot included).
    pub(super) fn memcpy(&self, m: &uapi::neuron_udma_memcpy) -> Result {
        reserved_zero(&[u64::from(m.reserved)])?;
        if m.size == 0 {
            return Err(EINVAL);
        }
        let limit = timeout(m.timeout_ms);
        let start = kernel::time::Instant::<kernel::time::Monotonic>::now();
        let _slot = self.h2t_slot(start, limit)?;
        let (s, d) = (self.buffer(m.src_handle)?, self.buffer(m.dst_handle)?);
        let route = self.dev.arch.host_route;
        let job = Job {
            src: s.span(route, m.src_offset, m.size)?,
            dst: d.span(route, m.dst_offset, m.size)?,
            size: m.size,
        };
        d.check_writable()?;
        // `MEM_FREE` refuses buffers in use until the engine is done with them.
        let hold = Hold::Buffers([s.busy()?, d.busy()?]);
        self.h2t_run(job, hold, start, limit)
    }

    /// `MEMSET`: fills a range of a buffer of this file with one byte value through the
    /// engine, as `MEMCPY` copies (the same queue, slot, timeout and orphan rules), reading the
    /// device's block of that value ([`Patterns`](crate::pattern::Patterns)).
    pub(super) fn memset(&self, m: &uapi::neuron_udma_memset) -> Result {
        let value = u8::try_from(m.value).map_err(|_| EINVAL)?;
        if m.size == 0 {
            return Err(EINVAL);
        }
        let limit = timeout(m.timeout_ms);
        let start = kernel::time::Instant::<kernel::time::Monotonic>::now();
        let _slot = self.h2t_slot(start, limit)?;
        let d = self.buffer(m.handle)?;
        let pattern = self.dev.patterns.get(value)?;
        let job = Job {
            src: Span::Repeat(pattern.addr()),
            dst: d.span(self.dev.arch.host_route, m.offset, m.size)?,
            size: m.size,
        };
        d.check_writable()?;
        let hold = Hold::Fill(d.busy()?, pattern);
        self.h2t_run(job, hold, start, limit)
    }
}
