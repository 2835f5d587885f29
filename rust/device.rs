// SPDX-License-Identifier: GPL-2.0

//! State of one bound device, shared by the PCI binding, open files and the KUnit suites:
//! register access, engine bring-up, the queue table and the driver's own H2T queue.
//!
//! Lifetime rules: the state is reference counted and may outlive the binding (an open file
//! keeps it). [`UdmaDevice::shutdown`], called from the PCI `unbind`, quiesces and frees every
//! queue while the device is still bound; afterwards every operation fails with `ENODEV`. The
//! BAR mapping itself is revoked by devres after unbind.

use crate::{
    arch::{Arch, QUEUES_PER_ENGINE},
    desc::{Barrier, DescLen, MAX_DESC_BYTES},
    engine::{self, EngineErrors, EngineIo},
    mem::{
        Backing, Buffer, BusyGuard, Charge, DramAllocator, BUF_ALIGN, DRAM_RESERVED,
        MAX_HOST_BUFFER,
    },
    queue::{self, FenceState, Queue, MAX_PAIRS_PER_SUBMISSION},
    ring::RingSize,
    shim::{fatal_signal_pending, MappedFile},
};
use kernel::{
    device::Bound,
    dma::{Coherent, DmaAddress},
    new_mutex, pci,
    prelude::*,
    sync::{
        aref::ARef,
        atomic::{Atomic, Relaxed},
        Arc, Mutex,
    },
    time::{delay::fsleep, Delta, Instant, Monotonic},
};

/// Default time a completion wait may take before the queue is declared stuck; on the
/// driver's shared H2T queue, only a wait at least this long resets the queue.
pub(crate) const DEFAULT_TIMEOUT: Delta = Delta::from_secs(10);
/// Shortest timeout a caller may choose (shorter ones are raised to it), in milliseconds.
pub(crate) const MIN_TIMEOUT_MS: u32 = 10;
/// Bytes of the zeroed host buffer that scrubs device memory (one 64 KiB descriptor).
const SCRUB_BYTES: usize = MAX_DESC_BYTES as usize;
/// Error messages per [`LOG_WINDOW`]; the rest are dropped (and counted).
const LOG_BURST: u32 = 10;
/// Rate-limit window of the error messages.
const LOG_WINDOW: Delta = Delta::from_secs(5);

/// How a wait treats signals.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WaitMode {
    /// Any signal ends the wait with `EINTR` (the copies go on).
    Interruptible,
    /// Only a fatal signal (SIGKILL) ends the wait with `EINTR`.
    Killable,
    /// Signals are ignored (driver-internal copies, bounded by their timeout).
    Uninterruptible,
}

/// Where the source of an engine copy is.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Src {
    /// Consecutive bytes from this device-fabric address.
    Linear(u64),
    /// The same `SCRUB_BYTES` zero bytes again and again (device-memory scrub).
    Zeros,
}

/// What an [`Orphan`] keeps from being reused until its submission is settled.
enum Hold {
    /// The two buffers of a `MEMCPY` (busy).
    Buffers([BusyGuard; 2]),
    /// A device-memory range whose scrub was interrupted (given back to the allocator then).
    Dram(u64),
}

/// A `MEMCPY` or a device-memory scrub that ended (timeout or SIGKILL) while its last
/// submission was still in flight on the shared H2T queue: what it used stays reserved until
/// that fence is settled.
struct Orphan {
    seq: u64,
    file: u64,
    hold: Hold,
}

/// Keeps error messages that user space can provoke from flooding the log.
struct RateLimit {
    epoch: Instant<Monotonic>,
    /// Start of the current window, in milliseconds since `epoch`.
    window_start: Atomic<i64>,
    printed: Atomic<u32>,
}

impl RateLimit {
    fn new() -> Self {
        Self {
            epoch: Instant::<Monotonic>::now(),
            window_start: Atomic::new(0),
            printed: Atomic::new(0),
        }
    }

    /// Whether one more message may be printed now (races only blur the count).
    fn allow(&self) -> bool {
        let ms = self.epoch.elapsed().as_millis();
        let start = self.window_start.load(Relaxed);
        if ms - start >= LOG_WINDOW.as_millis() {
            self.window_start.store(ms, Relaxed);
            self.printed.store(0, Relaxed);
        }
        self.printed.fetch_add(1, Relaxed) < LOG_BURST
    }
}
/// Ring size of the driver's H2T queue, as in the reference (hardware.rst §3.7: 8192 descriptors).
pub(crate) const H2T_RING_DESCS: u32 = 8192;

/// Who owns a queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Owner {
    /// The driver (H2T queue, KUnit).
    Driver,
    /// An open file, identified by a unique id.
    File(u64),
}

/// One queue slot of the device: the queue's software state, `None` once released or after
/// [`UdmaDevice::shutdown`].
#[pin_data]
pub(crate) struct QueueCell {
    /// Engine id.
    pub(crate) eng: u32,
    /// Queue id.
    pub(crate) qid: u32,
    /// Owner.
    pub(crate) owner: Owner,
    #[pin]
    inner: Mutex<Option<Queue>>,
    /// A file's queue memory (rings, completion slots, pair references) charged to the user
    /// who took it; given back when the queue is released.
    #[pin]
    charge: Mutex<Option<Charge>>,
}

