// SPDX-License-Identifier: MIT OR Apache-2.0
//! The async fence: a `Future` that is ready when a fence is done ([`Fence::completion`]),
//! woken through the device file's readiness (`poll()` says `EPOLLIN` while a queue of the file
//! has completed fences not reported yet, `EPOLLPRI | EPOLLERR` for a failure; `QUEUE_EVENTS`
//! clears it).
//!
//! Design: a [`DeviceEvents`] is the one listener of a device file. It owns a [`Readiness`]
//! source, the only runtime-specific part: [`ThreadReadiness`] (runtime-neutral: one helper
//! thread blocked in `poll(2)` while a future waits), [`TokioReadiness`] (feature `tokio`:
//! tokio's `AsyncFd`), or the caller's own. A [`FenceCompletion`] future, when polled:
//!
//! 1. enters the listener's list of waiters (with its current waker);
//! 2. asks `FENCE_STATUS`: done, failed or expired ends it;
//! 3. else polls the readiness source. `Pending`: its waker is the one the source holds (the
//!    "registrar"), and it sleeps. `Ready`: the readiness is consumed, the listener drains
//!    `QUEUE_EVENTS` (which clears the file's readiness), wakes every other waiter (their fences
//!    may be done now: they ask `FENCE_STATUS` again) and goes back to 2.
//!
//! A source keeps one waker (as tokio's does), so whichever waiter leaves the list while it is
//! the registrar (its fence done, or the future dropped) wakes the others, one of which
//! registers again. Nothing spins: a waiter is polled again only when the source fired, when
//! another waiter drained events, or when the registrar left.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::thread::JoinHandle;

use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};

use crate::{Device, Error, Fence, Result};

/// Where the readiness of the device file comes from: a reactor (tokio's `TokioReadiness`, with
/// the feature `tokio`), a helper thread ([`ThreadReadiness`]), or any other. It is polled only
/// by its [`DeviceEvents`], one call at a time.
pub trait Readiness {
    /// `Ready(Ok(()))`: the file may have become readable (`EPOLLIN`, `EPOLLPRI`, `EPOLLERR`)
    /// since the previous `Ready`. That readiness is consumed: the caller drains `QUEUE_EVENTS`
    /// next, which clears the file's readiness, and polls again. `Pending`: the waker of `cx`
    /// (a source may keep only the latest one it was given) is woken once the file may be
    /// readable. `Ready(Err(_))` ends every waiting future with that error.
    ///
    /// A source must not lose an edge: readiness that arrives after it returned `Ready` must
    /// make a later poll `Ready` (or wake its waker). It may report readiness that is not
    /// there any more (a spurious wakeup costs one `QUEUE_EVENTS` and a `FENCE_STATUS` per
    /// waiter).
    fn poll_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;
}

impl<R: Readiness + ?Sized> Readiness for Box<R> {
    fn poll_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        (**self).poll_ready(cx)
    }
}

/// The waiters of a [`DeviceEvents`]: who to wake after a drain, and whose waker the readiness
/// source holds. The fence logic of [`Waiters::poll_until`] is independent of the device (the
/// status check and the drain are closures), so it is tested with fakes.
#[derive(Debug, Default)]
pub(crate) struct Waiters {
    inner: Mutex<WaitersInner>,
}

#[derive(Debug, Default)]
struct WaitersInner {
    next_id: u64,
    wakers: HashMap<u64, Waker>,
    /// The waiter whose waker the source holds (its last `poll_ready` was `Pending`).
    registrar: Option<u64>,
}

impl Waiters {
    fn lock(&self) -> MutexGuard<'_, WaitersInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Enters (or updates) waiter `*id` with `waker`.
    fn enter(&self, id: &mut Option<u64>, waker: &Waker) {
        let mut w = self.lock();
        let key = *id.get_or_insert_with(|| {
            w.next_id += 1;
            w.next_id
        });
        match w.wakers.get_mut(&key) {
            Some(old) if old.will_wake(waker) => {}
            Some(old) => old.clone_from(waker),
            None => {
                w.wakers.insert(key, waker.clone());
            }
        }
    }

