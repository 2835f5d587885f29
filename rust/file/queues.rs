// SPDX-License-Identifier: GPL-2.0

//! The queue commands of an open file: `QUEUE_INIT`, `QUEUE_RELEASE`, `QUEUE_STATE`, the copy
//! commands (`COPY_PREPARE_ONE`, `COPY_PREPARE`, `COPY_START`, `COPY_WAIT`, `COPY_SUBMIT`) and
//! the fence commands (`FENCE_STATUS`, `FENCE_WAIT`).
//!
//! Each names its queue by engine and index and finds it among the file's own
//! ([`OpenFile::queue`]); what it does to the queue is a [`Channel`] method.

use super::{reserved_zero, timeout, OpenFile, MAX_BATCH};
use crate::{
    batch::{Batch, Copies},
    buffer::Buffer,
    channel::{Channel, Owner, QueueId, Wait, NONBLOCK_SPIN},
    completion::Completer,
    fence, uapi,
};
use core::mem::MaybeUninit;
use kernel::{
    prelude::*,
    sync::{atomic::Relaxed, Arc},
    uaccess::{UserPtr, UserSlice, UserSliceReader},
};

/// Batches of copies up to this many entries are read without a heap allocation
/// ([`with_user_copies`]).
const INLINE_BATCH: usize = 16;

/// Checks at build time that `T` is valid for any bit pattern.
const fn from_bytes<T: kernel::transmute::FromBytes>() {}
// `with_user_copies` reads the entries as bytes into uninitialised memory.
const _: () = from_bytes::<uapi::neuron_udma_copy>();

impl OpenFile {
    /// `QUEUE_INIT`: takes queue `engine`/`queue` of the device for this file, its rings in host
    /// memory or (`NEURON_UDMA_QUEUE_DEVICE_RINGS`) device memory; its fences continue the
    /// numbers of the id's earlier instances in this file.
    pub(super) fn queue_init(&self, q: &uapi::neuron_udma_queue_init) -> Result {
        let device_rings = q.flags & uapi::NEURON_UDMA_QUEUE_DEVICE_RINGS != 0;
        reserved_zero(&[
            u64::from(q.flags & !uapi::NEURON_UDMA_QUEUE_DEVICE_RINGS),
            u64::from(q.reserved0),
            q.reserved[0],
            q.reserved[1],
        ])?;
        let id = QueueId::new(self.dev.arch, q.engine, q.queue).ok_or(EINVAL)?;
        // Rings in host memory: only an engine with host connectivity can fetch them
        // (hardware.rst §2.5). EOPNOTSUPP, not EINVAL: the engine exists, it just cannot serve
        // such a queue (with DEVICE_RINGS it can, when the device has device memory).
        if self.dev.is_alive() && !device_rings && !self.dev.arch.has_host_connectivity(q.engine) {
            pr_debug!(
                "queue {}/{}: engine {} cannot reach host memory\n",
                q.engine,
                q.queue,
                q.engine
            );
            return Err(EOPNOTSUPP);
        }
        let mut st = self.st.lock();
        st.queues.reserve(1, GFP_KERNEL_ACCOUNT)?;
        st.add_next_fence(id)?;
        let first_fence = st.first_fence(id);
        self.dev.queue_init_placed(
            id,
            (q.tx_descs, q.rx_descs),
            Owner::File(self.id),
            Some(self.events.clone()),
            device_rings,
            first_fence,
        )?;
        // Cannot fail: capacity was reserved.
        let _ = st.queues.push_within_capacity(id);
        Ok(())
    }

    /// `QUEUE_RELEASE`: pauses and frees the file's queue, remembering its fence counts
    /// (fdinfo) and the fence number its next instance starts from.
    pub(super) fn queue_release(&self, q: &uapi::neuron_udma_queue_id) -> Result {
        reserved_zero(&[q.reserved])?;
        let id = QueueId::new(self.dev.arch, q.engine, q.queue).ok_or(ENOENT)?;
        let mut st = self.st.lock();
        let idx = st.queues.iter().position(|&x| x == id).ok_or(ENOENT)?;
        if let Ok(chan) = self.dev.queue(Owner::File(self.id), id) {
            let (done, failed) = chan.fence_counts();
            self.released_fences[0].fetch_add(done, Relaxed);
            self.released_fences[1].fetch_add(failed, Relaxed);
        }
        let next = self.dev.queue_release(Owner::File(self.id), id)?;
        st.queues.remove(idx).map_err(|_| ENOENT)?;
        st.set_next_fence(id, next);
        Ok(())
    }