struct DevState {
    /// False once unbind started: no new queue, no register access.
    alive: bool,
    /// Engines whose init sequence ran since probe (bit per engine id).
    engines_init: [u64; 3],
    /// Queues in use.
    queues: KVec<Arc<QueueCell>>,
    /// The driver's own H2T queue of NeuronCore 0, for in-kernel copies.
    h2t: Option<Arc<QueueCell>>,
    /// Zeroed host memory, the source of device-memory scrubs ([`SCRUB_BYTES`]).
    zeros: Option<Coherent<[u8]>>,
    /// Buffers handed to user space; each knows its index ([`Buffer::table_index`]), so
    /// removal is O(1).
    bufs: KVVec<Arc<Buffer>>,
    /// `MEMCPY`s that returned while their last submission was in flight.
    orphans: KVec<Orphan>,
    /// Device memory available to user space.
    dram: DramAllocator,
    /// Next mmap offset of a host buffer (bytes; never reused).
    next_mmap: u64,
}

/// A bound Neuron device.
#[pin_data]
pub(crate) struct UdmaDevice {
    /// The PCI device.
    pub(crate) pdev: ARef<pci::Device>,
    /// Per-generation data.
    pub(crate) arch: &'static Arch,
    /// BAR0 (registers), revoked by devres at unbind.
    bar0: pci::DevresBar,
    /// Size of the device memory (BAR4) in bytes, 0 if unmapped.
    pub(crate) dram_size: u64,
    /// The device model's fault-injection window (BAR2), mapped only in KUnit builds on the
    /// model.
    model_ctl: Option<pci::DevresBar<{ crate::regs::MODEL_CTL_SIZE }>>,
    /// Rate limit of the wait failures' messages.
    log_limit: RateLimit,
    /// Orphans in [`DevState::orphans`] (updated under the state lock): lets [`Self::reap`]
    /// return at once, without a lock, when there is nothing to reap.
    orphan_count: Atomic<u32>,
    /// Non-zero while bound: [`DevState::alive`] for the per-ioctl check, which so takes no
    /// lock shared by every user (cleared under the state lock, before anything is torn down).
    bound: Atomic<u32>,
    #[pin]
    state: Mutex<DevState>,
}

impl UdmaDevice {
    /// Creates the device state; no register is touched.
    pub(crate) fn new(
        pdev: &pci::Device<Bound>,
        arch: &'static Arch,
        bar0: pci::DevresBar,
        dram_size: u64,
        model_ctl: Option<pci::DevresBar<{ crate::regs::MODEL_CTL_SIZE }>>,
    ) -> Result<Arc<Self>> {
        let dram = DramAllocator::new(DRAM_RESERVED, dram_size)?;
        Arc::pin_init(
            try_pin_init!(Self {
                pdev: pdev.into(),
                arch,
                bar0,
                dram_size,
                model_ctl,
                log_limit: RateLimit::new(),
                bound: Atomic::new(1),
                orphan_count: Atomic::new(0),
                state <- new_mutex!(DevState {
                    alive: true,
                    engines_init: [0; 3],
                    queues: KVec::new(),
                    h2t: None,
                    zeros: None,
                    bufs: KVVec::new(),
                    orphans: KVec::new(),
                    dram,
                    next_mmap: BUF_ALIGN,
                }),
            }),
            GFP_KERNEL,
        )
    }

    /// Takes the H2T queue of NeuronCore 0 (hardware.rst §2.3) for the driver's own copies, and the
    /// zeroed source of device-memory scrubs.
    pub(crate) fn setup_h2t(&self) -> Result {
        let (eng, qid) = self.arch.h2t[0];
        let zeros = self.alloc_coherent(SCRUB_BYTES)?;
        let cell = self.queue_init(eng, qid, H2T_RING_DESCS, H2T_RING_DESCS, Owner::Driver)?;
        let mut st = self.state.lock();
        st.h2t = Some(cell);
        st.zeros = Some(zeros);
        Ok(())
    }

    fn h2t(&self) -> Result<Arc<QueueCell>> {
        self.state.lock().h2t.clone().ok_or(ENODEV)
    }

    /// Copies `size` bytes between device-fabric addresses on the driver's H2T queue
    /// ([`Self::memcpy_on`]).
    pub(crate) fn memcpy(&self, src: u64, dst: u64, size: u64, timeout: Delta) -> Result {
        let cell = self.h2t()?;
        self.memcpy_on(&cell, src, dst, size, timeout)
    }

