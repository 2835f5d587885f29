// SPDX-License-Identifier: GPL-2.0
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
    /// `EBUSY`: the queue is taken (or reserved for the driver), or a buffer has copies in flight.
    #[error("busy: queue taken or reserved, or copies in flight (EBUSY)")]
    Busy,
    /// `ETIMEDOUT`: no completion in time; the queue was reset and is usable again.
    #[error("timed out waiting for completion; the queue was reset (ETIMEDOUT)")]
    TimedOut,
    /// `EIO`: the engine reported an error; the queue was reset.
    #[error("DMA engine error; the queue was reset (EIO)")]
    EngineError,
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
            Error::Other(e) => *e,
            Error::Open { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
        }
    }

    pub(crate) fn last_os() -> Self {
        Error::from_errno(io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO))
    }
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