    /// `QUEUE_STATE`: the registers, software ring state and engine state of the queue.
    pub(super) fn queue_state(&self, s: &mut uapi::neuron_udma_queue_state) -> Result {
        reserved_zero(&[u64::from(s.reserved)])?;
        *s = queue_state(&*self.queue(s.engine, s.queue)?)?;
        Ok(())
    }

    /// Validates and translates `copies` into one submission and writes it to queue
    /// `eng`/`qid`, all or nothing. Returns the pairs written when a copy has
    /// `NEURON_UDMA_COPY_SPLIT`, else 0 (ABI 1).
    pub(super) fn prepare(
        &self,
        eng: u32,
        qid: u32,
        copies: &[uapi::neuron_udma_copy],
    ) -> Result<isize> {
        let chan = self.queue(eng, qid)?;
        self.prepare_on(&chan, copies, None, None).map(|(r, _)| r)
    }

    /// [`Self::prepare`] on the queue instance `chan`, and with `fenced` (`Some`, how to wait
    /// for the queue lock) a fence after the pairs under the same queue lock
    /// ([`Channel::prepare_fenced`]), returned second (0 without). `fixed` is the buffer the
    /// copies may name as `NEURON_UDMA_FIXED_BUFFER` (an io_uring command's registered buffer
    /// range), held with the copies' other buffers.
    ///
    /// In one pass when it can ([`Channel::prepare_in_line`]: every copy names buffers
    /// resident on the queue, and no registered range), else in two (the copies translated
    /// into an array of pairs, then written): the same answer either way.
    pub(super) fn prepare_on(
        &self,
        chan: &Channel,
        copies: &[uapi::neuron_udma_copy],
        fenced: Option<Wait>,
        fixed: Option<Arc<Buffer>>,
    ) -> Result<(isize, u64)> {
        let mut batch = Batch::new();
        if let Some(buf) = fixed {
            batch.hold_fixed(buf)?;
        }
        let route = self.dev.arch.host_route;
        // One hold of the queue's resident lock for all the copies' buffers, until the
        // submission is written or failed (io_uring's non-blocking issue waits for it as for
        // the queue lock).
        let spin = matches!(fenced, Some(Wait::Never)).then_some(NONBLOCK_SPIN);
        let mut res = chan
            .resident()?
            .begin(&self.dev.pool, self.id, route, spin)?;
        let in_line = if batch.has_fixed() {
            None
        } else {
            let r = chan.prepare_in_line(fenced, copies.len(), |ahead| {
                // A pair per copy: more copies than free pairs go the two-pass way, which
                // answers ENOSPC after the checks of every copy.
                if copies.len() > ahead.room() as usize
                    || !batch.add_all_in_line(&mut res, copies, ahead)?
                {
                    return Ok(None);
                }
                Ok(Some((batch.take_holds(&mut res)?, batch.bytes)))
            })?;
            if r.is_none() {
                // From the start, with the same session: its stamps are the call's already.
                batch = Batch::new();
            }
            r
        };
        let (seq, pairs) = match in_line {
            Some(done) => done,
            None => {
                let mut out = Copies::new(copies.len())?;
                batch.add_all(&mut res, route, copies, &mut out)?;
                let holds = batch.take_holds(&mut res)?;
                let seq = if let Some(wait) = fenced {
                    chan.prepare_fenced(out.as_slice(), batch.largest, holds, wait)?
                } else {
                    chan.prepare(out.as_slice(), batch.largest, holds)?;
                    0
                };
                (seq, out.pairs())
            }
        };
        // Written: the buffers stay stamped as used until the submission is done (an early
        // return above drops the session unwritten, which puts the stamps back).
        res.written();
        self.copy_bytes.fetch_add(batch.bytes, Relaxed);
        self.dev
            .counters
            .add_copies(copies.len() as u64, batch.bytes);
        Ok((split_result(batch.flags, pairs), seq))
    }

