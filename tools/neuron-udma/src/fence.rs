// SPDX-License-Identifier: MIT OR Apache-2.0
//! Fences as values (ABI 3): `COPY_SUBMIT`, `FENCE_STATUS`, `FENCE_WAIT`, and the completion
//! events of a device file: `QUEUE_EVENTS` and `QUEUE_EVENTFD`.

use std::fmt;
use std::marker::PhantomData;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::atomic::Ordering;
use std::time::Duration;

use nix::sys::eventfd::{EfdFlags, EventFd};

use crate::{ioctl, sys, timeout_ms, Copy, Device, Error, Queue, Result};

/// The state of a fence (`state` and `error` of `FENCE_STATUS`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FenceStatus {
    /// In flight (`NEURON_UDMA_FENCE_PENDING`).
    Pending,
    /// Every copy submitted to the queue before it completed (`NEURON_UDMA_FENCE_DONE`).
    Done,
    /// Dropped by an engine error or a queue reset before its marker arrived
    /// (`NEURON_UDMA_FENCE_FAILED`); the copies before it may not all have run. `error` is a
    /// positive errno: `EIO` (an engine error) or `ETIMEDOUT` (the queue made no progress for
    /// 10 s and was reset).
    Failed {
        /// Why, a positive errno.
        error: i32,
    },
    /// Older than what the queue remembers of its failures (its last 32 resets): it may have
    /// failed (`NEURON_UDMA_FENCE_EXPIRED`).
    Expired,
    /// A state this crate does not know (a newer driver).
    Unknown(u32),
}

impl FenceStatus {
    /// The status a `FENCE_STATUS` reported.
    pub fn from_raw(state: u32, error: i32) -> Self {
        match state {
            sys::NEURON_UDMA_FENCE_PENDING => FenceStatus::Pending,
            sys::NEURON_UDMA_FENCE_DONE => FenceStatus::Done,
            sys::NEURON_UDMA_FENCE_FAILED => FenceStatus::Failed { error },
            sys::NEURON_UDMA_FENCE_EXPIRED => FenceStatus::Expired,
            s => FenceStatus::Unknown(s),
        }
    }

    /// `Ok(true)` for [`FenceStatus::Done`], `Ok(false)` for [`FenceStatus::Pending`], and the
    /// error of the others: [`Error::FenceFailed`] (for `id`), [`Error::Expired`], or
    /// `EPROTO` ([`Error::Other`]) for an unknown state.
    pub fn to_result(self, id: FenceId) -> Result<bool> {
        match self {
            FenceStatus::Pending => Ok(false),
            FenceStatus::Done => Ok(true),
            FenceStatus::Failed { error } => Err(id.failed(error)),
            FenceStatus::Expired => Err(Error::Expired),
            FenceStatus::Unknown(_) => Err(Error::Other(libc::EPROTO)),
        }
    }
}

/// What `FENCE_STATUS` says about a fence and its queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FenceReport {
    /// The fence's state.
    pub status: FenceStatus,
    /// The newest fence of the queue known done.
    pub completed: u64,
    /// The newest fence of the queue.
    pub submitted: u64,
}

/// A fence's identity without a borrow: (engine, queue, number). For maps keyed by fence, and
/// for matching [`QueueEvent`]s.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FenceId {
    /// The queue's engine.
    pub engine: u32,
    /// The queue within the engine.
    pub queue: u32,
    /// The fence number: from 1 per queue; 0 means "nothing to wait for".
    pub number: u64,
}

impl FenceId {
    fn failed(self, error: i32) -> Error {
        Error::FenceFailed { engine: self.engine, queue: self.queue, fence: self.number, error }
    }
}

impl fmt::Display for FenceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "fence {} of queue {}/{}", self.number, self.engine, self.queue)
    }
}

/// A fence of a queue (ABI 3): [`Queue::submit`] returns it at once, and it is done when every
/// copy submitted to the queue before it is done. A value: copy it, keep it, ask it any number
/// of times. It borrows its queue, so it cannot outlive it (the numbers start again from 1 on a
/// new queue).
///
/// Fence number 0 stands for "the queue had nothing to fence" (`COPY_SUBMIT` with nothing
/// prepared and no fence before): it is done, and asking it issues no ioctl.
///
/// ```no_run
/// # let dev = neuron_udma::Device::open_index(0)?;
/// # let (src, dst) = (dev.alloc_host(65536)?, dev.alloc_device(65536)?);
/// use neuron_udma::Copy;
/// let q = dev.queue(0, 1, 64)?;
/// q.prepare_one(&Copy::new(&src, 0, &dst, 0, 65536)?)?;
/// let fence = q.submit()?;
/// while !fence.is_done()? {
///     // ... other work ...
/// #   break;
/// }
/// fence.wait(None)?;
/// # Ok::<(), neuron_udma::Error>(())
/// ```
#[derive(Clone, Copy)]
pub struct Fence<'q> {
    pub(crate) queue: &'q Queue<'q>,
    number: u64,
}

