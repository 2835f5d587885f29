// SPDX-License-Identifier: MIT OR Apache-2.0
//! User-space access to the `neuron_udma` driver (AWS Neuron UDMA, memory-to-memory DMA).
//!
//! The ABI is `include/uapi/linux/neuron_udma.h`; its structs and constants are generated from
//! the header by bindgen ([`sys`]). This crate wraps them in RAII types:
//!
//! * [`Device`]: one open `/dev/neuron_udmaN`. Everything below borrows it, so no buffer or queue
//!   can outlive the file it belongs to.
//! * [`HostBuffer`]: coherent host memory, mapped into the process (`Deref<Target = [u8]>`),
//!   unmapped and freed (`MEM_FREE`) on drop.
//! * [`DeviceBuffer`]: device memory (HBM), freed on drop.
//! * [`Imported`] / [`ImportedMut`]: the caller's own memory pinned for DMA (`MEM_IMPORT`,
//!   zero-copy), as source only or as source and destination. They borrow the slice for their
//!   life, so the borrow checker keeps the process from freeing (or, for [`ImportedMut`],
//!   touching) the memory while the device may reach it; freed (`MEM_FREE`) on drop.
//! * [`Queue`]: one (engine, queue) pair, released (`QUEUE_RELEASE`) on drop. ABI 3:
//!   [`Queue::submit`] starts what is prepared and returns a [`Fence`] at once; the fence is a
//!   value: [`Fence::is_done`] (`FENCE_STATUS`), [`Fence::wait`] (`FENCE_WAIT`), or
//!   [`Fence::completion`], a `Future` ([`DeviceEvents`]: the device file's readiness through
//!   a pluggable [`Readiness`]: [`ThreadReadiness`], or tokio's with the `tokio` feature).
//!   [`Device::queue_events`] (`QUEUE_EVENTS`) and [`QueueEventFd`] (`QUEUE_EVENTFD`) report
//!   completions as events.
//! * [`DmaBufImport`]: a dma-buf of another driver as a buffer of this file
//!   ([`Device::dmabuf_import`]); [`Device::dmabuf_export`] gives a device buffer as a dma-buf.
//! * [`usage`]: the driver's usage counters: [`Device::usage`] (this file's fdinfo,
//!   [`FileUsage`]), [`DeviceUsage`] (the device's sysfs group), [`usage::scan_processes`]
//!   (every process's device files, for `udmactl top`).
//! * [`Copy`](struct@Copy): one validated descriptor pair (at most `max_copy_size` of [`Info`]
//!   bytes, checked when it is prepared on a queue).
//!
//! The ABI's structs, constants and ioctl numbers come from the header; the device's limits
//! (copy size, ring sizes, batch size, host buffer size, engines, queues, host connectivity) come
//! from `NEURON_UDMA_INFO` at run time ([`Device::limits`]), so nothing here restates them.
//!
//! ```no_run
//! use neuron_udma::{Copy, Device};
//!
//! # fn main() -> neuron_udma::Result<()> {
//! let dev = Device::open_index(0)?;
//! let mut src = dev.alloc_host(4096)?;
//! let dst = dev.alloc_host(4096)?;
//! src.fill(0xA5);
//! let q = dev.queue(0, 1, 64)?;
//! q.prepare_one(&Copy::new(&src, 0, &dst, 0, 4096)?)?;
//! q.wait(None)?;
//! assert!(dst.iter().all(|&b| b == 0xA5));
//! # Ok(())
//! # }
//! ```
//!
//! Imported memory cannot be dropped, or written while the device may write it:
//!
//! ```compile_fail,E0505
//! let dev = neuron_udma::Device::open_index(0).unwrap();
//! let data = vec![0u8; 4096];
//! let imp = dev.import(&data).unwrap();
//! drop(data); // error: `data` is still borrowed by `imp`
//! drop(imp);
//! ```
//!
//! ```compile_fail,E0499
//! let dev = neuron_udma::Device::open_index(0).unwrap();
//! let mut data = vec![0u8; 4096];
//! let imp = dev.import_mut(&mut data).unwrap();
//! data[0] = 1; // error: `data` is mutably borrowed by `imp`
//! drop(imp);
//! ```
//!
//! Buffers and queues cannot outlive their device:
//!
//! ```compile_fail,E0505
//! let dev = neuron_udma::Device::open_index(0).unwrap();
//! let buf = dev.alloc_host(4096).unwrap();
//! drop(dev); // error: `dev` is still borrowed by `buf`
//! drop(buf);
//! ```

#![warn(missing_docs)]

mod error;
mod events;
mod fence;
pub mod metrics;
pub mod sys;
pub mod usage;

use std::fs::{File, OpenOptions};
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

pub use error::{errno_name, Error, Result};
#[cfg(feature = "tokio")]
pub use events::TokioReadiness;
pub use events::{DeviceEvents, FenceCompletion, Readiness, ThreadReadiness};
pub use fence::{
    EventFdRegistration, Fence, FenceId, FenceReport, FenceStatus, QueueEvent, QueueEventFd, RegisteredRange, UringCopy,
};
pub use usage::{DeviceActivity, DeviceUsage, FileUsage, UsageError};

/// Facts about a device and its driver (`NEURON_UDMA_INFO`).
pub type Info = sys::neuron_udma_info;

/// Registers and software indices of a queue (`NEURON_UDMA_QUEUE_STATE`).
pub type QueueState = sys::neuron_udma_queue_state;

/// Registers and software indices of one ring of a queue.
pub type RingState = sys::neuron_udma_ring_state;

/// Device generation (`neuron_udma_info.generation`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Generation {
    /// Trainium1 (0x7164) and Inferentia2 (0x7264).
    V2,
    /// Trainium2 (0x7364).
    V3,
    /// A generation this crate does not know.
    Unknown(u32),
}

impl sys::neuron_udma_info {
    /// The device generation.
    pub fn gen(&self) -> Generation {
        match self.generation {
            sys::NEURON_UDMA_GEN_V2 => Generation::V2,
            sys::NEURON_UDMA_GEN_V3 => Generation::V3,
            g => Generation::Unknown(g),
        }
    }

    /// The product the device is (`device_id` of INFO, hardware.rst §1.1): `"trn1"` (0x7164,
    /// Trainium1), `"inf2"` (0x7264, Inferentia2) or `"trn2"` (0x7364, Trainium2); `None` for
    /// another id.
    pub fn model(&self) -> Option<&'static str> {
        match self.device_id {
            0x7164 => Some("trn1"),
            0x7264 => Some("inf2"),
            0x7364 => Some("trn2"),
            _ => None,
        }
    }

    /// The engines that reach host memory (`host_engines` of INFO), ascending: the engines
    /// that can have user queues.
    pub fn host_engine_list(&self) -> Vec<u32> {
        (0..self.engines).filter(|&e| self.has_host_connectivity(e)).collect()
    }

    /// The driver's own host-DMA (H2T) queues on this generation: V2 engines 32 and 33 queue 0,
    /// V3 engines 128..=131 queues 0 and 1. `QUEUE_INIT` of them fails with `EBUSY`.
    pub fn h2t_queues(&self) -> &'static [(u32, u32)] {
        match self.gen() {
            Generation::V2 => &[(32, 0), (33, 0)],
            Generation::V3 => &[(128, 0), (128, 1), (129, 0), (129, 1), (130, 0), (130, 1), (131, 0), (131, 1)],
            Generation::Unknown(_) => &[],
        }
    }

    /// The queues the driver's in-kernel dmaengine provider holds when it registered `channels`
    /// channels (the `dma_channels` module parameter at probe; the channels are the PCI
    /// device's `dma/dma*chan*` entries in sysfs): the highest free queues of the last H2T
    /// engine (V2 engine 33, V3 engine 131), one per channel, at most 8. `QUEUE_INIT` of them
    /// fails with `EBUSY` while the device is bound.
    pub fn dmaengine_queues(&self, channels: u32) -> Vec<(u32, u32)> {
        const MAX_CHANNELS: usize = 8;
        let Some(&(engine, _)) = self.h2t_queues().last() else {
            return Vec::new();
        };
        (0..self.queues_per_engine)
            .rev()
            .filter(|&q| !self.is_reserved_queue(engine, q))
            .take((channels as usize).min(MAX_CHANNELS))
            .map(|q| (engine, q))
            .collect()
    }

    /// Whether `QUEUE_INIT` of (`engine`, `queue`) is refused with `EBUSY` because the queue is
    /// reserved (hardware.rst §2.4): the H2T queues, and the queues kept for the NeuronCores and
    /// collectives (V2: queue 15 of engines 0..32 and queue 14 of engines whose id % 16 < 11;
    /// V3: queue 14 of engines 0..128 whose id % 16 is 0..=4, 7 or 8). Engines 0..=3 with
    /// queues 1..=3 are free on every generation.
    pub fn is_reserved_queue(&self, engine: u32, queue: u32) -> bool {
        if self.h2t_queues().contains(&(engine, queue)) {
            return true;
        }
        match self.gen() {
            Generation::V2 => engine < 32 && (queue == 15 || (queue == 14 && engine % 16 < 11)),
            Generation::V3 => engine < 128 && queue == 14 && matches!(engine % 16, 0..=4 | 7 | 8),
            Generation::Unknown(_) => false,
        }
    }

    /// Whether `engine` reaches host memory (`host_engines` of `INFO`): user queues exist only
    /// on such engines (`QUEUE_INIT` of another is `EOPNOTSUPP`).
    pub fn has_host_connectivity(&self, engine: u32) -> bool {
        engine < self.engines
            && self
                .host_engines
                .get((engine / u64::BITS) as usize)
                .is_some_and(|w| (w >> (engine % u64::BITS)) & 1 == 1)
    }

    /// Whether the driver has ABI 3: fences ([`Queue::submit`]), events, `MEMSET`, dma-bufs,
    /// rings in device memory, mmap of device buffers.
    pub fn has_abi3(&self) -> bool {
        self.abi_version >= 3
    }

    /// Whether queues of `engine` may keep their rings in device memory
    /// (`device_ring_engines` of INFO, ABI 3; never on an older driver): [`QueueOptions::device_rings`].
    pub fn has_device_rings(&self, engine: u32) -> bool {
        engine < self.engines
            && self
                .device_ring_engines
                .get((engine / u64::BITS) as usize)
                .is_some_and(|w| (w >> (engine % u64::BITS)) & 1 == 1)
    }

    /// The engines whose queues may keep their rings in device memory, ascending.
    pub fn device_ring_engine_list(&self) -> Vec<u32> {
        (0..self.engines).filter(|&e| self.has_device_rings(e)).collect()
    }

    /// The lowest engine with host connectivity whose queues 1..=3 are free for user queues
    /// (V2: 0, V3: 4), or `None` if the device has none.
    pub fn user_engine(&self) -> Option<u32> {
        (0..self.engines).find(|&e| self.has_host_connectivity(e) && (1..=3).all(|q| !self.is_reserved_queue(e, q)))
    }

    /// The most copy pairs one `COPY_PREPARE` + `COPY_WAIT` round can hold on a ring of
    /// `ring_descs` descriptors: the ring minus its reserve minus the completion marker pair,
    /// capped at `max_batch`.
    pub fn pairs_per_round(&self, ring_descs: u32) -> u32 {
        ring_descs.saturating_sub(self.ring_reserve_descs).saturating_sub(1).min(self.max_batch).max(1)
    }
}

/// Bits `[23:0]` of a head, tail or length register of [`RingState`]: a slot index.
pub const RING_PTR_INDEX_MASK: u32 = (1 << 24) - 1;
/// Bits `[31:30]` of a head or tail register of [`RingState`]: the ring id.
pub const RING_PTR_ID_SHIFT: u32 = 30;

