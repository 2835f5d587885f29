// SPDX-License-Identifier: MIT OR Apache-2.0
//! Typed errors of the neuron_udma ioctls, one variant per errno the header documents.

use std::io;
use std::path::PathBuf;

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An error of a neuron_udma operation. Each kernel errno the ABI header documents has its own
/// variant; [`Error::errno`] gives the errno back.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `EINVAL`: a bad argument, or a reserved field or undefined flag set.
    #[error("invalid argument (EINVAL)")]
    InvalidArgument,
    /// An argument rejected by this library before any system call (it would be `EINVAL`).
    #[error("invalid argument (EINVAL, checked before the ioctl): {0}")]
    Argument(String),
    /// `ENOENT`: no such handle in this file, or the queue is not this file's.
    #[error("no such buffer handle or queue in this file (ENOENT)")]
    NotFound,
    /// `ERANGE`: offset + size beyond a buffer.
    #[error("offset + size beyond the buffer (ERANGE)")]
    OutOfRange,
    /// `ENOSPC`: the ring is full; nothing was written. `COPY_WAIT` frees space.
    #[error("descriptor ring full (ENOSPC)")]
    RingFull,
    /// `EBUSY`: the queue is taken (or reserved for the driver), a buffer has copies in flight
    /// (or is exported as a dma-buf), or (`COPY_SUBMIT`) `max_queue_fences` fences are in flight
    /// on the queue.
    #[error("busy: queue taken or reserved, copies or fences in flight, or buffer exported (EBUSY)")]
    Busy,
    /// `ETIMEDOUT`: no completion in time. Since ABI 3 the copies go on (the queue is reset only
    /// when it made no progress for 10 s); an ABI 1/2 driver reset the queue.
    #[error("timed out waiting for completion; the copies go on unless the queue made no progress (ETIMEDOUT)")]
    TimedOut,
    /// `EIO`: the engine reported an error, or a reset dropped the copy; the queue was reset.
    /// Also while the device itself is reset (function-level reset, PCI error recovery): the
    /// device's `device_resets` counter in sysfs tells which. ([`Fence::wait`](crate::Fence::wait)
    /// reports a failed fence as [`Error::FenceFailed`].)
    #[error("DMA engine error or device reset; the queue was reset (EIO)")]
    EngineError,
    /// A fence failed (`NEURON_UDMA_FENCE_FAILED`, or `EIO` of `FENCE_WAIT`): an engine error or
    /// a queue reset dropped it before its marker arrived; the copies before it may not all have
    /// run. [`Error::errno`] is `EIO`, as `FENCE_WAIT` says it.
    #[error("fence {fence} of queue {engine}/{queue} failed: {} ({})", fence_reason(*.error), errno_name(*.error))]
    FenceFailed {
        /// The queue's engine.
        engine: u32,
        /// The queue within the engine.
        queue: u32,
        /// The fence number.
        fence: u64,
        /// Why, a positive errno: `EIO` (an engine error), `ETIMEDOUT` (no progress for 10 s,
        /// the queue was reset); 0 if the driver could not say.
        error: i32,
    },
    /// `ESTALE` (`NEURON_UDMA_FENCE_EXPIRED`): the fence is older than what its queue remembers
    /// of its failures (its last 32 resets): it may have failed.
    #[error("fence expired: older than the queue's last 32 resets, it may have failed (ESTALE)")]
    Expired,
    /// `EMFILE`: the file holds `max_buffers` of [`Info`](crate::Info) buffers already, or (a
    /// dma-buf export) the process has no free file descriptor.
    #[error("too many buffers in this file, or no free file descriptor (EMFILE)")]
    TooMany,
    /// `EBADF`: the fd is not an eventfd (`QUEUE_EVENTFD`) or not a dma-buf (`DMABUF_IMPORT`),
    /// or the device file was opened read-only (such files may only look).
    #[error("bad file descriptor: not an eventfd or dma-buf, or a read-only device file (EBADF)")]
    BadFd,
    /// `E2BIG`: a split copy needs more pairs than the queue's rings hold even when empty.
    #[error("copy needs more descriptor pairs than the rings hold: use larger rings (E2BIG)")]
    TooBig,
    /// `ENODEV`: the device was unbound from the driver.
    #[error("device unbound (ENODEV)")]
    Unbound,
    /// `EFAULT`: a bad user pointer.
    #[error("bad address (EFAULT)")]
    Fault,
    /// `ENOTTY`: the file does not know this ioctl (not a neuron_udma device?).
    #[error("unsupported ioctl: not a neuron_udma device or an older driver (ENOTTY)")]
    Unsupported,
    /// `EINTR`: interrupted by a signal; the copies go on.
    #[error("interrupted by a signal; copies go on (EINTR)")]
    Interrupted,
    /// `ENOMEM`: no memory of that type (host or device) or for the rings; for `MEM_IMPORT`
    /// also `RLIMIT_MEMLOCK` exceeded (nothing stays pinned).
    #[error("out of memory or RLIMIT_MEMLOCK exceeded (ENOMEM)")]
    OutOfMemory,
    /// `EDQUOT`: device memory (a device buffer, or rings with
    /// [`QueueOptions::device_rings`](crate::QueueOptions::device_rings)) past the `dmem.max`
    /// of the caller's cgroup for this device's region (`neuron_udma/<PCI address>`); nothing
    /// was allocated.
    #[error("device memory past the cgroup's dmem.max for this device (EDQUOT)")]
    QuotaExceeded,
    /// `EPERM`: the destination of a copy is an imported buffer without write access
    /// ([`Device::import`](crate::Device::import) instead of
    /// [`Device::import_mut`](crate::Device::import_mut)).
    #[error("destination imported read-only (EPERM)")]
    ReadOnly,
    /// `EXDEV`: a copy crosses from one physically contiguous run of an imported buffer to the
    /// next without `NEURON_UDMA_COPY_SPLIT` ([`Copy::new`](crate::Copy::new) sets it).
    #[error("copy crosses a run of an imported buffer without COPY_SPLIT (EXDEV)")]
    CrossesRun,
    /// `EOPNOTSUPP`: the engine does not reach host memory (`QUEUE_INIT`), or memory that cannot
    /// be pinned long-term or reached without bounce buffers (`MEM_IMPORT`).
    #[error("operation not supported for this engine or memory (EOPNOTSUPP)")]
    NotSupported,
    /// Any other errno.
    #[error("{msg} (errno {0})", msg = io::Error::from_raw_os_error(*.0))]
    Other(i32),
    /// Opening the device file failed.
    #[error("cannot open {}", path.display())]
    Open {
        /// The device path.
        path: PathBuf,
        /// The error of `open(2)`.
        #[source]
        source: io::Error,
    },
}