    /// Leaves: a registrar that leaves wakes the others, so that one of them registers.
    pub(crate) fn leave(&self, id: &mut Option<u64>) {
        let Some(key) = id.take() else { return };
        let wake: Vec<Waker> = {
            let mut w = self.lock();
            w.wakers.remove(&key);
            if w.registrar == Some(key) {
                w.registrar = None;
                w.wakers.values().cloned().collect()
            } else {
                Vec::new()
            }
        };
        wake.into_iter().for_each(Waker::wake);
    }

    /// Polls the source on behalf of waiter `key`, keeping `registrar` right: under the lock,
    /// so no other waiter's poll can come between the source's registration and the record.
    fn poll_source(&self, key: u64, source: &dyn Readiness, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut w = self.lock();
        let r = source.poll_ready(cx);
        w.registrar = match r {
            Poll::Pending => Some(key),
            // Consumed: the source holds no waker of ours any more.
            Poll::Ready(_) => None,
        };
        r
    }

    /// Wakes every waiter but `key`.
    fn wake_others(&self, key: u64) {
        let wake: Vec<Waker> = self.lock().wakers.iter().filter(|(&k, _)| k != key).map(|(_, w)| w.clone()).collect();
        wake.into_iter().for_each(Waker::wake);
    }

    /// The waiter loop of the module docs: `check` says whether the awaited thing happened
    /// (`Ok(Some(_))`, or an error), `drain` consumes the file's events after the source fired.
    pub(crate) fn poll_until<T>(
        &self,
        cx: &mut Context<'_>,
        id: &mut Option<u64>,
        source: &dyn Readiness,
        mut check: impl FnMut() -> Result<Option<T>>,
        mut drain: impl FnMut() -> Result<()>,
    ) -> Poll<Result<T>> {
        loop {
            self.enter(id, cx.waker());
            let key = id.expect("entered");
            match check() {
                Ok(None) => {}
                Ok(Some(v)) => {
                    self.leave(id);
                    return Poll::Ready(Ok(v));
                }
                Err(e) => {
                    self.leave(id);
                    return Poll::Ready(Err(e));
                }
            }
            match self.poll_source(key, source, cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => {
                    // Every waiter will see the source's error when it polls it.
                    self.wake_others(key);
                    self.leave(id);
                    return Poll::Ready(Err(e.into()));
                }
                Poll::Ready(Ok(())) => {
                    let drained = drain();
                    // Whatever the drain found, the others' fences may be done now.
                    self.wake_others(key);
                    if let Err(e) = drained {
                        self.leave(id);
                        return Poll::Ready(Err(e));
                    }
                }
            }
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().wakers.len()
    }

    #[cfg(test)]
    fn registrar(&self) -> Option<u64> {
        self.lock().registrar
    }
}

/// The one listener of a device file's completion events, for [`FenceCompletion`] futures:
/// it owns the readiness source `R` and drains `QUEUE_EVENTS` when it fires. Create one per
/// device file and share it (`&DeviceEvents`) among the futures; it takes the file's events
/// for itself, so do not read them elsewhere ([`Device::queue_events`], or another listener)
/// while futures wait: they would not be woken.
///
/// ```no_run
/// use neuron_udma::{Copy, DeviceEvents};
/// # let dev = neuron_udma::Device::open_index(0)?;
/// # let (src, dst) = (dev.alloc_host(65536)?, dev.alloc_device(65536)?);
/// let events = DeviceEvents::with_thread(&dev)?;
/// let q = dev.queue(0, 1, 64)?;
/// q.prepare_one(&Copy::new(&src, 0, &dst, 0, 65536)?)?;
/// let fence = q.submit()?;
/// let done = fence.completion(&events); // a Future<Output = neuron_udma::Result<()>>
/// # let _ = done;
/// # Ok::<(), neuron_udma::Error>(())
/// ```
pub struct DeviceEvents<'d, R: Readiness = ThreadReadiness> {
    dev: &'d Device,
    source: R,
    waiters: Waiters,
}

