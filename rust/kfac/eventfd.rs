// SPDX-License-Identifier: GPL-2.0

//! eventfd, which Linux 7.3's Rust does not wrap: [`EventFd`] owns a reference to the eventfd
//! context of a file descriptor and signals it. Every function it needs is exported
//! (`eventfd_ctx_fdget()`, `eventfd_signal_mask()`, `eventfd_ctx_put()`): no C of its own.

use kernel::{bindings, prelude::*};

/// The eventfd context of a file descriptor (a counted reference, given back on drop).
///
/// # Invariants
///
/// The pointer is a context from `eventfd_ctx_fdget()`, owned by this value.
pub(crate) struct EventFd(core::ptr::NonNull<bindings::eventfd_ctx>);

// SAFETY: an eventfd context is reference counted and may be signalled and put from any task.
unsafe impl Send for EventFd {}
// SAFETY: signalling takes the context's own lock.
unsafe impl Sync for EventFd {}

impl EventFd {
    /// The eventfd of file descriptor `fd` of the calling process.
    ///
    /// # Errors
    ///
    /// `EBADF` if `fd` is not open, `EINVAL` if it is not an eventfd.
    pub(crate) fn from_fd(fd: i32) -> Result<Self> {
        // SAFETY: plain call on the current task's descriptor table; on success the function
        // returns a context with a reference of its own.
        let p = kernel::error::from_err_ptr(unsafe { bindings::eventfd_ctx_fdget(fd) })?;
        // INVARIANT: a context from `eventfd_ctx_fdget()`, not an error pointer.
        core::ptr::NonNull::new(p).map(Self).ok_or(EINVAL)
    }

    /// Adds `n` to the eventfd's counter (one `eventfd_signal()` each), waking its readers.
    pub(crate) fn signal(&self, n: u64) {
        for _ in 0..n {
            // SAFETY: by the type invariant the context is alive. A mask of 0 is what
            // `eventfd_signal()` (a static inline) passes.
            unsafe { bindings::eventfd_signal_mask(self.0.as_ptr(), 0) };
        }
    }
}

impl Drop for EventFd {
    fn drop(&mut self) {
        // SAFETY: by the type invariant the reference is ours, given back once.
        unsafe { bindings::eventfd_ctx_put(self.0.as_ptr()) };
    }
}