    /// `COPY_PREPARE`: [`Self::prepare`] of the `count` copies at user address `copies`.
    pub(super) fn copy_prepare(&self, p: &uapi::neuron_udma_copy_prepare) -> Result<isize> {
        reserved_zero(&[u64::from(p.reserved)])?;
        with_user_copies(p.copies, p.count, |staged| {
            self.prepare(p.engine, p.queue, staged)
        })
    }

    /// `COPY_START`: rings the doorbells for `m2s_count` Tx and `s2m_count` Rx prepared
    /// descriptors of the queue.
    pub(super) fn copy_start(&self, s: &uapi::neuron_udma_copy_start) -> Result {
        reserved_zero(&[s.reserved])?;
        self.queue(s.engine, s.queue)?
            .start(s.m2s_count, s.s2m_count)
    }

    /// `COPY_WAIT`: waits until everything prepared or started on the queue is done
    /// ([`Channel::wait_all`]); the Tx descriptors it completed go out.
    pub(super) fn copy_wait(&self, w: &mut uapi::neuron_udma_copy_wait) -> Result {
        reserved_zero(&[u64::from(w.reserved)])?;
        let chan = self.queue(w.engine, w.queue)?;
        let r = chan.wait_all(timeout(w.timeout_ms));
        // The wait's own fence settles without the completion engine: the queue's listeners
        // (pollers, the eventfd) hear of it from here, as of fences of COPY_SUBMIT.
        Completer::look_then_watch(&self.dev.completer, &chan);
        w.completed = r?;
        Ok(())
    }

    /// `COPY_SUBMIT`: the new fence (or the newest one); listeners watch it from now on.
    pub(super) fn copy_submit(&self, c: &mut uapi::neuron_udma_copy_submit) -> Result {
        reserved_zero(&[u64::from(c.flags), u64::from(c.reserved)])?;
        let chan = self.queue(c.engine, c.queue)?;
        c.fence = chan.submit_fence()?;
        Completer::look_then_watch(&self.dev.completer, &chan);
        Ok(())
    }

    /// `FENCE_STATUS`: the state of fence `fence` (and why it failed), the newest fence known
    /// done and the newest fence.
    pub(super) fn fence_status(&self, f: &mut uapi::neuron_udma_fence_status) -> Result {
        let chan = self.queue(f.engine, f.queue)?;
        let (state, done, newest) = chan.fence_state(f.fence)?;
        let (state, error) = fence::status(state);
        f.state = state;
        f.error = error;
        f.completed = done;
        f.submitted = newest;
        Ok(())
    }

    /// `FENCE_WAIT`: waits for fence `fence`, bounded by `timeout_ms`. The wait changes
    /// nothing, so an interruption that runs no signal handler (io_uring's task work, as when
    /// its workers start: udma-fuzz.rst) restarts the call (`ERESTARTNOHAND`); a handler
    /// that ran makes it `EINTR`.
    pub(super) fn fence_wait(&self, w: &uapi::neuron_udma_fence_wait) -> Result {
        reserved_zero(&[u64::from(w.reserved)])?;
        let chan = self.queue(w.engine, w.queue)?;
        chan.wait_fence(w.fence, timeout(w.timeout_ms))
            .map_err(|e| if e == EINTR { ERESTARTNOHAND } else { e })
    }
}