impl fmt::Debug for Fence<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fence")
            .field("engine", &self.queue.engine)
            .field("queue", &self.queue.queue)
            .field("number", &self.number)
            .finish()
    }
}

impl PartialEq for Fence<'_> {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self.queue, other.queue) && self.number == other.number
    }
}

impl Eq for Fence<'_> {}

impl<'q> Fence<'q> {
    /// The queue the fence belongs to.
    pub fn queue(&self) -> &'q Queue<'q> {
        self.queue
    }

    /// The fence number (from 1 per queue; 0: nothing to wait for).
    pub fn number(&self) -> u64 {
        self.number
    }

    /// (engine, queue, number).
    pub fn id(&self) -> FenceId {
        FenceId { engine: self.queue.engine, queue: self.queue.queue, number: self.number }
    }

    /// The fence's state and its queue's progress, without blocking (`FENCE_STATUS`; the
    /// completed fences are retired first). For fence 0: done, with `completed` and
    /// `submitted` 0, and no ioctl. Errors: [`Error::NotFound`] (the queue is not this file's
    /// any more), [`Error::InvalidArgument`] (a number newer than the queue's newest fence:
    /// only from [`Queue::fence`]), [`Error::Unsupported`] (a driver older than ABI 3).
    pub fn report(&self) -> Result<FenceReport> {
        if self.number == 0 {
            return Ok(FenceReport { status: FenceStatus::Done, completed: 0, submitted: 0 });
        }
        let mut arg = sys::neuron_udma_fence_status {
            engine: self.queue.engine,
            queue: self.queue.queue,
            fence: self.number,
            ..Default::default()
        };
        ioctl(self.queue.dev.fd(), sys::NEURON_UDMA_FENCE_STATUS, &mut arg)?;
        Ok(FenceReport {
            status: FenceStatus::from_raw(arg.state, arg.error),
            completed: arg.completed,
            submitted: arg.submitted,
        })
    }

    /// The fence's state, without blocking (`FENCE_STATUS`). Errors: as [`Fence::report`].
    pub fn status(&self) -> Result<FenceStatus> {
        self.report().map(|r| r.status)
    }

    /// Whether the fence is done, without blocking (`FENCE_STATUS`): `Ok(true)` done,
    /// `Ok(false)` in flight; a failed fence is [`Error::FenceFailed`] (with the errno the
    /// driver gives: `EIO` engine error, `ETIMEDOUT` no progress), an expired one
    /// [`Error::Expired`]. Other errors: as [`Fence::report`].
    pub fn is_done(&self) -> Result<bool> {
        self.status()?.to_result(self.id())
    }

    /// Blocks until the fence is done (`FENCE_WAIT`), at most `timeout` (`None`: the driver's
    /// 10 s; at least 10 ms). Errors: [`Error::TimedOut`] (not done in time: the copies go on;
    /// the queue is reset only when it made no progress for 10 s), [`Error::FenceFailed`] (the
    /// driver's `EIO`, with the reason `FENCE_STATUS` gives), [`Error::Expired`] (`ESTALE`),
    /// [`Error::Interrupted`] (a signal), and those of [`Fence::report`].
    pub fn wait(&self, timeout: Option<Duration>) -> Result<()> {
        if self.number == 0 {
            return Ok(());
        }
        let mut arg = sys::neuron_udma_fence_wait {
            engine: self.queue.engine,
            queue: self.queue.queue,
            fence: self.number,
            timeout_ms: timeout_ms(timeout),
            ..Default::default()
        };
        match ioctl(self.queue.dev.fd(), sys::NEURON_UDMA_FENCE_WAIT, &mut arg) {
            Err(Error::EngineError) => Err(match self.status() {
                Ok(FenceStatus::Failed { error }) => self.id().failed(error),
                Ok(FenceStatus::Expired) => Error::Expired,
                // The driver said EIO; if it cannot say why any more, say that much.
                _ => self.id().failed(libc::EIO),
            }),
            r => r,
        }
    }
}

