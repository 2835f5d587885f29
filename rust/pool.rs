// SPDX-License-Identifier: GPL-2.0

//! The device's buffer pool: every buffer handed to user space, by handle (each knows its
//! owner), and the device memory they are carved from. An open file keeps only the handles of
//! its buffers; this is the one place that knows which buffer exists and who owns it.

use crate::{
    buffer::{Buffer, MemKind, MMAP_STRIDE_SHIFT},
    dram::DramAllocator,
    holds::{Shard, SHARDS},
    kfac::trace::{self, BufferEvent},
};
use core::ptr::NonNull;
use kernel::{
    new_mutex, new_spinlock, pci,
    prelude::*,
    sync::{
        aref::ARef,
        atomic::{Atomic, Relaxed},
        Arc, ArcBorrow, Mutex, SpinLock,
    },
    xarray::{self, XArray},
};

/// A buffer looked up for a resident set ([`BufferPool::hold_resident`]).
pub(crate) enum Held {
    /// A driver-allocated buffer, held by one count of its shard for the set: the data pointer
    /// of the shard's `Arc` of the record, alive while the count is.
    Pooled(NonNull<Buffer>),
    /// An import, by a counted reference (not resident).
    Import(Arc<Buffer>),
}

struct PoolState {
    /// False after [`BufferPool::shutdown`]: nothing is allocated any more.
    alive: bool,
    /// Every buffer in the pool, for the walks of unbind and file release; each knows its
    /// index ([`Buffer::table_index`]), so removal is O(1).
    table: KVVec<Arc<Buffer>>,
    /// Device memory available to user space.
    dram: DramAllocator,
    /// Ranges of `dram` reserved for stranded dma-buf exports (a pinned importer of an earlier
    /// binding may still reach them): `(export instance, start, length in bytes)`.
    stranded: KVec<(u64, u64, u64)>,
}

/// The buffers of one device and their memory: the one place that knows which buffer exists
/// and who owns it (an open file keeps only its id). Lookups by handle are O(1) (an XArray).
#[pin_data]
pub(crate) struct BufferPool {
    /// Handle -> buffer, in [`SHARDS`] indexes by owner.
    handles: KVec<Arc<Shard>>,
    #[pin]
    state: Mutex<PoolState>,
    /// Held while a `MEM_FREE` decides ([`Buffer::take_for_free`]): keeps the decider on its
    /// CPU while claims spin for the outcome.
    #[pin]
    deciding: SpinLock<()>,
    /// Bytes held by the buffers in the pool, and the peak, per [`MemKind`] (sysfs).
    pub(crate) usage: Usage,
    /// The device, which the buffer events name (`kfac/trace.rs`).
    dev: ARef<pci::Device>,
}

/// Memory held by a device's buffers: `held` and `peak` bytes per [`MemKind`] (host, device,
/// imported), and the device memory reserved for stranded exports. Read without a lock (sysfs);
/// changed under the pool lock, so a peak is never missed.
pub(crate) struct Usage {
    held: [Atomic<u64>; 3],
    peak: [Atomic<u64>; 3],
    /// Device memory available to buffers, bytes.
    device_total: u64,
    /// Of that, bytes reserved for stranded dma-buf exports ([`BufferPool::reserve_stranded`]):
    /// no buffer can have them until their dma-bufs are released.
    stranded: Atomic<u64>,
}

impl Usage {
    const fn new(device_total: u64) -> Self {
        Self {
            held: [const { Atomic::new(0) }; 3],
            peak: [const { Atomic::new(0) }; 3],
            device_total,
            stranded: Atomic::new(0),
        }
    }

    /// The counters as raw `u64`s for the sysfs attributes of `rust/kfac/sysfs.c`: held then
    /// peak per kind, then the device memory available and the stranded bytes of it.
    pub(crate) fn raw(&self) -> [*const u64; 8] {
        let p = |a: &Atomic<u64>| a.as_ptr().cast_const();
        [
            p(&self.held[0]),
            p(&self.held[1]),
            p(&self.held[2]),
            p(&self.peak[0]),
            p(&self.peak[1]),
            p(&self.peak[2]),
            &self.device_total,
            p(&self.stranded),
        ]
    }

