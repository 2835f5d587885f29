// SPDX-License-Identifier: GPL-2.0

//! One bound device: its register BAR and engine bring-up ([`Bar0`]), the queue table (which
//! queue is in use, and by whom), the buffer pool and the driver's own H2T queue.
//!
//! Lifetime rules: the state is reference counted and may outlive the binding (an open file
//! keeps it). [`UdmaDevice::shutdown`], called from the PCI `unbind`, quiesces and frees every
//! queue and buffer while the device is still bound; afterwards every operation fails with
//! `ENODEV`. The BAR mapping itself is revoked by devres after unbind.

use crate::{
    arch::{Arch, QUEUES_PER_ENGINE},
    bar0::Bar0,
    channel::{Channel, Owner},
    h2t::{H2t, H2T_RING_DESCS, SCRUB_BYTES},
    mem::{
        Backing, Buffer, BufferPool, Charge, DramAllocator, BUF_ALIGN, DRAM_RESERVED,
        MAX_HOST_BUFFER, MAX_IMPORT_SIZE,
    },
    queue::Queue,
    ring::RingSize,
    shim::{MappedFile, PinnedPages},
};
use kernel::{
    device::Bound,
    dma::Coherent,
    new_mutex, new_work, pci,
    prelude::*,
    sync::{
        aref::ARef,
        atomic::{Atomic, Relaxed, Release},
        Arc, Mutex,
    },
    time::{delay::fsleep, Delta},
    workqueue::{self, impl_has_work, Work, WorkItem},
    xarray::{AllocKind, XArray},
};

struct DevState {
    /// False once unbind started: no new queue, no register access.
    alive: bool,
    /// The driver's H2T queue (NeuronCore 0's) for in-kernel copies.
    h2t: Option<Arc<H2t>>,
}

/// A bound Neuron device.
#[pin_data]
pub(crate) struct UdmaDevice {
    /// The PCI device.
    pub(crate) pdev: ARef<pci::Device>,
    /// Per-generation data.
    pub(crate) arch: &'static Arch,
    /// BAR0: the engines' registers (revoked by devres at unbind).
    pub(crate) bar: Arc<Bar0>,
    /// Size of the device memory (BAR4) in bytes, 0 if unmapped.
    pub(crate) dram_size: u64,
    /// The device model's control window (KUnit builds on the model only).
    #[cfg(neuron_udma_kunit)]
    pub(crate) model: Option<crate::testing::ModelCtl>,
    /// Non-zero while bound: [`DevState::alive`] for the per-ioctl check, which so takes no
    /// lock shared by every user (cleared under the state lock, before anything is torn down).
    bound: Atomic<u32>,
    /// The queues in use, keyed by [`queue_key`]; each knows its owner.
    #[pin]
    queues: XArray<Arc<Channel>>,
    /// The buffers handed to user space and their memory.
    #[pin]
    pub(crate) pool: BufferPool,
    #[pin]
    state: Mutex<DevState>,
    /// Gives back what abandoned copies of released files hold once the engine is done with
    /// it ([`Self::reap_later`]): no later call may come to do it.
    #[pin]
    reaper: Work<UdmaDevice>,
    /// Non-zero while [`Self::reaper`] is queued or running.
    reaping: Atomic<u32>,
}

impl_has_work! {
    impl HasWork<Self> for UdmaDevice { self.reaper }
}

/// First and longest sleep between two looks of the reaper at the held fences.
const REAP_SLEEP: (Delta, Delta) = (Delta::from_micros(100), Delta::from_millis(10));

impl WorkItem for UdmaDevice {
    type Pointer = Arc<UdmaDevice>;

    /// Reaps until nothing is held or the device is unbound; a queue whose held submission
    /// no longer completes is reset when it made no progress for the default timeout.
    fn run(this: Arc<UdmaDevice>) {
        let mut sleep = REAP_SLEEP.0;
        loop {
            this.reap();
            if !this.pool.has_held() || !this.is_alive() {
                break;
            }
            if let Ok(h2t) = this.h2t() {
                let _ = h2t.reset_if_stuck();
            }
            fsleep(sleep);
            sleep = (sleep + sleep).min(REAP_SLEEP.1);
        }
        this.reaping.store(0, Release);
        // Memory held after the last look is not missed.
        Self::reap_later(&this);
    }
}