impl<'d> Queue<'d> {
    /// Rings the doorbells for everything prepared and appends a completion marker pair, with
    /// one doorbell, without waiting (`NEURON_UDMA_COPY_SUBMIT`, ABI 3): the returned fence is
    /// done when every copy submitted before it is. With nothing prepared or started since the
    /// queue's newest fence, nothing is written and that fence is returned again (fence 0 if
    /// the queue has none: nothing to wait for).
    ///
    /// Errors: [`Error::RingFull`] (no room for the marker pair: wait for an earlier fence
    /// first), [`Error::Busy`] (`max_queue_fences` of [`Info`](crate::Info) fences in flight),
    /// [`Error::NotFound`], [`Error::Unsupported`] (a driver older than ABI 3).
    pub fn submit(&self) -> Result<Fence<'_>> {
        let mut arg = sys::neuron_udma_copy_submit { engine: self.engine, queue: self.queue, ..Default::default() };
        ioctl(self.dev.fd(), sys::NEURON_UDMA_COPY_SUBMIT, &mut arg)?;
        Ok(Fence { queue: self, number: arg.fence })
    }

    /// The fence `number` of this queue, e.g. the `completed` of a [`QueueEvent`]. Nothing is
    /// checked: a number newer than the queue's newest fence makes its calls fail with
    /// [`Error::InvalidArgument`].
    pub fn fence(&self, number: u64) -> Fence<'_> {
        Fence { queue: self, number }
    }

    /// Registers `fd` (an eventfd) to be signalled once per fence of this queue that completes
    /// or fails (`NEURON_UDMA_QUEUE_EVENTFD`, ABI 3; the count added is the number of such
    /// fences). Unregistered (fd -1) when the returned registration is dropped. The driver
    /// keeps its own reference to the eventfd: closing `fd` does not unregister it.
    ///
    /// A queue has at most one eventfd; [`Error::Argument`] (before the ioctl) while another
    /// registration of this queue is alive. Errors: [`Error::BadFd`] / [`Error::InvalidArgument`]
    /// (not an eventfd), [`Error::NotFound`], [`Error::Unsupported`] (older than ABI 3).
    pub fn register_eventfd(&self, fd: BorrowedFd<'_>) -> Result<EventFdRegistration<'_>> {
        if self.eventfd.swap(true, Ordering::AcqRel) {
            return Err(Error::Argument(format!(
                "queue {}/{} has an eventfd registered already",
                self.engine, self.queue
            )));
        }
        match self.set_eventfd(fd.as_raw_fd()) {
            Ok(()) => Ok(EventFdRegistration { queue: self }),
            Err(e) => {
                self.eventfd.store(false, Ordering::Release);
                Err(e)
            }
        }
    }

    /// Creates an eventfd (non-blocking, close-on-exec; nix's `EventFd`) and registers it for
    /// this queue ([`Queue::register_eventfd`]). Poll it with epoll or a reactor, and read the
    /// number of fences that completed or failed with [`QueueEventFd::read`].
    ///
    /// ```no_run
    /// # let dev = neuron_udma::Device::open_index(0)?;
    /// let q = dev.queue(0, 1, 64)?;
    /// let efd = q.eventfd()?;
    /// // ... submit, then epoll on efd.as_fd() ...
    /// let fences = efd.read()?;
    /// # Ok::<(), neuron_udma::Error>(())
    /// ```
    pub fn eventfd(&self) -> Result<QueueEventFd<'_>> {
        let fd = EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)?;
        let reg = self.register_eventfd(fd.as_fd())?;
        Ok(QueueEventFd { reg, fd })
    }

    /// The io_uring command that prepares `copies` on this queue, submits them with a fence and
    /// completes when the fence is done (`NEURON_UDMA_URING_COPY`, ABI 3): put
    /// [`UringCopy::to_bytes`] in the command area of an `IORING_OP_URING_CMD` SQE on the device
    /// file, with `cmd_op` [`UringCopy::CMD_OP`]. The CQE's `res` is 0 or `-errno` (the errors
    /// of `COPY_PREPARE` and `COPY_SUBMIT`; `EIO`: the fence failed; `ESTALE`, `ECANCELED`,
    /// `EBADF`, `ENOTTY`: Documentation/userspace-api.rst). This crate
    /// does not own a ring: with the `io-uring` crate, for example,
    /// `opcode::UringCmd16::new(types::Fd(dev.as_raw_fd()), UringCopy::CMD_OP).cmd(cmd.to_bytes())`.
    /// The command holds the address of `copies`, which must stay alive and unchanged until
    /// its CQE (the driver may read them from io_uring's worker, after `io_uring_enter`
    /// returned); the borrow of the returned value only covers its own life. SQEs are not
    /// ordered against each other: link them (`IOSQE_IO_LINK`) for order. The copies may name a
    /// range of an io_uring registered buffer ([`RegisteredRange`], whose fields the SQE then
    /// carries). [`Error::Argument`] (before anything is submitted): an empty batch,
    /// more than `max_batch` copies, a copy above `max_copy_size`, or an engine or queue above
    /// 65535 (the command's fields are 16 bits).
    pub fn uring_copy<'c>(&self, copies: &'c [Copy]) -> Result<UringCopy<'c>> {
        if copies.is_empty() {
            return Err(Error::Argument("empty batch".into()));
        }
        let max_batch = self.dev.limits()?.max_batch;
        let count = u32::try_from(copies.len()).ok().filter(|&n| n <= max_batch).ok_or_else(|| {
            Error::Argument(format!("batch of {} copies above max_batch {max_batch} (INFO)", copies.len()))
        })?;
        self.check_sizes(copies)?;
        let (Ok(engine), Ok(queue)) = (u16::try_from(self.engine), u16::try_from(self.queue)) else {
            return Err(Error::Argument("engine or queue above 65535: not expressible in an io_uring copy".into()));
        };
        Ok(UringCopy {
            raw: sys::neuron_udma_uring_copy { engine, queue, count, copies: copies.as_ptr() as u64 },
            _copies: PhantomData,
        })
    }

    fn set_eventfd(&self, fd: RawFd) -> Result<()> {
        let mut arg = sys::neuron_udma_eventfd { engine: self.engine, queue: self.queue, fd, ..Default::default() };
        ioctl(self.dev.fd(), sys::NEURON_UDMA_QUEUE_EVENTFD, &mut arg)
    }
}