/// Index part (bits `[23:0]`) of a head or tail register.
pub fn ring_index(reg: u32) -> u32 {
    reg & RING_PTR_INDEX_MASK
}

/// Ring id part (bits `[31:30]`) of a head or tail register.
pub fn ring_id(reg: u32) -> u32 {
    reg >> RING_PTR_ID_SHIFT
}

/// Converts a wait timeout to the ABI's milliseconds (`None`: the driver's default, 10 s).
/// A non-zero timeout shorter than 1 ms is rounded up to 1 ms, so it never means "default".
pub fn timeout_ms(timeout: Option<Duration>) -> u32 {
    match timeout {
        None => 0,
        Some(d) => d.as_millis().clamp(1, u32::MAX as u128) as u32,
    }
}

/// Issues one ioctl with a pointer to `arg`; returns its non-negative return value (the pairs
/// written, for a `COPY_PREPARE*` with `NEURON_UDMA_COPY_SPLIT`; 0 otherwise).
fn ioctl_ret<T>(fd: RawFd, request: sys::IoctlRequest, arg: &mut T) -> Result<u32> {
    // SAFETY: every request of this ABI takes a pointer to a struct of type T, whose size is
    // encoded in the request number; `arg` is valid for reads and writes of that size.
    let rc = unsafe { libc::ioctl(fd, request, arg as *mut T) };
    // CAST: `rc` is not negative in the cast branch.
    if rc < 0 {
        Err(Error::last_os())
    } else {
        Ok(rc as u32)
    }
}

/// Issues one ioctl with a pointer to `arg`.
fn ioctl<T>(fd: RawFd, request: sys::IoctlRequest, arg: &mut T) -> Result<()> {
    ioctl_ret(fd, request, arg).map(|_| ())
}

/// The page size of the process, in bytes: the physically contiguous runs of an imported
/// buffer can only begin or end where a page of the caller's mapping does.
pub fn page_size() -> u64 {
    static PAGE: OnceLock<u64> = OnceLock::new();
    *PAGE.get_or_init(|| {
        // SAFETY: sysconf has no memory-safety preconditions.
        let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        u64::try_from(n).ok().filter(|&n| n.is_power_of_two()).unwrap_or(4096)
    })
}

/// How long dropping an imported buffer retries a `MEM_FREE` that is `EBUSY` after completing
/// this file's queues: a `MEMCPY` that timed out while still progressing goes on, and keeps
/// its buffers busy, until it is done.
const IMPORT_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// An open neuron_udma device file (`/dev/neuron_udmaN`). Every buffer and queue belongs to the
/// file that created it and is released when it is closed; the types of this crate borrow the
/// `Device`, so they are all dropped before it.
#[derive(Debug)]
pub struct Device {
    file: File,
    path: PathBuf,
    /// `NEURON_UDMA_INFO`, read on first use by [`Device::limits`].
    limits: OnceLock<Info>,
    /// The (engine, queue) of every live [`Queue`] of this file: what dropping an imported
    /// buffer completes (`COPY_WAIT`) when copies in flight still reach it.
    queues: Mutex<Vec<(u32, u32)>>,
}