/// Index of queue `qid` of engine `eng` in the queue table.
fn queue_key(eng: u32, qid: u32) -> usize {
    // CAST: engines and queues are small (validated by the caller).
    (eng * QUEUES_PER_ENGINE + qid) as usize
}

impl UdmaDevice {
    /// Creates the device state; no register is touched.
    pub(crate) fn new(
        pdev: &pci::Device<Bound>,
        arch: &'static Arch,
        bar0: pci::DevresBar,
        dram_size: u64,
        #[cfg(neuron_udma_kunit)] model: Option<crate::testing::ModelCtl>,
    ) -> Result<Arc<Self>> {
        let dram = DramAllocator::new(DRAM_RESERVED, dram_size)?;
        let bar = Arc::pin_init(Bar0::new(pdev.into(), arch, bar0), GFP_KERNEL)?;
        Arc::pin_init(
            try_pin_init!(Self {
                pdev: pdev.into(),
                arch,
                bar,
                dram_size,
                #[cfg(neuron_udma_kunit)]
                model,
                bound: Atomic::new(1),
                queues <- XArray::new(AllocKind::Alloc),
                pool <- BufferPool::new(dram),
                state <- new_mutex!(DevState {
                    alive: true,
                    h2t: None,
                }),
                reaper <- new_work!("neuron_udma::reap"),
                reaping: Atomic::new(0),
            }),
            GFP_KERNEL,
        )
    }

    /// Takes the H2T queue of NeuronCore 0 (hardware.rst §2.3) for the driver's own copies, and
    /// allocates the zeroed source of device-memory scrubs.
    pub(crate) fn setup_h2t(&self) -> Result {
        let (eng, qid) = self.arch.h2t[0];
        let zeros = self.alloc_coherent(SCRUB_BYTES)?;
        let zeros_addr = self.arch.host_addr(zeros.dma_address());
        let chan = self.queue_init(eng, qid, H2T_RING_DESCS, H2T_RING_DESCS, Owner::Driver)?;
        let h2t = H2t::new(chan, zeros, zeros_addr)?;
        self.state.lock().h2t = Some(h2t);
        Ok(())
    }

    /// The driver's H2T queue.
    ///
    /// # Errors
    ///
    /// `ENODEV` after unbind.
    pub(crate) fn h2t(&self) -> Result<Arc<H2t>> {
        self.state.lock().h2t.clone().ok_or(ENODEV)
    }

    /// Copies `size` bytes between device-fabric addresses on the driver's H2T queue
    /// ([`Channel::memcpy`]).
    ///
    /// # Errors
    ///
    /// See [`Channel::memcpy`]; `ENODEV` after unbind.
    // Only the KUnit suites copy through it; the ioctl paths use `copy`.
    #[cfg(neuron_udma_kunit)]
    pub(crate) fn memcpy(
        &self,
        src: u64,
        dst: u64,
        size: u64,
        timeout: kernel::time::Delta,
    ) -> Result {
        self.h2t()?.memcpy(src, dst, size, timeout)
    }

    /// Gives back what abandoned copies held, once the engine is done with them (a no-op
    /// without any, or after unbind).
    pub(crate) fn reap(&self) {
        if !self.pool.has_held() {
            return;
        }
        if let Ok(h2t) = self.h2t() {
            h2t.reap(&self.pool);
        }
    }

    /// Queues the reaper if abandoned copies hold memory: called when a file is released, after
    /// which no call of that file will reap what its abandoned `MEMCPY` holds (the pinned pages
    /// of an import, a buffer's memory and charge). Queued only while the device is bound
    /// (decided under the state lock, which unbind takes before it flushes the reaper), so it
    /// never runs after unbind.
    pub(crate) fn reap_later(this: &Arc<Self>) {
        if !this.pool.has_held() {
            return;
        }
        let st = this.state.lock();
        if st.alive && this.reaping.cmpxchg(0, 1, Relaxed).is_ok() {
            // Cannot be queued already: `reaping` was 0.
            let _ = workqueue::system_unbound().enqueue(this.clone());
        }
    }

