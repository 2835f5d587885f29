// SPDX-License-Identifier: GPL-2.0

//! One bound device: its register BAR and engine bring-up ([`Bar0`]), the buffer pool, the
//! driver's own H2T queue, the reaper of orphans and the unbind. Its children: `queues` (the
//! queue table: which queue is in use, and by whom), `buffers` (buffer allocation and
//! import) and `reset` (the device across a reset, PCI error recovery and shutdown).
//!
//! Lifetime rules: the state is reference counted and may outlive the binding (an open file
//! keeps it). [`UdmaDevice::shutdown`], called from the PCI `unbind`, quiesces and frees every
//! queue and buffer while the device is still bound; afterwards every operation fails with
//! `ENODEV`. The BAR mapping itself is revoked by devres after unbind.

mod buffers;
mod queues;
mod reset;

use crate::{
    arch::Arch,
    bar0::Bar0,
    buffer::{MAX_HOST_BUFFER, MAX_IMPORT_SIZE},
    channel::{Channel, Gone, Owner},
    completion::{Completer, Look, Member},
    counters::DeviceCounters,
    devmem::DevMem,
    dram::{DramAllocator, DRAM_RESERVED},
    engine::QueueId,
    h2t::{H2t, H2T_RING_DESCS, SCRUB_BYTES, SCRUB_RING_DESCS},
    kfac::dmem::DmemRegion,
    pattern::Patterns,
    pool::BufferPool,
};
use kernel::{
    device::Bound,
    dma::Coherent,
    new_mutex, pci,
    prelude::*,
    str::CString,
    sync::{
        aref::ARef,
        atomic::{Atomic, Full, Relaxed, Release},
        Arc, Mutex,
    },
    time::{delay::fsleep, Delta},
    xarray::{AllocKind, XArray},
};

struct DevState {
    /// False once unbind started: no new queue, no allocation, no register access.
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
    /// The device's NUMA node (`NUMA_NO_NODE`, -1, if none): INFO, and where the completion
    /// work runs.
    pub(crate) node: i32,
    /// BAR0: the engines' registers (revoked by devres at unbind).
    pub(crate) bar: Arc<Bar0>,
    /// Size of the device memory (BAR4) in bytes, 0 if unmapped.
    pub(crate) dram_size: u64,
    /// CPU physical address of BAR4 (device address 0), 0 if unmapped.
    pub(crate) bar4_phys: u64,
    /// Device memory through BAR4 (revoked at unbind), if mapped.
    devmem: Option<Arc<DevMem>>,
    /// The device model's control window (KUnit builds on the model only).
    #[cfg(neuron_udma_kunit)]
    pub(crate) model: Option<crate::testing::ModelCtl>,
    /// Non-zero while bound: [`DevState::alive`] for the per-ioctl check, which so takes no
    /// lock shared by every user (cleared under the state lock, before anything is torn down).
    bound: Atomic<u32>,
    /// Sections running in [`Self::enter`]: the unbind waits for them.
    entered: Atomic<u32>,
    /// The queues in use, keyed by [`QueueId::key`]; each knows its owner.
    #[pin]
    queues: XArray<Arc<Channel>>,
    /// The activity counters (sysfs).
    pub(crate) counters: Arc<DeviceCounters>,
    /// The buffers handed to user space and their memory.
    #[pin]
    pub(crate) pool: BufferPool,
    #[pin]
    state: Mutex<DevState>,
    /// The completion engine (`completion.rs`): the queues somebody listens to, the dmaengine
    /// channels, and the orphans ([`Self::reap_later`]).
    pub(crate) completer: Arc<Completer>,
    /// The source blocks of fills (`MEMSET`, dmaengine `DMA_MEMSET`).
    pub(crate) patterns: Arc<Patterns>,
}

/// The device is a member of its completion engine while it has orphans: a look reaps what
/// the engine is done with (a stuck H2T queue is reset by the reaping itself).
impl Member for UdmaDevice {
    fn look(&self, _check: bool) -> Look {
        let left = self.reap();
        // An orphan is a marker to be late for, not a rate to learn: no progress is reported,
        // so the engine looks closely for a while, then backs off to its longest sleep.
        Look {
            progress: false,
            busy: left != 0 && self.is_alive(),
        }
    }

    fn check_every(&self) -> Delta {
        // The reaping reads the H2T queue's state itself (`H2t::reap`).
        Delta::from_secs(1)
    }
}