impl Device {
    /// Opens a device file.
    ///
    /// ```no_run
    /// let dev = neuron_udma::Device::open("/dev/neuron_udma0")?;
    /// # Ok::<(), neuron_udma::Error>(())
    /// ```
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(&path)
            .map_err(|source| Error::Open { path: path.clone(), source })?;
        Ok(Device { file, path, limits: OnceLock::new(), queues: Mutex::new(Vec::new()) })
    }

    /// Opens a neuron_udma device node read-only: enough for [`Device::info`]; every call that
    /// allocates, starts DMA or changes a queue then fails with `EBADF` (the driver's rule for
    /// read-only files).
    pub fn open_read_only(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(&path)
            .map_err(|source| Error::Open { path: path.clone(), source })?;
        Ok(Device { file, path, limits: OnceLock::new(), queues: Mutex::new(Vec::new()) })
    }

    /// Opens `/dev/neuron_udma<n>`.
    ///
    /// ```no_run
    /// let dev = neuron_udma::Device::open_index(0)?;
    /// # Ok::<(), neuron_udma::Error>(())
    /// ```
    pub fn open_index(n: u32) -> Result<Self> {
        Self::open(format!("/dev/neuron_udma{n}"))
    }

    /// The path this device was opened with.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the device and driver facts (`NEURON_UDMA_INFO`).
    ///
    /// ```no_run
    /// let info = neuron_udma::Device::open_index(0)?.info()?;
    /// println!("{:#x}: {} engines, {} bytes of HBM", info.device_id, info.engines, info.device_mem_size);
    /// # Ok::<(), neuron_udma::Error>(())
    /// ```
    ///
    /// The struct has grown with ABI 3 (`max_buffers`, `max_queue_fences`,
    /// `device_ring_engines`), and its size is part of the command number. This asks with the
    /// ABI 3 size first; a driver older than ABI 3 answers that with `ENOTTY`, and the call is
    /// then repeated with the ABI 1/2 size ([`sys::NEURON_UDMA_INFO_SIZE_V2`], 88 bytes): the
    /// ABI 3 fields are 0 then. Only if that fails too is the error returned (`ENOTTY`: not a
    /// neuron_udma device).
    pub fn info(&self) -> Result<Info> {
        let mut info = Info::default();
        match ioctl(self.fd(), sys::NEURON_UDMA_INFO, &mut info) {
            Err(Error::Unsupported) => {
                let mut old = Info::default();
                // The driver writes only the first NEURON_UDMA_INFO_SIZE_V2 bytes, which the
                // request number encodes; `old` is larger, so the write stays inside it.
                ioctl(self.fd(), sys::NEURON_UDMA_INFO_V2, &mut old)?;
                Ok(old)
            }
            r => r.map(|()| info),
        }
    }

    /// The device's limits: `NEURON_UDMA_INFO`, read once and kept for the life of this
    /// `Device` (the driver's facts do not change while the device is bound). The checks this
    /// library makes before an ioctl use them. Errors: those of [`Device::info`] (e.g.
    /// [`Error::Unsupported`] for a file that is not a neuron_udma device).
    pub fn limits(&self) -> Result<&Info> {
        if let Some(info) = self.limits.get() {
            return Ok(info);
        }
        let info = self.info()?;
        Ok(self.limits.get_or_init(|| info))
    }

    fn alloc(&self, size: u64, kind: u32) -> Result<sys::neuron_udma_mem_alloc> {
        if size == 0 {
            return Err(Error::Argument("buffer size 0".into()));
        }
        if kind == sys::NEURON_UDMA_MEM_HOST {
            let max = self.limits()?.max_host_buffer;
            if size > max {
                return Err(Error::Argument(format!("host buffer of {size} bytes above max_host_buffer {max} (INFO)")));
            }
        }
        let mut arg = sys::neuron_udma_mem_alloc { size, type_: kind, ..Default::default() };
        ioctl(self.fd(), sys::NEURON_UDMA_MEM_ALLOC, &mut arg)?;
        Ok(arg)
    }

    fn free(&self, handle: u64) -> Result<()> {
        let mut arg = sys::neuron_udma_mem_free { handle, ..Default::default() };
        ioctl(self.fd(), sys::NEURON_UDMA_MEM_FREE, &mut arg)
    }

    /// Allocates `size` bytes of coherent host memory (rounded up to 4 KiB by the driver) and
    /// maps them into the process. [`Error::Argument`] (before the ioctl): a size of 0 or above
    /// `max_host_buffer` of [`Info`].
    ///
    /// ```no_run
    /// let dev = neuron_udma::Device::open_index(0)?;
    /// let mut buf = dev.alloc_host(1 << 20)?;
    /// buf[..5].copy_from_slice(b"hello");
    /// # Ok::<(), neuron_udma::Error>(())
    /// ```
    pub fn alloc_host(&self, size: u64) -> Result<HostBuffer<'_>> {
        let len = usize::try_from(size).map_err(|_| Error::Argument(format!("buffer size {size} too large")))?;
        let arg = self.alloc(size, sys::NEURON_UDMA_MEM_HOST)?;
        // SAFETY: the mapping is of driver-owned coherent memory that stays allocated at least
        // until MEM_FREE, which HostBuffer::drop issues only after unmapping it. Nothing else
        // in this process maps it mutably.
        let map = unsafe { memmap2::MmapOptions::new().offset(arg.mmap_offset).len(len).map_mut(&self.file) };
        match map {
            Ok(map) => Ok(HostBuffer { dev: self, handle: arg.handle, size, map: Some(map) }),
            Err(e) => {
                let _ = self.free(arg.handle);
                Err(e.into())
            }
        }
    }

    /// Allocates `size` bytes of device memory (HBM).
    ///
    /// ```no_run
    /// let dev = neuron_udma::Device::open_index(0)?;
    /// let hbm = dev.alloc_device(64 << 10)?;
    /// # Ok::<(), neuron_udma::Error>(())
    /// ```
    pub fn alloc_device(&self, size: u64) -> Result<DeviceBuffer<'_>> {
        let arg = self.alloc(size, sys::NEURON_UDMA_MEM_DEVICE)?;
        Ok(DeviceBuffer { dev: self, handle: arg.handle, size, mmap_offset: arg.mmap_offset })
    }

    /// Takes queue (`engine`, `queue`) with Tx and Rx rings of `ring_descs` descriptors each
    /// (a power of two from `min_ring_descs` to `max_ring_descs` of [`Info`]). Errors:
    /// [`Error::Argument`] for another ring size (checked before the ioctl), those of
    /// [`Device::limits`], and `QUEUE_INIT`'s (`EBUSY`: taken or reserved; `EOPNOTSUPP`: the
    /// engine does not reach host memory; `EINVAL`: no such engine or queue).
    ///
    /// ```no_run
    /// let dev = neuron_udma::Device::open_index(0)?;
    /// let q = dev.queue(0, 1, 4096)?;
    /// # Ok::<(), neuron_udma::Error>(())
    /// ```
    pub fn queue(&self, engine: u32, queue: u32, ring_descs: u32) -> Result<Queue<'_>> {
        self.queue_with_rings(engine, queue, ring_descs, ring_descs)
    }

    /// Like [`Device::queue`] with separate Tx and Rx ring sizes.
    pub fn queue_with_rings(&self, engine: u32, queue: u32, tx_descs: u32, rx_descs: u32) -> Result<Queue<'_>> {
        self.queue_with(engine, queue, QueueOptions { tx_descs, rx_descs, device_rings: false })
    }

    /// Takes queue (`engine`, `queue`) as `opts` says: ring sizes, and (ABI 3) whether the rings
    /// live in device memory (`NEURON_UDMA_QUEUE_DEVICE_RINGS`: then an engine without host
    /// connectivity can serve the queue, and its copies may only name device buffers; a copy
    /// from or to host memory fails in the engine with `EIO`). Errors: those of
    /// [`Device::queue`]; with `device_rings`, [`Error::Unsupported`] (before the ioctl) on a
    /// driver older than ABI 3 and [`Error::NotSupported`] from the driver when the device has
    /// no device memory ([`Info::has_device_rings`] says which engines can).
    ///
    /// ```no_run
    /// use neuron_udma::QueueOptions;
    /// let dev = neuron_udma::Device::open_index(0)?;
    /// let q = dev.queue_with(0, 1, QueueOptions::new(1024).device_rings(true))?;
    /// # Ok::<(), neuron_udma::Error>(())
    /// ```
    pub fn queue_with(&self, engine: u32, queue: u32, opts: QueueOptions) -> Result<Queue<'_>> {
        let QueueOptions { tx_descs, rx_descs, device_rings } = opts;
        for (name, n) in [("tx", tx_descs), ("rx", rx_descs)] {
            if !n.is_power_of_two() {
                return Err(Error::Argument(format!("{name} ring of {n} descriptors: not a power of two")));
            }
        }
        let info = self.limits()?;
        for (name, n) in [("tx", tx_descs), ("rx", rx_descs)] {
            if !(info.min_ring_descs..=info.max_ring_descs).contains(&n) {
                return Err(Error::Argument(format!(
                    "{name} ring of {n} descriptors: outside {}..={} (INFO)",
                    info.min_ring_descs, info.max_ring_descs
                )));
            }
        }
        if device_rings && !info.has_abi3() {
            // An ABI 1/2 driver would refuse the flag with EINVAL.
            return Err(Error::Unsupported);
        }
        let flags = if device_rings { sys::NEURON_UDMA_QUEUE_DEVICE_RINGS } else { 0 };
        let mut arg = sys::neuron_udma_queue_init { engine, queue, tx_descs, rx_descs, flags, ..Default::default() };
        ioctl(self.fd(), sys::NEURON_UDMA_QUEUE_INIT, &mut arg)?;
        self.queues.lock().unwrap_or_else(|e| e.into_inner()).push((engine, queue));
        Ok(Queue::new(self, engine, queue, opts))
    }

    /// Pins `size` bytes at `addr` (`MEM_IMPORT`) after the library's checks.
    fn import_raw(&self, addr: *const u8, size: usize, flags: u32) -> Result<Import<'_>> {
        if size == 0 {
            return Err(Error::Argument("import of 0 bytes".into()));
        }
        let max = self.limits()?.max_import_size;
        if max == 0 {
            // An ABI 1 driver: it has no MEM_IMPORT (it would answer ENOTTY).
            return Err(Error::Unsupported);
        }
        // CAST: usize is at most 64 bits on every Linux target.
        let size = size as u64;
        if size > max {
            return Err(Error::Argument(format!("import of {size} bytes above max_import_size {max} (INFO)")));
        }
        let mut arg = sys::neuron_udma_mem_import { addr: addr as u64, size, flags, ..Default::default() };
        ioctl(self.fd(), sys::NEURON_UDMA_MEM_IMPORT, &mut arg)?;
        Ok(Import { dev: self, handle: arg.handle, size, addr: arg.addr, segments: arg.segments })
    }

    /// Pins `buf` for DMA as a read-only source (`MEM_IMPORT` without `IMPORT_WRITE`): zero-copy,
    /// the device reads the caller's own pages. The handle borrows `buf` (the process may still
    /// read it, not change or free it) and can be the source of [`Device::memcpy`] and of every
    /// [`Copy`](struct@Copy); as a destination the driver refuses it with `EPERM`
    /// ([`Error::ReadOnly`]). The pages are charged to `RLIMIT_MEMLOCK`.
    ///
    /// Errors: [`Error::Argument`] (before the ioctl): an empty slice or one above
    /// `max_import_size` of [`Info`]; [`Error::Unsupported`]: a driver without `MEM_IMPORT`
    /// (ABI 1); [`Error::OutOfMemory`]: `RLIMIT_MEMLOCK` would be exceeded or no memory (nothing
    /// stays pinned); [`Error::NotSupported`]: memory that cannot be pinned long-term (some file
    /// mappings) or that the device reaches only through bounce buffers; [`Error::Fault`]: part
    /// of the range is not mapped.
    ///
    /// ```no_run
    /// let dev = neuron_udma::Device::open_index(0)?;
    /// let data = vec![7u8; 1 << 20];
    /// let src = dev.import(&data)?;
    /// let hbm = dev.alloc_device(1 << 20)?;
    /// dev.memcpy(&src, 0, &hbm, 0, 1 << 20, None)?;
    /// # Ok::<(), neuron_udma::Error>(())
    /// ```
    pub fn import<'a>(&'a self, buf: &'a [u8]) -> Result<Imported<'a>> {
        let inner = self.import_raw(buf.as_ptr(), buf.len(), 0)?;
        Ok(Imported { inner, _buf: PhantomData })
    }

    /// Pins `buf` for DMA as source and destination (`MEM_IMPORT` with `IMPORT_WRITE`). The
    /// handle borrows `buf` mutably: the process can neither read, write nor free it until the
    /// handle is dropped (which waits for the copies that still reach it, see [`ImportedMut`]),
    /// so it sees what the device wrote only then.
    ///
    /// Errors: those of [`Device::import`], and [`Error::Fault`] also for a read-only mapping
    /// (e.g. a file mapped with `PROT_READ`).
    ///
    /// ```no_run
    /// let dev = neuron_udma::Device::open_index(0)?;
    /// let hbm = dev.alloc_device(4096)?;
    /// let mut out = vec![0u8; 4096];
    /// let dst = dev.import_mut(&mut out)?;
    /// dev.memcpy(&hbm, 0, &dst, 0, 4096, None)?;
    /// drop(dst);
    /// println!("{:x?}", &out[..16]);
    /// # Ok::<(), neuron_udma::Error>(())
    /// ```
    pub fn import_mut<'a>(&'a self, buf: &'a mut [u8]) -> Result<ImportedMut<'a>> {
        let inner = self.import_raw(buf.as_mut_ptr(), buf.len(), sys::NEURON_UDMA_IMPORT_WRITE)?;
        Ok(ImportedMut { inner, _buf: PhantomData })
    }

    /// Frees an imported buffer so that no descriptor can reach it any more: `MEM_FREE`, and if
    /// that is `EBUSY` (copies in flight), `COPY_WAIT` on every queue of this file (which also
    /// starts what they have prepared), then `MEM_FREE` again until [`IMPORT_DRAIN_TIMEOUT`].
    fn free_drained(&self, handle: u64) -> Result<()> {
        match self.free(handle) {
            Err(Error::Busy) => {}
            r => return r,
        }
        let queues = self.queues.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for (engine, queue) in queues {
            let mut arg = sys::neuron_udma_copy_wait { engine, queue, ..Default::default() };
            // An error (ETIMEDOUT, EIO) reset the queue, which dropped its descriptors: either
            // way none of them reaches the buffer any more.
            let _ = ioctl(self.fd(), sys::NEURON_UDMA_COPY_WAIT, &mut arg);
        }
        let deadline = Instant::now() + IMPORT_DRAIN_TIMEOUT;
        loop {
            match self.free(handle) {
                Err(Error::Busy) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
                r => return r,
            }
        }
    }

    /// Copies `size` bytes (any size) with the driver's own queue and waits for completion
    /// (`NEURON_UDMA_MEMCPY`). `timeout` applies to each submission (`None`: 10 s). Either side
    /// may be imported ([`Device::import`]): the driver copies run by run, no flag needed;
    /// [`Error::ReadOnly`] for a destination imported read-only.
    ///
    /// ```no_run
    /// let dev = neuron_udma::Device::open_index(0)?;
    /// let src = dev.alloc_host(1 << 20)?;
    /// let hbm = dev.alloc_device(1 << 20)?;
    /// dev.memcpy(&src, 0, &hbm, 0, 1 << 20, None)?;
    /// # Ok::<(), neuron_udma::Error>(())
    /// ```
    pub fn memcpy(
        &self,
        src: &dyn Buffer,
        src_offset: u64,
        dst: &dyn Buffer,
        dst_offset: u64,
        size: u64,
        timeout: Option<Duration>,
    ) -> Result<()> {
        if size == 0 {
            return Err(Error::Argument("memcpy of 0 bytes".into()));
        }
        check_range("source", src.size(), src_offset, size)?;
        check_range("destination", dst.size(), dst_offset, size)?;
        let mut arg = sys::neuron_udma_memcpy {
            src_handle: src.handle(),
            src_offset,
            dst_handle: dst.handle(),
            dst_offset,
            size,
            timeout_ms: timeout_ms(timeout),
            ..Default::default()
        };
        ioctl(self.fd(), sys::NEURON_UDMA_MEMCPY, &mut arg)
    }

    /// Fills `size` bytes of `buf` at `offset` with `value` through the engine, on the driver's
    /// shared queue (`NEURON_UDMA_MEMSET`, ABI 3), and waits for it; `timeout` as for
    /// [`Device::memcpy`]. `buf` is a host or device buffer, or one imported writable
    /// ([`Error::ReadOnly`] otherwise). Errors: [`Error::Argument`] (before the ioctl) for a size
    /// of 0 or a range beyond the buffer; [`Error::Unsupported`] on a driver older than ABI 3;
    /// [`Error::TimedOut`], [`Error::EngineError`], [`Error::Interrupted`] (SIGKILL).
    ///
    /// ```no_run
    /// let dev = neuron_udma::Device::open_index(0)?;
    /// let hbm = dev.alloc_device(1 << 20)?;
    /// dev.memset(&hbm, 0, 1 << 20, 0, None)?;
    /// # Ok::<(), neuron_udma::Error>(())
    /// ```
    pub fn memset(&self, buf: &dyn Buffer, offset: u64, size: u64, value: u8, timeout: Option<Duration>) -> Result<()> {
        if size == 0 {
            return Err(Error::Argument("memset of 0 bytes".into()));
        }
        check_range("memset", buf.size(), offset, size)?;
        let mut arg = sys::neuron_udma_memset {
            handle: buf.handle(),
            offset,
            size,
            value: value.into(),
            timeout_ms: timeout_ms(timeout),
        };
        ioctl(self.fd(), sys::NEURON_UDMA_MEMSET, &mut arg)
    }

    /// Exports the device buffer `buf` as a dma-buf (`NEURON_UDMA_DMABUF_EXPORT`, ABI 3, with
    /// `O_CLOEXEC`): other devices' drivers can DMA from and to that range of device memory.
    /// The buffer cannot be freed while any fd of the dma-buf is open (`MEM_FREE` is `EBUSY`:
    /// dropping the [`DeviceBuffer`] then leaves it to the file's close); at unbind every
    /// importer's mapping is revoked. Errors: [`Error::NotFound`], [`Error::TooMany`] (no free
    /// file descriptor), [`Error::Unsupported`] (a driver older than ABI 3).
    ///
    /// ```no_run
    /// let dev = neuron_udma::Device::open_index(0)?;
    /// let hbm = dev.alloc_device(1 << 20)?;
    /// let fd: std::os::fd::OwnedFd = dev.dmabuf_export(&hbm)?;
    /// # Ok::<(), neuron_udma::Error>(())
    /// ```
    pub fn dmabuf_export(&self, buf: &DeviceBuffer<'_>) -> Result<OwnedFd> {
        if !std::ptr::eq(buf.dev, self) {
            return Err(Error::Argument("the buffer belongs to another device file".into()));
        }
        let mut arg =
            sys::neuron_udma_dmabuf_export { handle: buf.handle, flags: libc::O_CLOEXEC as u32, ..Default::default() };
        ioctl(self.fd(), sys::NEURON_UDMA_DMABUF_EXPORT, &mut arg)?;
        if arg.fd < 0 {
            return Err(Error::Other(libc::EPROTO));
        }
        // SAFETY: the driver installed a new fd for the dma-buf and gave it to us: we own it.
        Ok(unsafe { OwnedFd::from_raw_fd(arg.fd) })
    }

    /// Imports the dma-buf `fd` of any exporter as a buffer of this file
    /// (`NEURON_UDMA_DMABUF_IMPORT`, ABI 3), usable as the source of copies (as destination
    /// the driver refuses it with `EPERM`: use [`Device::dmabuf_import_writable`]). The driver
    /// keeps its own reference: `fd` may be closed after the call. Errors: [`Error::BadFd`]
    /// (not a dma-buf), [`Error::NotSupported`] (the exporter's memory is not reachable by this
    /// device), [`Error::OutOfMemory`], [`Error::TooMany`] (`max_buffers`),
    /// [`Error::Unsupported`] (a driver older than ABI 3).
    pub fn dmabuf_import(&self, fd: BorrowedFd<'_>) -> Result<DmaBufImport<'_>> {
        self.dmabuf_import_flags(fd, 0)
    }

    /// Like [`Device::dmabuf_import`], with `NEURON_UDMA_IMPORT_WRITE`: the engine may also
    /// write the buffer (copy destination, [`Device::memset`]).
    pub fn dmabuf_import_writable(&self, fd: BorrowedFd<'_>) -> Result<DmaBufImport<'_>> {
        self.dmabuf_import_flags(fd, sys::NEURON_UDMA_IMPORT_WRITE)
    }

    fn dmabuf_import_flags(&self, fd: BorrowedFd<'_>, flags: u32) -> Result<DmaBufImport<'_>> {
        let mut arg = sys::neuron_udma_dmabuf_import { fd: fd.as_raw_fd(), flags, ..Default::default() };
        ioctl(self.fd(), sys::NEURON_UDMA_DMABUF_IMPORT, &mut arg)?;
        Ok(DmaBufImport {
            dev: self,
            handle: arg.handle,
            size: arg.size,
            segments: arg.segments,
            writable: flags & sys::NEURON_UDMA_IMPORT_WRITE != 0,
        })
    }

    /// Issues a raw ioctl of this ABI on the device file. For tests and tools that need to
    /// send what the safe API refuses to build.
    ///
    /// # Safety
    ///
    /// `arg` must be the struct type the request encodes, and its pointers (`copies` of
    /// `COPY_PREPARE`) must be valid for the sizes they claim.
    pub unsafe fn raw_ioctl<T>(&self, request: sys::IoctlRequest, arg: &mut T) -> Result<()> {
        ioctl(self.fd(), request, arg)
    }

    fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}

impl AsRawFd for Device {
    fn as_raw_fd(&self) -> RawFd {
        self.fd()
    }
}

/// The device file, for `poll(2)` / epoll: readable (`EPOLLIN`) while a queue of the file has
/// completed fences not reported by [`Device::queue_events`] yet, `EPOLLPRI | EPOLLERR` while one
/// has a failure not reported yet (ABI 3).
impl AsFd for Device {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

fn check_range(what: &str, buf_size: u64, offset: u64, size: u64) -> Result<()> {
    match offset.checked_add(size) {
        Some(end) if end <= buf_size => Ok(()),
        _ => {
            Err(Error::Argument(format!("{what} range {offset:#x}+{size:#x} beyond the buffer of {buf_size:#x} bytes")))
        }
    }
}

/// A buffer of a device file: host or device memory, or imported user memory, named by its
/// handle.
pub trait Buffer {
    /// The driver's handle of the buffer.
    fn handle(&self) -> u64;
    /// The size requested at allocation (or imported), in bytes.
    fn size(&self) -> u64;
    /// For an imported buffer: where it lies in the process and how many physically contiguous
    /// runs it has (a copy crossing from one to the next takes one pair per piece). `None` for
    /// driver-allocated buffers, which are contiguous.
    fn import_layout(&self) -> Option<ImportLayout> {
        None
    }
}

/// Where an imported buffer lies: its user address and its physically contiguous runs
/// (`segments` of `MEM_IMPORT`). Runs begin and end only at page boundaries of the user address
/// (or at the buffer's ends).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImportLayout {
    /// User address of the buffer's byte 0.
    pub addr: u64,
    /// Physically contiguous runs (at least 1).
    pub segments: u32,
}

impl ImportLayout {
    /// The most run boundaries `size` bytes at `offset` can cross: the page boundaries strictly
    /// inside the range, at most `segments - 1`.
    pub fn max_crossings(&self, offset: u64, size: u64) -> u64 {
        if size == 0 {
            return 0;
        }
        let page = page_size();
        let start = self.addr.saturating_add(offset);
        let last = start.saturating_add(size - 1);
        (last / page - start / page).min(u64::from(self.segments.saturating_sub(1)))
    }
}

/// Coherent host memory of a device file, mapped into the process. Dereferences to its bytes.
/// Dropping it unmaps and frees it (`MEM_FREE`; an error there, such as `EBUSY` for copies
/// still in flight, is ignored: the file's close frees it then). Use [`HostBuffer::free`] to
/// see that error.
///
/// The device writes these bytes behind the compiler's back when a copy targets the buffer:
/// read them only after that copy's [`Queue::wait`] (or [`Device::memcpy`]) returned.
#[derive(Debug)]
pub struct HostBuffer<'d> {
    dev: &'d Device,
    handle: u64,
    size: u64,
    map: Option<memmap2::MmapMut>,
}

impl HostBuffer<'_> {
    /// The bytes of the buffer.
    pub fn as_slice(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }

    /// The bytes of the buffer, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.map.as_deref_mut().unwrap_or(&mut [])
    }

    /// Unmaps and frees the buffer, reporting a `MEM_FREE` error (e.g. [`Error::Busy`]).
    pub fn free(mut self) -> Result<()> {
        self.map = None;
        let r = self.dev.free(self.handle);
        self.handle = 0;
        r
    }
}