    /// Allocates `len` bytes of coherent host memory for DMA by this device.
    ///
    /// # Errors
    ///
    /// `ENOMEM`, or `ENODEV` once the device is unbound.
    pub(crate) fn alloc_coherent(&self, len: usize) -> Result<Coherent<[u8]>> {
        // No warning: a refused request is the caller's ENOMEM, not a kernel problem.
        self.with_bound(|dev| Coherent::<u8>::zeroed_slice(dev, len, GFP_KERNEL | __GFP_NOWARN))
    }

    /// Runs `f` on the device while it is certainly bound (DMA allocations and mappings).
    ///
    /// # Errors
    ///
    /// `ENODEV` once the device is unbound; those of `f`.
    fn with_bound<R>(
        &self,
        f: impl FnOnce(&kernel::device::Device<Bound>) -> Result<R>,
    ) -> Result<R> {
        let st = self.state.lock();
        if !st.alive {
            return Err(ENODEV);
        }
        // SAFETY: `st.alive` is true and the state lock is held: `shutdown`, which runs in the
        // PCI unbind callback before the device is unbound, takes this lock to clear `alive`,
        // so the device stays bound at least until the lock is released, and `dev` does not
        // outlive this scope.
        let dev = unsafe { self.pdev.as_ref().as_bound() };
        f(dev)
    }

    /// Takes queue `qid` of engine `eng` for `owner`: allocates rings of `tx_descs`/`rx_descs`
    /// descriptors, initialises the engine if needed and programs the queue (hardware.rst §3.7).
    ///
    /// # Errors
    ///
    /// `EINVAL` for an unknown engine/queue or a bad ring size, `EBUSY` if the queue is in use
    /// or (for a file) reserved by the driver, `ENOMEM` (also when a file's queue memory would
    /// exceed `RLIMIT_MEMLOCK`), `ENODEV` after unbind.
    pub(crate) fn queue_init(
        &self,
        eng: u32,
        qid: u32,
        tx_descs: u32,
        rx_descs: u32,
        owner: Owner,
    ) -> Result<Arc<Channel>> {
        if self.arch.engine_offset(eng).is_none() || qid >= QUEUES_PER_ENGINE {
            return Err(EINVAL);
        }
        let st = self.state.lock();
        if !st.alive {
            return Err(ENODEV);
        }
        if owner != Owner::Driver && self.arch.is_reserved_queue(eng, qid) {
            return Err(EBUSY);
        }
        if self.queues.lock().get(queue_key(eng, qid)).is_some() {
            return Err(EBUSY);
        }
        // SAFETY: as in `alloc_coherent`: `alive` under the state lock keeps the device bound.
        let dev = unsafe { self.pdev.as_ref().as_bound() };
        // A file's queue is pinned memory like a host buffer: charged to RLIMIT_MEMLOCK (after
        // the sizes are validated, so that a bad size is EINVAL, not ENOMEM).
        RingSize::new(tx_descs)?;
        RingSize::new(rx_descs)?;
        let charge = match owner {
            Owner::Driver => None,
            Owner::File(_) => Some(Charge::new(Queue::memory_bytes(tx_descs, rx_descs))?),
        };
        let mut q = Queue::new(dev, self.arch, eng, qid, tx_descs, rx_descs)?;
        self.bar.ensure_engine(eng)?;
        self.bar.with_engine(eng, |io| {
            q.hw_init(io);
            Ok(())
        })?;
        let chan = Channel::new(self.bar.clone(), eng, qid, owner, q, charge)?;
        if let Err(e) = self
            .queues
            .lock()
            .store(queue_key(eng, qid), chan.clone(), GFP_KERNEL)
        {
            chan.quiesce();
            return Err(e.into());
        }
        drop(st);
        Ok(chan)
    }

