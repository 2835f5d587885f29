// SPDX-License-Identifier: GPL-2.0

//! The character device `/dev/neuron_udmaN` and its ioctl ABI (`include/uapi/linux/neuron_udma.h`).
//!
//! Every open file owns the buffers and queues it creates; nothing of another file is reachable
//! through it (unknown handles and other files' queues are `ENOENT`). Each ioctl validates all
//! of its input before it changes anything, so a bad argument leaves every ring, buffer and
//! queue as it was. Closing the file (also by a killed process) releases everything it owns.

use crate::{
    channel::{Channel, Owner, DEFAULT_TIMEOUT, MIN_TIMEOUT_MS},
    desc::{Barrier, DescLen, MAX_DESC_BYTES},
    device::UdmaDevice,
    engine::{self, QueueRegs},
    mem::{self, Buffer, InFlight, MAX_HOST_BUFFER, MAX_IMPORT_SIZE},
    queue::{Copy, PairRefs, Queue},
    regs::{M2s, S2m},
    ring::{RingState, MAX_DESCS, MIN_DESCS, RESERVE},
    shim::{self, MappedFile},
    span::Pieces,
    uapi, Registry,
};
use kernel::{
    fs::{file::flags, File},
    miscdevice::{MiscDevice, MiscDeviceRegistration},
    mm::virt::VmaNew,
    new_mutex,
    prelude::*,
    sync::{
        atomic::{Atomic, Relaxed},
        Arc, Mutex,
    },
    time::Delta,
    transmute::AsBytes,
    uaccess::{UserPtr, UserSlice, UserSliceReader},
};

/// Most entries of one `COPY_PREPARE` (twice the reference's 2032-pair submission).
pub(crate) const MAX_BATCH: u32 = 4096;
/// `COPY_PREPARE` batches up to this many entries are staged without a heap allocation.
const INLINE_BATCH: usize = 16;

/// Source of unique open-file ids (queue ownership).
static NEXT_FILE_ID: Atomic<u64> = Atomic::new(1);
/// Source of buffer handles: unique across files and never reused, so that a stale or foreign
/// handle can never name another buffer.
static NEXT_HANDLE: Atomic<u64> = Atomic::new(1);

/// What the file owns, by id: the device's queue table and buffer pool hold the objects
/// (and know their owner).
struct FileState {
    /// Handles of the file's buffers (a vmalloc-backed array: no limit from the slab's largest
    /// block).
    handles: KVVec<u64>,
    /// `(engine, queue)` of the file's queues.
    queues: KVec<(u32, u32)>,
}

/// Per-open-file state.
#[pin_data(PinnedDrop)]
pub(crate) struct OpenFile {
    dev: Arc<UdmaDevice>,
    id: u64,
    /// The `struct file`, for the buffers' user mappings (open while this value lives).
    file: MappedFile,
    /// The ids of what the file owns; held while they change. Copies are prepared without it:
    /// a buffer is kept from being freed between its lookup and its use by the handshake of
    /// `mem::InFlight::new` and `MEM_FREE` (so threads on different queues do not serialise).
    #[pin]
    st: Mutex<FileState>,
    /// Held by the file's running `MEMCPY`: one at a time per file, so that threads cannot
    /// get around the one-unfinished-copy-per-file rule of the shared queue.
    #[pin]
    memcpy_slot: Mutex<()>,
}

#[pinned_drop]
impl PinnedDrop for OpenFile {
    fn drop(self: Pin<&mut Self>) {
        // Queues first: once paused, no engine touches the buffers. A buffer that a MEMCPY of
        // this file that returned early (SIGKILL, timeout) still uses is freed by the device
        // when the engine is done with it. No mapping of the buffers
        // exists any more: each one holds a reference to this file. The lists are taken out of
        // the file lock first: freeing a host buffer gives back its memory charge, which takes
        // the mmap lock, and mmap() takes the file lock under it.
        let (queues, handles) = {
            let mut st = self.st.lock();
            (
                core::mem::take(&mut st.queues),
                core::mem::replace(&mut st.handles, KVVec::new()),
            )
        };
        self.dev.release_file(self.id, &queues, &handles);
        // What an abandoned MEMCPY of this file still holds comes back when the engine is done.
        UdmaDevice::reap_later(&self.dev);
    }
}

