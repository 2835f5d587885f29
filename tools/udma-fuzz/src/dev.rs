// SPDX-License-Identifier: GPL-2.0
//! Raw access to the device for the fuzzer: the ioctls with their errno (no typed wrapper, so
//! that invalid arguments reach the driver as they are), host-buffer mappings, and the device
//! model's fault window (BAR2 of `tools/udma-sim`, `Documentation/udma-sim.rst`).

use neuron_udma::sys;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

/// An errno value (`libc::E*`); 0 never appears.
pub type Errno = i32;

/// One open `/dev/neuron_udmaN`.
#[derive(Debug)]
pub struct Dev {
    fd: OwnedFd,
}

/// The errno of the last failed call.
fn last_errno() -> Errno {
    io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

impl Dev {
    /// Opens `path` read-write, or read-only when `read_only`.
    ///
    /// # Errors
    ///
    /// The errno of `open(2)`.
    pub fn open(path: &Path, read_only: bool) -> Result<Self, Errno> {
        let c = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| libc::EINVAL)?;
        let mode = if read_only { libc::O_RDONLY } else { libc::O_RDWR };
        // SAFETY: `c` is a NUL-terminated path; the returned descriptor is owned below.
        let fd = unsafe { libc::open(c.as_ptr(), mode | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(last_errno());
        }
        // SAFETY: `fd` was just opened and nothing else owns it.
        Ok(Self { fd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    /// The raw descriptor (for `mmap` and children).
    pub fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Issues ioctl `req` with argument `arg` (a struct of the ABI, read and written in place).
    ///
    /// # Errors
    ///
    /// The errno the driver returned.
    pub fn ioctl<T>(&self, req: sys::IoctlRequest, arg: &mut T) -> Result<(), Errno> {
        ioctl_raw(self.raw(), req, (arg as *mut T).cast())
    }
}

/// `ioctl(fd, req, arg)` with a raw argument pointer (also bad ones: the driver must answer
/// `EFAULT` without touching anything).
///
/// # Errors
///
/// The errno the driver returned.
pub fn ioctl_raw(fd: RawFd, req: sys::IoctlRequest, arg: *mut libc::c_void) -> Result<(), Errno> {
    // SAFETY: the driver reads and writes at most the size encoded in `req` at `arg`; callers
    // pass either a live struct of that size or an address the driver must reject (EFAULT).
    let r = unsafe { libc::ioctl(fd, req, arg) };
    if r < 0 {
        Err(last_errno())
    } else {
        Ok(())
    }
}

/// `ioctl(fd, req, arg)` returning the driver's non-negative result (the pairs a split
/// prepare wrote).
///
/// # Errors
///
/// The errno the driver returned.
pub fn ioctl_ret<T>(fd: RawFd, req: sys::IoctlRequest, arg: &mut T) -> Result<i32, Errno> {
    // SAFETY: as `ioctl_raw`: `arg` is a live struct of the size `req` encodes.
    let r = unsafe { libc::ioctl(fd, req, (arg as *mut T).cast::<libc::c_void>()) };
    if r < 0 {
        Err(last_errno())
    } else {
        Ok(r)
    }
}

/// An ioctl request number: `_IOC(dir, 0xB9, nr, size)`.
const fn ioc(dir: u64, nr: u64, size: usize) -> sys::IoctlRequest {
    ((dir << 30) | ((size as u64) << 16) | (0xB9 << 8) | nr) as sys::IoctlRequest
}

/// ABI 3 requests (the client crate's `sys` names those of ABI 2).
pub mod abi3 {
    use super::{ioc, sys};
    use std::mem::size_of;
    /// `NEURON_UDMA_COPY_SUBMIT`.
    pub const COPY_SUBMIT: sys::IoctlRequest = ioc(3, 0x0C, size_of::<sys::neuron_udma_copy_submit>());
    /// `NEURON_UDMA_FENCE_STATUS`.
    pub const FENCE_STATUS: sys::IoctlRequest = ioc(3, 0x0D, size_of::<sys::neuron_udma_fence_status>());
    /// `NEURON_UDMA_FENCE_WAIT`.
    pub const FENCE_WAIT: sys::IoctlRequest = ioc(1, 0x0E, size_of::<sys::neuron_udma_fence_wait>());
    /// `NEURON_UDMA_QUEUE_EVENTS`.
    pub const QUEUE_EVENTS: sys::IoctlRequest = ioc(3, 0x0F, size_of::<sys::neuron_udma_events>());
    /// `NEURON_UDMA_QUEUE_EVENTFD`.
    pub const QUEUE_EVENTFD: sys::IoctlRequest = ioc(1, 0x10, size_of::<sys::neuron_udma_eventfd>());
}

/// `poll()` of one descriptor for `POLLIN | POLLRDNORM | POLLPRI`: its `revents` (0 on timeout).
///
/// # Errors
///
/// The errno of `poll(2)`.
pub fn poll(fd: RawFd, timeout_ms: i32) -> Result<i16, Errno> {
    let mut p = libc::pollfd { fd, events: libc::POLLIN | libc::POLLRDNORM | libc::POLLPRI, revents: 0 };
    // SAFETY: one valid pollfd.
    let r = unsafe { libc::poll(&mut p, 1, timeout_ms) };
    if r < 0 {
        return Err(last_errno());
    }
    Ok(p.revents)
}

/// A new eventfd (counter, non-blocking).
///
/// # Errors
///
/// The errno of `eventfd(2)`.
pub fn eventfd() -> Result<OwnedFd, Errno> {
    // SAFETY: plain syscall; the descriptor is owned below.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(last_errno());
    }
    // SAFETY: just created, owned here only.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Reads (and so resets) an eventfd's counter: 0 when it is 0.
pub fn eventfd_take(fd: RawFd) -> u64 {
    let mut v = 0u64;
    // SAFETY: reads 8 bytes into `v`.
    let r = unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
    if r == 8 {
        v
    } else {
        0
    }
}

/// What backs a memory region of the process that the fuzzer imports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegionKind {
    /// Private anonymous memory of 4 KiB pages (`MADV_NOHUGEPAGE`: scattered pages).
    Anon,
    /// 2 MiB of private anonymous memory, 2 MiB aligned, `MADV_HUGEPAGE` (a transparent huge
    /// page when the kernel has one; `MADV_COLLAPSE` makes one), `MADV_DONTFORK`.
    Thp,
    /// A shared mapping of a memfd (shmem pages).
    Memfd,
    /// Private anonymous memory mapped read-only.
    ReadOnly,
    /// `PROT_NONE`: nothing can be pinned.
    NoAccess,
    /// A sealed memfd's shared pages and a udmabuf (`/dev/udmabuf`) of them: a dma-buf of
    /// another exporter for `DMABUF_IMPORT`, whose bytes the CPU writes through the mapping.
    Udmabuf,
}

/// A memory region of the process (mapped at creation, unmapped on drop).
#[derive(Debug)]
pub struct Region {
    /// Its kind.
    pub kind: RegionKind,
    ptr: *mut u8,
    /// Length in bytes.
    pub len: usize,
    map: (*mut u8, usize),
    memfd: Option<OwnedFd>,
    /// `Udmabuf`: the dma-buf of the whole region (`None` without `/dev/udmabuf`).
    dmabuf: Option<OwnedFd>,
}

// SAFETY: plain process memory, accessed with volatile byte accesses only.
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

impl Region {
    /// Maps a region of `len` bytes (`Thp`: 2 MiB) filled with `fill(i)`.
    ///
    /// # Errors
    ///
    /// The errno of the failing `mmap`/`memfd_create`/`mprotect`.
    pub fn new(kind: RegionKind, len: usize, fill: impl Fn(usize) -> u8) -> Result<Self, Errno> {
        const HUGE: usize = 2 << 20;
        let rw = libc::PROT_READ | libc::PROT_WRITE;
        let anon = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        let mut memfd = None;
        // SAFETY: fresh mappings chosen by the kernel; they alias no Rust object.
        let (map, ptr) = unsafe {
            match kind {
                RegionKind::Thp => {
                    let m = libc::mmap(std::ptr::null_mut(), 2 * HUGE, rw, anon, -1, 0);
                    if m == libc::MAP_FAILED {
                        return Err(last_errno());
                    }
                    let p = ((m as usize + HUGE - 1) & !(HUGE - 1)) as *mut u8;
                    libc::madvise(p.cast(), HUGE, libc::MADV_HUGEPAGE);
                    // Not shared with children: a child's copy-on-write reference would make
                    // the parent's next write (or pin) split the huge page.
                    libc::madvise(m, 2 * HUGE, libc::MADV_DONTFORK);
                    ((m.cast::<u8>(), 2 * HUGE), p)
                }
                RegionKind::Memfd | RegionKind::Udmabuf => {
                    // udmabuf takes only memfds that cannot shrink.
                    let seal = kind == RegionKind::Udmabuf;
                    let flags = libc::MFD_CLOEXEC | if seal { libc::MFD_ALLOW_SEALING } else { 0 };
                    let fd = libc::memfd_create(c"udma-fuzz".as_ptr(), flags);
                    if fd < 0 {
                        return Err(last_errno());
                    }
                    let fd = OwnedFd::from_raw_fd(fd);
                    if libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) != 0 {
                        return Err(last_errno());
                    }
                    if seal && libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) != 0 {
                        return Err(last_errno());
                    }
                    let m = libc::mmap(std::ptr::null_mut(), len, rw, libc::MAP_SHARED, fd.as_raw_fd(), 0);
                    if m == libc::MAP_FAILED {
                        return Err(last_errno());
                    }
                    memfd = Some(fd);
                    ((m.cast(), len), m.cast())
                }
                _ => {
                    let m = libc::mmap(std::ptr::null_mut(), len, rw, anon, -1, 0);
                    if m == libc::MAP_FAILED {
                        return Err(last_errno());
                    }
                    libc::madvise(m, len, libc::MADV_NOHUGEPAGE);
                    ((m.cast(), len), m.cast())
                }
            }
        };
        let len = if kind == RegionKind::Thp { HUGE } else { len };
        let mut r = Self { kind, ptr, len, map, memfd, dmabuf: None };
        if kind == RegionKind::Udmabuf {
            // Pages allocated last to first in the first half (a run each, as the allocator
            // hands out ascending frames), first to last in the second: the udmabuf has many
            // runs and a long one.
            let pages = len / 4096;
            for p in (0..pages / 2).rev().chain(pages / 2..pages) {
                r.write(p * 4096, &[0]);
            }
        }
        if kind != RegionKind::NoAccess {
            r.write(0, &(0..len).map(fill).collect::<Vec<u8>>());
        }
        if kind == RegionKind::Udmabuf {
            r.dmabuf = udmabuf(r.memfd.as_ref().expect("memfd").as_raw_fd(), len)?;
        }
        let prot = match kind {
            RegionKind::ReadOnly => Some(libc::PROT_READ),
            RegionKind::NoAccess => Some(libc::PROT_NONE),
            _ => None,
        };
        r.collapse();
        if let Some(prot) = prot {
            // SAFETY: our own mapping.
            if unsafe { libc::mprotect(r.ptr.cast(), len, prot) } != 0 {
                return Err(last_errno());
            }
        }
        Ok(r)
    }

    /// Makes a `Thp` region one huge page if it is not (`MADV_COLLAPSE`: synchronous, keeps
    /// the bytes; it may fail when no 2 MiB block is free). Returns whether the region is
    /// physically contiguous now.
    pub fn collapse(&self) -> bool {
        if self.kind != RegionKind::Thp {
            return false;
        }
        if phys_runs(self.addr(0), self.len).is_ok_and(|r| r.is_empty()) {
            return true;
        }
        // SAFETY: our own mapping; the advice changes no byte.
        unsafe { libc::madvise(self.ptr.cast(), self.len, libc::MADV_COLLAPSE) };
        phys_runs(self.addr(0), self.len).is_ok_and(|r| r.is_empty())
    }

    /// The memfd behind a `Memfd` or `Udmabuf` region (a descriptor that is not a dma-buf).
    pub fn memfd(&self) -> Option<RawFd> {
        self.memfd.as_ref().map(|f| f.as_raw_fd())
    }

    /// The dma-buf of a `Udmabuf` region (`None` without `/dev/udmabuf`).
    pub fn dmabuf(&self) -> Option<RawFd> {
        self.dmabuf.as_ref().map(|f| f.as_raw_fd())
    }

    /// The address of byte `off`.
    pub fn addr(&self, off: usize) -> u64 {
        self.ptr as u64 + off as u64
    }

    /// Writes `data` at `off`. A plain copy: the memory is the process's (the device reads it
    /// only during the system calls that follow), and a byte-wise volatile loop is slow under
    /// emulation.
    pub fn write(&self, off: usize, data: &[u8]) {
        assert!(off + data.len() <= self.len);
        // SAFETY: in bounds of the live, writable mapping (checked above; callers do not
        // write read-only regions); it aliases no Rust object.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(off), data.len()) };
    }

    /// Reads `len` bytes at `off` (after the calls that may have written them returned).
    pub fn read(&self, off: usize, len: usize) -> Vec<u8> {
        assert!(off + len <= self.len);
        let mut v = vec![0u8; len];
        // SAFETY: in bounds of the live, readable mapping; `v` has `len` bytes.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(off), v.as_mut_ptr(), len) };
        v
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: the mapping this value owns.
        unsafe { libc::munmap(self.map.0.cast(), self.map.1) };
    }
}

/// `struct udmabuf_create` of `<linux/udmabuf.h>`.
#[repr(C)]
struct UdmabufCreate {
    memfd: u32,
    flags: u32,
    offset: u64,
    size: u64,
}

/// `UDMABUF_CREATE`: `_IOW('u', 0x42, struct udmabuf_create)`.
const UDMABUF_CREATE: sys::IoctlRequest =
    ((1u64 << 30) | ((std::mem::size_of::<UdmabufCreate>() as u64) << 16) | (0x75 << 8) | 0x42) as sys::IoctlRequest;
/// `UDMABUF_FLAGS_CLOEXEC`.
const UDMABUF_FLAGS_CLOEXEC: u32 = 1;

/// A dma-buf of the first `len` bytes of `memfd` from `/dev/udmabuf`; `None` if the kernel has
/// no udmabuf device.
///
/// # Errors
///
/// The errno of `UDMABUF_CREATE`.
fn udmabuf(memfd: RawFd, len: usize) -> Result<Option<OwnedFd>, Errno> {
    let Ok(dev) = Dev::open(Path::new("/dev/udmabuf"), false) else { return Ok(None) };
    let mut c = UdmabufCreate { memfd: memfd as u32, flags: UDMABUF_FLAGS_CLOEXEC, offset: 0, size: len as u64 };
    // SAFETY: `c` is a live `struct udmabuf_create`, the size the request encodes.
    let r = unsafe { libc::ioctl(dev.raw(), UDMABUF_CREATE, (&mut c as *mut UdmabufCreate).cast::<libc::c_void>()) };
    if r < 0 {
        return Err(last_errno());
    }
    // SAFETY: a new descriptor that only this value owns.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(r) }))
}

/// Offsets in `[addr, addr + len)` where a new physically contiguous run starts (0
/// excluded), from `/proc/self/pagemap` (root: page frame numbers are visible).
///
/// # Errors
///
/// A page that is not present, or frame numbers hidden.
pub fn phys_runs(addr: u64, len: usize) -> Result<Vec<usize>, String> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open("/proc/self/pagemap").map_err(|e| format!("pagemap: {e}"))?;
    let first = addr / 4096;
    let last = (addr + len as u64 - 1) / 4096;
    let mut raw = vec![0u8; ((last - first + 1) * 8) as usize];
    f.read_exact_at(&mut raw, first * 8).map_err(|e| format!("pagemap: {e}"))?;
    let mut runs = vec![];
    let mut prev = None;
    for (i, e) in raw.chunks_exact(8).enumerate() {
        let e = u64::from_le_bytes(e.try_into().expect("8 bytes"));
        let pfn = e & ((1 << 55) - 1);
        if e >> 63 == 0 || pfn == 0 {
            return Err(format!(
                "page {:#x} not present or its frame hidden (entry {e:#x})",
                (first + i as u64) * 4096
            ));
        }
        if let Some(p) = prev {
            if pfn != p + 1 {
                runs.push(((first + i as u64) * 4096 - addr) as usize);
            }
        }
        prev = Some(pfn);
    }
    Ok(runs)
}