/// The command area of an io_uring copy ([`Queue::uring_copy`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UringCopy<'c> {
    raw: sys::neuron_udma_uring_copy,
    _copies: PhantomData<&'c [Copy]>,
}

impl UringCopy<'_> {
    /// The `cmd_op` of the SQE: `NEURON_UDMA_URING_COPY`.
    pub const CMD_OP: u32 = sys::NEURON_UDMA_URING_COPY;

    /// The raw ABI struct.
    pub fn raw(&self) -> &sys::neuron_udma_uring_copy {
        &self.raw
    }

    /// The 16 bytes of the SQE's command area (`struct neuron_udma_uring_copy`, native byte
    /// order), for a 64-byte SQE (no `IORING_SETUP_SQE128` needed).
    pub fn to_bytes(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0..2].copy_from_slice(&self.raw.engine.to_ne_bytes());
        b[2..4].copy_from_slice(&self.raw.queue.to_ne_bytes());
        b[4..8].copy_from_slice(&self.raw.count.to_ne_bytes());
        b[8..16].copy_from_slice(&self.raw.copies.to_ne_bytes());
        b
    }
}

/// A range of an io_uring registered buffer (`io_uring_register_buffers`) as a side of the
/// copies of one io_uring copy ([`Queue::uring_copy`]; the driver has it when INFO's `features`
/// has `NEURON_UDMA_FEATURE_URING_FIXED`, [`RegisteredRange::supported`]): the copies name it as
/// any [`Buffer`], at offsets from `addr`, and the SQE carries where it starts:
/// `IORING_URING_CMD_FIXED` in `uring_cmd_flags`, `buf_index` = `index` and `addr`
/// ([`RegisteredRange::sqe_fields`]; with the `io-uring` crate,
/// `UringCmd16::new(..).buf_index(Some(index)).addr(Some(addr))`). The driver maps from `addr`
/// to the furthest byte the copies name; the engine then reads or writes the registered pages
/// themselves, and the driver holds them until it is done, also if the buffer is unregistered
/// meanwhile. Its physically contiguous runs are
/// unknown here, so copies naming it carry `NEURON_UDMA_COPY_SPLIT` ([`Copy::new`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegisteredRange {
    /// The registered buffer's index (the SQE's `buf_index`).
    pub index: u16,
    /// User address of the range's byte 0, inside the registered buffer.
    pub addr: u64,
    /// Bytes the copies may reach from `addr` (checked by [`Copy::new`] here; the driver
    /// checks the registered buffer's end).
    pub len: u32,
}

impl RegisteredRange {
    /// The handle copies name the range by (`NEURON_UDMA_FIXED_BUFFER`; bindgen types the
    /// all-ones macro as -1).
    pub const HANDLE: u64 = u64::MAX;
    /// `IORING_URING_CMD_FIXED`, the SQE's `uring_cmd_flags` bit (`linux/io_uring.h`).
    pub const URING_CMD_FIXED: u32 = 1 << 0;

    /// Whether the driver of `dev` takes registered buffers in io_uring copies (INFO
    /// `features`); a driver without them answers the handle with `ENOENT`.
    pub fn supported(dev: &Device) -> Result<bool> {
        Ok(dev.limits()?.features & sys::NEURON_UDMA_FEATURE_URING_FIXED != 0)
    }

    /// The SQE's fields for the range: `(uring_cmd_flags, buf_index, addr)` (its `len` stays
    /// 0).
    pub fn sqe_fields(&self) -> (u32, u16, u64) {
        (Self::URING_CMD_FIXED, self.index, self.addr)
    }
}

impl crate::Buffer for RegisteredRange {
    fn handle(&self) -> u64 {
        Self::HANDLE
    }
    fn size(&self) -> u64 {
        self.len.into()
    }
    fn import_layout(&self) -> Option<crate::ImportLayout> {
        Some(crate::ImportLayout { addr: self.addr, segments: u32::MAX })
    }
}

/// An eventfd registered for a queue ([`Queue::register_eventfd`]); dropping it unregisters it
/// (`QUEUE_EVENTFD` with fd -1).
#[derive(Debug)]
pub struct EventFdRegistration<'q> {
    queue: &'q Queue<'q>,
}