impl UdmaDevice {
    /// Creates the device state; no register is touched.
    pub(crate) fn new(
        pdev: &pci::Device<Bound>,
        arch: &'static Arch,
        bar0: pci::DevresBar,
        (bar4, dram_size): (Option<pci::DevresBar>, u64),
        bar4_phys: u64,
        #[cfg(neuron_udma_kunit)] model: Option<crate::testing::ModelCtl>,
    ) -> Result<Arc<Self>> {
        // The device memory users allocate from, a dmem cgroup region of its own
        // ("neuron_udma/<PCI name>" in dmem.capacity and dmem.max).
        let name = CString::try_from_fmt(fmt!("neuron_udma/{}", pdev.as_ref().name()))?;
        let user_bytes = dram_size.saturating_sub(DRAM_RESERVED);
        let region = DmemRegion::register(user_bytes, &name)?;
        let dram = DramAllocator::new(DRAM_RESERVED, dram_size, region)?;
        let bar = Arc::pin_init(Bar0::new(pdev.into(), arch, bar0), GFP_KERNEL)?;
        let patterns = Patterns::new(pdev.into(), arch)?;
        let pool_dev: ARef<pci::Device> = pdev.into();
        let counters = DeviceCounters::new()?;
        let node = crate::kfac::pci::node(pdev.as_ref());
        let completer = Completer::new(node)?;
        let devmem = match bar4 {
            Some(b) => Some(Arc::new(DevMem::new(b), GFP_KERNEL)?),
            None => None,
        };
        Arc::pin_init(
            try_pin_init!(Self {
                pdev: pdev.into(),
                arch,
                node,
                bar,
                dram_size,
                bar4_phys,
                devmem,
                #[cfg(neuron_udma_kunit)]
                model,
                bound: Atomic::new(1),
                entered: Atomic::new(0),
                queues <- XArray::new(AllocKind::Alloc),
                counters,
                pool <- BufferPool::new(pool_dev, dram),
                state <- new_mutex!(DevState {
                    alive: true,
                    h2t: None,
                }),
                completer,
                patterns,
            }),
            GFP_KERNEL,
        )
    }