impl Error {
    /// Maps a kernel errno (positive) to its meaning in the neuron_udma ABI.
    pub fn from_errno(errno: i32) -> Self {
        match errno {
            libc::EINVAL => Error::InvalidArgument,
            libc::ENOENT => Error::NotFound,
            libc::ERANGE => Error::OutOfRange,
            libc::ENOSPC => Error::RingFull,
            libc::EBUSY => Error::Busy,
            libc::ETIMEDOUT => Error::TimedOut,
            libc::EIO => Error::EngineError,
            libc::ENODEV => Error::Unbound,
            libc::EFAULT => Error::Fault,
            libc::ENOTTY => Error::Unsupported,
            libc::EINTR => Error::Interrupted,
            libc::ENOMEM => Error::OutOfMemory,
            libc::EPERM => Error::ReadOnly,
            libc::EXDEV => Error::CrossesRun,
            libc::EOPNOTSUPP => Error::NotSupported,
            libc::ESTALE => Error::Expired,
            libc::EMFILE => Error::TooMany,
            libc::EBADF => Error::BadFd,
            libc::E2BIG => Error::TooBig,
            libc::EDQUOT => Error::QuotaExceeded,
            e => Error::Other(e),
        }
    }

    /// The errno this error stands for (`EINVAL` for [`Error::Argument`]).
    pub fn errno(&self) -> i32 {
        match self {
            Error::InvalidArgument | Error::Argument(_) => libc::EINVAL,
            Error::NotFound => libc::ENOENT,
            Error::OutOfRange => libc::ERANGE,
            Error::RingFull => libc::ENOSPC,
            Error::Busy => libc::EBUSY,
            Error::TimedOut => libc::ETIMEDOUT,
            Error::EngineError => libc::EIO,
            Error::Unbound => libc::ENODEV,
            Error::Fault => libc::EFAULT,
            Error::Unsupported => libc::ENOTTY,
            Error::Interrupted => libc::EINTR,
            Error::OutOfMemory => libc::ENOMEM,
            Error::ReadOnly => libc::EPERM,
            Error::CrossesRun => libc::EXDEV,
            Error::NotSupported => libc::EOPNOTSUPP,
            Error::FenceFailed { .. } => libc::EIO,
            Error::Expired => libc::ESTALE,
            Error::TooMany => libc::EMFILE,
            Error::BadFd => libc::EBADF,
            Error::TooBig => libc::E2BIG,
            Error::QuotaExceeded => libc::EDQUOT,
            Error::Other(e) => *e,
            Error::Open { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
        }
    }

    pub(crate) fn last_os() -> Self {
        Error::from_errno(io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO))
    }
}

/// What the `error` of a failed fence means (`FENCE_STATUS`, `QUEUE_EVENTS`).
pub(crate) fn fence_reason(errno: i32) -> &'static str {
    match errno {
        libc::EIO => "an engine error; the queue was reset",
        libc::ETIMEDOUT => "the queue made no progress for 10 s and was reset",
        0 => "dropped by a queue reset",
        _ => "dropped",
    }
}

/// The symbolic name of the errnos this ABI uses ("EIO"), else "errno N".
pub fn errno_name(errno: i32) -> String {
    let name = match errno {
        libc::EINVAL => "EINVAL",
        libc::ENOENT => "ENOENT",
        libc::ERANGE => "ERANGE",
        libc::ENOSPC => "ENOSPC",
        libc::EBUSY => "EBUSY",
        libc::ETIMEDOUT => "ETIMEDOUT",
        libc::EIO => "EIO",
        libc::ENODEV => "ENODEV",
        libc::EFAULT => "EFAULT",
        libc::ENOTTY => "ENOTTY",
        libc::EINTR => "EINTR",
        libc::ENOMEM => "ENOMEM",
        libc::EPERM => "EPERM",
        libc::EXDEV => "EXDEV",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::ESTALE => "ESTALE",
        libc::EMFILE => "EMFILE",
        libc::EBADF => "EBADF",
        libc::E2BIG => "E2BIG",
        libc::EDQUOT => "EDQUOT",
        libc::EAGAIN => "EAGAIN",
        libc::EACCES => "EACCES",
        _ => return format!("errno {errno}"),
    };
    name.to_string()
}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        Error::from_errno(e.raw_os_error().unwrap_or(libc::EIO))
    }
}

impl From<nix::errno::Errno> for Error {
    fn from(e: nix::errno::Errno) -> Self {
        Error::from_errno(e as i32)
    }
}