impl<R: Readiness> std::fmt::Debug for DeviceEvents<'_, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceEvents").field("device", &self.dev.path()).finish_non_exhaustive()
    }
}

impl<'d, R: Readiness> DeviceEvents<'d, R> {
    /// A listener of `dev` whose readiness comes from `source` (which must report the
    /// readiness of `dev`'s file, e.g. built from `dev.as_fd()`).
    pub fn new(dev: &'d Device, source: R) -> Self {
        DeviceEvents { dev, source, waiters: Waiters::default() }
    }

    /// The device.
    pub fn device(&self) -> &'d Device {
        self.dev
    }

    /// The readiness source.
    pub fn source(&self) -> &R {
        &self.source
    }

    /// A future that is ready when `fence` is done ([`Fence::completion`]).
    pub fn completion<'a>(&'a self, fence: Fence<'a>) -> FenceCompletion<'a, R> {
        FenceCompletion { events: self, fence, id: None }
    }

    fn drain(&self) -> Result<()> {
        self.dev.queue_events().map(drop)
    }
}

impl<'d> DeviceEvents<'d, ThreadReadiness> {
    /// A runtime-neutral listener of `dev`: its readiness comes from a [`ThreadReadiness`]
    /// (one helper thread, blocked in `poll(2)` only while a future waits). Works with any
    /// executor, `futures::executor::block_on` included.
    pub fn with_thread(dev: &'d Device) -> Result<Self> {
        Ok(Self::new(dev, ThreadReadiness::new(dev.as_fd())?))
    }
}

#[cfg(feature = "tokio")]
impl<'d> DeviceEvents<'d, TokioReadiness> {
    /// A listener of `dev` on tokio's reactor ([`TokioReadiness`]). Call it from within a
    /// tokio runtime with its IO driver enabled (`enable_io`); [`Error::NotSupported`]
    /// otherwise.
    pub fn with_tokio(dev: &'d Device) -> Result<Self> {
        Ok(Self::new(dev, TokioReadiness::new(dev.as_fd()).map_err(|_| Error::NotSupported)?))
    }
}

impl<'q> Fence<'q> {
    /// A future that is ready when the fence is done: `Ok(())`, or the errors of
    /// [`Fence::is_done`] ([`Error::FenceFailed`], [`Error::Expired`], ...) and those of the
    /// listener (`QUEUE_EVENTS`, the readiness source). `events` must listen to this fence's
    /// device ([`Error::Argument`] otherwise). Dropping the future cancels nothing: the copies
    /// go on.
    pub fn completion<'a, R: Readiness>(&self, events: &'a DeviceEvents<'_, R>) -> FenceCompletion<'a, R>
    where
        'q: 'a,
    {
        FenceCompletion { events, fence: *self, id: None }
    }
}

/// The future of [`Fence::completion`]: `Output = Result<()>`. It asks `FENCE_STATUS` each
/// time it is polled and sleeps on its [`DeviceEvents`] in between.
#[must_use = "futures do nothing unless polled"]
pub struct FenceCompletion<'a, R: Readiness = ThreadReadiness> {
    events: &'a DeviceEvents<'a, R>,
    fence: Fence<'a>,
    /// The waiter id while in the listener's list.
    id: Option<u64>,
}

impl<R: Readiness> std::fmt::Debug for FenceCompletion<'_, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FenceCompletion").field("fence", &self.fence).finish_non_exhaustive()
    }
}

impl<R: Readiness> FenceCompletion<'_, R> {
    /// The fence awaited.
    pub fn fence(&self) -> Fence<'_> {
        self.fence
    }
}