    /// Queue `qid` of engine `eng` if `owner` holds it.
    ///
    /// # Errors
    ///
    /// `ENOENT` if the queue is not in use by `owner`, `ENODEV` if it is gone because the device
    /// was unbound.
    pub(crate) fn queue(&self, owner: Owner, eng: u32, qid: u32) -> Result<Arc<Channel>> {
        if self.arch.engine_offset(eng).is_none() || qid >= QUEUES_PER_ENGINE {
            return Err(ENOENT);
        }
        let xa = self.queues.lock();
        // [`Self::shutdown`] marks the device dead before it empties the table under this lock:
        // a call that raced with the unbind finds no queue and must say why.
        let chan = xa.get(queue_key(eng, qid)).ok_or_else(|| {
            if self.is_alive() {
                ENOENT
            } else {
                ENODEV
            }
        })?;
        if chan.owner != owner {
            return Err(ENOENT);
        }
        Ok(chan.into())
    }

    /// The queues in use (driver's and files'), by engine and queue id.
    ///
    /// # Errors
    ///
    /// `ENOMEM`.
    pub(crate) fn queues(&self) -> Result<KVec<Arc<Channel>>> {
        let mut v = KVec::new();
        for key in 0..queue_key(self.arch.engines, 0) {
            let chan = self.queues.lock().get(key).map(Arc::from);
            if let Some(chan) = chan {
                v.push(chan, GFP_KERNEL)?;
            }
        }
        Ok(v)
    }

    /// Releases queue `qid` of engine `eng` of `owner`: pauses it and frees its rings.
    ///
    /// # Errors
    ///
    /// `ENOENT` if the queue is not in use by `owner`; nothing changes then.
    pub(crate) fn queue_release(&self, owner: Owner, eng: u32, qid: u32) -> Result {
        let chan = {
            let _st = self.state.lock();
            let chan = self.queue(owner, eng, qid)?;
            drop(self.queues.lock().remove(queue_key(eng, qid)));
            chan
        };
        chan.quiesce();
        Ok(())
    }

    /// Whether the device is still bound: a lock-free early check; every path that touches
    /// the device or its memory checks again under a lock.
    pub(crate) fn is_alive(&self) -> bool {
        self.bound.load(Relaxed) != 0
    }

    /// Allocates a buffer of `size` bytes (rounded up to 4 KiB) of host (`host == true`) or
    /// device memory for the open file `owner` / `owner_file`, with handle `handle`; it is not
    /// in the pool yet (see [`BufferPool::insert`]). Host memory is charged to the caller's
    /// `RLIMIT_MEMLOCK`; device memory is scrubbed with the engine (zeros copied from host
    /// memory on the H2T queue) before it is handed out, so a new buffer never shows a previous
    /// owner's data.
    ///
    /// # Errors
    ///
    /// `EINVAL` for size 0 or a host buffer above [`MAX_HOST_BUFFER`], `ENOMEM` when no memory
    /// of that kind is left or the locked-memory limit would be exceeded, `EIO`/`ETIMEDOUT`
    /// if the scrub failed, `EINTR` on SIGKILL, `ENODEV` after unbind.
    pub(crate) fn alloc_buffer(
        &self,
        host: bool,
        size: u64,
        handle: u64,
        owner: u64,
        owner_file: MappedFile,
    ) -> Result<Arc<Buffer>> {
        if size == 0 {
            return Err(EINVAL);
        }
        let size = size.checked_next_multiple_of(BUF_ALIGN).ok_or(EINVAL)?;
        // Memory of released files' finished copies comes back first.
        self.reap();
        if host {
            if size > MAX_HOST_BUFFER {
                return Err(EINVAL);
            }
            // Charged before anything is allocated, for what the allocation really pins:
            // coherent memory comes in power-of-two blocks of pages.
            let charge = Charge::new(size.checked_next_power_of_two().ok_or(EINVAL)?)?;
            // CAST: at most MAX_HOST_BUFFER.
            let mem = self.alloc_coherent(size as usize)?;
            return Buffer::new(
                handle,
                size,
                owner,
                owner_file,
                Backing::Host(mem, Some(charge)),
            );
        }
        let addr = self.pool.alloc_dram(size)?;
        let give_back = |e| {
            self.pool.free_dram(addr);
            e
        };
        let h2t = self.h2t().map_err(give_back)?;
        match h2t.scrub(&self.pool, addr, size) {
            (Ok(()), _) => {}
            (Err(e), true) => return Err(give_back(e)),
            // The range stays reserved until the engine is done with it.
            (Err(e), false) => return Err(e),
        }
        Buffer::new(handle, size, owner, owner_file, Backing::Device(addr)).map_err(give_back)
    }