fn reserved_zero(fields: &[u64]) -> Result {
    if fields.iter().any(|&f| f != 0) {
        return Err(EINVAL);
    }
    Ok(())
}

/// Which limit of hardware.rst §4.8 a ring size breaks, if any.
fn ring_size_problem(descs: u32) -> Option<&'static str> {
    if !descs.is_power_of_two() {
        Some("not a power of two")
    } else if descs < MIN_DESCS {
        Some("below the minimum of 32")
    } else if descs > MAX_DESCS {
        Some("above the maximum of 2^23")
    } else {
        None
    }
}

/// The wait bound of a `timeout_ms` field: 0 for the default, otherwise at least
/// [`MIN_TIMEOUT_MS`].
fn timeout(ms: u32) -> Delta {
    if ms == 0 {
        DEFAULT_TIMEOUT
    } else {
        Delta::from_millis(i64::from(ms.max(MIN_TIMEOUT_MS)))
    }
}

fn ring_state(regs: &QueueRegs, sw: &RingState, pending: u32) -> uapi::neuron_udma_ring_state {
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
}

/// The buffers one `COPY_PREPARE` has looked up, with the device-fabric address of their byte
/// 0: a batch that names the same few buffers again and again looks each up in the device's
/// table (a lock shared by every file) and reads its address once, not twice per entry.
///
/// A cached address stays valid for the whole call: the entry that cached it holds a reference
/// on the buffer from then on (so `MEM_FREE` is `EBUSY`), and an unbind in between pauses the
/// queue before any memory is freed (the prepare then fails with `ENODEV`).
#[derive(Default)]
struct Lookups {
    seen: [Option<(u64, Arc<Buffer>, u64)>; LOOKUPS],
    next: usize,
}

/// Buffers [`Lookups`] remembers (a copy names two; a few more cover gather/scatter batches).
const LOOKUPS: usize = 4;

impl Lookups {
    /// Buffer `handle` of `file` and its [`Buffer::base`], after checking that bytes
    /// `[offset, offset + len)` lie inside it.
    ///
    /// # Errors
    ///
    /// `ENOENT` for an unknown handle, `ERANGE` for a range outside the buffer, `ENODEV` if it
    /// was freed by an unbind.
    fn lookup(
        &mut self,
        file: &OpenFile,
        handle: u64,
        offset: u64,
        len: u32,
    ) -> Result<(Arc<Buffer>, u64)> {
        let hit = self.seen.iter().flatten().find(|(h, _, _)| *h == handle);
        let (buf, base) = match hit {
            Some((_, b, base)) => (b.clone(), *base),
            None => {
                let b = file.buffer(handle)?;
                let base = b.base(file.dev.arch.host_route)?;
                self.seen[self.next] = Some((handle, b.clone(), base));
                self.next = (self.next + 1) % LOOKUPS;
                (b, base)
            }
        };
        buf.check_range(offset, u64::from(len))?;
        Ok((buf, base))
    }
}

/// The descriptor pairs of one copy: one, or one per piece when it crosses runs of an imported
/// buffer (`NEURON_UDMA_COPY_SPLIT`).
enum Pairs {
    One(Copy, PairRefs),
    Split(KVec<(Copy, PairRefs)>),
}

impl Pairs {
    /// Number of descriptor pairs.
    fn count(&self) -> u32 {
        match self {
            Pairs::One(..) => 1,
            // CAST: at most 2 * 16 + 1 pieces (a 64 KiB range touches at most 17 pages).
            Pairs::Split(v) => v.len() as u32,
        }
    }
}

impl OpenFile {
    /// Buffer `handle` of this file.
    fn buffer(&self, handle: u64) -> Result<Arc<Buffer>> {
        self.dev.pool.get(self.id, handle)
    }

    /// Queue `qid` of engine `eng` of this file.
    fn queue(&self, eng: u32, qid: u32) -> Result<Arc<Channel>> {
        self.dev.queue(Owner::File(self.id), eng, qid)
    }