    /// The `MEMCPY` ioctl of the open file `file`: copies `size` bytes on the shared H2T
    /// queue, with `guards` keeping the two buffers busy. The wait ends on SIGKILL; a timeout
    /// resets the shared queue only when it made no progress for [`DEFAULT_TIMEOUT`] (other
    /// files' copies go on otherwise). When the call returns early (timeout, SIGKILL) with its
    /// last submission still
    /// in flight, the buffers stay busy until the engine is done with it, and the file's next
    /// `MEMCPY` first waits for that submission.
    ///
    /// # Errors
    ///
    /// `ETIMEDOUT` (also when the file's previous timed-out copy is still running), `EIO`
    /// (engine error: the queue was reset), `EINTR` (SIGKILL), `EINVAL` for size 0, `ENODEV`.
    pub(crate) fn memcpy_for_file(
        &self,
        file: u64,
        src: u64,
        dst: u64,
        size: u64,
        timeout: Delta,
        guards: [BusyGuard; 2],
    ) -> Result {
        let cell = self.h2t()?;
        let start = Instant::<Monotonic>::now();
        // One unfinished copy per file: a caller with a tiny timeout cannot fill the queue.
        loop {
            self.reap_orphans(&cell);
            if !self.state.lock().orphans.iter().any(|o| o.file == file) {
                break;
            }
            if start.elapsed() >= timeout {
                // The earlier copy may be on a stuck queue that nobody else waits on.
                self.reset_if_stuck(&cell)?;
                self.reap_orphans(&cell);
                return Err(ETIMEDOUT);
            }
            if fatal_signal_pending() {
                return Err(EINTR);
            }
            fsleep(Delta::from_micros(200));
        }
        let mut in_flight = None;
        let remaining = timeout - start.elapsed();
        // The shared queue is reset only when it made no progress for the default timeout,
        // whatever this caller's timeout.
        let r = self.copy_on(
            &cell,
            Src::Linear(src),
            dst,
            size,
            remaining,
            WaitMode::Killable,
            false,
            &mut in_flight,
        );
        if let Some(seq) = in_flight {
            self.adopt_orphan(
                &cell,
                Orphan {
                    seq,
                    file,
                    hold: Hold::Buffers(guards),
                },
            );
        }
        r
    }

    /// Records `orphan`, whose submission is still in flight on `cell`, so that what it holds
    /// stays reserved until the fence settles ([`Self::reap_orphans`]). Returns `false` when
    /// there was no memory to record it: then this waits (uninterruptibly, bounded by the
    /// stuck-queue reset) until the fence is settled and drops the orphan here.
    fn adopt_orphan(&self, cell: &QueueCell, orphan: Orphan) -> bool {
        let seq = orphan.seq;
        let mut st = self.state.lock();
        if st.orphans.reserve(1, GFP_KERNEL).is_ok() {
            self.orphan_count.fetch_add(1, Relaxed);
            // Cannot fail: capacity was reserved.
            let _ = st.orphans.push_within_capacity(orphan);
            return true;
        }
        drop(st);
        let _ = self.wait_settled(cell, seq);
        drop(orphan);
        false
    }

    /// Called when the open file `file` is released, after its queues: releases its buffers.
    /// A buffer that an orphaned `MEMCPY` of the file still uses is handed to the device,
    /// which frees it when the engine is done with it (see [`Self::reap_orphans`]): the
    /// release never waits for the engine, so a killed process exits at once.
    pub(crate) fn release_file(&self, bufs: &[Arc<Buffer>]) {
        if let Ok(cell) = self.h2t() {
            self.reap_orphans(&cell);
        }
        for b in bufs {
            b.mark_released();
            // Checked under the state lock, which the reaper holds while it drops the guards
            // and looks at the mark: one of the two frees the buffer.
            let free_now = {
                let _st = self.state.lock();
                !b.is_busy()
            };
            if free_now {
                self.free_buffer(b);
            }
        }
    }

    /// [`Self::reap_orphans`] on the shared H2T queue (a no-op after unbind).
    pub(crate) fn reap(&self) {
        if self.orphan_count.load(Relaxed) == 0 {
            return;
        }
        if let Ok(cell) = self.h2t() {
            self.reap_orphans(&cell);
        }
    }

    /// Releases the buffers of orphaned `MEMCPY`s whose submission is settled, and frees those
    /// whose file is gone.
    fn reap_orphans(&self, cell: &QueueCell) {
        let mut seqs = KVec::new();
        for o in self.state.lock().orphans.iter() {
            if seqs.push(o.seq, GFP_KERNEL).is_err() {
                break;
            }
        }
        if seqs.is_empty() {
            return;
        }
        let mut done = KVec::new();
        for seq in seqs {
            // The queue lock is never taken inside the state lock.
            if self
                .with_queue(cell, |q, _| Ok(q.is_settled(seq)))
                .unwrap_or(true)
            {
                let _ = done.push(seq, GFP_KERNEL);
            }
        }
        let mut to_free: KVec<Arc<Buffer>> = KVec::new();
        {
            let mut st = self.state.lock();
            let mut i = 0;
            while i < st.orphans.len() {
                if !done.contains(&st.orphans[i].seq) {
                    i += 1;
                    continue;
                }
                if let Ok(o) = st.orphans.remove(i) {
                    self.orphan_count.fetch_sub(1, Relaxed);
                    let bufs = match &o.hold {
                        Hold::Buffers(g) => [g[0].buffer().clone(), g[1].buffer().clone()],
                        Hold::Dram(addr) => {
                            st.dram.free(*addr);
                            continue;
                        }
                    };
                    // Not the last references: the device table holds the buffers.
                    drop(o);
                    for b in bufs {
                        if b.released.load(Relaxed) != 0
                            && !b.is_busy()
                            && !to_free.iter().any(|x| Arc::ptr_eq(x, &b))
                        {
                            let _ = to_free.push(b, GFP_KERNEL);
                        }
                    }
                }
            }
        }
        for b in to_free.iter() {
            self.free_buffer(b);
        }
    }