impl Buffer for HostBuffer<'_> {
    fn handle(&self) -> u64 {
        self.handle
    }
    fn size(&self) -> u64 {
        self.size
    }
}

impl Deref for HostBuffer<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl DerefMut for HostBuffer<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

impl Drop for HostBuffer<'_> {
    fn drop(&mut self) {
        self.map = None;
        if self.handle != 0 {
            let _ = self.dev.free(self.handle);
        }
    }
}

/// Device memory (HBM) of a device file, freed (`MEM_FREE`) on drop. Reach it with copies, or
/// (ABI 3) map it for small CPU reads and writes with [`DeviceBuffer::map`].
#[derive(Debug)]
pub struct DeviceBuffer<'d> {
    dev: &'d Device,
    handle: u64,
    size: u64,
    /// Where `mmap()` finds it: non-zero from an ABI 3 driver, 0 (not mappable) before.
    mmap_offset: u64,
}

impl DeviceBuffer<'_> {
    /// Maps the buffer into the process (ABI 3: write-combined through BAR4, for small CPU
    /// reads and writes: every CPU access crosses PCIe, reads are slow). The mapping borrows
    /// the buffer and is unmapped on drop. As with [`HostBuffer`], the engine writes these bytes
    /// behind the compiler's back: read them only after the copies that write them completed.
    /// Errors: [`Error::Unsupported`] when the driver gave no mmap offset (older than ABI 3);
    /// the errors of `mmap(2)`.
    ///
    /// ```no_run
    /// let dev = neuron_udma::Device::open_index(0)?;
    /// let hbm = dev.alloc_device(4096)?;
    /// let mut m = hbm.map()?;
    /// m[..4].copy_from_slice(b"abcd");
    /// # Ok::<(), neuron_udma::Error>(())
    /// ```
    pub fn map(&self) -> Result<DeviceMapping<'_>> {
        if self.mmap_offset == 0 {
            return Err(Error::Unsupported);
        }
        let len = usize::try_from(self.size).map_err(|_| Error::Argument("buffer too large to map".into()))?;
        // SAFETY: the mapping is of device memory the driver keeps allocated until MEM_FREE,
        // which this buffer issues only on drop, after every mapping that borrows it is gone.
        let map = unsafe { memmap2::MmapOptions::new().offset(self.mmap_offset).len(len).map_mut(&self.dev.file) }?;
        Ok(DeviceMapping { map, _buf: PhantomData })
    }

    /// Frees the buffer, reporting a `MEM_FREE` error (e.g. [`Error::Busy`]).
    pub fn free(mut self) -> Result<()> {
        let r = self.dev.free(self.handle);
        self.handle = 0;
        r
    }
}

impl Buffer for DeviceBuffer<'_> {
    fn handle(&self) -> u64 {
        self.handle
    }
    fn size(&self) -> u64 {
        self.size
    }
}

impl Drop for DeviceBuffer<'_> {
    fn drop(&mut self) {
        if self.handle != 0 {
            let _ = self.dev.free(self.handle);
        }
    }
}

/// A device buffer mapped into the process ([`DeviceBuffer::map`]), unmapped on drop.
/// Dereferences to its bytes.
#[derive(Debug)]
pub struct DeviceMapping<'b> {
    map: memmap2::MmapMut,
    _buf: PhantomData<&'b DeviceBuffer<'b>>,
}

impl Deref for DeviceMapping<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.map
    }
}

impl DerefMut for DeviceMapping<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.map
    }
}

/// A dma-buf of another exporter imported as a buffer of this file
/// ([`Device::dmabuf_import`], ABI 3). A copy source, and with
/// [`Device::dmabuf_import_writable`] a destination. Its physically contiguous runs
/// ([`DmaBufImport::segments`]) split copies as an imported buffer's do ([`Copy::new`] sets
/// `NEURON_UDMA_COPY_SPLIT`; [`Copy::max_pairs`] counts its runs as beginning at page
/// boundaries of the buffer's offsets).
///
/// Dropping it frees it (`MEM_FREE`); one that is `EBUSY` (copies still reach it) is handled as
/// for [`Imported`]: this file's queues are completed first, and a remaining error is ignored
/// (the file's close frees it).
#[derive(Debug)]
pub struct DmaBufImport<'d> {
    dev: &'d Device,
    handle: u64,
    size: u64,
    segments: u32,
    writable: bool,
}

impl DmaBufImport<'_> {
    /// Physically contiguous runs of the buffer (`segments` of `DMABUF_IMPORT`).
    pub fn segments(&self) -> u32 {
        self.segments
    }

    /// Whether it was imported writable (`NEURON_UDMA_IMPORT_WRITE`).
    pub fn writable(&self) -> bool {
        self.writable
    }

    /// Frees the buffer as drop does, reporting the `MEM_FREE` error.
    pub fn free(mut self) -> Result<()> {
        let r = self.dev.free_drained(self.handle);
        self.handle = 0;
        r
    }
}

impl Buffer for DmaBufImport<'_> {
    fn handle(&self) -> u64 {
        self.handle
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn import_layout(&self) -> Option<ImportLayout> {
        Some(ImportLayout { addr: 0, segments: self.segments })
    }
}

impl Drop for DmaBufImport<'_> {
    fn drop(&mut self) {
        if self.handle != 0 {
            let _ = self.dev.free_drained(self.handle);
        }
    }
}

/// The handle of an imported buffer, shared by [`Imported`] and [`ImportedMut`].
#[derive(Debug)]
struct Import<'d> {
    dev: &'d Device,
    handle: u64,
    size: u64,
    addr: u64,
    segments: u32,
}

impl Import<'_> {
    fn layout(&self) -> ImportLayout {
        ImportLayout { addr: self.addr, segments: self.segments }
    }
}

/// The caller's memory pinned read-only for DMA ([`Device::import`]): the source of copies,
/// never their destination (`EPERM`). It borrows the slice for its whole life; the process may
/// keep reading the slice meanwhile.
///
/// Dropping it frees it (`MEM_FREE`). A `MEM_FREE` that is `EBUSY` (a copy prepared or in
/// flight still reads it) is handled as for the other buffer types, except that the library
/// first completes this file's queues (`COPY_WAIT` on each, which starts what they have
/// prepared) and retries, so that what the device reads is still the slice's content; if it
/// still fails, the error is ignored and the pages stay pinned (read-only for the device) until
/// the file is closed. [`Imported::free`] reports that error instead.
#[derive(Debug)]
pub struct Imported<'a> {
    inner: Import<'a>,
    _buf: PhantomData<&'a [u8]>,
}

impl Imported<'_> {
    /// Frees the buffer as drop does, reporting the `MEM_FREE` error (e.g. [`Error::Busy`]
    /// after the wait on this file's queues).
    pub fn free(mut self) -> Result<()> {
        let r = self.inner.dev.free_drained(self.inner.handle);
        self.inner.handle = 0;
        r
    }
}