/// Writes `what` to the sysfs file `path`.
///
/// # Errors
///
/// The errno of the write.
pub fn sysfs_write(path: &str, what: &str) -> Result<(), Errno> {
    std::fs::write(path, what).map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))
}

/// The PCI device (`0000:00:03.0`) behind the device node `path`: a file of the node takes
/// queue 13 of engine 5 for a moment and the debugfs directory that lists it is the device's
/// (the misc device has no parent link). `None` if that fails (no debugfs, queue taken).
pub fn node_bdf(path: &Path) -> Option<String> {
    const ENGINE: u32 = 5;
    const QUEUE: u32 = 13;
    let dev = Dev::open(path, false).ok()?;
    let mut q =
        sys::neuron_udma_queue_init { engine: ENGINE, queue: QUEUE, tx_descs: 32, rx_descs: 32, ..Default::default() };
    dev.ioctl(sys::NEURON_UDMA_QUEUE_INIT, &mut q).ok()?;
    let head = format!("engine {ENGINE} queue {QUEUE} owner ");
    let found = std::fs::read_dir("/sys/kernel/debug/neuron_udma").ok().and_then(|d| {
        d.filter_map(|e| e.ok()).find_map(|e| {
            let rings = std::fs::read_to_string(e.path().join("rings")).ok()?;
            rings.lines().any(|l| l.starts_with(&head)).then(|| e.file_name().to_string_lossy().into_owned())
        })
    });
    let mut r = sys::neuron_udma_queue_id { engine: ENGINE, queue: QUEUE, reserved: 0 };
    dev.ioctl(sys::NEURON_UDMA_QUEUE_RELEASE, &mut r).ok();
    found
}