    /// Waits (uninterruptibly) until fence `seq` of `cell` is no longer in flight, resetting
    /// the queue after [`DEFAULT_TIMEOUT`].
    fn wait_settled(&self, cell: &QueueCell, seq: u64) -> Result {
        let start = Instant::<Monotonic>::now();
        while !self.with_queue(cell, |q, _| Ok(q.is_settled(seq)))? {
            if start.elapsed() >= DEFAULT_TIMEOUT {
                return self.reset_queue(cell);
            }
            fsleep(Delta::from_micros(200));
        }
        Ok(())
    }

    /// Allocates `len` bytes of coherent host memory for DMA by this device.
    ///
    /// # Errors
    ///
    /// `ENOMEM`, or `ENODEV` once the device is unbound.
    pub(crate) fn alloc_coherent(&self, len: usize) -> Result<Coherent<[u8]>> {
        let st = self.state.lock();
        if !st.alive {
            return Err(ENODEV);
        }
        // SAFETY: as in `queue_init`: `alive` under the state lock keeps the device bound.
        let dev = unsafe { self.pdev.as_ref().as_bound() };
        Coherent::<u8>::zeroed_slice(dev, len, GFP_KERNEL | __GFP_NOWARN)
    }

    /// Device-fabric address of a host DMA address (hardware.rst §1.3).
    pub(crate) fn host_addr(&self, dma: DmaAddress) -> u64 {
        self.arch.host_addr(dma)
    }