impl<R: Readiness> Future for FenceCompletion<'_, R> {
    type Output = Result<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let this = self.get_mut();
        let events = this.events;
        if !std::ptr::eq(this.fence.queue.dev, events.dev) {
            return Poll::Ready(Err(Error::Argument("the fence's queue belongs to another device file".into())));
        }
        let fence = this.fence;
        events.waiters.poll_until(
            cx,
            &mut this.id,
            &events.source,
            || fence.is_done().map(|done| done.then_some(())),
            || events.drain(),
        )
    }
}

impl<R: Readiness> Drop for FenceCompletion<'_, R> {
    fn drop(&mut self) {
        self.events.waiters.leave(&mut self.id);
    }
}

/// Runtime-neutral [`Readiness`]: a helper thread that blocks in `poll(2)` on (a duplicate of)
/// the device file while a waiter is armed, and wakes the latest waker when the file is
/// readable. It polls again only after the readiness was consumed and a waiter armed it anew,
/// so a level-triggered `poll()` on a file not drained yet cannot make it spin. Dropping it
/// stops and joins the thread (through an eventfd).
#[derive(Debug)]
pub struct ThreadReadiness {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<ThreadState>,
    armed: Condvar,
    stop: EventFd,
}

#[derive(Debug, Default)]
struct ThreadState {
    waker: Option<Waker>,
    /// A waiter wants to know when the file is readable.
    armed: bool,
    /// The file was readable since the readiness was last consumed.
    ready: bool,
    /// `poll(2)` failed: reported to the next poller.
    error: Option<i32>,
    stop: bool,
}

impl ThreadReadiness {
    /// Starts the helper thread for `fd` (duplicated: the thread never touches the caller's
    /// fd number). Any pollable fd works; [`DeviceEvents::with_thread`] passes the device's.
    /// The duplicate keeps the open file alive until this is dropped: the driver releases a
    /// file's buffers and queues only when its last fd is closed. (Inside a [`DeviceEvents`],
    /// which borrows the [`Device`], it is dropped first.)
    pub fn new(fd: BorrowedFd<'_>) -> io::Result<Self> {
        let fd = fd.try_clone_to_owned()?;
        let stop = EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)?;
        let shared = Arc::new(Shared { state: Mutex::new(ThreadState::default()), armed: Condvar::new(), stop });
        let s = shared.clone();
        let thread =
            std::thread::Builder::new().name("neuron-udma-events".into()).spawn(move || readiness_thread(&s, fd))?;
        Ok(ThreadReadiness { shared, thread: Some(thread) })
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, ThreadState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn readiness_thread(s: &Shared, fd: OwnedFd) {
    let file_events = PollFlags::POLLIN | PollFlags::POLLPRI;
    loop {
        {
            let mut st = s.lock();
            // Sleep until stopped, or armed with the readiness not yet reported.
            while !st.stop && (!st.armed || st.ready) {
                st = s.armed.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            if st.stop {
                return;
            }
        }
        let mut fds = [PollFd::new(fd.as_fd(), file_events), PollFd::new(s.stop.as_fd(), PollFlags::POLLIN)];
        let r = nix::poll::poll(&mut fds, PollTimeout::NONE);
        let fired = fds[0].revents().is_some_and(|e| !e.is_empty());
        let waker = {
            let mut st = s.lock();
            if st.stop {
                return;
            }
            match r {
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => st.error = Some(e as i32),
                Ok(_) if fired => st.ready = true,
                Ok(_) => continue,
            }
            st.armed = false;
            st.waker.take()
        };
        // After an error too (EBADF, ENOMEM: not recoverable here) the thread waits to be
        // armed again: the error goes to the next poller.
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl Readiness for ThreadReadiness {
    fn poll_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut st = self.shared.lock();
        if let Some(e) = st.error.take() {
            return Poll::Ready(Err(io::Error::from_raw_os_error(e)));
        }
        if st.ready {
            st.ready = false;
            return Poll::Ready(Ok(()));
        }
        match &mut st.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            slot => *slot = Some(cx.waker().clone()),
        }
        if !st.armed {
            st.armed = true;
            self.shared.armed.notify_one();
        }
        Poll::Pending
    }
}

impl Drop for ThreadReadiness {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.armed.notify_one();
        let _ = self.shared.stop.write(1);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// [`Readiness`] from tokio's reactor (feature `tokio`): an `AsyncFd` over a duplicate of the
/// device file, registered for `READABLE | PRIORITY` (`EPOLLIN` for completions, `EPOLLPRI` for
/// failures; `EPOLLERR` is always reported), waited for with `AsyncFd::ready`, whose readiness
/// is cleared before the listener drains `QUEUE_EVENTS` (so an event after the drain sets it
/// again).
#[cfg(feature = "tokio")]
pub struct TokioReadiness {
    fd: Arc<tokio::io::unix::AsyncFd<OwnedFd>>,
    wait: Mutex<Option<ReadyFuture>>,
}

/// The `AsyncFd::ready` wait in progress (it owns an `Arc` of the `AsyncFd`).
#[cfg(feature = "tokio")]
type ReadyFuture = Pin<Box<dyn Future<Output = io::Result<()>> + Send>>;

#[cfg(feature = "tokio")]
impl std::fmt::Debug for TokioReadiness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokioReadiness")
            .field("fd", &std::os::fd::AsRawFd::as_raw_fd(self.fd.get_ref()))
            .finish_non_exhaustive()
    }
}

#[cfg(feature = "tokio")]
impl TokioReadiness {
    /// The interests waited for: completions and failures.
    const INTEREST: tokio::io::Interest = tokio::io::Interest::READABLE.add(tokio::io::Interest::PRIORITY);