    /// Validates one copy and translates it to descriptor pairs, looking its buffers up
    /// through `seen`: one pair, or with `NEURON_UDMA_COPY_SPLIT` one per piece of a copy that
    /// crosses runs of an imported buffer (each with the copy's barrier; `DST_INT` on the last).
    /// The returned references keep both buffers from being freed (`MEM_FREE` is `EBUSY`) until
    /// the pairs are consumed or dropped; a buffer whose `MEM_FREE` is under way is `ENOENT`.
    ///
    /// # Errors
    ///
    /// `EINVAL`, `ENOENT`, `ERANGE`, `ENODEV` (see the header), `EPERM` for a destination the
    /// engine may not write, `EXDEV` for a copy that needs several pairs without
    /// `NEURON_UDMA_COPY_SPLIT`, `ENOMEM`.
    fn translate(&self, seen: &mut Lookups, c: &uapi::neuron_udma_copy) -> Result<Pairs> {
        use uapi::{NEURON_UDMA_COPY_DST_INT as DST_INT, NEURON_UDMA_COPY_SPLIT as SPLIT};
        reserved_zero(&[u64::from(c.reserved)])?;
        if c.flags & !(DST_INT | SPLIT) != 0 {
            return Err(EINVAL);
        }
        // EINVAL for size 0 or above 64 KiB, before any lookup.
        DescLen::new(c.size)?;
        let barrier = Barrier::try_from(c.barrier)?;
        let (sb, sbase) = seen.lookup(self, c.src_handle, c.src_offset, c.size)?;
        let (db, dbase) = seen.lookup(self, c.dst_handle, c.dst_offset, c.size)?;
        db.check_writable()?;
        let (src, dst) = (
            sb.span_at(sbase, c.src_offset),
            db.span_at(dbase, c.dst_offset),
        );
        let set_dst_int = c.flags & DST_INT != 0;
        let mut pieces = Pieces::new(src, dst, u64::from(c.size), MAX_DESC_BYTES);
        // The pair of the next piece; its buffer references are taken once the copy is valid.
        let next = |pieces: &mut Pieces<'_>| -> Result<Copy> {
            // A span too short for the copy (the ranges were checked above).
            let (s, d, n) = pieces.next().ok_or(ERANGE)?;
            Ok(Copy {
                src: s,
                dst: d,
                len: DescLen::new(n)?,
                barrier,
                set_dst_int: set_dst_int && pieces.remaining() == 0,
            })
        };
        let refs =
            || -> Result<PairRefs> { Ok([Some(InFlight::new(&sb)?), Some(InFlight::new(&db)?)]) };
        // Within 64 KiB, copies between driver-allocated buffers are always one piece.
        let first = next(&mut pieces)?;
        if pieces.remaining() == 0 {
            return Ok(Pairs::One(first, refs()?));
        }
        if c.flags & SPLIT == 0 {
            return Err(EXDEV);
        }
        let mut v = KVec::new();
        v.push((first, refs()?), GFP_KERNEL)?;
        while pieces.remaining() != 0 {
            v.push((next(&mut pieces)?, refs()?), GFP_KERNEL)?;
        }
        Ok(Pairs::Split(v))
    }

    fn info(&self) -> Result<uapi::neuron_udma_info> {
        if !self.dev.is_alive() {
            return Err(ENODEV);
        }
        let arch = self.dev.arch;
        Ok(uapi::neuron_udma_info {
            abi_version: uapi::NEURON_UDMA_ABI_VERSION,
            generation: arch.uapi_generation(),
            vendor_id: crate::arch::PCI_VENDOR.as_raw(),
            device_id: arch.device_id,
            engines: arch.engines,
            queues_per_engine: crate::arch::QUEUES_PER_ENGINE,
            max_copy_size: crate::desc::MAX_DESC_BYTES,
            device_mem_size: self.dev.pool.dram_capacity(),
            min_ring_descs: MIN_DESCS,
            max_ring_descs: MAX_DESCS,
            ring_reserve_descs: RESERVE,
            max_batch: MAX_BATCH,
            max_host_buffer: MAX_HOST_BUFFER,
            host_engines: arch.host_engine_bitmap(),
            max_import_size: MAX_IMPORT_SIZE,
        })
    }

    /// Allocates the buffer of a `MEM_ALLOC` and fills in its result; the buffer is not in the
    /// file's table yet (see [`Self::mem_alloc_publish`]), so no other call can use it.
    fn mem_alloc(&self, a: &mut uapi::neuron_udma_mem_alloc) -> Result<Arc<Buffer>> {
        reserved_zero(&[a.reserved[0], a.reserved[1], u64::from(a.flags)])?;
        let host = match a.type_ {
            uapi::NEURON_UDMA_MEM_HOST => true,
            uapi::NEURON_UDMA_MEM_DEVICE => false,
            _ => return Err(EINVAL),
        };
        let handle = NEXT_HANDLE.fetch_add(1, Relaxed);
        // Outside the file lock: a device buffer is scrubbed by the engine first.
        let buf = self
            .dev
            .alloc_buffer(host, a.size, handle, self.id, self.file)?;
        a.handle = handle;
        a.mmap_offset = buf.mmap_offset;
        a.size = buf.size;
        Ok(buf)
    }

    /// Pins the memory of a `MEM_IMPORT` and fills in its result; like [`Self::mem_alloc`], the
    /// buffer joins the file only through [`Self::mem_alloc_publish`].
    fn mem_import(&self, a: &mut uapi::neuron_udma_mem_import) -> Result<Arc<Buffer>> {
        let write = a.flags & uapi::NEURON_UDMA_IMPORT_WRITE != 0;
        reserved_zero(&[
            a.reserved[0],
            a.reserved[1],
            u64::from(a.flags & !uapi::NEURON_UDMA_IMPORT_WRITE),
        ])?;
        let handle = NEXT_HANDLE.fetch_add(1, Relaxed);
        let buf = self
            .dev
            .import_buffer(a.addr, a.size, write, handle, self.id, self.file)?;
        a.handle = handle;
        a.segments = u32::try_from(buf.run_count()).unwrap_or(u32::MAX);
        Ok(buf)
    }

    /// Adds a buffer whose `MEM_ALLOC` (or `MEM_IMPORT`) result reached user space to the
    /// device's pool and the file, or frees it if `publish` is false (the copy-out failed: a
    /// failing call changes nothing).
    fn mem_alloc_publish(&self, buf: Arc<Buffer>, publish: bool) -> Result {
        if !publish {
            // Nothing references it: it was never in the pool.
            self.dev.pool.free(&buf);
            return Ok(());
        }
        let mut st = self.st.lock();
        if let Err(e) = st.handles.push(buf.handle, GFP_KERNEL) {
            drop(st);
            self.dev.pool.free(&buf);
            return Err(e.into());
        }
        if let Err(e) = self.dev.pool.insert(&buf) {
            // `insert` gave the memory back.
            st.handles.pop();
            return Err(e);
        }
        Ok(())
    }

    fn mem_free(&self, f: &uapi::neuron_udma_mem_free) -> Result {
        reserved_zero(&[f.reserved])?;
        // Buffers of an abandoned MEMCPY become free once the engine is done with them.
        self.dev.reap();
        let mut st = self.st.lock();
        let idx = st
            .handles
            .iter()
            .position(|&h| h == f.handle)
            .ok_or(ENOENT)?;
        // Retire what the engine has finished, then refuse while a prepared pair that the
        // engine has not consumed, or a running MEMCPY, references the buffer.
        for &(eng, qid) in st.queues.iter() {
            self.queue(eng, qid)?.with(|q, _| {
                q.retire();
                Ok(())
            })?;
        }
        self.dev.pool.free_handle(self.id, f.handle)?;
        st.handles.remove(idx).map_err(|_| ENOENT)?;
        Ok(())
    }

    fn queue_init(&self, q: &uapi::neuron_udma_queue_init) -> Result {
        reserved_zero(&[
            u64::from(q.flags),
            u64::from(q.reserved0),
            q.reserved[0],
            q.reserved[1],
        ])?;
        // The rings live in host memory, and so do host buffers: only an engine with host
        // connectivity can fetch or copy them (hardware.rst §2.5). EOPNOTSUPP, not EINVAL: the
        // engine exists, it just cannot serve a user queue.
        let arch = self.dev.arch;
        if self.dev.is_alive()
            && arch.engine_offset(q.engine).is_some()
            && !arch.has_host_connectivity(q.engine)
        {
            pr_debug!(
                "queue {}/{}: engine {} cannot reach host memory\n",
                q.engine,
                q.queue,
                q.engine
            );
            return Err(EOPNOTSUPP);
        }
        let mut st = self.st.lock();
        st.queues.reserve(1, GFP_KERNEL)?;
        self.dev
            .queue_init(
                q.engine,
                q.queue,
                q.tx_descs,
                q.rx_descs,
                Owner::File(self.id),
            )
            .inspect_err(|e| {
                // Say which ring-size limit was hit (hardware.rst §4.8); debug level, as user space
                // can trigger it at will.
                let bad = [("tx", q.tx_descs), ("rx", q.rx_descs)]
                    .into_iter()
                    .find_map(|(ring, n)| ring_size_problem(n).map(|why| (ring, n, why)));
                if let (true, Some((ring, n, why))) = (*e == EINVAL, bad) {
                    pr_debug!(
                        "queue {}/{}: {} ring of {} descriptors: {}\n",
                        q.engine,
                        q.queue,
                        ring,
                        n,
                        why
                    );
                }
            })?;
        // Cannot fail: capacity was reserved.
        let _ = st.queues.push_within_capacity((q.engine, q.queue));
        Ok(())
    }

    fn queue_release(&self, q: &uapi::neuron_udma_queue_id) -> Result {
        reserved_zero(&[q.reserved])?;
        let mut st = self.st.lock();
        let idx = st
            .queues
            .iter()
            .position(|&id| id == (q.engine, q.queue))
            .ok_or(ENOENT)?;
        self.dev
            .queue_release(Owner::File(self.id), q.engine, q.queue)?;
        st.queues.remove(idx).map_err(|_| ENOENT)?;
        Ok(())
    }

    /// Returns the pairs written when the copy has `NEURON_UDMA_COPY_SPLIT`, else 0 (ABI 1).
    fn copy_prepare_one(&self, p: &uapi::neuron_udma_copy_prepare_one) -> Result<isize> {
        let chan = self.queue(p.engine, p.queue)?;
        let pairs = self.translate(&mut Lookups::default(), &p.copy)?;
        let n = pairs.count();
        chan.with(|q, _| match pairs {
            Pairs::One(c, refs) => q.prepare_one_refs(&c, refs),
            Pairs::Split(v) => write_all(q, v, n, n),
        })?;
        Ok(split_result(p.copy.flags, n))
    }

    /// Returns the pairs written when an entry has `NEURON_UDMA_COPY_SPLIT`, else 0 (ABI 1).
    fn copy_prepare(&self, p: &uapi::neuron_udma_copy_prepare) -> Result<isize> {
        reserved_zero(&[u64::from(p.reserved)])?;
        if p.count == 0 || p.count > MAX_BATCH {
            return Err(EINVAL);
        }
        let entry = core::mem::size_of::<uapi::neuron_udma_copy>();
        // CAST: `copies` is a user address, `count` at most MAX_BATCH.
        let mut reader = UserSlice::new(
            UserPtr::from_addr(p.copies as usize),
            entry * p.count as usize,
        )
        .reader();
        // Small batches are staged on the stack: a heap array per call costs more than the
        // descriptors themselves (Documentation/benchmarks.rst).
        let count = p.count as usize;
        let unused = uapi::neuron_udma_copy::default();
        let mut inline = [unused; INLINE_BATCH];
        let mut heap = KVVec::new();
        let staged = if count <= INLINE_BATCH {
            &mut inline[..count]
        } else {
            heap.reserve(count, GFP_KERNEL)?;
            for _ in 0..count {
                heap.push(unused, GFP_KERNEL)?;
            }
            &mut heap[..]
        };
        // The whole array in one user copy, before any lock: a page fault takes the mmap lock,
        // which a fault on a buffer mapping holds while it takes a buffer's lock.
        reader.read_slice(staged.as_bytes_mut())?;
        let chan = self.queue(p.engine, p.queue)?;
        let mut copies = KVVec::with_capacity(count, GFP_KERNEL)?;
        let mut seen = Lookups::default();
        let mut flags = 0;
        let mut largest = 1;
        for raw in staged.iter() {
            match self.translate(&mut seen, raw)? {
                Pairs::One(c, refs) => copies.push((c, refs), GFP_KERNEL)?,
                Pairs::Split(v) => {
                    // CAST: at most 33 pairs.
                    largest = largest.max(v.len() as u32);
                    copies.reserve(v.len(), GFP_KERNEL)?;
                    for x in v {
                        copies.push(x, GFP_KERNEL)?;
                    }
                }
            }
            flags |= raw.flags;
        }
        // CAST: at most MAX_BATCH copies of at most 33 pairs each.
        let pairs = copies.len() as u32;
        chan.with(|q, _| write_all(q, copies.drain_all(), pairs, largest))?;
        Ok(split_result(flags, pairs))
    }

    fn copy_start(&self, s: &uapi::neuron_udma_copy_start) -> Result {
        reserved_zero(&[s.reserved])?;
        self.queue(s.engine, s.queue)?
            .with(|q, io| q.start(io, s.m2s_count, s.s2m_count))
    }

    fn copy_wait(&self, w: &mut uapi::neuron_udma_copy_wait) -> Result {
        reserved_zero(&[u64::from(w.reserved)])?;
        let chan = self.queue(w.engine, w.queue)?;
        let limit = timeout(w.timeout_ms);
        let start = kernel::time::Instant::<kernel::time::Monotonic>::now();
        let mut completed = 0u64;
        loop {
            // Retire what the engine finished first. Work that no fence covers gets a new
            // fence; with none, or no room for another marker, the wait is for the newest
            // fence in flight (interrupted waits leave their fences behind: they are reused,
            // not multiplied).
            let (seq, last, ack_before) = chan.with(|q, io| {
                q.retire();
                let ack = q.tx_state().ack_index();
                if q.unfenced() != 0 && q.can_fence() {
                    return Ok((Some(q.fence(io)?), true, ack));
                }
                match q.last_fence() {
                    Some(seq) => {
                        q.add_waiter(seq)?;
                        Ok((Some(seq), q.unfenced() == 0, ack))
                    }
                    None if q.unfenced() == 0 => Ok((None, true, ack)),
                    None => Err(ENOSPC),
                }
            })?;
            if let Some(seq) = seq {
                let left = limit - start.elapsed();
                chan.wait(seq, left.max(Delta::from_millis(0)))?;
            }
            completed += chan.with(|q, _| {
                let t = q.tx_state();
                Ok(u64::from(t.size().distance(ack_before, t.ack_index())))
            })?;
            if last {
                break;
            }
        }
        w.completed = completed;
        Ok(())
    }

    fn queue_state(&self, s: &mut uapi::neuron_udma_queue_state) -> Result {
        reserved_zero(&[u64::from(s.reserved)])?;
        let chan = self.queue(s.engine, s.queue)?;
        *s = chan.with(|queue: &mut Queue, io| {
            let q = queue.q();
            let errors = engine::engine_errors(io);
            let (ptx, prx) = queue.pending();
            Ok(uapi::neuron_udma_queue_state {
                engine: chan.eng,
                queue: chan.qid,
                m2s_engine_state: errors.m2s_state,
                s2m_engine_state: errors.s2m_state,
                m2s_error_cause: errors.m2s_cause,
                s2m_error_cause: errors.s2m_cause,
                resets: queue.resets,
                reserved: 0,
                tx: ring_state(&engine::queue_regs::<M2s>(io, q), queue.tx_state(), ptx),
                rx: ring_state(&engine::queue_regs::<S2m>(io, q), queue.rx_state(), prx),
            })
        })?;
        Ok(())
    }

    fn memcpy(&self, m: &uapi::neuron_udma_memcpy) -> Result {
        reserved_zero(&[u64::from(m.reserved)])?;
        if m.size == 0 {
            return Err(EINVAL);
        }
        let limit = timeout(m.timeout_ms);
        // One MEMCPY of this file at a time (the wait for the slot counts against the timeout
        // and ends on SIGKILL).
        let start = kernel::time::Instant::<kernel::time::Monotonic>::now();
        let _slot = loop {
            if let Some(g) = self.memcpy_slot.try_lock() {
                break g;
            }
            if start.elapsed() >= limit {
                return Err(ETIMEDOUT);
            }
            if shim::fatal_signal_pending() {
                return Err(EINTR);
            }
            kernel::time::delay::fsleep(Delta::from_micros(200));
        };
        let (s, d) = (self.buffer(m.src_handle)?, self.buffer(m.dst_handle)?);
        let route = self.dev.arch.host_route;
        let src = s.span(route, m.src_offset, m.size)?;
        let dst = d.span(route, m.dst_offset, m.size)?;
        d.check_writable()?;
        // `MEM_FREE` refuses buffers in use until the engine is done with them.
        let guards = [s.busy()?, d.busy()?];
        let left = limit - start.elapsed();
        self.dev
            .h2t()?
            .memcpy_for_file(&self.dev.pool, self.id, src, dst, m.size, left, guards)
    }
}