impl EventFdRegistration<'_> {
    /// Unregisters the eventfd, reporting the error of `QUEUE_EVENTFD`.
    pub fn unregister(self) -> Result<()> {
        let r = self.queue.set_eventfd(-1);
        self.queue.eventfd.store(false, Ordering::Release);
        std::mem::forget(self);
        r
    }
}

impl Drop for EventFdRegistration<'_> {
    fn drop(&mut self) {
        let _ = self.queue.set_eventfd(-1);
        self.queue.eventfd.store(false, Ordering::Release);
    }
}

/// An eventfd of this crate's making registered for a queue ([`Queue::eventfd`]): readable
/// (epoll, a reactor) once a fence of the queue completed or failed. Dropping it unregisters and
/// closes it.
#[derive(Debug)]
pub struct QueueEventFd<'q> {
    // Dropped in this order: unregister, then close.
    reg: EventFdRegistration<'q>,
    fd: EventFd,
}

impl QueueEventFd<'_> {
    /// The fences of the queue that completed or failed since the previous read (the eventfd's
    /// counter, which this resets); 0 if none (the fd is non-blocking). Which ones: ask the
    /// fences, or [`Device::queue_events`].
    pub fn read(&self) -> Result<u64> {
        match self.fd.read() {
            Ok(n) => Ok(n),
            Err(nix::errno::Errno::EAGAIN) => Ok(0),
            Err(e) => Err(e.into()),
        }
    }

    /// The queue the eventfd is registered for.
    pub fn queue(&self) -> &Queue<'_> {
        self.reg.queue
    }
}

impl AsFd for QueueEventFd<'_> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for QueueEventFd<'_> {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// What happened on one queue of the file since the previous `QUEUE_EVENTS`
/// ([`Device::queue_events`]).
#[derive(Clone, Copy, Default, PartialEq, Eq)]
#[repr(transparent)]
pub struct QueueEvent(pub(crate) sys::neuron_udma_queue_event);

impl QueueEvent {
    /// The queue's engine.
    pub fn engine(&self) -> u32 {
        self.0.engine
    }

    /// The queue within the engine.
    pub fn queue(&self) -> u32 {
        self.0.queue
    }

    /// Whether fences of the queue completed (`NEURON_UDMA_EVENT_COMPLETED`).
    pub fn has_completions(&self) -> bool {
        self.0.flags & sys::NEURON_UDMA_EVENT_COMPLETED != 0
    }

    /// The newest fence of the queue known done: every fence up to it is done.
    pub fn completed(&self) -> u64 {
        self.0.completed
    }

    /// A failure (`NEURON_UDMA_EVENT_FAILED`): the newest fence of the queue that failed, and
    /// why (a positive errno, as [`FenceStatus::Failed`]).
    pub fn failure(&self) -> Option<(u64, i32)> {
        (self.0.flags & sys::NEURON_UDMA_EVENT_FAILED != 0).then_some((self.0.failed, self.0.error))
    }

    /// The failure as the error of its fence ([`Error::FenceFailed`]).
    pub fn failure_error(&self) -> Option<Error> {
        self.failure().map(|(fence, error)| Error::FenceFailed {
            engine: self.0.engine,
            queue: self.0.queue,
            fence,
            error,
        })
    }

    /// The raw ABI struct.
    pub fn raw(&self) -> &sys::neuron_udma_queue_event {
        &self.0
    }

    /// Wraps a raw event (for tests and tools).
    pub fn from_raw(raw: sys::neuron_udma_queue_event) -> Self {
        QueueEvent(raw)
    }
}

impl fmt::Debug for QueueEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("QueueEvent");
        d.field("engine", &self.0.engine).field("queue", &self.0.queue).field("completed", &self.0.completed);
        if let Some((fence, error)) = self.failure() {
            d.field("failed", &fence).field("error", &crate::errno_name(error));
        }
        d.finish()
    }
}

impl Device {
    /// One `NEURON_UDMA_QUEUE_EVENTS` (ABI 3): the queues of this file with completions or
    /// failures not reported yet, up to `out.len()` of them, written to `out`; returns how
    /// many. Reporting them clears what `poll()` on the device file shows (`EPOLLIN` for
    /// completions, `EPOLLPRI | EPOLLERR` for failures) once every queue's are reported.
    /// [`Error::Argument`] (before the ioctl): an empty `out`.
    pub fn read_queue_events(&self, out: &mut [QueueEvent]) -> Result<usize> {
        let max = u32::try_from(out.len()).unwrap_or(u32::MAX);
        if max == 0 {
            return Err(Error::Argument("QUEUE_EVENTS into no room".into()));
        }
        let mut arg = sys::neuron_udma_events { events: out.as_mut_ptr() as u64, max, count: 0 };
        ioctl(self.fd(), sys::NEURON_UDMA_QUEUE_EVENTS, &mut arg)?;
        // The driver never reports more than `max`; do not trust it beyond the slice either.
        Ok((arg.count as usize).min(out.len()))
    }

