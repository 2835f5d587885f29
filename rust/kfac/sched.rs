// SPDX-License-Identifier: GPL-2.0

//! The current task's fatal signals, voluntary rescheduling, the waiting for a work item and the
//! default unbound workqueue: `fatal_signal_pending()` and `cond_resched()` (a static inline and
//! a macro: C in `rust/kfac/sched.c`), `flush_work()` and `system_dfl_wq` (exported: used
//! directly) and `queue_work_node()`, which Linux 7.3's Rust does not wrap; and the driver's
//! release workqueue (`alloc_workqueue()` and `flush_workqueue()` are macros: C).

super::generated! { include!("sched_generated.rs"); }

/// Whether the current task was killed (SIGKILL): waits that ignore other signals end on it.
pub(crate) fn fatal_signal_pending() -> bool {
    // SAFETY: plain query of the current task.
    unsafe { ffi::neuron_udma_fatal_signal_pending() }
}

/// Lets other tasks run if this one should give the CPU up (`cond_resched()`): for long loops
/// in process context.
pub(crate) fn cond_resched() {
    // SAFETY: plain call in the current task's (process) context.
    unsafe { ffi::neuron_udma_cond_resched() }
}

/// Takes `m` without sleeping: tries for `spin` at most (a holder that runs lets go within
/// microseconds, as `mutex_lock` would spin for it; one that sleeps keeps it longer), for
/// callers that may not wait (io_uring's non-blocking issue).
///
/// # Errors
///
/// `EAGAIN` if `m` stayed held for `spin`.
pub(crate) fn lock_within<T>(
    m: &kernel::sync::Mutex<T>,
    spin: kernel::time::Delta,
) -> kernel::error::Result<kernel::sync::MutexGuard<'_, T>> {
    use kernel::time::{Instant, Monotonic};
    let start = Instant::<Monotonic>::now();
    loop {
        if let Some(g) = m.try_lock() {
            return Ok(g);
        }
        if start.elapsed() >= spin {
            return Err(kernel::error::code::EAGAIN);
        }
        kernel::processor::cpu_relax();
    }
}

/// Whether another task wants this CPU: one is runnable here, or the scheduler asked the
/// current task to give the CPU up, also lazily (`PREEMPT_LAZY` acts on that only at the tick
/// or the return to user space). A polling loop spins only while this is false and sleeps
/// otherwise, so that a task it woke, or any other, is not kept waiting for its spin.
pub(crate) fn cpu_wanted() -> bool {
    // SAFETY: plain query of the current CPU's run queue and the current task's flags.
    unsafe { ffi::neuron_udma_cpu_wanted() }
}

/// Waits until `work` is neither queued nor running (`flush_work()`).
pub(crate) fn flush_work<T: ?Sized, const ID: u64>(work: &kernel::workqueue::Work<T, ID>) {
    // SAFETY: `work` is a valid, initialised work item for the duration of the call.
    unsafe { kernel::bindings::flush_work(kernel::workqueue::Work::raw_get(work)) };
}

/// The default unbound workqueue (`system_dfl_wq`). Linux 7.3 marks `system_unbound_wq`, which
/// the kernel crate's `workqueue::system_unbound()` returns, deprecated (a warning in the log at
/// the first work queued on it) in favour of this one, which the crate does not offer yet.
#[cfg(neuron_udma_kunit)]
pub(crate) fn system_dfl() -> &'static kernel::workqueue::Queue {
    // SAFETY: `system_dfl_wq` is a C global set up before any module loads and never freed.
    unsafe { kernel::workqueue::Queue::from_raw(kernel::bindings::system_dfl_wq) }
}

/// Queues `w` on the default unbound workqueue ([`system_dfl`]) to run on a CPU of NUMA node
/// `node` (`queue_work_node()`; any CPU for -1, `NUMA_NO_NODE`): the work of a device runs
/// near it. As `Queue::enqueue`: fails (returns what `W` says) only if `w` is queued already.
pub(crate) fn enqueue_on_node<W, const ID: u64>(node: i32, w: W) -> W::EnqueueOutput
where
    W: kernel::workqueue::RawWorkItem<ID> + Send + 'static,
{
    // SAFETY: `system_dfl_wq` is a C global set up before any module loads and never freed.
    let queue = unsafe { kernel::bindings::system_dfl_wq };
    // SAFETY: as in `Queue::enqueue`: `queue_work_node` returns false only if the work item is
    // queued already, and it dereferences the work pointer only while `__enqueue` guarantees
    // it valid (during the call, and until the work runs if it was queued). `system_dfl_wq`
    // is unbound, as `queue_work_node()` requires.
    unsafe { w.__enqueue(move |work| kernel::bindings::queue_work_node(node, queue, work)) }
}

/// The driver's release workqueue, from module load to unload (`rust/kfac/sched.c`): for what
/// must be released in process context but may be let go of where sleeping is not allowed.
/// Dropping the guard (at unload, after the driver is unregistered) waits for every release
/// queued and destroys the queue.
pub(crate) struct ReleaseQueue(());

impl ReleaseQueue {
    /// Creates the queue (once, at module load, before the driver is registered).
    ///
    /// # Errors
    ///
    /// `ENOMEM`.
    pub(crate) fn create() -> kernel::error::Result<Self> {
        // SAFETY: called once, at module load, before anything can queue work on it.
        kernel::error::to_result(unsafe { ffi::neuron_udma_release_wq_init() })?;
        Ok(Self(()))
    }

    /// The queue.
    pub(crate) fn get() -> &'static kernel::workqueue::Queue {
        // SAFETY: the queue exists from `create` (module load, before the driver is
        // registered) to the guard's drop (unload, after it is unregistered and every file is
        // closed), and only the driver's objects queue work on it.
        unsafe { kernel::workqueue::Queue::from_raw(ffi::neuron_udma_release_wq()) }
    }

    /// Waits until every release queued so far has run.
    pub(crate) fn flush() {
        // SAFETY: as in `get`.
        unsafe { ffi::neuron_udma_release_wq_flush() }
    }
}

impl Drop for ReleaseQueue {
    fn drop(&mut self) {
        // SAFETY: the driver is unregistered and no file is open: nothing queues work any
        // more; destroying the queue runs what is queued first.
        unsafe { ffi::neuron_udma_release_wq_exit() }
    }
}