    /// Registers (a duplicate of) `fd` with the current tokio runtime's reactor (the duplicate
    /// keeps the open file alive until this is dropped, as for [`ThreadReadiness::new`]).
    /// Errors: no current runtime, or one without its IO driver; the errors of `dup` and
    /// `epoll_ctl`.
    pub fn new(fd: BorrowedFd<'_>) -> io::Result<Self> {
        tokio::runtime::Handle::try_current().map_err(io::Error::other)?;
        let fd = fd.try_clone_to_owned()?;
        // AsyncFd::register_with_interest panics without an IO driver; the runtime builder's
        // enable_io (or enable_all) provides it.
        let fd = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // SAFETY: the OwnedFd is open, and AsyncFd owns it until it is dropped: its
            // as_raw_fd() is the same open file description for the AsyncFd's whole life.
            unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, Self::INTEREST) }
        }))
        .map_err(|_| io::Error::other("tokio runtime without its IO driver (enable_io)"))?
        .map_err(io::Error::from)?;
        Ok(TokioReadiness { fd: Arc::new(fd), wait: Mutex::new(None) })
    }
}

#[cfg(feature = "tokio")]
impl Readiness for TokioReadiness {
    fn poll_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut wait = self.wait.lock().unwrap_or_else(|e| e.into_inner());
        let fut = wait.get_or_insert_with(|| {
            let fd = self.fd.clone();
            Box::pin(async move {
                let mut guard = fd.ready(Self::INTEREST).await?;
                guard.clear_ready();
                Ok(())
            })
        });
        match fut.as_mut().poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(r) => {
                *wait = None;
                Poll::Ready(r)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::{Cell, RefCell};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    /// A waker that counts its wakes.
    #[derive(Default)]
    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    fn counter() -> (Arc<Count>, Waker) {
        let c = Arc::new(Count::default());
        (c.clone(), Waker::from(c))
    }
    fn wakes(c: &Count) -> usize {
        c.0.load(Ordering::SeqCst)
    }

    /// A fake source with tokio's single waker slot: `fire()` makes it ready and wakes the
    /// waker it holds.
    #[derive(Default)]
    struct FakeSource {
        ready: Cell<bool>,
        waker: RefCell<Option<Waker>>,
        polls: Cell<usize>,
        error: Cell<Option<i32>>,
    }
    impl FakeSource {
        fn fire(&self) {
            self.ready.set(true);
            if let Some(w) = self.waker.borrow_mut().take() {
                w.wake();
            }
        }
    }
    impl Readiness for FakeSource {
        fn poll_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.polls.set(self.polls.get() + 1);
            if let Some(e) = self.error.take() {
                return Poll::Ready(Err(io::Error::from_raw_os_error(e)));
            }
            if self.ready.replace(false) {
                return Poll::Ready(Ok(()));
            }
            *self.waker.borrow_mut() = Some(cx.waker().clone());
            Poll::Pending
        }
    }