    /// Imports the calling process's memory `[addr, addr + size)` (bytes, any alignment) as
    /// buffer `handle` of the open file `owner` / `owner_file` (`MEM_IMPORT`): charges its pages
    /// to the caller's `RLIMIT_MEMLOCK`, pins them long-term (writable by the engine if
    /// `write`) and maps them for the device; not in the pool yet (see [`BufferPool::insert`]).
    ///
    /// # Errors
    ///
    /// `EINVAL` for size 0, above [`MAX_IMPORT_SIZE`] or a wrapping range, `ENOMEM` past the
    /// locked-memory limit (checked before anything is pinned) or without memory, `EFAULT` for
    /// unmapped pages (or read-only ones with `write`), `EOPNOTSUPP` for memory that cannot be
    /// pinned long-term or reached without bounce buffers, `EINTR` on SIGKILL, `ENODEV` after
    /// unbind. Nothing stays pinned or charged on error.
    pub(crate) fn import_buffer(
        &self,
        addr: u64,
        size: u64,
        write: bool,
        handle: u64,
        owner: u64,
        owner_file: MappedFile,
    ) -> Result<Arc<Buffer>> {
        if size == 0 || size > MAX_IMPORT_SIZE {
            return Err(EINVAL);
        }
        let end = addr.checked_add(size).ok_or(EINVAL)?;
        let page = kernel::page::PAGE_SIZE as u64;
        // What pinning really holds: every page the range touches.
        let pinned = end.div_ceil(page) - addr / page;
        let charge = Charge::new(pinned * page)?;
        // Pinned outside the state lock (it may fault pages in); mapped while certainly bound.
        let mut pages = PinnedPages::new(addr, size, write)?;
        self.with_bound(|dev| pages.map(dev))?;
        Buffer::imported(handle, size, owner, owner_file, pages, charge, write)
    }

    /// Called when the open file `owner` is released: releases its queues `queues` (engine,
    /// queue), then its buffers `handles` ([`BufferPool::release_owner`]). Never waits for the
    /// engine, so a killed process exits at once.
    pub(crate) fn release_file(&self, owner: u64, queues: &[(u32, u32)], handles: &[u64]) {
        // Queues first: once paused, no engine touches the buffers.
        for &(eng, qid) in queues {
            let _ = self.queue_release(Owner::File(owner), eng, qid);
        }
        self.reap();
        self.pool.release_owner(owner, handles);
    }

    /// Called from the PCI unbind callback: no new operation starts, every queue is paused
    /// and its memory freed while the device is still bound, then every buffer's memory.
    pub(crate) fn shutdown(&self) {
        let h2t = {
            let mut st = self.state.lock();
            st.alive = false;
            self.bound.store(0, Relaxed);
            st.h2t.take()
        };
        for key in 0..queue_key(self.arch.engines, 0) {
            let chan = self.queues.lock().remove(key);
            if let Some(chan) = chan {
                chan.quiesce();
            }
        }
        if let Some(h2t) = h2t {
            h2t.shutdown();
        }
        // After the queues: no engine uses the buffers any more. The coherent memory is freed
        // now, while the device is bound; open files and mappings keep only the records.
        self.pool.shutdown();
        // `alive` is false: the reaper ends its loop and is not queued again.
        crate::shim::flush_work(&self.reaper);
    }
}