    /// Every queue event not reported yet (`QUEUE_EVENTS` until the driver has no more):
    /// empty if nothing happened. See [`Device::read_queue_events`].
    ///
    /// ```no_run
    /// # let dev = neuron_udma::Device::open_index(0)?;
    /// for ev in dev.queue_events()? {
    ///     if let Some(e) = ev.failure_error() {
    ///         eprintln!("{e}");
    ///     }
    ///     println!("queue {}/{}: fences up to {} done", ev.engine(), ev.queue(), ev.completed());
    /// }
    /// # Ok::<(), neuron_udma::Error>(())
    /// ```
    pub fn queue_events(&self) -> Result<Vec<QueueEvent>> {
        let room = self.queues.lock().unwrap_or_else(|e| e.into_inner()).len().max(1);
        let mut all = Vec::new();
        let mut buf = vec![QueueEvent::default(); room];
        // A full answer may have left queues out; the driver reports one record per queue, so a
        // few rounds suffice (bounded, should events keep arriving).
        for _ in 0..16 {
            let n = self.read_queue_events(&mut buf)?;
            all.extend_from_slice(&buf[..n]);
            if n < buf.len() {
                break;
            }
        }
        Ok(all)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Buffer, DeviceEvents, Info, QueueOptions, Readiness};
    use std::future::Future;
    use std::sync::Arc;
    use std::task::{Context, Poll, Wake, Waker};

    /// /dev/null posing as a device whose INFO says `info`: every ioctl fails with ENOTTY.
    fn fake_device(info: Info) -> Device {
        let dev = Device::open("/dev/null").unwrap();
        dev.limits.set(info).unwrap();
        dev
    }

    struct Fake(u64, u64);
    impl Buffer for Fake {
        fn handle(&self) -> u64 {
            self.0
        }
        fn size(&self) -> u64 {
            self.1
        }
    }

    #[test]
    fn status_values_and_errors() {
        let id = FenceId { engine: 4, queue: 2, number: 9 };
        assert_eq!(FenceStatus::from_raw(0, 0), FenceStatus::Pending);
        assert_eq!(FenceStatus::from_raw(1, 0), FenceStatus::Done);
        assert_eq!(FenceStatus::from_raw(2, libc::EIO), FenceStatus::Failed { error: libc::EIO });
        assert_eq!(FenceStatus::from_raw(3, 0), FenceStatus::Expired);
        assert_eq!(FenceStatus::from_raw(7, 0), FenceStatus::Unknown(7));
        assert!(matches!(FenceStatus::Pending.to_result(id), Ok(false)));
        assert!(matches!(FenceStatus::Done.to_result(id), Ok(true)));
        match (FenceStatus::Failed { error: libc::ETIMEDOUT }).to_result(id) {
            Err(Error::FenceFailed { engine: 4, queue: 2, fence: 9, error }) => assert_eq!(error, libc::ETIMEDOUT),
            r => panic!("{r:?}"),
        }
        let e = FenceStatus::Expired.to_result(id).unwrap_err();
        assert!(matches!(e, Error::Expired));
        assert_eq!(e.errno(), libc::ESTALE);
        assert!(matches!(FenceStatus::Unknown(7).to_result(id), Err(Error::Other(libc::EPROTO))));
        assert_eq!(id.to_string(), "fence 9 of queue 4/2");
    }

    #[test]
    fn queue_events_decode() {
        let ev = QueueEvent::from_raw(sys::neuron_udma_queue_event {
            engine: 4,
            queue: 3,
            flags: sys::NEURON_UDMA_EVENT_COMPLETED,
            completed: 12,
            ..Default::default()
        });
        assert_eq!((ev.engine(), ev.queue(), ev.completed(), ev.has_completions()), (4, 3, 12, true));
        assert_eq!(ev.failure(), None);
        assert!(ev.failure_error().is_none());
        let ev = QueueEvent::from_raw(sys::neuron_udma_queue_event {
            engine: 4,
            queue: 3,
            flags: sys::NEURON_UDMA_EVENT_FAILED,
            error: libc::EIO,
            completed: 12,
            failed: 15,
        });
        assert!(!ev.has_completions());
        assert_eq!(ev.failure(), Some((15, libc::EIO)));
        assert!(matches!(
            ev.failure_error(),
            Some(Error::FenceFailed { engine: 4, queue: 3, fence: 15, error: libc::EIO })
        ));
        assert!(format!("{ev:?}").contains("failed: 15, error: \"EIO\""), "{ev:?}");
    }