    /// A fake queue: the newest fence done, and the drains done.
    #[derive(Default)]
    struct FakeQueue {
        completed: Cell<u64>,
        failed: Cell<Option<(u64, i32)>>,
        drains: Cell<usize>,
        checks: Cell<usize>,
    }
    impl FakeQueue {
        fn check(&self, fence: u64) -> Result<Option<()>> {
            self.checks.set(self.checks.get() + 1);
            if let Some((f, error)) = self.failed.get() {
                if fence <= f && fence > self.completed.get() {
                    return Err(Error::FenceFailed { engine: 0, queue: 1, fence, error });
                }
            }
            Ok((self.completed.get() >= fence).then_some(()))
        }
        fn drain(&self) -> Result<()> {
            self.drains.set(self.drains.get() + 1);
            Ok(())
        }
    }

    fn poll(
        w: &Waiters,
        src: &FakeSource,
        q: &FakeQueue,
        id: &mut Option<u64>,
        waker: &Waker,
        fence: u64,
    ) -> Poll<Result<()>> {
        let mut cx = Context::from_waker(waker);
        w.poll_until(&mut cx, id, src, || q.check(fence), || q.drain())
    }

    #[test]
    fn a_done_fence_is_ready_without_touching_the_source() {
        let (w, src, q) = (Waiters::default(), FakeSource::default(), FakeQueue::default());
        q.completed.set(5);
        let (_c, waker) = counter();
        let mut id = None;
        assert!(matches!(poll(&w, &src, &q, &mut id, &waker, 5), Poll::Ready(Ok(()))));
        assert_eq!((src.polls.get(), q.drains.get(), w.len()), (0, 0, 0));
        assert!(id.is_none());
    }

    #[test]
    fn a_pending_fence_sleeps_until_the_source_fires() {
        let (w, src, q) = (Waiters::default(), FakeSource::default(), FakeQueue::default());
        let (c, waker) = counter();
        let mut id = None;
        assert!(poll(&w, &src, &q, &mut id, &waker, 3).is_pending());
        assert_eq!((q.checks.get(), src.polls.get(), w.registrar(), wakes(&c)), (1, 1, id, 0));
        // Fences 1 and 2 complete: the source fires, the future is woken, drains, and sleeps
        // again on the source: one check per round, no spinning.
        q.completed.set(2);
        src.fire();
        assert_eq!(wakes(&c), 1);
        assert!(poll(&w, &src, &q, &mut id, &waker, 3).is_pending());
        assert_eq!((q.checks.get(), src.polls.get(), q.drains.get()), (3, 3, 1));
        assert_eq!(w.registrar(), id);
        // Not woken again without an event.
        assert_eq!(wakes(&c), 1);
        q.completed.set(3);
        src.fire();
        assert_eq!(wakes(&c), 2);
        assert!(matches!(poll(&w, &src, &q, &mut id, &waker, 3), Poll::Ready(Ok(()))));
        assert_eq!((w.len(), w.registrar()), (0, None));
    }