/// What both kinds of import share: the `Buffer` view and the run count, from their `Import`.
macro_rules! impl_import {
    ($($t:ident),*) => {$(
        impl $t<'_> {
            /// Physically contiguous runs of the pinned range (`segments` of `MEM_IMPORT`).
            pub fn segments(&self) -> u32 {
                self.inner.segments
            }
        }

        impl Buffer for $t<'_> {
            fn handle(&self) -> u64 {
                self.inner.handle
            }
            fn size(&self) -> u64 {
                self.inner.size
            }
            fn import_layout(&self) -> Option<ImportLayout> {
                Some(self.inner.layout())
            }
        }
    )*};
}

impl_import!(Imported, ImportedMut);

impl Drop for Imported<'_> {
    fn drop(&mut self) {
        if self.inner.handle != 0 {
            let _ = self.inner.dev.free_drained(self.inner.handle);
        }
    }
}

/// The caller's memory pinned for DMA as source and destination ([`Device::import_mut`]). It
/// borrows the slice mutably for its whole life: the process reads what the device wrote after
/// dropping it.
///
/// Dropping it frees it (`MEM_FREE`). A `MEM_FREE` that is `EBUSY` (a copy prepared or in flight
/// still reaches it) cannot be ignored as for the other buffer types: once the borrow ends the
/// process owns the memory again, and the device must not write it then. So the library first
/// completes this file's queues (`COPY_WAIT` on each, which starts what they have prepared) and
/// retries `MEM_FREE` for up to 30 s (a `MEMCPY` that timed out while progressing); if the
/// buffer is still busy then, the process is aborted. Wait for your copies before dropping it
/// (or use [`ImportedMut::try_free`], which gives the handle back on an error). Leaking it
/// (`std::mem::forget`) leaves the pages pinned, and writable by copies built before, until the
/// file is closed.
#[derive(Debug)]
pub struct ImportedMut<'a> {
    inner: Import<'a>,
    _buf: PhantomData<&'a mut [u8]>,
}

impl<'a> ImportedMut<'a> {
    /// One `MEM_FREE`, without waiting: on an error (e.g. [`Error::Busy`]: copies in flight;
    /// wait for them and try again) the handle comes back with it, still borrowing the slice.
    pub fn try_free(mut self) -> std::result::Result<(), (Self, Error)> {
        match self.inner.dev.free(self.inner.handle) {
            Ok(()) => {
                self.inner.handle = 0;
                Ok(())
            }
            Err(e) => Err((self, e)),
        }
    }
}

impl Drop for ImportedMut<'_> {
    fn drop(&mut self) {
        if self.inner.handle == 0 {
            return;
        }
        if let Err(Error::Busy) = self.inner.dev.free_drained(self.inner.handle) {
            // The device may still write memory the borrow checker is about to hand back.
            eprintln!(
                "neuron_udma: imported buffer {:#x} still busy after waiting for every queue; aborting",
                self.inner.handle
            );
            std::process::abort();
        }
    }
}

/// Barrier mode of a copy, as in the hardware's Tx descriptor.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Barrier {
    /// No barrier.
    #[default]
    None,
    /// Wait for all earlier transfers of the queue (DMB).
    Dmb,
    /// Make this copy's writes visible before later ones.
    Write,
}

impl Barrier {
    fn raw(self) -> u32 {
        match self {
            Barrier::None => sys::NEURON_UDMA_BARRIER_NONE,
            Barrier::Dmb => sys::NEURON_UDMA_BARRIER_DMB,
            Barrier::Write => sys::NEURON_UDMA_BARRIER_WRITE,
        }
    }
}

/// One copy (one descriptor pair, or with an imported side one per physically contiguous piece):
/// `size` bytes from (buffer, offset) to (buffer, offset). Built with [`Copy::new`], which checks
/// that the size is not 0 and both ranges; [`Queue::prepare`] and [`Queue::prepare_one`] check
/// the size against the device's `max_copy_size`. A `Copy` the kernel refuses can only come
/// from [`Copy::from_raw`], a freed buffer or a read-only import as destination.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(transparent)]
pub struct Copy(sys::neuron_udma_copy);

impl Copy {
    /// A copy of `size` bytes from `src` at `src_offset` to `dst` at `dst_offset`. When either
    /// side is imported, the copy has `NEURON_UDMA_COPY_SPLIT`: the driver writes one pair per
    /// physically contiguous piece (at most [`Copy::max_pairs`]) and [`Queue::prepare`] returns
    /// how many. Errors: [`Error::Argument`] for a size of 0 or a range beyond its buffer.
    ///
    /// ```no_run
    /// # let dev = neuron_udma::Device::open_index(0)?;
    /// # let (a, b) = (dev.alloc_host(8192)?, dev.alloc_device(8192)?);
    /// use neuron_udma::{Barrier, Copy};
    /// let c = Copy::new(&a, 4096, &b, 0, 4096)?.barrier(Barrier::Dmb);
    /// # Ok::<(), neuron_udma::Error>(())
    /// ```
    pub fn new<S, D>(src: &S, src_offset: u64, dst: &D, dst_offset: u64, size: u32) -> Result<Self>
    where
        S: Buffer + ?Sized,
        D: Buffer + ?Sized,
    {
        if size == 0 {
            return Err(Error::Argument("copy size 0".into()));
        }
        check_range("source", src.size(), src_offset, size.into())?;
        check_range("destination", dst.size(), dst_offset, size.into())?;
        let split = src.import_layout().is_some() || dst.import_layout().is_some();
        Ok(Copy(sys::neuron_udma_copy {
            src_handle: src.handle(),
            src_offset,
            dst_handle: dst.handle(),
            dst_offset,
            size,
            flags: if split { sys::NEURON_UDMA_COPY_SPLIT } else { 0 },
            ..Default::default()
        }))
    }

    /// The most descriptor pairs the copy [`Copy::new`] builds from the same arguments can take
    /// on a ring: 1, plus one per run boundary of an imported side it may cross
    /// ([`ImportLayout::max_crossings`]). Budget ring space with it; the driver returns the
    /// exact count when it prepares the copy.
    pub fn max_pairs<S, D>(src: &S, src_offset: u64, dst: &D, dst_offset: u64, size: u32) -> u32
    where
        S: Buffer + ?Sized,
        D: Buffer + ?Sized,
    {
        let cross = |b: Option<ImportLayout>, off: u64| b.map_or(0, |l| l.max_crossings(off, size.into()));
        // CAST: each side crosses at most one boundary per page of a copy of at most 4 GiB.
        (1 + cross(src.import_layout(), src_offset) + cross(dst.import_layout(), dst_offset)).min(u32::MAX.into())
            as u32
    }

    /// Sets the barrier mode.
    pub fn barrier(mut self, barrier: Barrier) -> Self {
        self.0.barrier = barrier.raw();
        self
    }

    /// Sets or clears the interrupt flag on the Rx descriptor (`NEURON_UDMA_COPY_DST_INT`).
    /// ABI 1 and 2 only: an ABI 3 driver refuses the flag (`EINVAL`); completions are reported
    /// by fences and their events there.
    pub fn dst_interrupt(mut self, on: bool) -> Self {
        if on {
            self.0.flags |= sys::NEURON_UDMA_COPY_DST_INT;
        } else {
            self.0.flags &= !sys::NEURON_UDMA_COPY_DST_INT;
        }
        self
    }

    /// Wraps a raw copy without any check (for tests of the driver's own checks).
    pub fn from_raw(raw: sys::neuron_udma_copy) -> Self {
        Copy(raw)
    }

    /// The raw ABI struct.
    pub fn raw(&self) -> &sys::neuron_udma_copy {
        &self.0
    }

    /// Size in bytes.
    pub fn size(&self) -> u32 {
        self.0.size
    }
}

/// One (engine, queue) of a device file, with its Tx and Rx rings. Released (`QUEUE_RELEASE`)
/// on drop. Copies go: [`Queue::prepare`] (or [`Queue::prepare_one`]), optionally
/// [`Queue::start`], then [`Queue::wait`], which starts what is left and frees the ring space.
///
/// ```no_run
/// # let dev = neuron_udma::Device::open_index(0)?;
/// # let (src, dst) = (dev.alloc_host(4 << 20)?, dev.alloc_device(4 << 20)?);
/// use neuron_udma::Copy;
/// let q = dev.queue(1, 2, 64)?;
/// let max = u64::from(dev.limits()?.max_copy_size);
/// let copies = (0..16u64)
///     .map(|i| Copy::new(&src, i * max, &dst, i * max, max as u32))
///     .collect::<Result<Vec<_>, _>>()?;
/// q.prepare(&copies)?;
/// let completed = q.wait(None)?; // 16 pairs + the marker
/// # Ok::<(), neuron_udma::Error>(())
/// ```
#[derive(Debug)]
pub struct Queue<'d> {
    dev: &'d Device,
    engine: u32,
    queue: u32,
    tx_descs: u32,
    rx_descs: u32,
    device_rings: bool,
    /// An [`EventFdRegistration`] of this queue is alive (a queue has at most one eventfd).
    eventfd: AtomicBool,
}

/// How [`Device::queue_with`] takes a queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueOptions {
    /// Descriptors of the Tx (m2s) ring: a power of two from `min_ring_descs` to
    /// `max_ring_descs` of [`Info`].
    pub tx_descs: u32,
    /// Descriptors of the Rx (s2m) ring.
    pub rx_descs: u32,
    /// ABI 3: the rings live in device memory (`NEURON_UDMA_QUEUE_DEVICE_RINGS`).
    pub device_rings: bool,
}

impl QueueOptions {
    /// Tx and Rx rings of `ring_descs` descriptors each, in host memory.
    pub fn new(ring_descs: u32) -> Self {
        QueueOptions { tx_descs: ring_descs, rx_descs: ring_descs, device_rings: false }
    }

    /// Whether the rings live in device memory (`NEURON_UDMA_QUEUE_DEVICE_RINGS`, ABI 3).
    pub fn device_rings(mut self, on: bool) -> Self {
        self.device_rings = on;
        self
    }
}

impl<'d> Queue<'d> {
    fn new(dev: &'d Device, engine: u32, queue: u32, opts: QueueOptions) -> Self {
        Queue {
            dev,
            engine,
            queue,
            tx_descs: opts.tx_descs,
            rx_descs: opts.rx_descs,
            device_rings: opts.device_rings,
            eventfd: AtomicBool::new(false),
        }
    }

    /// Whether the queue's rings live in device memory ([`QueueOptions::device_rings`]).
    pub fn device_rings(&self) -> bool {
        self.device_rings
    }

    /// The engine id.
    pub fn engine(&self) -> u32 {
        self.engine
    }

    /// The queue id within the engine.
    pub fn queue(&self) -> u32 {
        self.queue
    }

    /// Tx and Rx ring sizes in descriptors.
    pub fn ring_descs(&self) -> (u32, u32) {
        (self.tx_descs, self.rx_descs)
    }

