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
    mem::{Backing, Buffer, DramAllocator, BUF_ALIGN, DRAM_RESERVED, MAX_HOST_BUFFER},
    queue::{self, FenceState, Queue, MAX_PAIRS_PER_SUBMISSION},
};
use kernel::{
    device::Bound,
    dma::{Coherent, DmaAddress},
    new_mutex, pci,
    prelude::*,
    sync::{aref::ARef, Arc, Mutex},
    time::{delay::fsleep, Delta, Instant, Monotonic},
};

/// Default time a completion wait may take before the queue is declared stuck.
pub(crate) const DEFAULT_TIMEOUT: Delta = Delta::from_secs(10);
/// Ring size of the driver's H2T queue, as in the reference (spec 3.7: 8192 descriptors).
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
    /// Buffers handed to user space.
    bufs: KVec<Arc<Buffer>>,
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
        Arc::pin_init(
            try_pin_init!(Self {
                pdev: pdev.into(),
                arch,
                bar0,
                dram_size,
                model_ctl,
                state <- new_mutex!(DevState {
                    alive: true,
                    engines_init: [0; 3],
                    queues: KVec::new(),
                    h2t: None,
                    bufs: KVec::new(),
                    dram: DramAllocator::new(DRAM_RESERVED, *dram_size),
                    next_mmap: BUF_ALIGN,
                }),
            }),
            GFP_KERNEL,
        )
    }

    /// Takes the H2T queue of NeuronCore 0 (spec 2.3) for the driver's own copies.
    pub(crate) fn setup_h2t(&self) -> Result {
        let (eng, qid) = self.arch.h2t[0];
        let cell = self.queue_init(eng, qid, H2T_RING_DESCS, H2T_RING_DESCS, Owner::Driver)?;
        self.state.lock().h2t = Some(cell);
        Ok(())
    }

    /// Copies `size` bytes between device-fabric addresses on the driver's H2T queue
    /// ([`Self::memcpy_on`]).
    pub(crate) fn memcpy(&self, src: u64, dst: u64, size: u64, timeout: Delta) -> Result {
        let cell = self.state.lock().h2t.clone().ok_or(ENODEV)?;
        self.memcpy_on(&cell, src, dst, size, timeout)
    }

    /// Allocates `len` bytes of coherent host memory for DMA by this device.
    ///
    /// # Errors
    ///
    /// `ENOMEM`, or `ENODEV` once the device is unbound.
    #[cfg_attr(not(neuron_udma_kunit), expect(dead_code))]
    pub(crate) fn alloc_coherent(&self, len: usize) -> Result<Coherent<[u8]>> {
        let st = self.state.lock();
        if !st.alive {
            return Err(ENODEV);
        }
        // SAFETY: as in `queue_init`: `alive` under the state lock keeps the device bound.
        let dev = unsafe { self.pdev.as_ref().as_bound() };
        Coherent::<u8>::zeroed_slice(dev, len, GFP_KERNEL)
    }

    /// Device-fabric address of a host DMA address (spec 1.3).
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

    /// Runs the engine init sequence (spec 3.6) once per engine since probe.
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
    /// descriptors, initialises the engine if needed and programs the queue (spec 3.7).
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
        let mut q = Queue::new(dev, self.arch, eng, qid, tx_descs, rx_descs)?;
        self.ensure_engine(&mut st, eng)?;
        self.with_engine(eng, |io| q.hw_init(io))?;
        let cell = Arc::pin_init(
            try_pin_init!(QueueCell {
                eng,
                qid,
                owner,
                inner <- new_mutex!(Some(q)),
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

    /// Whether the device is still bound.
    pub(crate) fn is_alive(&self) -> bool {
        self.state.lock().alive
    }

    /// Bytes of device memory available to user buffers.
    pub(crate) fn user_dram_size(&self) -> u64 {
        self.state.lock().dram.capacity()
    }

    /// Allocates a buffer of `size` bytes (rounded up to 4 KiB) of host (`host == true`) or
    /// device memory for the open file `owner_file`, with handle `handle`.
    ///
    /// # Errors
    ///
    /// `EINVAL` for size 0 or a host buffer above [`MAX_HOST_BUFFER`], `ENOMEM` when no memory
    /// of that kind is left, `ENODEV` after unbind.
    pub(crate) fn alloc_buffer(
        &self,
        host: bool,
        size: u64,
        handle: u64,
        owner_file: *mut kernel::bindings::file,
    ) -> Result<Arc<Buffer>> {
        if size == 0 {
            return Err(EINVAL);
        }
        let size = size.checked_next_multiple_of(BUF_ALIGN).ok_or(EINVAL)?;
        let mut st = self.state.lock();
        if !st.alive {
            return Err(ENODEV);
        }
        st.bufs.reserve(1, GFP_KERNEL)?;
        let buf = if host {
            if size > MAX_HOST_BUFFER {
                return Err(EINVAL);
            }
            // SAFETY: as in `queue_init`: `alive` under the state lock keeps the device bound.
            let dev = unsafe { self.pdev.as_ref().as_bound() };
            // CAST: at most MAX_HOST_BUFFER.
            let mem = Coherent::<u8>::zeroed_slice(dev, size as usize, GFP_KERNEL)?;
            let off = st.next_mmap;
            st.next_mmap = off.checked_add(size).ok_or(ENOMEM)?;
            Buffer::new(handle, size, off, owner_file, Backing::Host(mem))?
        } else {
            let addr = st.dram.alloc(size)?;
            Buffer::new(handle, size, 0, owner_file, Backing::Device(addr))
                .inspect_err(|_| st.dram.free(addr))?
        };
        st.bufs.push(buf.clone(), GFP_KERNEL)?;
        Ok(buf)
    }

    /// Frees buffer `buf` (its user mappings first).
    pub(crate) fn free_buffer(&self, buf: &Buffer) {
        let mut st = self.state.lock();
        st.bufs.retain(|b| !core::ptr::eq(&**b, buf));
        if let Some(addr) = buf.free() {
            st.dram.free(addr);
        }
    }

    /// A raw pointer to the underlying `struct device`, for the C helpers.
    pub(crate) fn raw_device(&self) -> *mut kernel::bindings::device {
        // CAST: `device::Device` is a `repr(transparent)` wrapper of `struct device`.
        core::ptr::from_ref::<kernel::device::Device>(self.pdev.as_ref())
            .cast_mut()
            .cast()
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
    }

    /// Called from the PCI unbind callback: no new operation starts, every queue is paused
    /// and its memory freed while the device is still bound.
    pub(crate) fn shutdown(&self) {
        let queues = {
            let mut st = self.state.lock();
            st.alive = false;
            st.h2t = None;
            core::mem::take(&mut st.queues)
        };
        for cell in queues.iter() {
            self.quiesce(cell);
        }
        // After the queues: no engine uses the buffers any more.
        let bufs = core::mem::take(&mut self.state.lock().bufs);
        for b in bufs.iter() {
            b.free();
        }
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

    /// Waits for fence `seq` of the queue in `cell`, sleeping between checks; bounded by
    /// `timeout`, with one last check after it. On a timeout or an engine error, logs the
    /// engine, queue and error causes and resets the queue so that it can be used again.
    ///
    /// # Errors
    ///
    /// `ETIMEDOUT` if the fence did not complete in time, `EIO` if the engine reported an error,
    /// `ENODEV` after unbind.
    pub(crate) fn wait(&self, cell: &QueueCell, seq: u64, timeout: Delta) -> Result {
        self.wait_for(cell, seq, timeout, true)
    }

    /// [`Self::wait`], optionally ignoring signals (then it never returns `EINTR`).
    fn wait_for(&self, cell: &QueueCell, seq: u64, timeout: Delta, interruptible: bool) -> Result {
        let start = Instant::<Monotonic>::now();
        let resets = self.with_queue(cell, |q, _| Ok(q.resets))?;
        let mut delay = Delta::from_micros(2);
        let mut next_state_check = Delta::from_millis(5);
        loop {
            let state = self.with_queue(cell, |q, _| {
                if q.resets != resets {
                    // Reset by another waiter: this fence is lost.
                    return Err(EIO);
                }
                Ok(q.check(seq))
            })?;
            if state == FenceState::Done {
                return Ok(());
            }
            if interruptible && kernel::current!().signal_pending() {
                // The copies go on; a later wait completes the fence.
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
                let errors = self.with_engine(cell.eng, engine::engine_errors)?;
                if errors.aborted() {
                    return self.fail(cell, seq, EIO, &errors);
                }
            }
            fsleep(delay);
            delay = Delta::from_micros((delay.as_micros_ceil() * 2).min(1000));
        }
        // TIMEOUT: one last look, so that a completion racing the deadline is not lost.
        if self.with_queue(cell, |q, _| Ok(q.check(seq)))? == FenceState::Done {
            return Ok(());
        }
        let errors = self.with_engine(cell.eng, engine::engine_errors)?;
        let err = if errors.aborted() { EIO } else { ETIMEDOUT };
        self.fail(cell, seq, err, &errors)
    }

    /// Logs a failed wait and resets the queue (and an aborted engine).
    fn fail(&self, cell: &QueueCell, seq: u64, err: Error, errors: &EngineErrors) -> Result {
        let what = if err == EIO {
            "failed: engine error"
        } else {
            "timed out"
        };
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
        self.reset_queue(cell)?;
        Err(err)
    }

    /// Resets the queue in `cell` (full queue init, ring id 1, fences dropped) and returns its
    /// engine to normal operation if it is still aborted.
    pub(crate) fn reset_queue(&self, cell: &QueueCell) -> Result {
        self.with_queue(cell, |q, io| {
            q.reset(io)?;
            // A queue reset clears an abort caused by this queue; if the engine is still
            // aborted (another queue's error), return it to normal operation too.
            let now = engine::engine_errors(io)?;
            if now.aborted() {
                engine::recover_engine(io, &now)?;
            }
            Ok(())
        })
    }

    /// Copies `size` bytes from device-fabric address `src` to `dst` on queue `cell`, in 64 KiB
    /// pairs: at most 2032 data pairs plus one marker pair per doorbell and never more than the
    /// ring's free space, the generation's final barrier on the last data pair of each
    /// submission (spec 6.1), waiting for each submission before the next.
    ///
    /// # Errors
    ///
    /// `EINVAL` for size 0; the errors of [`Self::wait`].
    pub(crate) fn memcpy_on(
        &self,
        cell: &QueueCell,
        src: u64,
        dst: u64,
        size: u64,
        timeout: Delta,
    ) -> Result {
        if size == 0 {
            return Err(EINVAL);
        }
        let mut done = 0u64;
        while done < size {
            let (seq, bytes) = self.with_queue(cell, |q, io| {
                // One pair of the free space is for the marker.
                let room = q
                    .available_pairs()
                    .saturating_sub(1)
                    .min(MAX_PAIRS_PER_SUBMISSION);
                if room == 0 || !q.can_fence() {
                    return Ok((q.last_fence(), 0));
                }
                let mut off = done;
                let mut pairs = 0;
                while off < size && pairs < room {
                    // CAST: bounded by MAX_DESC_BYTES.
                    let len = (size - off).min(u64::from(MAX_DESC_BYTES)) as u32;
                    let last = off + u64::from(len) >= size || pairs + 1 == room;
                    q.prepare_one(&queue::Copy {
                        src: src + off,
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
                // Not interruptible: the caller's buffers are in use until the copy is done,
                // and the wait is bounded by `timeout` anyway.
                Some(seq) => self.wait_for(cell, seq, timeout, false)?,
                // The ring is full of other submissions: wait for a slot to free up.
                None => fsleep(Delta::from_micros(50)),
            }
            done += bytes;
        }
        Ok(())
    }
}