/// A shared mapping of a host buffer.
#[derive(Debug)]
pub struct Mapping {
    ptr: *mut u8,
    len: usize,
}

impl Mapping {
    /// `mmap(NULL, len, prot, flags, fd, offset)`.
    ///
    /// # Errors
    ///
    /// The errno of `mmap(2)` (the driver's `EINVAL` for a bad offset, length or flags).
    pub fn new(fd: RawFd, len: usize, offset: u64, prot: i32, flags: i32) -> Result<Self, Errno> {
        let off = libc::off_t::try_from(offset).map_err(|_| libc::EINVAL)?;
        // SAFETY: a fresh mapping chosen by the kernel; it aliases no Rust object.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, fd, off) };
        if p == libc::MAP_FAILED {
            return Err(last_errno());
        }
        Ok(Self { ptr: p.cast(), len })
    }

    /// Copies `data` into the mapping at `off` (volatile: the device reads it behind our back).
    pub fn write(&self, off: usize, data: &[u8]) {
        assert!(off + data.len() <= self.len);
        for (i, &b) in data.iter().enumerate() {
            // SAFETY: in bounds of the live mapping (checked above).
            unsafe { self.ptr.add(off + i).write_volatile(b) };
        }
    }

    /// The address of the mapping.
    pub fn addr(&self) -> u64 {
        self.ptr as u64
    }