    #[test]
    fn failures_end_the_future_with_the_fence_error() {
        let (w, src, q) = (Waiters::default(), FakeSource::default(), FakeQueue::default());
        let (_c, waker) = counter();
        let mut id = None;
        assert!(poll(&w, &src, &q, &mut id, &waker, 4).is_pending());
        q.failed.set(Some((4, libc::ETIMEDOUT)));
        src.fire();
        match poll(&w, &src, &q, &mut id, &waker, 4) {
            Poll::Ready(Err(Error::FenceFailed { fence: 4, error, .. })) => assert_eq!(error, libc::ETIMEDOUT),
            r => panic!("{r:?}"),
        }
        assert_eq!(w.len(), 0);
        // A source error ends it too, and wakes the others so that they see it.
        let (c2, waker2) = counter();
        let (mut a, mut b) = (None, None);
        assert!(poll(&w, &src, &q, &mut a, &waker2, 9).is_pending());
        let (_c3, waker3) = counter();
        src.error.set(Some(libc::EBADF));
        assert!(matches!(poll(&w, &src, &q, &mut b, &waker3, 9), Poll::Ready(Err(Error::BadFd))));
        assert_eq!(wakes(&c2), 1);
    }

    #[test]
    fn a_drain_wakes_every_other_waiter() {
        let (w, src, q) = (Waiters::default(), FakeSource::default(), FakeQueue::default());
        let (ca, wa) = counter();
        let (cb, wb) = counter();
        let (mut a, mut b) = (None, None);
        assert!(poll(&w, &src, &q, &mut a, &wa, 1).is_pending());
        // B polls last: the source holds B's waker only.
        assert!(poll(&w, &src, &q, &mut b, &wb, 2).is_pending());
        assert_eq!(w.registrar(), b);
        // Fence 1 (A's) completes: only B is woken by the source; B drains and wakes A.
        q.completed.set(1);
        src.fire();
        assert_eq!((wakes(&ca), wakes(&cb)), (0, 1));
        assert!(poll(&w, &src, &q, &mut b, &wb, 2).is_pending());
        assert_eq!((wakes(&ca), q.drains.get()), (1, 1));
        assert!(matches!(poll(&w, &src, &q, &mut a, &wa, 1), Poll::Ready(Ok(()))));
        // A was not the registrar: leaving wakes nobody.
        assert_eq!((wakes(&ca), wakes(&cb)), (1, 1));
        assert_eq!(w.registrar(), b);
    }

    #[test]
    fn the_registrar_leaving_hands_the_source_on() {
        let (w, src, q) = (Waiters::default(), FakeSource::default(), FakeQueue::default());
        let (ca, wa) = counter();
        let (cb, wb) = counter();
        let (mut a, mut b) = (None, None);
        assert!(poll(&w, &src, &q, &mut a, &wa, 7).is_pending());
        assert!(poll(&w, &src, &q, &mut b, &wb, 2).is_pending());
        // B's fence completes and B is polled for another reason (no source event): it is
        // ready, and as the registrar it wakes A, which registers its own waker.
        q.completed.set(2);
        assert!(matches!(poll(&w, &src, &q, &mut b, &wb, 2), Poll::Ready(Ok(()))));
        assert_eq!((wakes(&ca), wakes(&cb)), (1, 0));
        assert_eq!(w.registrar(), None);
        assert!(poll(&w, &src, &q, &mut a, &wa, 7).is_pending());
        assert_eq!(w.registrar(), a);
        q.completed.set(7);
        src.fire();
        assert_eq!(wakes(&ca), 2);
        assert!(matches!(poll(&w, &src, &q, &mut a, &wa, 7), Poll::Ready(Ok(()))));
        // A dropped (cancelled) registrar does the same.
        let (cc, wc) = counter();
        let (cd, wd) = counter();
        let (mut c, mut d) = (None, None);
        assert!(poll(&w, &src, &q, &mut c, &wc, 9).is_pending());
        assert!(poll(&w, &src, &q, &mut d, &wd, 9).is_pending());
        w.leave(&mut d);
        assert_eq!((wakes(&cc), wakes(&cd)), (1, 0));
        assert!(poll(&w, &src, &q, &mut c, &wc, 9).is_pending());
        assert_eq!((w.registrar(), w.len()), (c, 1));
        w.leave(&mut c);
        assert_eq!(w.len(), 0);
    }