    fn add(&self, kind: MemKind, bytes: u64) {
        let i = kind as usize;
        let now = self.held[i].load(Relaxed) + bytes;
        self.held[i].store(now, Relaxed);
        if now > self.peak[i].load(Relaxed) {
            self.peak[i].store(now, Relaxed);
        }
    }

    fn sub(&self, kind: MemKind, bytes: u64) {
        let i = kind as usize;
        let now = self.held[i].load(Relaxed).saturating_sub(bytes);
        self.held[i].store(now, Relaxed);
    }
}

impl BufferPool {
    /// An empty pool of device `dev` over its device memory `dram`.
    pub(crate) fn new(dev: ARef<pci::Device>, dram: DramAllocator) -> impl PinInit<Self, Error> {
        let total = dram.capacity();
        try_pin_init!(Self {
            handles: Shard::new_all()?,
            state <- new_mutex!(PoolState {
                alive: true,
                table: KVVec::new(),
                dram,
                stranded: KVec::new(),
            }),
            deciding <- new_spinlock!(()),
            usage: Usage::new(total),
            dev,
        })
    }

    /// The handle index of the buffers of open file `owner`.
    pub(crate) fn shard(&self, owner: u64) -> &Arc<Shard> {
        // CAST: the remainder is below SHARDS.
        // PANIC: `handles` has SHARDS shards (`Shard::new_all`).
        &self.handles[(owner % SHARDS as u64) as usize]
    }

    /// Bytes of device memory available to user buffers.
    pub(crate) fn dram_capacity(&self) -> u64 {
        self.state.lock().dram.capacity()
    }

    /// Allocates `size` bytes of device memory ([`DramAllocator::alloc`]).
    ///
    /// # Errors
    ///
    /// `ENOMEM` if no range is large enough, `ENODEV` after [`Self::shutdown`].
    pub(crate) fn alloc_dram(&self, size: u64) -> Result<u64> {
        let mut st = self.state.lock();
        if !st.alive {
            return Err(ENODEV);
        }
        st.dram.alloc(size)
    }

    /// Gives back the device-memory range at `addr`.
    pub(crate) fn free_dram(&self, addr: u64) {
        self.state.lock().dram.free(addr);
    }

    /// Reserves device addresses `start..start + len` (bytes) for the stranded export
    /// `instance` ([`DramAllocator::reserve`]) until [`Self::unreserve_stranded`]. Exports of
    /// one buffer share its range: a range already reserved for another stranded export with
    /// the same start is shared (whole buffers: stranded ranges are the same or disjoint).
    ///
    /// # Errors
    ///
    /// `EINVAL` if the range is neither free nor a stranded export's, `ENOMEM`; nothing is
    /// reserved then.
    pub(crate) fn reserve_stranded(&self, instance: u64, start: u64, len: u64) -> Result {
        let mut st = self.state.lock();
        st.stranded.reserve(1, GFP_KERNEL)?;
        // The first export of a range reserves it (outside the managed addresses: nothing to).
        if !st.stranded.iter().any(|&(_, s, _)| s == start) {
            if !st.dram.reserve(start, len)? {
                return Ok(());
            }
            self.usage.stranded.fetch_add(len, Relaxed);
        }
        // Room reserved above: cannot fail.
        st.stranded.push((instance, start, len), GFP_KERNEL)?;
        Ok(())
    }

    /// Frees the range reserved for the stranded export `instance`, if this pool reserved one
    /// (true then); it is scrubbed at its next `MEM_ALLOC`, as any freed device memory.
    pub(crate) fn unreserve_stranded(&self, instance: u64) -> bool {
        let mut st = self.state.lock();
        let Some(i) = st.stranded.iter().position(|&(n, _, _)| n == instance) else {
            return false;
        };
        let Ok((_, start, len)) = st.stranded.remove(i) else {
            return false;
        };
        // The last export of the range gives it back.
        if !st.stranded.iter().any(|&(_, s, _)| s == start) {
            st.dram.free(start);
            self.usage.stranded.fetch_sub(len, Relaxed);
        }
        true
    }