    /// Reads the whole mapping (volatile: the device writes it behind our back).
    pub fn read(&self) -> Vec<u8> {
        (0..self.len)
            // SAFETY: in bounds of the live mapping.
            .map(|i| unsafe { self.ptr.add(i).read_volatile() })
            .collect()
    }
}

// SAFETY: the mapping is plain shared memory; every access is a volatile byte or word access
// through `&self`, and its owner unmaps it only on drop.
unsafe impl Send for Mapping {}
// SAFETY: as above: concurrent volatile reads and writes of shared memory are what a DMA
// buffer sees anyway.
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` describe a mapping this value owns.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// Fault kinds of the model's `FAULT_KIND` register.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// Fail the n-th next Tx descriptor of a queue (engine abort, cause 8).
    FailNth = 1,
    /// Put an engine into abort state.
    Abort = 2,
    /// Start no new packet on a queue for `arg` ms.
    Stall = 3,
    /// Delay every packet's completion by `(arg - 1)` times its copy time.
    Slow = 4,
}

/// The model's control window (BAR2, 4 KiB), mapped through sysfs.
#[derive(Debug)]
pub struct FaultWindow {
    map: Mapping,
}

const MAGIC: usize = 0x000;
const MAGIC_UDMA: u32 = 0x5544_4D41;
const FAULT_KIND: usize = 0x010;
const FAULT_ENGINE: usize = 0x014;
const FAULT_QUEUE: usize = 0x018;
const FAULT_ARG: usize = 0x01C;
const FAULT_COMMIT: usize = 0x020;
const CLEAR: usize = 0x060;

impl FaultWindow {
    /// Maps BAR2 of PCI device `bdf` (default: the first bound to the driver; root only).
    /// `None` when the device is not the model or the window cannot be mapped.
    pub fn open(bdf: Option<&str>) -> Option<Self> {
        let pci = match bdf {
            Some(b) => PathBuf::from("/sys/bus/pci/devices").join(b),
            None => bound_device()?,
        };
        let path = pci.join("resource2");
        let c = CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
        // SAFETY: NUL-terminated path; the descriptor is owned below.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_SYNC | libc::O_CLOEXEC) };
        if fd < 0 {
            return None;
        }
        // SAFETY: just opened, owned here only.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let map = Mapping::new(fd.as_raw_fd(), 4096, 0, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED).ok()?;
        let w = Self { map };
        (w.read(MAGIC) == MAGIC_UDMA).then_some(w)
    }

    fn reg(&self, off: usize) -> *mut u32 {
        assert!(off + 4 <= self.map.len && off.is_multiple_of(4));
        // SAFETY: in bounds and 4-byte aligned within the page-aligned mapping.
        unsafe { self.map.ptr.add(off).cast() }
    }

    fn read(&self, off: usize) -> u32 {
        // SAFETY: a 32-bit register of the mapped window.
        unsafe { self.reg(off).read_volatile() }
    }

    fn write(&self, off: usize, v: u32) {
        // SAFETY: a 32-bit register of the mapped window.
        unsafe { self.reg(off).write_volatile(v) }
    }

    /// Stages and commits one fault; false if the model rejected it.
    pub fn inject(&self, kind: FaultKind, engine: u32, queue: u32, arg: u32) -> bool {
        self.write(FAULT_KIND, kind as u32);
        self.write(FAULT_ENGINE, engine);
        self.write(FAULT_QUEUE, queue);
        self.write(FAULT_ARG, arg);
        self.write(FAULT_COMMIT, 1);
        self.read(FAULT_COMMIT) == 0
    }

    /// Clears every armed fault, the counters and the last error (not an engine's abort).
    pub fn clear(&self) {
        self.write(CLEAR, 1);
    }
}

/// The sysfs directory of the PCI device bound to the driver (the first one).
fn bound_device() -> Option<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir("/sys/bus/pci/drivers/neuron_udma")
        .ok()?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(':'))
        .map(|e| e.path())
        .collect();
    v.sort();
    v.into_iter().next()
}