    /// Blocks on `f` with a thread-parking waker (the smallest runtime-neutral executor).
    fn block_on<F: Future>(f: F) -> F::Output {
        struct Unpark(std::thread::Thread);
        impl Wake for Unpark {
            fn wake(self: Arc<Self>) {
                self.0.unpark();
            }
        }
        let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        let mut f = std::pin::pin!(f);
        loop {
            if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
                return v;
            }
            std::thread::park();
        }
    }

    /// Counts how often `source` is polled until it is ready.
    fn ready_after_polls<R: Readiness>(source: &R) -> io::Result<usize> {
        let polls = Cell::new(0);
        block_on(std::future::poll_fn(|cx| {
            polls.set(polls.get() + 1);
            source.poll_ready(cx)
        }))?;
        Ok(polls.get())
    }

    #[test]
    fn thread_readiness_wakes_on_a_readable_fd_and_does_not_spin() {
        let efd = EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK).unwrap();
        let source = ThreadReadiness::new(efd.as_fd()).unwrap();
        let writer = std::thread::spawn({
            let mut fd = std::fs::File::from(efd.as_fd().try_clone_to_owned().unwrap());
            move || {
                std::thread::sleep(std::time::Duration::from_millis(50));
                std::io::Write::write_all(&mut fd, &1u64.to_ne_bytes()).unwrap();
            }
        });
        // Woken once by the write: a handful of polls, not a spin (park may wake spuriously).
        let polls = ready_after_polls(&source).unwrap();
        assert!((2..10).contains(&polls), "{polls} polls");
        writer.join().unwrap();
        // Still readable (not drained): the next arm fires again at once.
        assert!(ready_after_polls(&source).unwrap() <= 2);
        efd.read().unwrap();
        // Drained: armed, and pending until the next write.
        let (c, waker) = counter();
        assert!(source.poll_ready(&mut Context::from_waker(&waker)).is_pending());
        std::thread::sleep(std::time::Duration::from_millis(30));
        assert_eq!(wakes(&c), 0);
        efd.write(1).unwrap();
        let t = std::time::Instant::now();
        while wakes(&c) == 0 && t.elapsed() < std::time::Duration::from_secs(5) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(wakes(&c), 1);
        assert!(source.poll_ready(&mut Context::from_waker(&waker)).is_ready());
        drop(source); // joins the thread
    }

    #[cfg(feature = "tokio")]
    #[test]
    fn tokio_readiness_wakes_on_a_readable_fd() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_io().build().unwrap();
        let efd = EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK).unwrap();
        rt.block_on(async {
            let source = TokioReadiness::new(efd.as_fd()).unwrap();
            let (c, waker) = counter();
            assert!(source.poll_ready(&mut Context::from_waker(&waker)).is_pending());
            efd.write(1).unwrap();
            // Let the reactor see the event.
            let t = std::time::Instant::now();
            while wakes(&c) == 0 && t.elapsed() < std::time::Duration::from_secs(5) {
                tokio::task::yield_now().await;
            }
            assert_eq!(wakes(&c), 1);
            assert!(matches!(source.poll_ready(&mut Context::from_waker(&waker)), Poll::Ready(Ok(()))));
            // Readiness consumed and the fd drained: pending again.
            efd.read().unwrap();
            assert!(source.poll_ready(&mut Context::from_waker(&waker)).is_pending());
        });
        // Outside a runtime: an error, not a panic.
        assert!(TokioReadiness::new(efd.as_fd()).is_err());
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async { assert!(TokioReadiness::new(efd.as_fd()).is_err()) });
    }
}