    /// The device this queue belongs to.
    pub fn device(&self) -> &'d Device {
        self.dev
    }

    /// Checks the sizes of `copies` against the device's `max_copy_size` ([`Device::limits`]).
    fn check_sizes(&self, copies: &[Copy]) -> Result<()> {
        let max = self.dev.limits()?.max_copy_size;
        match copies.iter().position(|c| c.size() > max) {
            Some(i) => {
                Err(Error::Argument(format!("copy {i}: size {} above max_copy_size {max} (INFO)", copies[i].size())))
            }
            None => Ok(()),
        }
    }

    /// Writes one copy (`COPY_PREPARE_ONE`) and returns the descriptor pairs it took: 1, or with
    /// an imported side one per physically contiguous piece (give that count to
    /// [`Queue::start`]). [`Error::Argument`]: a size above `max_copy_size`;
    /// [`Error::RingFull`]: no room for all its pairs, nothing written; [`Error::ReadOnly`]:
    /// the destination is imported read-only; [`Error::CrossesRun`]: a copy from
    /// [`Copy::from_raw`] without `NEURON_UDMA_COPY_SPLIT` crosses a run of an imported buffer.
    pub fn prepare_one(&self, copy: &Copy) -> Result<u32> {
        self.check_sizes(std::slice::from_ref(copy))?;
        let mut arg = sys::neuron_udma_copy_prepare_one { engine: self.engine, queue: self.queue, copy: copy.0 };
        let pairs = ioctl_ret(self.dev.fd(), sys::NEURON_UDMA_COPY_PREPARE_ONE, &mut arg)?;
        // Without COPY_SPLIT the driver returns 0 for its one pair.
        Ok(pairs.max(1))
    }

    /// Writes the pairs of `copies` (`COPY_PREPARE`): all or nothing. Returns the descriptor
    /// pairs written: `copies.len()`, or more when copies with an imported side were split at
    /// run boundaries (the counts to give [`Queue::start`]). [`Error::Argument`] (before the
    /// ioctl): an empty batch, more than `max_batch` of [`Info`] entries, or a size above
    /// `max_copy_size`. Kernel errors as [`Queue::prepare_one`].
    pub fn prepare(&self, copies: &[Copy]) -> Result<u32> {
        if copies.is_empty() {
            return Err(Error::Argument("empty batch".into()));
        }
        let max_batch = self.dev.limits()?.max_batch;
        let count = u32::try_from(copies.len()).ok().filter(|&n| n <= max_batch).ok_or_else(|| {
            Error::Argument(format!("batch of {} copies above max_batch {max_batch} (INFO)", copies.len()))
        })?;
        self.check_sizes(copies)?;
        let mut arg = sys::neuron_udma_copy_prepare {
            engine: self.engine,
            queue: self.queue,
            count,
            copies: copies.as_ptr() as u64,
            ..Default::default()
        };
        let pairs = ioctl_ret(self.dev.fd(), sys::NEURON_UDMA_COPY_PREPARE, &mut arg)?;
        // Without any COPY_SPLIT entry the driver returns 0 for its `count` pairs.
        Ok(pairs.max(count))
    }

    /// Rings the doorbells (`COPY_START`): Rx += `s2m_count`, then Tx += `m2s_count`
    /// descriptors. Each prepared pair is one descriptor on each ring (a split copy is several,
    /// as [`Queue::prepare`] returned).
    pub fn start(&self, m2s_count: u32, s2m_count: u32) -> Result<()> {
        let mut arg = sys::neuron_udma_copy_start {
            engine: self.engine,
            queue: self.queue,
            m2s_count,
            s2m_count,
            ..Default::default()
        };
        ioctl(self.dev.fd(), sys::NEURON_UDMA_COPY_START, &mut arg)
    }

    /// Starts everything prepared, appends a completion marker and waits for it
    /// (`COPY_WAIT`; `None`: 10 s). Returns the descriptor pairs freed, marker included.
    pub fn wait(&self, timeout: Option<Duration>) -> Result<u64> {
        let mut arg = sys::neuron_udma_copy_wait {
            engine: self.engine,
            queue: self.queue,
            timeout_ms: timeout_ms(timeout),
            ..Default::default()
        };
        ioctl(self.dev.fd(), sys::NEURON_UDMA_COPY_WAIT, &mut arg)?;
        Ok(arg.completed)
    }

    /// Reads the queue's registers and software indices (`QUEUE_STATE`).
    pub fn state(&self) -> Result<QueueState> {
        let mut arg = QueueState { engine: self.engine, queue: self.queue, ..Default::default() };
        ioctl(self.dev.fd(), sys::NEURON_UDMA_QUEUE_STATE, &mut arg)?;
        Ok(arg)
    }

    /// Gives the queue back, reporting a `QUEUE_RELEASE` error.
    pub fn release(self) -> Result<()> {
        let r = self.release_raw();
        std::mem::forget(self);
        r
    }

    fn release_raw(&self) -> Result<()> {
        let mut arg = sys::neuron_udma_queue_id { engine: self.engine, queue: self.queue, ..Default::default() };
        let r = ioctl(self.dev.fd(), sys::NEURON_UDMA_QUEUE_RELEASE, &mut arg);
        let mut queues = self.dev.queues.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = queues.iter().position(|&q| q == (self.engine, self.queue)) {
            queues.swap_remove(i);
        }
        r
    }
}

/// Streams batches of copies through two queues of one device so that the engine always has
/// work: each [`Pipeline::submit`] first waits for the batch submitted two calls before on the
/// same queue, then prepares and starts the new batch, so the preparation of one batch and the
/// wait for the other overlap with the engine's work (Documentation/userspace-api.rst,
/// "Streaming"). Copies of different batches may complete in any order; [`Pipeline::finish`]
/// waits for all of them.
pub struct Pipeline<'q, 'd> {
    queues: [&'q Queue<'d>; 2],
    /// The batch in flight on each queue: its fence (ABI 3), or 0 for one started without
    /// (an older driver).
    in_flight: [Option<u64>; 2],
    /// Whether batches go with a fence (`COPY_SUBMIT`, ABI 3).
    fences: bool,
    next: usize,
    timeout: Option<Duration>,
}

impl<'q, 'd> Pipeline<'q, 'd> {
    /// A pipeline over queues `a` and `b` (two different queues of the same device).
    /// [`Error::Argument`]: the same queue twice, or queues of two devices.
    pub fn new(a: &'q Queue<'d>, b: &'q Queue<'d>, timeout: Option<Duration>) -> Result<Self> {
        if !std::ptr::eq(a.dev, b.dev) || (a.engine, a.queue) == (b.engine, b.queue) {
            return Err(Error::Argument("a pipeline needs two different queues of one device".into()));
        }
        let fences = a.dev.limits()?.has_abi3();
        Ok(Self { queues: [a, b], in_flight: [None; 2], fences, next: 0, timeout })
    }

    /// Most descriptor pairs one [`Self::submit`] takes: what the smaller ring of either queue
    /// holds in one round, from [`Info::pairs_per_round`]. Without imported buffers every copy
    /// is one pair; with them, budget [`Copy::max_pairs`] per copy.
    pub fn batch_len(&self) -> Result<usize> {
        let info = self.queues[0].dev.limits()?;
        let descs = self.queues.iter().map(|q| q.tx_descs.min(q.rx_descs)).min().unwrap_or(0);
        Ok(info.pairs_per_round(descs) as usize)
    }

    /// Waits for the older batch of the next queue (if any), then prepares `copies` there and
    /// submits them: with their fence in one doorbell (`COPY_SUBMIT`, ABI 3), or on an older
    /// driver started (as many pairs as [`Queue::prepare`] wrote) and later waited for with
    /// `COPY_WAIT`, which rings again for its marker. Errors: those of [`Fence::wait`] or
    /// [`Queue::wait`], [`Queue::prepare`], [`Queue::submit`] and [`Queue::start`]; after an
    /// error the pipeline waits for nothing more (call [`Self::finish`] to collect the other
    /// queue's batch).
    pub fn submit(&mut self, copies: &[Copy]) -> Result<()> {
        let i = self.next;
        let q = self.queues[i];
        if let Some(f) = self.in_flight[i].take() {
            self.wait(q, f)?;
        }
        let pairs = q.prepare(copies)?;
        self.in_flight[i] = Some(if self.fences {
            q.submit()?.number()
        } else {
            q.start(pairs, pairs)?;
            0
        });
        self.next ^= 1;
        Ok(())
    }

    /// Waits for the batch of `q` in flight, of fence `fence` (0: none, `COPY_WAIT`).
    fn wait(&self, q: &Queue<'d>, fence: u64) -> Result<()> {
        if fence == 0 {
            q.wait(self.timeout).map(|_| ())
        } else {
            q.fence(fence).wait(self.timeout)
        }
    }

    /// Waits for every batch in flight (oldest first).
    pub fn finish(&mut self) -> Result<()> {
        for k in 0..2 {
            let i = (self.next + k) % 2;
            if let Some(f) = self.in_flight[i].take() {
                self.wait(self.queues[i], f)?;
            }
        }
        Ok(())
    }
}