    #[test]
    fn fence_calls_without_a_driver() {
        let dev = fake_device(Info { abi_version: 3, ..Default::default() });
        let q = Queue::new(&dev, 4, 2, QueueOptions::new(64));
        // COPY_SUBMIT reaches the file: /dev/null does not know it.
        assert!(matches!(q.submit(), Err(Error::Unsupported)));
        // Fence 0 is done without an ioctl.
        let none = q.fence(0);
        assert!(none.is_done().unwrap());
        assert!(none.wait(None).is_ok());
        assert_eq!(none.report().unwrap(), FenceReport { status: FenceStatus::Done, completed: 0, submitted: 0 });
        // Any other number asks the file.
        let f = q.fence(5);
        assert_eq!(f.id(), FenceId { engine: 4, queue: 2, number: 5 });
        assert!(matches!(f.is_done(), Err(Error::Unsupported)));
        assert!(matches!(f.wait(Some(Duration::from_millis(10))), Err(Error::Unsupported)));
        assert_eq!(f, q.fence(5));
        assert_ne!(f, q.fence(6));
        assert_eq!(format!("{f:?}"), "Fence { engine: 4, queue: 2, number: 5 }");
        // QUEUE_EVENTS: no room is refused before the ioctl.
        assert!(matches!(dev.read_queue_events(&mut []), Err(Error::Argument(_))));
        assert!(matches!(dev.queue_events(), Err(Error::Unsupported)));
    }

    #[test]
    fn one_eventfd_registration_per_queue() {
        let dev = fake_device(Info { abi_version: 3, ..Default::default() });
        let q = Queue::new(&dev, 4, 2, QueueOptions::new(64));
        // The ioctl fails on /dev/null, and leaves the queue free to register again.
        assert!(matches!(q.eventfd(), Err(Error::Unsupported)));
        assert!(matches!(q.eventfd(), Err(Error::Unsupported)));
        // While a registration lives, another is refused before the ioctl; dropping it frees
        // the queue again (its unregister ioctl fails on /dev/null, which drop ignores).
        let reg = EventFdRegistration { queue: &q };
        q.eventfd.store(true, Ordering::Release);
        assert!(matches!(q.eventfd(), Err(Error::Argument(_))));
        drop(reg);
        assert!(matches!(q.eventfd(), Err(Error::Unsupported)));
        let reg = EventFdRegistration { queue: &q };
        q.eventfd.store(true, Ordering::Release);
        assert!(matches!(reg.unregister(), Err(Error::Unsupported)));
        assert!(!q.eventfd.load(Ordering::Acquire));
    }

    #[test]
    fn abi3_calls_check_before_the_ioctl() {
        let old = fake_device(Info { abi_version: 2, min_ring_descs: 32, max_ring_descs: 1024, ..Default::default() });
        // Device rings on a driver older than ABI 3: refused before QUEUE_INIT.
        assert!(matches!(old.queue_with(0, 1, QueueOptions::new(64).device_rings(true)), Err(Error::Unsupported)));
        assert!(matches!(old.queue_with(0, 1, QueueOptions::new(48)), Err(Error::Argument(_))));
        let dev = fake_device(Info { abi_version: 3, min_ring_descs: 32, max_ring_descs: 1024, ..Default::default() });
        assert!(matches!(dev.queue_with(0, 1, QueueOptions::new(64).device_rings(true)), Err(Error::Unsupported)));
        let b = Fake(1, 8192);
        assert!(matches!(dev.memset(&b, 0, 0, 1, None), Err(Error::Argument(_))));
        assert!(matches!(dev.memset(&b, 4096, 4097, 1, None), Err(Error::Argument(_))));
        assert!(matches!(dev.memset(&b, 4096, 4096, 0xff, None), Err(Error::Unsupported)));
        // A device buffer without an mmap offset (an ABI 2 driver) cannot be mapped.
        let hbm = crate::DeviceBuffer { dev: &dev, handle: 0, size: 4096, mmap_offset: 0 };
        assert!(matches!(hbm.map(), Err(Error::Unsupported)));
        assert!(matches!(dev.dmabuf_export(&hbm), Err(Error::Unsupported)));
        // Another device file's buffer is refused before the ioctl.
        assert!(matches!(old.dmabuf_export(&hbm), Err(Error::Argument(_))));
        let null = std::fs::File::open("/dev/null").unwrap();
        assert!(matches!(dev.dmabuf_import(null.as_fd()), Err(Error::Unsupported)));
        assert!(matches!(dev.dmabuf_import_writable(null.as_fd()), Err(Error::Unsupported)));
    }