    /// The stranded exports this pool reserves a range for.
    pub(crate) fn stranded(&self) -> Result<KVec<u64>> {
        let st = self.state.lock();
        let mut v = KVec::with_capacity(st.stranded.len(), GFP_KERNEL)?;
        for &(n, _, _) in st.stranded.iter() {
            v.push(n, GFP_KERNEL)?;
        }
        Ok(v)
    }

    /// Adds `buf` to the pool (its handle becomes usable); on failure its memory is given back.
    ///
    /// # Errors
    ///
    /// `ENOMEM`, `ENODEV` after [`Self::shutdown`].
    pub(crate) fn insert(&self, buf: &Arc<Buffer>) -> Result {
        let r = {
            let mut st = self.state.lock();
            Self::link(&mut st, &self.shard(buf.owner).xa, &self.usage, buf)
        };
        if r.is_ok() {
            let what = match buf.kind {
                MemKind::Imported => BufferEvent::Import,
                MemKind::Host | MemKind::Device => BufferEvent::Alloc,
            };
            self.trace(what, buf);
        }
        if r.is_err() {
            // Freed outside the pool lock: giving back a host buffer's charge takes the mmap
            // lock.
            if let Some(addr) = buf.free() {
                self.free_dram(addr);
            }
        }
        r
    }

    fn link(
        st: &mut PoolState,
        handles: &XArray<Arc<Buffer>>,
        usage: &Usage,
        buf: &Arc<Buffer>,
    ) -> Result {
        if !st.alive {
            return Err(ENODEV);
        }
        st.table.reserve(1, GFP_KERNEL_ACCOUNT)?;
        // CAST: handles are below HANDLE_LIMIT, which fits in `usize` on 64-bit kernels.
        handles
            .lock()
            .store(buf.handle as usize, buf.clone(), GFP_KERNEL_ACCOUNT)?;
        buf.table_index.store(st.table.len(), Relaxed);
        // Cannot fail: capacity was reserved.
        let _ = st.table.push_within_capacity(buf.clone());
        usage.add(buf.kind, buf.size);
        Ok(())
    }

    /// The buffer `handle` of the open file `owner`.
    ///
    /// # Errors
    ///
    /// `ENOENT` if no such buffer exists or another file owns it.
    pub(crate) fn get(&self, owner: u64, handle: u64) -> Result<Arc<Buffer>> {
        let xa = self.shard(owner).xa.lock();
        Ok(Self::lookup(&xa, owner, handle)?.into())
    }