/// Writes the `count` descriptor pairs `pairs` of a prepare ioctl, all or nothing; the largest
/// copy among them took `largest` pairs.
///
/// # Errors
///
/// `E2BIG` if that copy takes more pairs than the queue's empty rings hold (it can never fit:
/// not "wait first"; a batch that cannot fit is split by its caller, as in ABI 1), `ENOSPC` if
/// the rings have no room for all of them now (after retiring what completed); nothing is
/// written then.
fn write_all(
    q: &mut Queue,
    pairs: impl IntoIterator<Item = (Copy, PairRefs)>,
    count: u32,
    largest: u32,
) -> Result {
    if largest > q.capacity_pairs() {
        return Err(E2BIG);
    }
    q.retire();
    if q.available_pairs() < count {
        return Err(ENOSPC);
    }
    for (c, refs) in pairs {
        q.prepare_one_refs(&c, refs)?;
    }
    Ok(())
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

/// Reads `T` from user space, runs `f` on it, and writes it back when `write_back` (checking
/// first that the argument is writable, so that `EFAULT` comes before any change).
fn in_out<T: kernel::transmute::FromBytes + kernel::transmute::AsBytes>(
    arg: usize,
    write_back: bool,
    f: impl FnOnce(&mut T) -> Result<isize>,
) -> Result<isize> {
    let slice = || UserSlice::new(UserPtr::from_addr(arg), core::mem::size_of::<T>());
    let mut v: T = read(&mut slice().reader())?;
    if write_back {
        // The output must be writable before anything changes (EFAULT then changes nothing).
        slice().writer().write(&v)?;
    }
    let r = f(&mut v)?;
    if write_back {
        slice().writer().write(&v)?;
    }
    Ok(r)
}

fn read<T: kernel::transmute::FromBytes>(r: &mut UserSliceReader) -> Result<T> {
    r.read()
}

#[vtable]
impl MiscDevice for OpenFile {
    type Ptr = Pin<KBox<Self>>;

    fn open(file: &File, misc: &MiscDeviceRegistration<Self>) -> Result<Pin<KBox<Self>>> {
        let dev = Registry::by_name(misc.device().name()).ok_or(ENODEV)?;
        KBox::pin_init(
            try_pin_init!(OpenFile {
                dev,
                id: NEXT_FILE_ID.fetch_add(1, Relaxed),
                file: MappedFile::new(file),
                st <- new_mutex!(FileState {
                    handles: KVVec::new(),
                    queues: KVec::new(),
                }),
                memcpy_slot <- new_mutex!(()),
            }),
            GFP_KERNEL,
        )
    }

    fn mmap(me: Pin<&OpenFile>, _file: &File, vma: &VmaNew) -> Result {
        if !me.dev.is_alive() {
            return Err(ENODEV);
        }
        // SAFETY: `vma` is a valid VMA being set up by this mmap call.
        let pgoff = unsafe { (*vma.as_ptr()).vm_pgoff };
        let offset = u64::try_from(pgoff).map_err(|_| EINVAL)? << kernel::page::PAGE_SHIFT;
        let buf = me.dev.pool.by_mmap_offset(me.id, offset)?;
        // The device and the process must see the same memory: no private (copy-on-write)
        // mappings, no execution.
        if vma.flags() & kernel::mm::virt::flags::SHARED == 0 {
            return Err(EINVAL);
        }
        vma.try_clear_mayexec()?;
        vma.set_dontcopy();
        vma.set_dontexpand();
        if !buf.is_host() {
            return Err(EINVAL);
        }
        // The VMA holds a reference to the buffer record (given back by its close); pages are
        // mapped on fault, under the buffer's lock (`mem::Buffer`), so a mapping never reaches
        // memory that was freed, whenever it was made.
        let priv_ = mem::vma_private(&buf);
        // SAFETY: `vma` is being set up by this call; `priv_` is a counted `Arc<Buffer>`
        // reference from `vma_private`, which the VMA's close gives back.
        let r = unsafe { shim::mmap_buffer(vma, priv_, buf.size) };
        if r.is_err() {
            // SAFETY: the VMA did not take the reference: give it back here.
            unsafe { mem::neuron_udma_vma_put(priv_) };
        }
        r
    }

    fn ioctl(me: Pin<&OpenFile>, file: &File, cmd: u32, arg: usize) -> Result<isize> {
        use uapi::*;
        // After unbind nothing is left to operate on (the file's resources were freed with it).
        if !me.dev.is_alive() {
            return Err(ENODEV);
        }
        // Commands that allocate, start DMA or change a queue need a file opened for writing:
        // a read-only descriptor may only look (INFO, QUEUE_STATE).
        if !matches!(cmd, IOC_INFO | IOC_QUEUE_STATE)
            && file.flags() & flags::O_ACCMODE == flags::O_RDONLY
        {
            return Err(EBADF);
        }
        if !matches!(cmd, IOC_INFO | IOC_QUEUE_STATE) {
            // Resources of abandoned copies come back as soon as the engine is done with them
            // (checked at every call that may need them).
            me.dev.reap();
        }
        match cmd {
            IOC_INFO => {
                let info = me.info()?;
                UserSlice::new(
                    UserPtr::from_addr(arg),
                    core::mem::size_of::<neuron_udma_info>(),
                )
                .writer()
                .write(&info)?;
                Ok(0)
            }
            IOC_MEM_ALLOC => {
                // The buffer joins the file's table only once its handle reached user space,
                // so a failing copy-out frees a buffer nothing can have used.
                let mut buf = None;
                let r = in_out(arg, true, |a: &mut neuron_udma_mem_alloc| {
                    buf = Some(me.mem_alloc(a)?);
                    Ok(0)
                });
                match buf {
                    Some(b) => me.mem_alloc_publish(b, r.is_ok()).and(r),
                    None => r,
                }
            }
            IOC_MEM_IMPORT => {
                // As MEM_ALLOC: the pages are unpinned if the handle cannot be returned.
                let mut buf = None;
                let r = in_out(arg, true, |a: &mut neuron_udma_mem_import| {
                    buf = Some(me.mem_import(a)?);
                    Ok(0)
                });
                match buf {
                    Some(b) => me.mem_alloc_publish(b, r.is_ok()).and(r),
                    None => r,
                }
            }
            IOC_MEM_FREE => in_out(arg, false, |f: &mut neuron_udma_mem_free| {
                me.mem_free(f).map(|()| 0)
            }),
            IOC_QUEUE_INIT => in_out(arg, false, |q: &mut neuron_udma_queue_init| {
                me.queue_init(q).map(|()| 0)
            }),
            IOC_QUEUE_RELEASE => in_out(arg, false, |q: &mut neuron_udma_queue_id| {
                me.queue_release(q).map(|()| 0)
            }),
            IOC_COPY_PREPARE_ONE => in_out(arg, false, |p: &mut neuron_udma_copy_prepare_one| {
                me.copy_prepare_one(p)
            }),
            IOC_COPY_PREPARE => in_out(arg, false, |p: &mut neuron_udma_copy_prepare| {
                me.copy_prepare(p)
            }),
            IOC_COPY_START => in_out(arg, false, |s: &mut neuron_udma_copy_start| {
                me.copy_start(s).map(|()| 0)
            }),
            IOC_COPY_WAIT => in_out(arg, true, |w: &mut neuron_udma_copy_wait| {
                me.copy_wait(w).map(|()| 0)
            }),
            IOC_QUEUE_STATE => in_out(arg, true, |s: &mut neuron_udma_queue_state| {
                me.queue_state(s).map(|()| 0)
            }),
            IOC_MEMCPY => in_out(arg, false, |m: &mut neuron_udma_memcpy| {
                me.memcpy(m).map(|()| 0)
            }),
            _ => Err(ENOTTY),
        }
    }
}