    /// Takes the H2T queue of NeuronCore 0 (hardware.rst §2.3) for the driver's own copies and
    /// a reserved queue of each other H2T engine for large scrubs, and allocates the zeroed
    /// source of device-memory scrubs.
    pub(crate) fn setup_h2t(&self) -> Result {
        let (eng, qid) = self.arch.h2t[0];
        let id = QueueId::new(self.arch, eng, qid).ok_or(EINVAL)?;
        let zeros = self.alloc_coherent(SCRUB_BYTES)?;
        let zeros_addr = self.arch.host_addr(zeros.dma_address());
        let chan = self.queue_init(id, H2T_RING_DESCS, H2T_RING_DESCS, Owner::Driver, None)?;
        // The other H2T engines scrub large ranges beside it (`h2t.rs`).
        let mut scrubbers = KVec::new();
        for (eng, qid) in self.arch.scrub_queues() {
            let id = QueueId::new(self.arch, eng, qid).ok_or(EINVAL)?;
            let c = self.queue_init(id, SCRUB_RING_DESCS, SCRUB_RING_DESCS, Owner::Driver, None)?;
            scrubbers.push(c, GFP_KERNEL)?;
        }
        let h2t = H2t::new(chan, scrubbers, zeros, zeros_addr)?;
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
    #[cfg(neuron_udma_kunit)]
    pub(crate) fn memcpy(&self, src: u64, dst: u64, size: u64, timeout: Delta) -> Result {
        self.h2t()?.memcpy(src, dst, size, timeout)
    }

    /// Fills `size` bytes at device-fabric address `dst` from the fill block at `block` on the
    /// driver's H2T queue ([`Channel::fill`]).
    ///
    /// # Errors
    ///
    /// See [`Channel::fill`].
    #[cfg(neuron_udma_kunit)]
    pub(crate) fn fill(&self, block: u64, dst: u64, size: u64, timeout: Delta) -> Result {
        self.h2t()?.fill(block, dst, size, timeout)
    }

    /// Gives back what settled orphans hold (`orphan.rs`); returns how many are left (0 after
    /// unbind).
    pub(crate) fn reap(&self) -> usize {
        match self.h2t() {
            Ok(h2t) if h2t.has_orphans() => h2t.reap(&self.pool),
            _ => 0,
        }
    }

    /// Has the completion engine reap while orphans exist: called when a file is released,
    /// after which no call of that file will reap what its abandoned `MEMCPY` holds (the pinned
    /// pages of an import, a buffer's memory and charge). Watched only while the device is
    /// bound (the engine drops its members at unbind, [`Completer::shutdown`]).
    pub(crate) fn reap_later(this: &Arc<Self>) {
        let any = {
            let st = this.state.lock();
            st.alive && st.h2t.as_ref().is_some_and(|h| h.has_orphans())
        };
        if any {
            Completer::watch(&this.completer, this.clone());
        }
    }

    /// Runs `f` on the device while it is certainly bound (DMA allocations and mappings).
    ///
    /// 7.3 has no Rust abstraction that proves a device bound outside its bus callbacks (what
    /// `drm::Device<Registered>` does for DRM, with `drm_dev_enter()`); this is its equivalent
    /// for this driver: the state lock is the read-side section, `alive` the registration, and
    /// [`Self::shutdown`] (the unbind) takes the lock to clear it before it returns.
    ///
    /// # Errors
    ///
    /// `ENODEV` once the device is unbound; those of `f`.
    pub(crate) fn with_bound<R>(
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

    /// Enters a section in which the device stays bound without the state lock, for calls that
    /// take another subsystem's locks which this driver's callbacks take the state lock under
    /// (a dma-buf's reservation lock: [`Self::with_bound`] would invert that order).
    /// [`Self::shutdown`] waits for every section to end before it tears anything down.
    ///
    /// # Errors
    ///
    /// `ENODEV` once the device is unbound.
    pub(crate) fn enter(&self) -> Result<Entered<'_>> {
        // The other half of the shutdown's handshake: mark, then look (fully ordered).
        self.entered.fetch_add(1, Full);
        let section = Entered { dev: self };
        if !self.is_alive() {
            return Err(ENODEV);
        }
        Ok(section)
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

    /// The device's `INFO` (the ABI's limits and the device's geometry); `max_batch` is the
    /// file layer's and left 0.
    pub(crate) fn info(&self) -> crate::uapi::neuron_udma_info {
        let arch = self.arch;
        crate::uapi::neuron_udma_info {
            abi_version: crate::uapi::NEURON_UDMA_ABI_VERSION,
            generation: arch.uapi_generation(),
            vendor_id: crate::arch::PCI_VENDOR.as_raw(),
            device_id: arch.device_id,
            engines: arch.engines,
            queues_per_engine: crate::arch::QUEUES_PER_ENGINE,
            max_copy_size: crate::split::PAIR_BYTES,
            device_mem_size: self.pool.dram_capacity(),
            min_ring_descs: crate::ring::MIN_DESCS,
            max_ring_descs: crate::ring::MAX_DESCS,
            ring_reserve_descs: crate::ring::RESERVE,
            max_batch: 0,
            max_host_buffer: MAX_HOST_BUFFER,
            host_engines: arch.host_engine_bitmap(),
            max_import_size: MAX_IMPORT_SIZE,
            max_buffers: 0,
            max_queue_fences: crate::queue::FENCE_SLOTS as u32,
            // Every engine fetches descriptors from and writes markers to device memory
            // (hardware.rst §1.3, 8.2).
            device_ring_engines: if self.has_device_rings() {
                arch.engine_bitmap()
            } else {
                [0; 3]
            },
            numa_node: self.node,
            // io_uring registered buffers as copies' host side (`file/uring.rs`).
            features: crate::uapi::NEURON_UDMA_FEATURE_URING_FIXED,
            reserved: [0; 3],
        }
    }

    /// Whether the device is still bound: a lock-free early check; every path that touches
    /// the device or its memory checks again under a lock.
    pub(crate) fn is_alive(&self) -> bool {
        self.bound.load(Relaxed) != 0
    }

    /// Called when the open file `owner` is released: releases its queues `queues`, then its
    /// buffers `handles` ([`BufferPool::release_owner`]). Never waits for the engine, so a
    /// killed process exits at once.
    pub(crate) fn release_file(&self, owner: u64, queues: &[QueueId], handles: &[u64]) {
        // Queues first: once paused, no engine touches the buffers, and their resident sets
        // let every buffer go (`Channel::quiesce`).
        for &id in queues {
            let _ = self.queue_release(Owner::File(owner), id);
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
        // Sections entered before the mark end first (`enter`): what they made is in the pool.
        while self.entered.fetch_add(0, Full) != 0 {
            fsleep(Delta::from_micros(100));
        }
        for key in 0..self.queue_keys() {
            let chan = self.queues.lock().remove(key);
            if let Some(chan) = chan {
                let gone = chan.quiesce(Gone::Unbound);
                chan.end_resident();
                self.give_back_rings(gone.range);
            }
        }
        self.completer.shutdown();
        // The queues let go of every hold: what their release workqueue frees (the mappings of
        // io_uring registered ranges, `buffer::Release`) is unmapped while the device is bound.
        crate::kfac::sched::ReleaseQueue::flush();
        // After the queues: no engine uses what the orphans hold, nor the buffers. The
        // coherent memory is freed now, while the device is bound; open files and mappings keep
        // only the records.
        if let Some(h2t) = h2t {
            h2t.shutdown();
        }
        self.patterns.shutdown();
        // No importer reaches the device memory (or the P2PDMA provider, which devres frees)
        // after this; the dma-bufs live on, revoked, until their last descriptor is closed.
        crate::kfac::dmabuf::dmabuf_revoke_all(self.pdev.as_ref());
        self.pool.shutdown();
    }
}

/// A section in which the device stays bound ([`UdmaDevice::enter`]); ends on drop.
pub(crate) struct Entered<'a> {
    dev: &'a UdmaDevice,
}

impl Entered<'_> {
    /// The device, bound while the section lasts.
    pub(crate) fn bound(&self) -> &kernel::device::Device<Bound> {
        // SAFETY: the section was entered while the device was alive (`enter` looked after its
        // fully ordered mark), and `shutdown`, which runs in the PCI unbind callback before the
        // device is unbound, waits for the mark to go (a fully ordered look after it cleared
        // `bound`): the device stays bound until this section ends, which the borrow bounds.
        unsafe { self.dev.pdev.as_ref().as_bound() }
    }
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        self.dev.entered.fetch_sub(1, Release);
    }
}