    /// The buffer `handle` of the open file `owner` in `xa`, the locked shard of `owner`: the
    /// one lookup of [`Self::get`] and [`Self::hold_resident`].
    ///
    /// # Errors
    ///
    /// `ENOENT` if no such buffer exists or another file owns it.
    fn lookup<'a>(
        xa: &'a xarray::Guard<'_, Arc<Buffer>>,
        owner: u64,
        handle: u64,
    ) -> Result<ArcBorrow<'a, Buffer>> {
        let buf = xa
            .get(usize::try_from(handle).map_err(|_| ENOENT)?)
            .ok_or(ENOENT)?;
        if buf.owner != owner {
            return Err(ENOENT);
        }
        Ok(buf)
    }

    /// Buffer `handle` of the open file `owner`, for its resident set (`resident.rs`), whose
    /// pool shard is `shard`: a driver-allocated buffer (host or device memory) is held by a
    /// count kept under the shard's lock ([`Buffer::hold_pooled`]), taken in the lookup's
    /// hold of that lock, which the set gives back when the buffer leaves it; an import is
    /// returned by a counted reference, for the submission to hold
    /// ([`Holds::take`](crate::holds::Holds::take)).
    ///
    /// # Errors
    ///
    /// `ENOENT` for an unknown handle, another file's buffer, or one that a `MEM_FREE` freed;
    /// `EINVAL` if `shard` is not `owner`'s (never: a file's set is made with its shard).
    /// Nothing is held then.
    pub(crate) fn hold_resident(
        &self,
        owner: u64,
        handle: u64,
        shard: &Arc<Shard>,
    ) -> Result<Held> {
        if !Arc::ptr_eq(shard, self.shard(owner)) {
            return Err(EINVAL);
        }
        let xa = shard.xa.lock();
        let buf = Self::lookup(&xa, owner, handle)?;
        if buf.kind == MemKind::Imported {
            return Ok(Held::Import(buf.into()));
        }
        buf.hold_pooled()?;
        // The data pointer of the shard's `Arc`; the count just taken keeps the buffer in the
        // shard, which keeps the record alive (`resident.rs` relies on it).
        Ok(Held::Pooled(NonNull::from(&*buf)))
    }

    /// The host buffer of the open file `owner` whose mmap offset is `offset` (bytes).
    ///
    /// # Errors
    ///
    /// `EINVAL` if there is none (also for an offset inside a buffer rather than at its start).
    pub(crate) fn by_mmap_offset(&self, owner: u64, offset: u64) -> Result<Arc<Buffer>> {
        let buf = self
            .get(owner, offset >> MMAP_STRIDE_SHIFT)
            .map_err(|_| EINVAL)?;
        if offset == 0 || buf.mmap_offset != offset {
            return Err(EINVAL);
        }
        Ok(buf)
    }

    /// Removes buffer `handle` of the open file `owner` from the pool and frees it, unless a
    /// descriptor or a running copy may still reach it. Copies being prepared concurrently
    /// either hold it first (then this is `EBUSY`) or fail with `ENOENT`: the decision and the
    /// resident holds are made under the shard's lock ([`Self::hold_resident`]), the counted
    /// holds and busy guards settle with it by the handshake of [`Buffer::take_for_free`].
    ///
    /// # Errors
    ///
    /// `ENOENT` (see [`Self::get`]), `EBUSY` if the buffer is busy ([`Buffer::is_busy`]);
    /// nothing changes then.
    pub(crate) fn free_handle(&self, owner: u64, handle: u64) -> Result {
        let buf = self.get(owner, handle)?;
        {
            // Under the pool lock, like every other busy check (see `release_owner`), and with
            // preemption off (a spinlock) for the few instructions of the decision, which
            // concurrent claims wait for by spinning.
            let _st = self.state.lock();
            let _deciding = self.deciding.lock();
            // And under the shard's lock, which counts the submissions' holds of it.
            let _xa = self.shard(owner).xa.lock();
            buf.take_for_free()?;
        }
        self.free(&buf);
        Ok(())
    }

    /// Removes `buf` from the pool and frees it ([`Buffer::free`]), giving device memory back.
    /// The caller made sure no descriptor references it ([`Buffer::is_busy`] is false, or its
    /// queues are paused).
    pub(crate) fn free(&self, buf: &Buffer) {
        let mut st = self.state.lock();
        let was_in = match Self::unlink(&mut st, &self.shard(buf.owner).xa, buf) {
            Ok(was_in) => was_in,
            Err(_) => {
                // Never: every caller checked that nothing holds it. Kept, memory and all:
                // the hold's submission may still reach it.
                drop(st);
                dev_err!(
                    self.dev.as_ref(),
                    "buffer {} freed while held\n",
                    buf.handle
                );
                return;
            }
        };
        if was_in {
            self.usage.sub(buf.kind, buf.size);
        }
        drop(st);
        if was_in {
            self.trace(BufferEvent::Free, buf);
        }
        if let Some(addr) = buf.free() {
            self.free_dram(addr);
        }
    }

    /// The buffer event `what` of `buf` (`kfac/trace.rs`).
    pub(crate) fn trace(&self, what: BufferEvent, buf: &Buffer) {
        let kind = match (buf.kind, buf.dmabuf) {
            (MemKind::Host, _) => c"host",
            (MemKind::Device, _) => c"device",
            (MemKind::Imported, false) => c"pages",
            (MemKind::Imported, true) => c"dmabuf",
        };
        trace::buffer(&self.dev, what, (buf.handle, buf.size), kind, buf.owner);
    }

    /// The `neuron_udma_scrub` event: `size` bytes at `addr` zeroed by `engines` H2T engines,
    /// with outcome `r` (`kfac/trace.rs`).
    pub(crate) fn trace_scrub(&self, addr: u64, size: u64, engines: u32, r: &Result) {
        trace::scrub(&self.dev, addr, size, engines, r);
    }

    /// Removes `buf` from the table and the handle index; `Ok(false)` if it was not there.
    ///
    /// # Errors
    ///
    /// `EBUSY` if a queue's resident set holds it through its shard ([`Buffer::hold_pooled`]);
    /// it stays then, in both (the hold points at the record the shard keeps alive).
    fn unlink(st: &mut PoolState, handles: &XArray<Arc<Buffer>>, buf: &Buffer) -> Result<bool> {
        let idx = buf.table_index.load(Relaxed);
        if !st.table.get(idx).is_some_and(|b| core::ptr::eq(&**b, buf)) {
            return Ok(false);
        }
        {
            let mut xa = handles.lock();
            if buf.pooled_holds() != 0 {
                return Err(EBUSY);
            }
            // CAST: as in `insert`.
            drop(xa.remove(buf.handle as usize));
        }
        // O(1) removal: the last entry takes the freed place.
        if let Some(last) = st.table.pop() {
            if idx < st.table.len() {
                last.table_index.store(idx, Relaxed);
                st.table[idx] = last;
            }
        }
        Ok(true)
    }

    /// Releases the buffers `handles` of the closed file `owner` (after its queues were
    /// released): a buffer that an abandoned `MEMCPY` of the file still uses stays in the pool,
    /// marked, and is freed by [`Self::free_if_released`] when the engine is done with it
    /// (`orphan.rs`); the others are freed now. Never waits for the engine.
    pub(crate) fn release_owner(&self, owner: u64, handles: &[u64]) {
        for &h in handles {
            let Ok(b) = self.get(owner, h) else {
                continue;
            };
            b.mark_released();
            // Decided under the pool lock, which `free_if_released` holds while it looks at the
            // mark: exactly one of the two frees the buffer.
            let free_now = {
                let _st = self.state.lock();
                // The shard's lock makes the pooled holds' count exact.
                let _xa = self.shard(owner).xa.lock();
                !b.is_busy()
            };
            if free_now {
                self.free(&b);
            }
        }
    }

    /// Frees `buf` if its owning file was released and nothing uses it any more (called when
    /// an abandoned copy that used it is settled, after its guard was dropped); decided under
    /// the pool lock, as [`Self::release_owner`] decides, so exactly one of the two frees it.
    pub(crate) fn free_if_released(&self, buf: &Buffer) {
        let free_now = {
            let _st = self.state.lock();
            let _xa = self.shard(buf.owner).xa.lock();
            buf.is_released() && !buf.is_busy()
        };
        if free_now {
            self.free(buf);
        }
    }

    /// Called at unbind, after every queue was paused and the orphans were dropped: frees every
    /// buffer's memory (the records stay with open files and mappings); nothing is allocated
    /// after.
    pub(crate) fn shutdown(&self) {
        let (table, region) = {
            let mut st = self.state.lock();
            st.alive = false;
            // No engine, importer or mapping reaches the device memory any more (but a pinned
            // importer of a stranded export: the next binding reserves its range again): every
            // range's dmem charge goes back now, not when the last record of a buffer is
            // dropped. The region is unregistered below, outside the lock (it waits for an SRCU
            // grace period).
            let region = st.dram.release_all();
            st.stranded.clear();
            self.usage.stranded.store(0, Relaxed);
            for b in st.table.iter() {
                self.usage.sub(b.kind, b.size);
                self.trace(BufferEvent::Free, b);
            }
            (core::mem::replace(&mut st.table, KVVec::new()), region)
        };
        drop(region);
        for b in table.iter() {
            // Freed while still in its shard: a close racing this finds it there, marks it
            // released and frees it too (the second free does nothing), so its `struct file`
            // is alive until this free (and its zap of the user mappings) is done. Taken out of
            // the shard first, the close would skip it and the file could be gone before the zap.
            b.free();
            let mut xa = self.shard(b.owner).xa.lock();
            // A record that a resident set still holds stays in its shard, whose last reference
            // drops it. Never expected: the queues' ends let their sets go, after any prepare
            // call under way (`COPY_PREPARE` runs outside the device's entry guard) settled.
            if b.pooled_holds() == 0 {
                // CAST: as in `insert`.
                drop(xa.remove(b.handle as usize));
            }
        }
    }
}
