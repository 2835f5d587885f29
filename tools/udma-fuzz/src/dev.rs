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
    /// Maps BAR2 of the PCI device behind `/dev/neuron_udma<index>` (root only). `None` when
    /// the device is not the model or the window cannot be mapped.
    pub fn open() -> Option<Self> {
        let pci = bound_device()?;
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