    #[test]
    fn uring_copy_commands() {
        let dev = fake_device(Info { abi_version: 3, max_batch: 2, max_copy_size: 4096, ..Default::default() });
        let q = Queue::new(&dev, 4, 3, QueueOptions::new(64));
        let b = Fake(1, 1 << 20);
        let copies = [Copy::new(&b, 0, &b, 8192, 4096).unwrap(), Copy::new(&b, 4096, &b, 12288, 100).unwrap()];
        let cmd = q.uring_copy(&copies).unwrap();
        assert_eq!(
            *cmd.raw(),
            sys::neuron_udma_uring_copy { engine: 4, queue: 3, count: 2, copies: copies.as_ptr() as u64 }
        );
        let bytes = cmd.to_bytes();
        assert_eq!(bytes.len(), std::mem::size_of::<sys::neuron_udma_uring_copy>());
        // SAFETY: the struct is 16 bytes of plain integers; any bytes are a valid value.
        let back: sys::neuron_udma_uring_copy = unsafe { std::mem::transmute(bytes) };
        assert_eq!(back, *cmd.raw());
        assert_eq!(UringCopy::CMD_OP, 0x4010_B920);
        assert!(matches!(q.uring_copy(&[]), Err(Error::Argument(_))));
        assert!(matches!(q.uring_copy(&[copies[0]; 3]), Err(Error::Argument(_))));
        let big = Copy::new(&b, 0, &b, 8192, 4097).unwrap();
        assert!(matches!(q.uring_copy(&[big]), Err(Error::Argument(_))));
        let wide = Queue::new(&dev, 70_000, 1, QueueOptions::new(64));
        assert!(matches!(wide.uring_copy(&copies), Err(Error::Argument(_))));
    }

    #[test]
    fn registered_range_copies() {
        let dev = fake_device(Info { abi_version: 3, max_batch: 4, max_copy_size: 65536, ..Default::default() });
        assert!(!RegisteredRange::supported(&dev).unwrap());
        let b = Fake(1, 1 << 20);
        let r = RegisteredRange { index: 2, addr: 0x7000_0000_1003, len: 3 * 4096 };
        let c = Copy::new(&b, 0, &r, 5, 4096).unwrap();
        assert_eq!(c.raw().dst_handle, u64::MAX);
        assert_eq!(c.raw().dst_handle as i64, sys::NEURON_UDMA_FIXED_BUFFER as i64);
        assert_eq!(c.raw().flags, sys::NEURON_UDMA_COPY_SPLIT);
        // The range's end is checked here; the pages crossed bound the pairs.
        assert!(matches!(Copy::new(&r, 3 * 4096 - 10, &b, 0, 11), Err(Error::Argument(_))));
        assert_eq!(Copy::max_pairs(&r, 0, &b, 0, 4096), 2);
        assert_eq!(r.sqe_fields(), (1, 2, 0x7000_0000_1003));
        let dev =
            fake_device(Info { abi_version: 3, features: sys::NEURON_UDMA_FEATURE_URING_FIXED, ..Default::default() });
        assert!(RegisteredRange::supported(&dev).unwrap());
    }

    #[test]
    fn device_ring_engines() {
        let info = Info { engines: 132, device_ring_engines: [u64::MAX, 0, 0x9], ..Default::default() };
        assert!(info.has_device_rings(0) && info.has_device_rings(63));
        assert!(!info.has_device_rings(64) && info.has_device_rings(128) && info.has_device_rings(131));
        assert!(!info.has_device_rings(132) && !info.has_abi3());
        assert_eq!(info.device_ring_engine_list().len(), 66);
        assert!(Info { abi_version: 3, ..Default::default() }.has_abi3());
    }

    struct NoWake;
    impl Wake for NoWake {
        fn wake(self: Arc<Self>) {}
    }

    /// A source that must not be needed.
    struct Never;
    impl Readiness for Never {
        fn poll_ready(&self, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            panic!("polled the readiness source");
        }
    }

    #[test]
    fn completion_futures_on_a_fake_device() {
        let dev = fake_device(Info { abi_version: 3, ..Default::default() });
        let other = fake_device(Info { abi_version: 3, ..Default::default() });
        let q = Queue::new(&dev, 4, 2, QueueOptions::new(64));
        let events = DeviceEvents::new(&dev, Never);
        let waker = Waker::from(Arc::new(NoWake));
        let mut cx = Context::from_waker(&waker);
        // Fence 0: ready at once.
        let mut f = std::pin::pin!(q.fence(0).completion(&events));
        assert!(matches!(f.as_mut().poll(&mut cx), Poll::Ready(Ok(()))));
        // FENCE_STATUS fails (ENOTTY): the error, before the source is polled.
        let mut f = std::pin::pin!(events.completion(q.fence(3)));
        assert!(matches!(f.as_mut().poll(&mut cx), Poll::Ready(Err(Error::Unsupported))));
        // A fence of another file: refused.
        let foreign = DeviceEvents::new(&other, Never);
        let mut f = std::pin::pin!(q.fence(3).completion(&foreign));
        assert!(matches!(f.as_mut().poll(&mut cx), Poll::Ready(Err(Error::Argument(_)))));
        // The runtime-neutral listener starts and stops its thread.
        let events = DeviceEvents::with_thread(&dev).unwrap();
        let mut f = std::pin::pin!(q.fence(0).completion(&events));
        assert!(matches!(f.as_mut().poll(&mut cx), Poll::Ready(Ok(()))));
    }
}