/// Reads the `count` copies (1 to [`MAX_BATCH`]) at user address `copies` in one user copy and
/// runs `f` on them (`COPY_PREPARE`, io_uring's `URING_COPY`). Up to [`INLINE_BATCH`] are read
/// onto the stack: a heap array per call costs more than the descriptors themselves
/// (Documentation/benchmarks.rst); a larger array straight into the spare capacity of a heap
/// array sized by the batch, nothing written to it before the user copy. Called before any
/// lock: a page fault takes the mmap lock, which a fault on a buffer mapping holds while it
/// takes a buffer's lock.
///
/// # Errors
///
/// `EINVAL` (`count` 0 or above [`MAX_BATCH`]), `EFAULT` (the array not readable), `ENOMEM`;
/// else `f`'s result.
pub(super) fn with_user_copies<R>(
    copies: u64,
    count: u32,
    f: impl FnOnce(&[uapi::neuron_udma_copy]) -> Result<R>,
) -> Result<R> {
    if count == 0 || count > MAX_BATCH {
        return Err(EINVAL);
    }
    let entry = core::mem::size_of::<uapi::neuron_udma_copy>();
    // CAST: `count` is at most MAX_BATCH.
    let count = count as usize;
    // CAST: a user address.
    let mut reader = UserSlice::new(UserPtr::from_addr(copies as usize), entry * count).reader();
    if count <= INLINE_BATCH {
        // Not cleared first: the user copy writes every entry used (or the call fails).
        let mut inline = [const { MaybeUninit::<uapi::neuron_udma_copy>::uninit() }; INLINE_BATCH];
        return f(read_into(&mut reader, &mut inline[..count])?);
    }
    let mut heap = KVVec::<uapi::neuron_udma_copy>::with_capacity(count, GFP_KERNEL_ACCOUNT)?;
    // PANIC: the capacity is at least `count`.
    read_into(&mut reader, &mut heap.spare_capacity_mut()[..count])?;
    // SAFETY: `read_into` succeeded, so the first `count` elements are initialised.
    unsafe { heap.inc_len(count) };
    f(&heap)
}

/// Fills `spare` with entries read from `reader` and returns them.
///
/// # Errors
///
/// `EFAULT` (the user array not readable); `spare` may then be partly written.
fn read_into<'a>(
    reader: &mut UserSliceReader,
    spare: &'a mut [MaybeUninit<uapi::neuron_udma_copy>],
) -> Result<&'a [uapi::neuron_udma_copy]> {
    let len = core::mem::size_of_val(spare);
    // SAFETY: `MaybeUninit<T>` has the size and alignment of `T`, so `spare` is `len` bytes;
    // the bytes are only written through this slice.
    let bytes = unsafe { core::slice::from_raw_parts_mut(spare.as_mut_ptr().cast(), len) };
    reader.read_raw(bytes)?;
    // SAFETY: `read_raw` succeeded, and after a successful call every byte of its buffer is
    // initialised (its documented guarantee), so is every element; any bit pattern is a valid
    // `neuron_udma_copy` (`FromBytes`); `MaybeUninit<T>` has the layout of `T`.
    Ok(unsafe { &*(core::ptr::from_mut(spare) as *const [uapi::neuron_udma_copy]) })
}

/// The result of a prepare ioctl whose copies had `flags` (OR-ed) and took `pairs` descriptor
/// pairs: the count with `NEURON_UDMA_COPY_SPLIT`, else 0 as in ABI 1.
fn split_result(flags: u32, pairs: u32) -> isize {
    if flags & uapi::NEURON_UDMA_COPY_SPLIT != 0 {
        // CAST: at most MAX_BATCH * 33.
        pairs as isize
    } else {
        0
    }
}

/// The `QUEUE_STATE` result of `chan`: its registers, software ring state and engine state.
fn queue_state(chan: &Channel) -> Result<uapi::neuron_udma_queue_state> {
    let snap = chan.snapshot()?;
    let ring = |i: usize, pending: u32| {
        let (regs, sw) = (&snap.regs[i], &snap.sw[i]);
        uapi::neuron_udma_ring_state {
            hw_cfg: regs.cfg,
            hw_status: regs.status,
            hw_len: regs.len,
            hw_head: regs.head,
            hw_tail: regs.tail,
            hw_comp_head: regs.comp_head,
            sw_next: sw.next_index(),
            sw_ack: sw.ack_index(),
            sw_ring_id: sw.ring_id().bits().get(),
            sw_available: sw.available(),
            sw_pending: pending,
            size: sw.size().descs(),
        }
    };
    let e = &snap.errors;
    Ok(uapi::neuron_udma_queue_state {
        engine: chan.id.eng.get(),
        queue: chan.id.q.number(),
        m2s_engine_state: e.m2s.state,
        s2m_engine_state: e.s2m.state,
        m2s_error_cause: e.m2s.cause,
        s2m_error_cause: e.s2m.cause,
        resets: snap.resets,
        reserved: 0,
        tx: ring(0, snap.pending.0),
        rx: ring(1, snap.pending.1),
    })
}