    /// Runs `f` on engine `eng`'s registers (inside an RCU read section: `f` must not sleep).
    ///
    /// # Errors
    ///
    /// `ENODEV` once the device is unbound; `EINVAL` for an unknown engine.
    pub(crate) fn with_engine<R>(
        &self,
        eng: u32,
        f: impl FnOnce(EngineIo<'_>) -> Result<R>,
    ) -> Result<R> {
        let bar = self.bar0.try_access().ok_or(ENODEV)?;
        f(engine::engine_io(self.arch, &bar, eng)?)
    }

    /// Runs the engine init sequence (hardware.rst §3.6) once per engine since probe.
    fn ensure_engine(&self, st: &mut DevState, eng: u32) -> Result {
        let (word, bit) = ((eng / 64) as usize, eng % 64);
        let first = st.engines_init.iter().all(|w| *w == 0);
        if st.engines_init.get(word).ok_or(EINVAL)? & (1 << bit) != 0 {
            return Ok(());
        }
        {
            let bar = self.bar0.try_access().ok_or(ENODEV)?;
            engine::init_engine(self.arch, &bar, eng, first)?;
        }
        st.engines_init[word] |= 1 << bit;
        Ok(())
    }

    /// Takes queue `qid` of engine `eng` for `owner`: allocates rings of `tx_descs`/`rx_descs`
    /// descriptors, initialises the engine if needed and programs the queue (hardware.rst §3.7).
    ///
    /// # Errors
    ///
    /// `EINVAL` for an unknown engine/queue or a bad ring size, `EBUSY` if the queue is in use
    /// or (for a file) reserved by the driver, `ENOMEM`, `ENODEV` after unbind.
    pub(crate) fn queue_init(
        &self,
        eng: u32,
        qid: u32,
        tx_descs: u32,
        rx_descs: u32,
        owner: Owner,
    ) -> Result<Arc<QueueCell>> {
        if self.arch.engine_offset(eng).is_none() || qid >= QUEUES_PER_ENGINE {
            return Err(EINVAL);
        }
        let mut st = self.state.lock();
        if !st.alive {
            return Err(ENODEV);
        }
        if owner != Owner::Driver && self.arch.is_reserved_queue(eng, qid) {
            return Err(EBUSY);
        }
        if st.queues.iter().any(|c| c.eng == eng && c.qid == qid) {
            return Err(EBUSY);
        }
        // SAFETY: `st.alive` is true and the state lock is held: `shutdown`, which runs in the
        // PCI unbind callback before the device is unbound, takes this lock to clear `alive`, so
        // the device stays bound at least until the lock is released, and `dev` does not
        // outlive this scope.
        let dev = unsafe { self.pdev.as_ref().as_bound() };
        // A file's queue is pinned memory like a host buffer: charged to RLIMIT_MEMLOCK (after
        // the sizes are validated, so that a bad size is EINVAL, not ENOMEM).
        RingSize::new(tx_descs)?;
        RingSize::new(rx_descs)?;
        let charge = match owner {
            Owner::Driver => None,
            Owner::File(_) => Some(Charge::new(Queue::memory_bytes(tx_descs, rx_descs))?),
        };
        let mut q = Queue::new(dev, self.arch, eng, qid, tx_descs, rx_descs)?;
        self.ensure_engine(&mut st, eng)?;
        self.with_engine(eng, |io| q.hw_init(io))?;
        let cell = Arc::pin_init(
            try_pin_init!(QueueCell {
                eng,
                qid,
                owner,
                inner <- new_mutex!(Some(q)),
                charge <- new_mutex!(charge),
            }),
            GFP_KERNEL,
        )?;
        st.queues.push(cell.clone(), GFP_KERNEL)?;
        Ok(cell)
    }

    /// Asks the device model to fail the `n`-th next Tx descriptor of queue `qid` of engine
    /// `eng` with a bad address (KUnit only).
    ///
    /// # Errors
    ///
    /// `ENODEV` without the model's control window, `EIO` if the model rejects the fault.
    #[cfg(neuron_udma_kunit)]
    pub(crate) fn inject_fail_nth(&self, eng: u32, qid: u32, n: u32) -> Result {
        use crate::regs::model::*;
        use kernel::io::Io;
        let ctl = self.model_ctl.as_ref().ok_or(ENODEV)?;
        let bar = ctl.try_access().ok_or(ENODEV)?;
        let io = &*bar;
        io.write_reg(FAULT_KIND::from(FAULT_FAIL_NTH));
        io.write_reg(FAULT_ENGINE::from(eng));
        io.write_reg(FAULT_QUEUE::from(qid));
        io.write_reg(FAULT_ARG::from(n));
        io.write_reg(FAULT_COMMIT::from(1));
        if io.read(FAULT_COMMIT).into_raw() != 0 {
            return Err(EIO);
        }
        Ok(())
    }

    /// Whether the device is still bound: a lock-free early check; every path that touches
    /// the device or its memory checks again under the state lock.
    pub(crate) fn is_alive(&self) -> bool {
        self.bound.load(Relaxed) != 0
    }

    /// Bytes of device memory available to user buffers.
    pub(crate) fn user_dram_size(&self) -> u64 {
        self.state.lock().dram.capacity()
    }

    /// Allocates a buffer of `size` bytes (rounded up to 4 KiB) of host (`host == true`) or
    /// device memory for the open file `owner_file`, with handle `handle`. Host memory is
    /// charged to the caller's `RLIMIT_MEMLOCK`; device memory is scrubbed with the engine
    /// (zeros copied from host memory on the H2T queue) before it is handed out, so a new
    /// buffer never shows a previous owner's data.
    ///
    /// # Errors
    ///
    /// `EINVAL` for size 0 or a host buffer above [`MAX_HOST_BUFFER`], `ENOMEM` when no memory
    /// of that kind is left or the locked-memory limit would be exceeded, `EIO`/`ETIMEDOUT`
    /// if the scrub failed, `ENODEV` after unbind.
    pub(crate) fn alloc_buffer(
        &self,
        host: bool,
        size: u64,
        handle: u64,
        owner_file: MappedFile,
    ) -> Result<Arc<Buffer>> {
        if size == 0 {
            return Err(EINVAL);
        }
        let size = size.checked_next_multiple_of(BUF_ALIGN).ok_or(EINVAL)?;
        // Memory of released files' finished copies comes back first.
        if let Ok(cell) = self.h2t() {
            self.reap_orphans(&cell);
        }
        let buf = if host {
            if size > MAX_HOST_BUFFER {
                return Err(EINVAL);
            }
            // Charged before anything is allocated, for what the allocation really pins:
            // coherent memory comes in power-of-two blocks of pages.
            let charge = Charge::new(size.checked_next_power_of_two().ok_or(EINVAL)?)?;
            let mut st = self.state.lock();
            if !st.alive {
                return Err(ENODEV);
            }
            // SAFETY: as in `queue_init`: `alive` under the state lock keeps the device bound.
            let dev = unsafe { self.pdev.as_ref().as_bound() };
            // CAST: at most MAX_HOST_BUFFER. No warning: a refused request is the caller's
            // ENOMEM, not a kernel problem.
            let mem = Coherent::<u8>::zeroed_slice(dev, size as usize, GFP_KERNEL | __GFP_NOWARN)?;
            let off = st.next_mmap;
            st.next_mmap = off.checked_add(size).ok_or(ENOMEM)?;
            drop(st);
            Buffer::new(
                handle,
                size,
                off,
                owner_file,
                Backing::Host(mem, Some(charge)),
            )?
        } else {
            let addr = {
                let mut st = self.state.lock();
                if !st.alive {
                    return Err(ENODEV);
                }
                st.dram.alloc(size)?
            };
            let give_back = |e| {
                self.state.lock().dram.free(addr);
                e
            };
            match self.scrub(addr, size) {
                (Ok(()), _) => {}
                (Err(e), true) => return Err(give_back(e)),
                // The range stays reserved until the engine is done with it.
                (Err(e), false) => return Err(e),
            }
            Buffer::new(handle, size, 0, owner_file, Backing::Device(addr)).map_err(give_back)?
        };
        let mut st = self.state.lock();
        if !st.alive {
            drop(st);
            buf.free();
            return Err(ENODEV);
        }
        if let Err(e) = st.bufs.push(buf.clone(), GFP_KERNEL) {
            drop(st);
            self.give_back(&buf);
            return Err(e.into());
        }
        buf.table_index.store(st.bufs.len() - 1, Relaxed);
        Ok(buf)
    }

    /// Writes zeros over `size` bytes of device memory at `addr` with the engine. The wait
    /// ends on SIGKILL; a failed scrub resets the queue (so the engine no longer touches the
    /// range). Returns `false` when the range must not be given back yet: a SIGKILL left its
    /// last submission in flight, and the range is given back when that is settled.
    fn scrub(&self, addr: u64, size: u64) -> (Result, bool) {
        let cell = match self.h2t() {
            Ok(c) => c,
            Err(e) => return (Err(e), true),
        };
        let mut in_flight = None;
        let r = self.copy_on(
            &cell,
            Src::Zeros,
            addr,
            size,
            DEFAULT_TIMEOUT,
            WaitMode::Killable,
            false,
            &mut in_flight,
        );
        if let Some(seq) = in_flight {
            let orphan = Orphan {
                seq,
                file: 0,
                hold: Hold::Dram(addr),
            };
            if self.adopt_orphan(&cell, orphan) {
                return (r, false);
            }
        }
        (r, true)
    }

    /// Gives a buffer's memory back (device memory to the allocator).
    fn give_back(&self, buf: &Buffer) {
        if let Some(addr) = buf.free() {
            self.state.lock().dram.free(addr);
        }
    }

    /// Frees buffer `buf`: removes it from the device's table, removes its user mappings and
    /// gives its memory back. The caller made sure no descriptor references it
    /// ([`Buffer::is_busy`] is false, or its queues are paused).
    pub(crate) fn free_buffer(&self, buf: &Buffer) {
        {
            let mut st = self.state.lock();
            let idx = buf.table_index.load(Relaxed);
            if st.bufs.get(idx).is_some_and(|b| core::ptr::eq(&**b, buf)) {
                // O(1) removal: the last entry takes the freed place.
                let last = st.bufs.pop();
                if let Some(last) = last {
                    if idx < st.bufs.len() {
                        last.table_index.store(idx, Relaxed);
                        st.bufs[idx] = last;
                    } else {
                        drop(last);
                    }
                }
            }
        }
        self.give_back(buf);
    }

    /// The queues in use (driver's and files'), in creation order.
    pub(crate) fn queues(&self) -> Result<KVec<Arc<QueueCell>>> {
        let st = self.state.lock();
        let mut v = KVec::with_capacity(st.queues.len(), GFP_KERNEL)?;
        for c in st.queues.iter() {
            v.push(c.clone(), GFP_KERNEL)?;
        }
        Ok(v)
    }

    /// Releases queue `cell`: pauses it and frees its rings.
    pub(crate) fn queue_release(&self, cell: &QueueCell) {
        let mut st = self.state.lock();
        st.queues.retain(|c| !core::ptr::eq(&**c, cell));
        drop(st);
        self.quiesce(cell);
    }

    /// Pauses the queue's hardware rings and drops its memory.
    fn quiesce(&self, cell: &QueueCell) {
        let mut inner = cell.inner.lock();
        if let Some(q) = (*inner).as_mut() {
            // A reset stops the engine from fetching from the rings before they are freed.
            let _ = self.with_engine(cell.eng, |io| q.pause(io));
        }
        *inner = None;
        drop(inner);
        let charge = cell.charge.lock().take();
        drop(charge);
    }

    /// Called from the PCI unbind callback: no new operation starts, every queue is paused
    /// and its memory freed while the device is still bound.
    pub(crate) fn shutdown(&self) {
        let queues = {
            let mut st = self.state.lock();
            st.alive = false;
            self.bound.store(0, Relaxed);
            st.h2t = None;
            core::mem::take(&mut st.queues)
        };
        for cell in queues.iter() {
            self.quiesce(cell);
        }
        // After the queues: no engine uses the buffers any more. The coherent memory is freed
        // now, while the device is bound; open files and mappings keep only the records.
        let (bufs, orphans, zeros) = {
            let mut st = self.state.lock();
            (
                core::mem::take(&mut st.bufs),
                {
                    self.orphan_count.store(0, Relaxed);
                    core::mem::take(&mut st.orphans)
                },
                st.zeros.take(),
            )
        };
        for b in bufs.iter() {
            b.free();
        }
        drop(orphans);
        drop(zeros);
    }

    /// Runs `f` on the queue in `cell` with its engine registers, under the queue lock.
    ///
    /// # Errors
    ///
    /// `ENODEV` if the queue was released or the device unbound.
    pub(crate) fn with_queue<R>(
        &self,
        cell: &QueueCell,
        f: impl FnOnce(&mut Queue, EngineIo<'_>) -> Result<R>,
    ) -> Result<R> {
        let mut inner = cell.inner.lock();
        let q = (*inner).as_mut().ok_or(ENODEV)?;
        self.with_engine(cell.eng, |io| f(q, io))
    }

    /// Waits for fence `seq` of the queue in `cell` (one of the caller's registrations, see
    /// [`Queue::fence`]), sleeping between checks; bounded by `timeout`, with one last check
    /// after it. On a timeout or an engine error, logs the engine, queue and error causes and
    /// resets the queue so that it can be used again. Interruptible by any signal.
    ///
    /// # Errors
    ///
    /// `ETIMEDOUT` if the fence did not complete in time, `EIO` if the engine reported an error
    /// or a reset dropped the fence, `EINTR` on a signal (the copies go on), `ENODEV` after
    /// unbind.
    pub(crate) fn wait(&self, cell: &QueueCell, seq: u64, timeout: Delta) -> Result {
        self.wait_for(cell, seq, timeout, WaitMode::Interruptible, true)
    }

    /// [`Self::wait`] with a signal policy, and whether a timeout resets the queue. On every
    /// return the caller's registration of `seq` is given back; without a reset, a fence that
    /// is still in flight stays so ([`Queue::is_settled`] tells when it is done).
    pub(crate) fn wait_for(
        &self,
        cell: &QueueCell,
        seq: u64,
        timeout: Delta,
        mode: WaitMode,
        reset_on_timeout: bool,
    ) -> Result {
        let mut collected = false;
        let r = self.wait_inner(cell, seq, timeout, mode, reset_on_timeout, &mut collected);
        if r.is_err() && !collected {
            // Not collected (signal, timeout, engine error): give the registration back.
            let _ = self.with_queue(cell, |q, _| {
                q.abandon(seq);
                Ok(())
            });
        }
        r
    }

    fn wait_inner(
        &self,
        cell: &QueueCell,
        seq: u64,
        timeout: Delta,
        mode: WaitMode,
        reset_on_timeout: bool,
        collected: &mut bool,
    ) -> Result {
        let start = Instant::<Monotonic>::now();
        let mut delay = Delta::from_micros(2);
        let mut next_state_check = Delta::from_millis(5);
        let mut collect = |dev: &Self| {
            let state = dev.with_queue(cell, |q, _| Ok(q.collect(seq)))?;
            *collected = state != FenceState::Pending;
            Ok::<_, Error>(state)
        };
        loop {
            match collect(self)? {
                FenceState::Done => return Ok(()),
                FenceState::Lost => return Err(EIO),
                FenceState::Pending => {}
            }
            let interrupted = match mode {
                WaitMode::Interruptible => kernel::current!().signal_pending(),
                WaitMode::Killable => fatal_signal_pending(),
                WaitMode::Uninterruptible => false,
            };
            if interrupted {
                // The copies go on; a later wait completes them.
                return Err(EINTR);
            }
            let elapsed = start.elapsed();
            if elapsed >= timeout {
                break;
            }
            if elapsed >= next_state_check {
                // An engine abort stops the queue for good: look for it now and then (an MMIO
                // read is slow on the model, so not on every check).
                next_state_check = elapsed + Delta::from_millis(20);
                let errors = self.with_engine(cell.eng, |io| Ok(engine::engine_errors(io)))?;
                if errors.aborted() {
                    return self.fail(cell, seq, EIO, &errors, timeout);
                }
            }
            fsleep(delay);
            delay = Delta::from_micros((delay.as_micros_ceil() * 2).min(1000));
        }
        // TIMEOUT: one last look, so that a completion racing the deadline is not lost.
        match collect(self)? {
            FenceState::Done => return Ok(()),
            FenceState::Lost => return Err(EIO),
            FenceState::Pending => {}
        }
        let errors = self.with_engine(cell.eng, |io| Ok(engine::engine_errors(io)))?;
        if errors.aborted() {
            return self.fail(cell, seq, EIO, &errors, timeout);
        }
        // A waiter that may not reset on its own timeout still resets a queue that has made no
        // progress for the default timeout: it is stuck, not just slow or busy.
        if !reset_on_timeout && self.with_queue(cell, |q, _| Ok(q.stalled_for()))? < DEFAULT_TIMEOUT
        {
            return Err(ETIMEDOUT);
        }
        // A stuck shared queue is an error whatever the caller's timeout.
        let logged = if reset_on_timeout {
            timeout
        } else {
            DEFAULT_TIMEOUT
        };
        self.fail(cell, seq, ETIMEDOUT, &errors, logged)
    }

    /// Logs a failed wait (rate-limited; a caller-chosen timeout at debug level) and resets
    /// the queue (and an aborted engine). The reset settles every fence in flight as lost, so
    /// exactly the waiters of the dropped fences see `EIO`.
    fn fail(
        &self,
        cell: &QueueCell,
        seq: u64,
        err: Error,
        errors: &EngineErrors,
        timeout: Delta,
    ) -> Result {
        let what = if err == EIO {
            "failed: engine error"
        } else {
            "timed out"
        };
        if err == ETIMEDOUT && timeout < DEFAULT_TIMEOUT {
            dev_dbg!(
                self.pdev,
                "engine {} queue {}: fence {} timed out after {} ms; resetting the queue\n",
                cell.eng,
                cell.qid,
                seq,
                timeout.as_millis()
            );
        } else if self.log_limit.allow() {
            dev_err!(
                self.pdev,
                "engine {} queue {}: fence {} {} (m2s state {:#x} cause {:#x}, s2m state {:#x} cause {:#x}); resetting the queue\n",
                cell.eng,
                cell.qid,
                seq,
                what,
                errors.m2s_state,
                errors.m2s_cause,
                errors.s2m_state,
                errors.s2m_cause
            );
        }
        self.reset_queue(cell)?;
        Err(err)
    }

    /// Resets the queue in `cell` if it made no progress for [`DEFAULT_TIMEOUT`] with fences
    /// in flight (a hung queue); logged at error level, rate-limited.
    fn reset_if_stuck(&self, cell: &QueueCell) -> Result {
        if self.with_queue(cell, |q, _| Ok(q.stalled_for()))? < DEFAULT_TIMEOUT {
            return Ok(());
        }
        if self.log_limit.allow() {
            dev_err!(
                self.pdev,
                "engine {} queue {}: no progress for {} s; resetting the queue\n",
                cell.eng,
                cell.qid,
                DEFAULT_TIMEOUT.as_millis() / 1000
            );
        }
        self.reset_queue(cell)
    }

    /// Resets the queue in `cell` (full queue init, ring id 1, fences dropped) and returns its
    /// engine to normal operation if it is still aborted.
    pub(crate) fn reset_queue(&self, cell: &QueueCell) -> Result {
        self.with_queue(cell, |q, io| {
            q.reset(io)?;
            // A queue reset clears an abort caused by this queue; if the engine is still
            // aborted (another queue's error), return it to normal operation too.
            let now = engine::engine_errors(io);
            if now.aborted() {
                engine::recover_engine(io, &now);
            }
            Ok(())
        })
    }

    /// Copies `size` bytes from device-fabric address `src` to `dst` on queue `cell`, in 64 KiB
    /// pairs: at most 2032 data pairs plus one marker pair per doorbell and never more than the
    /// ring's free space, the generation's final barrier on the last data pair of each
    /// submission (hardware.rst §6.1), waiting (uninterruptibly, resetting the queue on a timeout)
    /// for each submission before the next.
    ///
    /// # Errors
    ///
    /// `EINVAL` for size 0; the errors of [`Self::wait`] but `EINTR`.
    pub(crate) fn memcpy_on(
        &self,
        cell: &QueueCell,
        src: u64,
        dst: u64,
        size: u64,
        timeout: Delta,
    ) -> Result {
        let mut in_flight = None;
        self.copy_on(
            cell,
            Src::Linear(src),
            dst,
            size,
            timeout,
            WaitMode::Uninterruptible,
            true,
            &mut in_flight,
        )
    }

    /// The copy loop of [`Self::memcpy_on`], with the wait's signal and reset policy. `timeout`
    /// bounds each submission's wait. On an early return (`EINTR`, or `ETIMEDOUT` without a
    /// reset) `in_flight` names the fence still in flight.
    #[expect(clippy::too_many_arguments)]
    fn copy_on(
        &self,
        cell: &QueueCell,
        src: Src,
        dst: u64,
        size: u64,
        timeout: Delta,
        mode: WaitMode,
        reset_on_timeout: bool,
        in_flight: &mut Option<u64>,
    ) -> Result {
        if size == 0 {
            return Err(EINVAL);
        }
        let zeros = match src {
            Src::Zeros => {
                let st = self.state.lock();
                let z = st.zeros.as_ref().ok_or(ENODEV)?;
                self.host_addr(z.dma_address())
            }
            Src::Linear(_) => 0,
        };
        let start = Instant::<Monotonic>::now();
        let mut done = 0u64;
        while done < size {
            let (seq, bytes) = self.with_queue(cell, |q, io| {
                q.retire();
                // One pair of the free space is for the marker.
                let room = q
                    .available_pairs()
                    .saturating_sub(1)
                    .min(MAX_PAIRS_PER_SUBMISSION);
                if room == 0 || !q.can_fence() {
                    return Ok((None, 0));
                }
                let mut off = done;
                let mut pairs = 0;
                while off < size && pairs < room {
                    // CAST: bounded by MAX_DESC_BYTES.
                    let len = (size - off).min(u64::from(MAX_DESC_BYTES)) as u32;
                    let last = off + u64::from(len) >= size || pairs + 1 == room;
                    q.prepare_one(&queue::Copy {
                        src: match src {
                            Src::Linear(s) => s + off,
                            Src::Zeros => zeros,
                        },
                        dst: dst + off,
                        len: DescLen::new(len)?,
                        barrier: if last {
                            self.arch.final_barrier
                        } else {
                            Barrier::None
                        },
                        set_dst_int: false,
                    })?;
                    off += u64::from(len);
                    pairs += 1;
                }
                Ok((Some(q.fence(io)?), off - done))
            })?;
            match seq {
                Some(seq) => {
                    let r = self.wait_for(cell, seq, timeout, mode, reset_on_timeout);
                    if matches!(r, Err(e) if e == EINTR || e == ETIMEDOUT)
                        && !self.with_queue(cell, |q, _| Ok(q.is_settled(seq)))?
                    {
                        *in_flight = Some(seq);
                    }
                    r?;
                }
                // The ring is full of other submissions: wait for a slot to free up, within the
                // caller's time.
                None => {
                    if start.elapsed() >= timeout {
                        // A queue whose slots are all held by submissions that no longer
                        // complete is stuck: reset it, whoever waits.
                        self.reset_if_stuck(cell)?;
                        return Err(ETIMEDOUT);
                    }
                    if mode != WaitMode::Uninterruptible && fatal_signal_pending() {
                        return Err(EINTR);
                    }
                    fsleep(Delta::from_micros(50));
                }
            }
            done += bytes;
        }
        Ok(())
    }
}