impl Drop for Queue<'_> {
    fn drop(&mut self) {
        let _ = self.release_raw();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    struct Fake(u64, u64);
    impl Buffer for Fake {
        fn handle(&self) -> u64 {
            self.0
        }
        fn size(&self) -> u64 {
            self.1
        }
    }

    /// An imported buffer as the library sees it: handle, size and layout.
    struct FakeImport(u64, u64, ImportLayout);
    impl Buffer for FakeImport {
        fn handle(&self) -> u64 {
            self.0
        }
        fn size(&self) -> u64 {
            self.1
        }
        fn import_layout(&self) -> Option<ImportLayout> {
            Some(self.2)
        }
    }

    #[test]
    fn run_crossings_are_page_boundaries_inside_the_range() {
        let p = page_size();
        let l = ImportLayout { addr: 10 * p + 1, segments: 1000 };
        // Up to the end of the first page: no boundary inside.
        assert_eq!(l.max_crossings(0, p - 1), 0);
        // One byte more ends on the next page.
        assert_eq!(l.max_crossings(0, p), 1);
        assert_eq!(l.max_crossings(p - 2, 1), 0);
        assert_eq!(l.max_crossings(p - 2, 2), 1);
        // Starting on a boundary is not crossing it.
        assert_eq!(l.max_crossings(p - 1, p), 0);
        assert_eq!(l.max_crossings(0, 3 * p + 5), 3);
        assert_eq!(l.max_crossings(5, 0), 0);
        // Page-aligned: 16 pages of 64 KiB at 4 KiB pages cross 15 boundaries.
        let a = ImportLayout { addr: 4 * p, segments: 1000 };
        assert_eq!(a.max_crossings(0, 16 * p), 15);
        // Never more than the runs allow.
        let few = ImportLayout { addr: 4 * p, segments: 3 };
        assert_eq!(few.max_crossings(0, 16 * p), 2);
        let one = ImportLayout { addr: 1, segments: 1 };
        assert_eq!(one.max_crossings(0, 16 * p), 0);
    }

    #[test]
    fn copies_with_an_imported_side_split() {
        let p = page_size();
        let plain = Fake(1, 1 << 20);
        let src = FakeImport(2, 1 << 20, ImportLayout { addr: 0x10_0000 + 3, segments: 300 });
        let dst = FakeImport(3, 1 << 20, ImportLayout { addr: 0x80_0000, segments: 2 });
        assert_eq!(Copy::new(&plain, 0, &plain, 4096, 4096).unwrap().raw().flags, 0);
        let c = Copy::new(&src, 0, &plain, 0, 4096).unwrap().dst_interrupt(true);
        assert_eq!(c.raw().flags, sys::NEURON_UDMA_COPY_SPLIT | sys::NEURON_UDMA_COPY_DST_INT);
        assert_eq!(c.dst_interrupt(false).raw().flags, sys::NEURON_UDMA_COPY_SPLIT);
        assert_eq!(Copy::new(&plain, 0, &dst, 0, 1).unwrap().raw().flags, sys::NEURON_UDMA_COPY_SPLIT);
        assert_eq!(Copy::max_pairs(&plain, 0, &plain, 7, 65536), 1);
        // The source starts 3 bytes into a page: p - 3 bytes stay in it.
        assert_eq!(Copy::max_pairs(&src, 0, &plain, 0, (p - 3) as u32), 1);
        assert_eq!(Copy::max_pairs(&src, 0, &plain, 0, (p - 2) as u32), 2);
        // Both sides cross: source 16 page boundaries, destination at most its 1.
        assert_eq!(Copy::max_pairs(&src, 0, &dst, 0, 65536), 1 + 16 + 1);
        assert_eq!(Copy::max_pairs(&plain, 0, &dst, 0, 65536), 2);
        assert_eq!(Copy::max_pairs(&plain, 0, &dst, 0, p as u32), 1);
        assert!(matches!(Copy::new(&src, (1 << 20) - 1, &plain, 0, 2), Err(Error::Argument(_))));
    }

    #[test]
    fn import_checks_before_the_ioctl() {
        let data = vec![0u8; 8192];
        let mut out = vec![0u8; 8192];
        // An ABI 1 driver reports max_import_size 0: no MEM_IMPORT.
        let old = fake_device(Info { abi_version: 1, ..Default::default() });
        assert!(matches!(old.import(&data), Err(Error::Unsupported)));
        let dev = fake_device(Info { abi_version: 2, max_import_size: 4096, ..Default::default() });
        assert!(matches!(dev.import(&data[..0]), Err(Error::Argument(_))));
        assert!(matches!(dev.import(&data), Err(Error::Argument(_))));
        assert!(matches!(dev.import_mut(&mut out), Err(Error::Argument(_))));
        // /dev/null does not know MEM_IMPORT: the ioctl is issued and says ENOTTY.
        assert!(matches!(dev.import(&data[..4096]), Err(Error::Unsupported)));
        assert!(matches!(dev.import_mut(&mut out[1..4097]), Err(Error::Unsupported)));
        // The slices are usable again: the failed imports borrowed nothing.
        out[0] = 1;
        assert_eq!(out[0] + data[0], 1);
    }

    #[test]
    fn queues_are_registered_for_the_import_drain() {
        let dev = fake_device(Info::default());
        let q = Queue::new(&dev, 4, 2, QueueOptions::new(64));
        dev.queues.lock().unwrap().push((4, 2));
        // QUEUE_RELEASE fails on /dev/null, but the queue is gone from the list either way.
        assert!(matches!(q.release(), Err(Error::Unsupported)));
        assert!(dev.queues.lock().unwrap().is_empty());
        // MEM_FREE of an import on /dev/null: not EBUSY, so no drain and the error comes back.
        let imp = Imported { inner: Import { dev: &dev, handle: 9, size: 1, addr: 0, segments: 1 }, _buf: PhantomData };
        assert!(matches!(imp.free(), Err(Error::Unsupported)));
        let imp =
            ImportedMut { inner: Import { dev: &dev, handle: 9, size: 1, addr: 0, segments: 1 }, _buf: PhantomData };
        let (imp, e) = imp.try_free().unwrap_err();
        assert!(matches!(e, Error::Unsupported));
        assert_eq!((imp.handle(), imp.segments()), (9, 1));
        // Dropping it: MEM_FREE fails with ENOTTY, not EBUSY: no abort.
        drop(imp);
    }

    #[test]
    fn struct_sizes_match_c() {
        assert_eq!(size_of::<sys::neuron_udma_info>(), 152);
        assert_eq!(size_of::<sys::neuron_udma_mem_import>(), 48);
        assert_eq!(size_of::<sys::neuron_udma_mem_alloc>(), 48);
        assert_eq!(size_of::<sys::neuron_udma_mem_free>(), 16);
        assert_eq!(size_of::<sys::neuron_udma_queue_init>(), 40);
        assert_eq!(size_of::<sys::neuron_udma_queue_id>(), 16);
        assert_eq!(size_of::<sys::neuron_udma_copy>(), 48);
        assert_eq!(size_of::<sys::neuron_udma_copy_prepare_one>(), 56);
        assert_eq!(size_of::<sys::neuron_udma_copy_prepare>(), 24);
        assert_eq!(size_of::<sys::neuron_udma_copy_start>(), 24);
        assert_eq!(size_of::<sys::neuron_udma_copy_wait>(), 24);
        assert_eq!(size_of::<sys::neuron_udma_queue_state>(), 128);
        assert_eq!(size_of::<sys::neuron_udma_memcpy>(), 48);
        assert_eq!(size_of::<Copy>(), size_of::<sys::neuron_udma_copy>());
        assert_eq!(core::mem::align_of::<Copy>(), 8);
        // ABI 3.
        assert_eq!(size_of::<sys::neuron_udma_copy_submit>(), 24);
        assert_eq!(size_of::<sys::neuron_udma_fence_status>(), 40);
        assert_eq!(size_of::<sys::neuron_udma_fence_wait>(), 24);
        assert_eq!(size_of::<sys::neuron_udma_queue_event>(), 32);
        assert_eq!(size_of::<sys::neuron_udma_events>(), 16);
        assert_eq!(size_of::<sys::neuron_udma_eventfd>(), 16);
        assert_eq!(size_of::<sys::neuron_udma_uring_copy>(), 16);
        assert_eq!(size_of::<sys::neuron_udma_memset>(), 32);
        assert_eq!(size_of::<sys::neuron_udma_dmabuf_export>(), 24);
        assert_eq!(size_of::<sys::neuron_udma_dmabuf_import>(), 32);
        assert_eq!(size_of::<QueueEvent>(), size_of::<sys::neuron_udma_queue_event>());
    }

    #[test]
    fn abi3_field_offsets() {
        use core::mem::offset_of;
        // INFO grew at its end: an ABI 2 caller's 88 bytes are the same fields.
        assert_eq!(offset_of!(sys::neuron_udma_info, max_import_size), 80);
        assert_eq!(offset_of!(sys::neuron_udma_info, max_buffers), 88);
        assert_eq!(offset_of!(sys::neuron_udma_info, max_queue_fences), 92);
        assert_eq!(offset_of!(sys::neuron_udma_info, device_ring_engines), 96);
        assert_eq!(offset_of!(sys::neuron_udma_info, numa_node), 120);
        assert_eq!(offset_of!(sys::neuron_udma_info, reserved), 128);
        assert_eq!(sys::NEURON_UDMA_INFO_SIZE_V2, 88);
        assert_eq!(offset_of!(sys::neuron_udma_copy_submit, fence), 16);
        assert_eq!(offset_of!(sys::neuron_udma_fence_status, fence), 8);
        assert_eq!(offset_of!(sys::neuron_udma_fence_status, state), 16);
        assert_eq!(offset_of!(sys::neuron_udma_fence_status, error), 20);
        assert_eq!(offset_of!(sys::neuron_udma_fence_status, completed), 24);
        assert_eq!(offset_of!(sys::neuron_udma_fence_status, submitted), 32);
        assert_eq!(offset_of!(sys::neuron_udma_fence_wait, timeout_ms), 16);
        assert_eq!(offset_of!(sys::neuron_udma_queue_event, error), 12);
        assert_eq!(offset_of!(sys::neuron_udma_queue_event, completed), 16);
        assert_eq!(offset_of!(sys::neuron_udma_queue_event, failed), 24);
        assert_eq!(offset_of!(sys::neuron_udma_events, max), 8);
        assert_eq!(offset_of!(sys::neuron_udma_events, count), 12);
        assert_eq!(offset_of!(sys::neuron_udma_eventfd, fd), 8);
        assert_eq!(offset_of!(sys::neuron_udma_uring_copy, queue), 2);
        assert_eq!(offset_of!(sys::neuron_udma_uring_copy, count), 4);
        assert_eq!(offset_of!(sys::neuron_udma_uring_copy, copies), 8);
        assert_eq!(offset_of!(sys::neuron_udma_memset, value), 24);
        assert_eq!(offset_of!(sys::neuron_udma_memset, timeout_ms), 28);
        assert_eq!(offset_of!(sys::neuron_udma_dmabuf_export, flags), 8);
        assert_eq!(offset_of!(sys::neuron_udma_dmabuf_export, fd), 12);
        assert_eq!(offset_of!(sys::neuron_udma_dmabuf_import, handle), 8);
        assert_eq!(offset_of!(sys::neuron_udma_dmabuf_import, size), 16);
        assert_eq!(offset_of!(sys::neuron_udma_dmabuf_import, segments), 24);
        assert_eq!(offset_of!(sys::neuron_udma_queue_init, flags), 16);
    }

    #[test]
    fn header_constants() {
        assert_eq!(sys::NEURON_UDMA_ABI_VERSION, 3);
        assert_eq!(sys::NEURON_UDMA_QUEUE_DEVICE_RINGS, 1);
        assert_eq!(
            (
                sys::NEURON_UDMA_FENCE_PENDING,
                sys::NEURON_UDMA_FENCE_DONE,
                sys::NEURON_UDMA_FENCE_FAILED,
                sys::NEURON_UDMA_FENCE_EXPIRED
            ),
            (0, 1, 2, 3)
        );
        assert_eq!((sys::NEURON_UDMA_EVENT_COMPLETED, sys::NEURON_UDMA_EVENT_FAILED), (1, 2));
        assert_eq!((sys::NEURON_UDMA_IMPORT_WRITE, sys::NEURON_UDMA_COPY_SPLIT), (1, 2));
        assert_eq!(sys::NEURON_UDMA_IOC_MAGIC, 0xB9);
        assert_eq!((sys::NEURON_UDMA_GEN_V2, sys::NEURON_UDMA_GEN_V3), (2, 3));
        assert_eq!((sys::NEURON_UDMA_MEM_HOST, sys::NEURON_UDMA_MEM_DEVICE), (0, 1));
        assert_eq!(sys::NEURON_UDMA_COPY_DST_INT, 1);
        assert_eq!(Barrier::Write.raw(), 2);
    }

    #[test]
    #[allow(clippy::unnecessary_cast)] // ioctl_num_type is not u64 on every libc
    fn ioctl_numbers() {
        // By hand: dir << 30 | size << 16 | 0xB9 << 8 | nr, _IOR = 2, _IOW = 1, _IOWR = 3.
        let want: [(sys::IoctlRequest, u32); 21] = [
            (sys::NEURON_UDMA_INFO, 0x8098_B900),
            (sys::NEURON_UDMA_INFO_V2, 0x8058_B900),
            (sys::NEURON_UDMA_MEM_ALLOC, 0xC030_B901),
            (sys::NEURON_UDMA_MEM_FREE, 0x4010_B902),
            (sys::NEURON_UDMA_QUEUE_INIT, 0x4028_B903),
            (sys::NEURON_UDMA_QUEUE_RELEASE, 0x4010_B904),
            (sys::NEURON_UDMA_COPY_PREPARE_ONE, 0x4038_B905),
            (sys::NEURON_UDMA_COPY_PREPARE, 0x4018_B906),
            (sys::NEURON_UDMA_COPY_START, 0x4018_B907),
            (sys::NEURON_UDMA_COPY_WAIT, 0xC018_B908),
            (sys::NEURON_UDMA_QUEUE_STATE, 0xC080_B909),
            (sys::NEURON_UDMA_MEMCPY, 0x4030_B90A),
            (sys::NEURON_UDMA_MEM_IMPORT, 0xC030_B90B),
            (sys::NEURON_UDMA_COPY_SUBMIT, 0xC018_B90C),
            (sys::NEURON_UDMA_FENCE_STATUS, 0xC028_B90D),
            (sys::NEURON_UDMA_FENCE_WAIT, 0x4018_B90E),
            (sys::NEURON_UDMA_QUEUE_EVENTS, 0xC010_B90F),
            (sys::NEURON_UDMA_QUEUE_EVENTFD, 0x4010_B910),
            (sys::NEURON_UDMA_MEMSET, 0x4020_B911),
            (sys::NEURON_UDMA_DMABUF_EXPORT, 0xC018_B912),
            (sys::NEURON_UDMA_DMABUF_IMPORT, 0xC020_B913),
        ];
        for (i, (got, want)) in want.iter().enumerate() {
            assert_eq!(*got as u64, *want as u64, "ioctl {i}: {got:#x} != {want:#x}");
        }
        assert_eq!(sys::NEURON_UDMA_URING_COPY, 0x4010_B920);
    }

    #[test]
    fn errno_mapping_round_trips() {
        let cases = [
            (libc::EINVAL, "EINVAL"),
            (libc::ENOENT, "ENOENT"),
            (libc::ERANGE, "ERANGE"),
            (libc::ENOSPC, "ENOSPC"),
            (libc::EBUSY, "EBUSY"),
            (libc::ETIMEDOUT, "ETIMEDOUT"),
            (libc::EIO, "EIO"),
            (libc::ENODEV, "ENODEV"),
            (libc::EFAULT, "EFAULT"),
            (libc::ENOTTY, "ENOTTY"),
            (libc::EINTR, "EINTR"),
            (libc::ENOMEM, "ENOMEM"),
            (libc::EPERM, "EPERM"),
            (libc::EXDEV, "EXDEV"),
            (libc::EOPNOTSUPP, "EOPNOTSUPP"),
            (libc::ESTALE, "ESTALE"),
            (libc::EMFILE, "EMFILE"),
            (libc::EBADF, "EBADF"),
            (libc::E2BIG, "E2BIG"),
            (libc::EDQUOT, "EDQUOT"),
        ];
        for (errno, name) in cases {
            let e = Error::from_errno(errno);
            assert!(!matches!(e, Error::Other(_)), "{name} not mapped");
            assert_eq!(e.errno(), errno);
            assert!(e.to_string().contains(name), "{e} does not name {name}");
            assert_eq!(errno_name(errno), name);
        }
        assert!(matches!(Error::from_errno(libc::ESTALE), Error::Expired));
        assert_eq!(errno_name(9999), "errno 9999");
        // A failed fence: EIO as FENCE_WAIT says it, with the driver's reason in the message.
        let f = Error::FenceFailed { engine: 4, queue: 2, fence: 17, error: libc::ETIMEDOUT };
        assert_eq!(f.errno(), libc::EIO);
        assert_eq!(
            f.to_string(),
            "fence 17 of queue 4/2 failed: the queue made no progress for 10 s and was reset (ETIMEDOUT)"
        );
        let f = Error::FenceFailed { engine: 0, queue: 1, fence: 3, error: libc::EIO };
        assert!(f.to_string().ends_with("an engine error; the queue was reset (EIO)"), "{f}");
        assert!(matches!(Error::from_errno(libc::ENOENT), Error::NotFound));
        assert!(matches!(Error::from_errno(libc::ENOSPC), Error::RingFull));
        assert!(matches!(Error::from_errno(libc::EIO), Error::EngineError));
        assert!(matches!(Error::from_errno(libc::ENOTTY), Error::Unsupported));
        assert!(matches!(Error::from_errno(libc::EPERM), Error::ReadOnly));
        assert!(matches!(Error::from_errno(libc::EXDEV), Error::CrossesRun));
        let other = Error::from_errno(libc::EAGAIN);
        assert!(matches!(other, Error::Other(libc::EAGAIN)));
        assert_eq!(other.errno(), libc::EAGAIN);
        assert_eq!(Error::Argument("x".into()).errno(), libc::EINVAL);
    }

    #[test]
    fn copy_builder_checks_size_and_ranges() {
        let a = Fake(1, 1 << 20);
        let b = Fake(2, 8192);
        assert!(matches!(Copy::new(&a, 0, &b, 0, 0), Err(Error::Argument(_))));
        assert!(matches!(Copy::new(&a, 0, &b, 1, 8192), Err(Error::Argument(_))));
        assert!(matches!(Copy::new(&a, (1 << 20) - 1, &b, 0, 2), Err(Error::Argument(_))));
        assert!(matches!(Copy::new(&a, u64::MAX, &b, 0, 1), Err(Error::Argument(_))));
        let c = Copy::new(&a, 3, &a, 65539, 65536).unwrap();
        assert_eq!(
            *c.raw(),
            sys::neuron_udma_copy {
                src_handle: 1,
                src_offset: 3,
                dst_handle: 1,
                dst_offset: 65539,
                size: 65536,
                ..Default::default()
            }
        );
        let c = Copy::new(&a, 0, &b, 8191, 1).unwrap().barrier(Barrier::Dmb).dst_interrupt(true);
        assert_eq!((c.raw().barrier, c.raw().flags, c.raw().reserved), (1, 1, 0));
        assert_eq!(c.dst_interrupt(false).raw().flags, 0);
    }

    #[test]
    fn timeouts_and_ring_fields() {
        assert_eq!(timeout_ms(None), 0);
        assert_eq!(timeout_ms(Some(Duration::from_micros(10))), 1);
        assert_eq!(timeout_ms(Some(Duration::from_secs(3))), 3000);
        assert_eq!(timeout_ms(Some(Duration::from_secs(u64::MAX))), u32::MAX);
        assert_eq!(ring_index(0x4000_0123), 0x123);
        assert_eq!(ring_id(0x4000_0123), 1);
        assert_eq!(ring_id(0xC0FF_FFFF), 3);
        assert_eq!(ring_index(0xC0FF_FFFF), 0xFF_FFFF);
    }

    #[test]
    fn info_helpers() {
        let mut info = Info { generation: 2, ring_reserve_descs: 16, max_batch: 4096, ..Default::default() };
        assert_eq!(info.gen(), Generation::V2);
        assert!(info.is_reserved_queue(32, 0) && info.is_reserved_queue(33, 0));
        assert!(info.is_reserved_queue(3, 14) && info.is_reserved_queue(12, 15));
        assert!(!info.is_reserved_queue(32, 1) && !info.is_reserved_queue(12, 14));
        assert_eq!(info.pairs_per_round(32), 15);
        assert_eq!(info.pairs_per_round(4096), 4079);
        info.max_batch = 2032;
        assert_eq!(info.pairs_per_round(4096), 2032);
        info.generation = 3;
        assert!(info.is_reserved_queue(128, 0) && info.is_reserved_queue(129, 1));
        assert!(info.is_reserved_queue(7, 14) && !info.is_reserved_queue(5, 14));
        assert!(!info.is_reserved_queue(129, 2) && !info.is_reserved_queue(3, 15));
        for e in 0..4 {
            for q in 1..4 {
                assert!(!info.is_reserved_queue(e, q));
            }
        }
        // V3 host connectivity as the driver reports it: engines 4-7 of each 8, and 128-131.
        info.engines = 132;
        info.host_engines = [0xF0F0_F0F0_F0F0_F0F0, 0xF0F0_F0F0_F0F0_F0F0, 0xF];
        assert!(!info.has_host_connectivity(0) && info.has_host_connectivity(4));
        assert!(info.has_host_connectivity(131) && !info.has_host_connectivity(132));
        assert_eq!(info.user_engine(), Some(4));
        info.host_engines = [0; 3];
        assert_eq!(info.user_engine(), None);
        // The dmaengine provider's queues: the highest free queues of the last H2T engine.
        info.queues_per_engine = 16;
        assert_eq!(info.dmaengine_queues(4), [(131, 15), (131, 14), (131, 13), (131, 12)]);
        assert_eq!(info.dmaengine_queues(100).len(), 8);
        assert!(info.dmaengine_queues(0).is_empty());
        info.generation = 2;
        assert_eq!(info.dmaengine_queues(2), [(33, 15), (33, 14)]);
        assert_eq!(info.dmaengine_queues(16).last(), Some(&(33, 8)));
        info.generation = 9;
        assert!(info.dmaengine_queues(4).is_empty());
        info.generation = 9;
        assert_eq!(info.gen(), Generation::Unknown(9));
    }

    #[test]
    fn models_and_host_engine_list() {
        let mut info = Info { device_id: 0x7164, engines: 34, host_engines: [u64::MAX, 0x3, 0], ..Default::default() };
        assert_eq!(info.model(), Some("trn1"));
        assert_eq!(info.host_engine_list(), (0..34).collect::<Vec<_>>());
        info.device_id = 0x7264;
        assert_eq!(info.model(), Some("inf2"));
        info.device_id = 0x7364;
        assert_eq!(info.model(), Some("trn2"));
        info.engines = 132;
        info.host_engines = [0xF0F0_F0F0_F0F0_F0F0, 0xF0F0_F0F0_F0F0_F0F0, 0xF];
        let list = info.host_engine_list();
        assert_eq!(list.len(), 68);
        assert_eq!(&list[..5], &[4, 5, 6, 7, 12]);
        assert_eq!(&list[64..], &[128, 129, 130, 131]);
        info.device_id = 0x7064;
        assert_eq!(info.model(), None);
    }

    /// /dev/null posing as a device whose INFO says `info`: every ioctl fails with ENOTTY, so
    /// an `Error::Argument` can only come from the library's own checks against `info`.
    fn fake_device(info: Info) -> Device {
        let dev = Device::open("/dev/null").unwrap();
        dev.limits.set(info).unwrap();
        dev
    }

    #[test]
    fn limits_come_from_info() {
        let info = Info {
            max_copy_size: 4096,
            min_ring_descs: 64,
            max_ring_descs: 256,
            max_batch: 2,
            max_host_buffer: 1 << 20,
            ..Default::default()
        };
        let dev = fake_device(info);
        assert_eq!(*dev.limits().unwrap(), info);
        assert!(matches!(dev.queue(0, 1, 32), Err(Error::Argument(_))));
        assert!(matches!(dev.queue_with_rings(0, 1, 64, 512), Err(Error::Argument(_))));
        assert!(matches!(dev.queue(0, 1, 64), Err(Error::Unsupported)));
        assert!(matches!(dev.queue(0, 1, 256), Err(Error::Unsupported)));
        assert!(matches!(dev.alloc_host((1 << 20) + 1), Err(Error::Argument(_))));
        assert!(matches!(dev.alloc_host(1 << 20), Err(Error::Unsupported)));
        let q = Queue::new(&dev, 0, 1, QueueOptions::new(64));
        let buf = Fake(1, 1 << 20);
        let (ok, big) = (Copy::new(&buf, 0, &buf, 8192, 4096).unwrap(), Copy::new(&buf, 0, &buf, 8192, 4097).unwrap());
        assert!(matches!(q.prepare_one(&big), Err(Error::Argument(_))));
        assert!(matches!(q.prepare_one(&ok), Err(Error::Unsupported)));
        assert!(matches!(q.prepare(&[ok, big]), Err(Error::Argument(_))));
        assert!(matches!(q.prepare(&[ok, ok, ok]), Err(Error::Argument(_))));
        assert!(matches!(q.prepare(&[ok, ok]), Err(Error::Unsupported)));
    }

    #[test]
    fn open_errors_and_foreign_files() {
        let e = Device::open("/nonexistent/neuron_udma0").unwrap_err();
        assert!(matches!(e, Error::Open { .. }));
        assert_eq!(e.errno(), libc::ENOENT);
        assert!(e.to_string().contains("/nonexistent/neuron_udma0"));
        // /dev/null knows no ioctl: the ioctl path must report ENOTTY as Unsupported.
        let dev = Device::open("/dev/null").unwrap();
        assert!(matches!(dev.info(), Err(Error::Unsupported)));
        assert!(matches!(dev.alloc_device(4096), Err(Error::Unsupported)));
        assert!(matches!(dev.alloc_host(0), Err(Error::Argument(_))));
        assert!(matches!(dev.queue(0, 1, 48), Err(Error::Argument(_))));
        // The ring size range comes from INFO, which /dev/null does not answer.
        assert!(matches!(dev.queue(0, 1, 16), Err(Error::Unsupported)));
        assert!(matches!(dev.queue(0, 1, 64), Err(Error::Unsupported)));
        let a = Fake(1, 4096);
        assert!(matches!(dev.memcpy(&a, 0, &a, 0, 0, None), Err(Error::Argument(_))));
        assert!(matches!(dev.memcpy(&a, 1, &a, 0, 4096, None), Err(Error::Argument(_))));
        assert!(matches!(dev.memcpy(&a, 0, &a, 0, 4096, None), Err(Error::Unsupported)));
    }
}
