// SPDX-License-Identifier: GPL-2.0

//! The dmaengine provider (`Documentation/neuron-udma.rst`, "dmaengine"): each bound device
//! registers one private `DMA_MEMCPY` and `DMA_MEMSET` `dma_device` whose channels are
//! driver-owned queues of the last H2T engine, so that in-kernel clients (and the kernel's own
//! `dmatest`) copy and fill with the engine. A fill reads the device's block of its value
//! (`pattern.rs`), found or made by the completion work before the descriptor goes to the ring
//! (prep may run in atomic context, making a block may sleep).
//!
//! Everything but the `dma_device` and the cookies (the dmaengine core's `dma_cookie_*()`,
//! called by `rust/kfac/dmaengine.c`) is here: channel state, descriptor building
//! (cut by the splitter, `split.rs`, and written by the submission engine, `submit.rs`, as every
//! copy of the driver: at most 2032 pairs per doorbell), completion and residue. Each channel
//! is a member of the device's completion engine (`completion.rs`), looked at while it has work
//! ([`Completer::kick`] from `issue_pending`, which may run in atomic context). Client callbacks
//! run from the engine's work item without any lock of the driver held, so a callback may
//! prepare and submit the next descriptor. The ring side is the channel's
//! ([`Channel::submit_pieces`], [`Channel::state`], [`Channel::recover`]).

use crate::{
    arch::{Arch, QUEUES_PER_ENGINE},
    channel::{Channel, Owner, QueueId},
    completion::{Completer, Look, Member, Membership},
    device::UdmaDevice,
    kfac::dmaengine::{self as provider, DmaRegistration, RawTxd, TxResult, Txd, TxdRef},
    pattern::{PatternRef, Patterns},
    queue::{FenceState, FENCE_SLOTS, MAX_PAIRS_PER_SUBMISSION},
    span::Span,
    split::{self, Job},
};
use kernel::{
    device::Bound,
    new_condvar, new_mutex, new_spinlock_irq, pci,
    prelude::*,
    sync::{aref::ARef, Arc, ArcBorrow, CondVar, Mutex, SpinLockIrq},
    time::{delay::fsleep, Delta, Instant, Monotonic},
};

/// Most channels a device registers (`dma_channels` is clamped to it): the free queues of the
/// last H2T engine, from queue 15 down.
pub(crate) const MAX_CHANNELS: u32 = 8;
/// Ring size of a channel's queue, in descriptors: room for one full submission (2032 pairs and
/// its marker) while the previous one runs.
const RING_DESCS: u32 = 4096;
/// How often the engine's error state is read while fences are outstanding (a device register
/// read, slow on the model).
const STATE_CHECK_EVERY: Delta = Delta::from_millis(5);
/// How long unbind waits for clients to give their channels back.
const CLIENT_WAIT: Delta = Delta::from_secs(30);
/// Descriptors completed per round of the completion work (callbacks run between rounds).
const BATCH: usize = 16;
/// Failed cookie ranges remembered for `tx_status` (`DMA_ERROR`).
const FAILED_RANGES: usize = 8;
/// `DMA_MIN_COOKIE`: the first valid cookie (the core's cookies start above it, and wrap).
const MIN_COOKIE: i32 = 1;

/// Where a descriptor is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// Submitted (`tx_submit`), not yet issued.
    Submitted,
    /// Issued (`issue_pending`), not yet on the ring.
    Issued,
    /// On the ring, entirely or in part.
    Active,
    /// Terminated while on the ring: dropped once the queue was stopped.
    Terminated,
    /// Lost in a queue reset: completes (in order) as aborted.
    Failed,
    /// Completed; its callback may be running (only the completion work removes it).
    Completing,
    /// Completed and called back, waiting for the client's ack (`DMA_CTRL_ACK`).
    Done,
}

/// One memcpy or memset descriptor.
struct Desc {
    txd: Txd,
    /// Host DMA addresses and length in bytes (`src` unused by a fill).
    src: u64,
    dst: u64,
    len: u64,
    /// A fill: the byte value, and once found, its block.
    fill: Option<u8>,
    pattern: Option<PatternRef>,
    cookie: i32,
    stage: Stage,
    /// Bytes written to the ring.
    written: u64,
    /// The newest fence covering the written pairs (`None`: not fenced yet).
    fence: Option<u64>,
}

/// State of a channel, behind its spinlock (every dmaengine operation but `synchronize` and
/// `free_chan_resources` may be called in atomic context).
struct State {
    /// The device is unbound: nothing new is accepted.
    dead: bool,
    /// The completion engine looks at the channel: it has work, or its last callbacks may be
    /// running ([`DmaChan::idle`] is notified when this turns false).
    running: bool,
    /// A client holds the channel (between `alloc_chan_resources` and `free_chan_resources`).
    client: bool,
    /// `terminate_all` left descriptors on the ring: the work stops the queue.
    terminate: bool,
    /// Descriptors in cookie order.
    descs: KVec<Desc>,
    /// Fences in flight, oldest first (capacity [`FENCE_SLOTS`], never reallocated).
    fences: KVec<u64>,
    /// The newest fence that completed.
    done_seq: Option<u64>,
    /// Inclusive cookie ranges that failed, most recent at `failed_next - 1`.
    failed: [(i32, i32); FAILED_RANGES],
    failed_next: usize,
}

impl State {
    /// Whether the completion work has anything to do.
    fn has_work(&self) -> bool {
        self.terminate
            || self.descs.iter().any(|d| match d.stage {
                Stage::Issued | Stage::Active | Stage::Terminated | Stage::Failed => true,
                Stage::Submitted => self.dead,
                Stage::Completing | Stage::Done => false,
            })
    }

    fn record_failed(&mut self, first: i32, last: i32) {
        // PANIC: `failed_next` is kept below FAILED_RANGES.
        self.failed[self.failed_next] = (first, last);
        self.failed_next = (self.failed_next + 1) % FAILED_RANGES;
    }

    fn is_failed(&self, cookie: i32) -> bool {
        self.failed
            .iter()
            .any(|&(a, b)| a >= MIN_COOKIE && cookie >= a && cookie <= b)
    }
}

/// Completed descriptors of one round, called back outside the locks.
struct Completed {
    items: [Option<(TxdRef, TxResult, u32)>; BATCH],
    n: usize,
}

impl Completed {
    fn new() -> Self {
        Self {
            items: [None; BATCH],
            n: 0,
        }
    }

    fn is_full(&self) -> bool {
        self.n == BATCH
    }

    fn push(&mut self, d: &mut Desc, result: TxResult) {
        let residue = if result == TxResult::NoError {
            0
        } else {
            // CAST: dmaengine's residue is 32 bits; clamp a larger transfer.
            d.len.min(u64::from(u32::MAX)) as u32
        };
        d.stage = Stage::Completing;
        // PANIC: callers check `is_full` first.
        self.items[self.n] = Some((d.txd.handle(), result, residue));
        self.n += 1;
    }
}

/// One dmaengine channel: a driver-owned queue and its descriptors.
#[pin_data]
pub(crate) struct DmaChan {
    chan: Arc<Channel>,
    arch: &'static Arch,
    patterns: Arc<Patterns>,
    pdev: ARef<pci::Device>,
    /// Interrupts off while held: clients may call `prep`, `tx_submit`, `issue_pending` and
    /// `tx_status` in interrupt context (driver-api/dmaengine/provider.rst; KUnit
    /// `dmaengine_state_lock_in_interrupt`), the completion engine in process context.
    #[pin]
    state: SpinLockIrq<State>,
    /// The pieces of the next submission (only the completion engine uses it).
    #[pin]
    pieces: Mutex<KVec<(u64, u64, u32)>>,
    /// The device's completion engine, which looks at the channel while it has work.
    completer: Arc<Completer>,
    /// Notified when [`State::running`] turns false (`synchronize`, unbind).
    #[pin]
    idle: CondVar,
}

impl Member for DmaChan {
    /// One round: completes up to [`BATCH`] descriptors (their callbacks run here, outside
    /// the locks) and writes issued ones to the ring.
    fn look(&self, check: bool) -> Look {
        if !self.state.lock().running {
            return Look::IDLE;
        }
        let mut done = Completed::new();
        if self.step(check, &mut done).is_err() {
            // The queue is gone (unbind): fail what is left.
            let mut st = self.state.lock();
            Self::fail_all(&mut st);
            Self::complete(&mut st, &mut done);
        }
        let progress = done.n > 0;
        for (txd, result, residue) in done.items.iter().flatten() {
            // SAFETY: the descriptor is `Completing`: only this look removes it, below.
            unsafe { txd.complete(*result, *residue) };
        }
        let mut st = self.state.lock();
        if progress {
            for d in st.descs.iter_mut().filter(|d| d.stage == Stage::Completing) {
                d.stage = Stage::Done;
            }
            st.descs
                .retain(|d| !(d.stage == Stage::Done && d.txd.acked()));
        }
        let busy = st.has_work();
        if !busy {
            st.running = false;
            self.idle.notify_all();
        }
        Look { progress, busy }
    }

    fn check_every(&self) -> Delta {
        STATE_CHECK_EVERY
    }
}

impl DmaChan {
    /// A channel on the driver's queue `chan` of `dev`; `ENOMEM`.
    pub(crate) fn new(dev: &UdmaDevice, chan: Arc<Channel>) -> Result<Arc<Self>> {
        let mut fences = KVec::new();
        fences.reserve(FENCE_SLOTS, GFP_KERNEL)?;
        let pieces = KVec::with_capacity(MAX_PAIRS_PER_SUBMISSION as usize, GFP_KERNEL)?;
        Arc::pin_init(
            pin_init!(Self {
                chan,
                arch: dev.arch,
                patterns: dev.patterns.clone(),
                pdev: dev.pdev.clone(),
                state <- new_spinlock_irq!(State {
                    dead: false,
                    running: false,
                    client: false,
                    terminate: false,
                    descs: KVec::new(),
                    fences,
                    done_seq: None,
                    failed: [(0, 0); FAILED_RANGES],
                    failed_next: 0,
                }),
                pieces <- new_mutex!(pieces),
                completer: dev.completer.clone(),
                idle <- new_condvar!("neuron_udma::dma_idle"),
            }),
            GFP_KERNEL,
        )
    }

    /// Has the completion engine look at the channel (called under the lock; never sleeps).
    fn kick(&self, st: &mut State) {
        if !st.running {
            st.running = true;
            Completer::kick(&self.completer);
        }
    }

    /// Waits until the completion engine is done with the channel: no work left and no
    /// callback running.
    fn wait_idle(&self) {
        let mut st = self.state.lock();
        while st.running {
            self.idle.wait(&mut st);
        }
    }

    /// Forgets the fences in flight (a queue reset dropped them).
    fn drop_fences(&self) {
        self.state.lock().fences.clear();
    }

    /// One round: stop the queue for `terminate_all` or unbind, collect the fences, detect
    /// errors (engine state read when `check`), complete descriptors in order, and write issued
    /// ones. The queue lock (in the channel) and the state lock are never held together.
    fn step(&self, check: bool, done: &mut Completed) -> Result {
        let (stop, any_fence) = {
            let st = self.state.lock();
            (st.terminate || st.dead, !st.fences.is_empty())
        };
        if stop {
            if any_fence {
                self.chan.reset(ECANCELED)?;
                self.drop_fences();
            }
            let mut st = self.state.lock();
            st.terminate = false;
            st.descs.retain(|d| d.stage != Stage::Terminated);
            if st.dead {
                Self::fail_all(&mut st);
                Self::complete(&mut st, done);
                return Ok(());
            }
        }
        let mut lost = false;
        loop {
            let Some(seq) = self.state.lock().fences.first().copied() else {
                break;
            };
            let state = self.chan.state(seq)?;
            let mut st = self.state.lock();
            match state {
                FenceState::Pending => break,
                FenceState::Done => st.done_seq = Some(seq),
                FenceState::Failed(_) | FenceState::Expired => lost = true,
            }
            let _ = st.fences.remove(0);
        }
        let failed = if lost {
            // A fence was dropped: nothing that was on the ring completes.
            self.chan.reset(EIO)?;
            Some(EIO)
        } else if check && !self.state.lock().fences.is_empty() {
            self.chan.recover()?
        } else {
            None
        };
        if failed.is_some() {
            self.drop_fences();
            Self::fail_active(&mut self.state.lock());
        }
        Self::complete(&mut self.state.lock(), done);
        self.write()
    }

    /// Writes issued descriptors to the ring, in order: as many pairs as the ring has room for,
    /// at most [`MAX_PAIRS_PER_SUBMISSION`], cut by the splitter (`split.rs`), then one fence
    /// (the submission engine's [`Channel::submit_pieces`]).
    fn write(&self) -> Result {
        if self.state.lock().fences.len() >= FENCE_SLOTS {
            return Ok(());
        }
        self.find_patterns();
        let room = self.chan.room()? as usize;
        if room == 0 {
            return Ok(());
        }
        let mut pieces = self.pieces.lock();
        pieces.clear();
        {
            let mut st = self.state.lock();
            'descs: for d in st.descs.iter_mut() {
                match d.stage {
                    Stage::Issued => d.stage = Stage::Active,
                    Stage::Active if d.written < d.len => {}
                    Stage::Submitted => break,
                    _ => continue,
                }
                if d.written < d.len && pieces.len() < room {
                    // A fill reads its whole block for every piece.
                    let src = match (&d.fill, &d.pattern) {
                        (None, _) => Span::Linear(self.arch.host_addr(d.src + d.written)),
                        (Some(_), Some(p)) => Span::Repeat(p.addr()),
                        // Not found yet (issued after this round's look): the next round,
                        // and nothing after it before it (the channel runs in order).
                        (Some(_), None) => break 'descs,
                    };
                    let job = Job {
                        src,
                        dst: Span::Linear(self.arch.host_addr(d.dst + d.written)),
                        size: d.len - d.written,
                    };
                    for piece in split::pieces(&job).take(room - pieces.len()) {
                        // Cannot fail: the capacity is MAX_PAIRS_PER_SUBMISSION, at least
                        // `room`.
                        if pieces.push_within_capacity(piece).is_err() {
                            break;
                        }
                        d.written += u64::from(piece.2);
                        d.fence = None;
                    }
                }
                if pieces.len() == room {
                    break;
                }
            }
        }
        if pieces.is_empty() {
            return Ok(());
        }
        let seq = self.chan.submit_pieces(&pieces)?;
        let mut st = self.state.lock();
        // Cannot fail: fewer than FENCE_SLOTS fences are in flight (checked above; only this
        // work adds them).
        let _ = st.fences.push_within_capacity(seq);
        for d in st.descs.iter_mut() {
            if d.stage == Stage::Active && d.fence.is_none() && d.written > 0 {
                d.fence = Some(seq);
            }
        }
        Ok(())
    }

    /// Finds the block of every issued fill that has none yet (outside the state lock: making
    /// a block may sleep); a fill whose block cannot be made fails (`DMA_ERROR`, in order).
    fn find_patterns(&self) {
        loop {
            let want = {
                let st = self.state.lock();
                st.descs
                    .iter()
                    .find(|d| {
                        matches!(d.stage, Stage::Issued | Stage::Active) && d.pattern.is_none()
                    })
                    .and_then(|d| d.fill.map(|v| (d.cookie, v)))
            };
            let Some((cookie, value)) = want else {
                return;
            };
            let got = self.patterns.get(value);
            let mut st = self.state.lock();
            let Some(d) = st.descs.iter_mut().find(|d| d.cookie == cookie) else {
                continue;
            };
            match got {
                Ok(p) => d.pattern = Some(p),
                Err(_) => {
                    d.stage = Stage::Failed;
                    d.fill = None;
                    st.record_failed(cookie, cookie);
                }
            }
        }
    }

    /// Completes, in order, the descriptors the newest completed fence covers, and the failed
    /// ones, up to [`BATCH`] per round: their cookies complete on the channel here, under the
    /// state lock that serialises the channel's cookies; their callbacks run later, outside it.
    fn complete(st: &mut State, done: &mut Completed) {
        let done_seq = st.done_seq;
        for d in st.descs.iter_mut() {
            let result = match d.stage {
                Stage::Completing | Stage::Done | Stage::Terminated => continue,
                Stage::Failed => TxResult::Aborted,
                Stage::Active => TxResult::NoError,
                Stage::Submitted | Stage::Issued => break,
            };
            let covered = matches!((d.fence, done_seq), (Some(f), Some(s)) if f <= s);
            if done.is_full() || (result == TxResult::NoError && (d.written < d.len || !covered)) {
                break;
            }
            d.txd.cookie_complete();
            done.push(d, result);
        }
    }

    /// Marks the descriptors on the ring as failed (the queue was reset) and remembers their
    /// cookies for `tx_status`.
    fn fail_active(st: &mut State) {
        let mut range: Option<(i32, i32)> = None;
        for d in st.descs.iter_mut().filter(|d| d.stage == Stage::Active) {
            d.stage = Stage::Failed;
            range = Some((range.map_or(d.cookie, |r| r.0), d.cookie));
        }
        if let Some((a, b)) = range {
            st.record_failed(a, b);
        }
    }

    /// Fails every descriptor not yet completed (unbind, or the queue is gone).
    fn fail_all(st: &mut State) {
        for d in st.descs.iter_mut() {
            if matches!(d.stage, Stage::Submitted | Stage::Issued) {
                d.stage = Stage::Active;
            }
        }
        Self::fail_active(st);
        st.fences.clear();
    }

    /// The channel behind a pointer `rust/kfac/dmaengine.c` passes to a callback.
    ///
    /// # Safety
    ///
    /// `ptr` is one of the references `DmaProvider::register` gave the `dma_device`
    /// (`Arc::into_raw`), which it owns until it gives it back in `neuron_udma_dma_put_chan`;
    /// the borrow does not outlive the callback.
    unsafe fn from_raw<'a>(ptr: *const Self) -> ArcBorrow<'a, Self> {
        // SAFETY: per the function's contract `ptr` is an `Arc::into_raw` reference that stays
        // alive for `'a`.
        unsafe { ArcBorrow::from_raw(ptr) }
    }
}

/// `device_alloc_chan_resources`: a client takes the channel (`rust/kfac/dmaengine.c` restarts
/// its cookies).
///
/// # Safety
///
/// `chan` is a channel reference of the `dma_device` (see `DmaChan::from_raw`), called by the
/// dmaengine core through `rust/kfac/dmaengine.c` under its rules for this operation.
#[no_mangle]
unsafe extern "C" fn neuron_udma_dma_alloc_chan(chan: *const DmaChan) -> c_int {
    // SAFETY: per the function's contract.
    let this = unsafe { DmaChan::from_raw(chan) };
    let mut st = this.state.lock();
    if st.dead {
        return ENODEV.to_errno();
    }
    st.failed = [(0, 0); FAILED_RANGES];
    st.client = true;
    0
}

/// `device_free_chan_resources`: the client let go; everything left is stopped and freed.
///
/// # Safety
///
/// `chan` as for [`neuron_udma_dma_alloc_chan`].
#[no_mangle]
unsafe extern "C" fn neuron_udma_dma_free_chan(chan: *const DmaChan) {
    // SAFETY: the same channel, per this function's contract.
    unsafe { neuron_udma_dma_terminate(chan) };
    // SAFETY: as above.
    unsafe { neuron_udma_dma_sync(chan) };
    // SAFETY: per the function's contract.
    let this = unsafe { DmaChan::from_raw(chan) };
    let old = {
        let mut st = this.state.lock();
        st.client = false;
        core::mem::take(&mut st.descs)
    };
    drop(old);
}

/// `device_prep_dma_memcpy`: a descriptor of `len` bytes from `src` to `dst` (host DMA
/// addresses); `NULL` for length 0, no memory, or after unbind.
///
/// # Safety
///
/// `chan` is a channel reference of the `dma_device` (see `DmaChan::from_raw`); `txd` is the
/// client descriptor `rust/kfac/dmaengine.c` is preparing, which this function owns from now on
/// (it is freed here on a null return).
#[no_mangle]
unsafe extern "C" fn neuron_udma_dma_prep(
    chan: *const DmaChan,
    txd: *mut RawTxd,
    dst: u64,
    src: u64,
    len: u64,
) -> *mut Desc {
    // SAFETY: per the function's contract the descriptor is ours from now on (the C side frees
    // nothing on a null return: dropping the `Txd` frees it).
    let Some(txd) = (unsafe { Txd::from_raw(txd) }) else {
        return core::ptr::null_mut();
    };
    // SAFETY: per the function's contract.
    let this = unsafe { DmaChan::from_raw(chan) };
    if len == 0 || this.state.lock().dead {
        return core::ptr::null_mut();
    }
    let desc = Desc {
        txd,
        src,
        dst,
        len,
        fill: None,
        pattern: None,
        cookie: 0,
        stage: Stage::Submitted,
        written: 0,
        fence: None,
    };
    match KBox::new(desc, GFP_NOWAIT) {
        Ok(d) => KBox::into_raw(d),
        Err(_) => core::ptr::null_mut(),
    }
}

/// `device_prep_dma_memset`: a descriptor that fills `len` bytes at `dst` (a host DMA address)
/// with `value`; `NULL` for length 0, no memory, or after unbind.
///
/// # Safety
///
/// As [`neuron_udma_dma_prep`].
#[no_mangle]
unsafe extern "C" fn neuron_udma_dma_prep_memset(
    chan: *const DmaChan,
    txd: *mut RawTxd,
    dst: u64,
    value: u8,
    len: u64,
) -> *mut Desc {
    // SAFETY: per this function's contract, which is `neuron_udma_dma_prep`'s.
    let d = unsafe { neuron_udma_dma_prep(chan, txd, dst, 0, len) };
    if !d.is_null() {
        // SAFETY: `d` was just made by `neuron_udma_dma_prep` and is not shared yet.
        unsafe { (*d).fill = Some(value) };
    }
    d
}

/// `tx_submit`: queues `desc` (from [`neuron_udma_dma_prep`]) and returns its cookie
/// (`dma_cookie_assign()`), or a negative errno (`ENODEV` after unbind, `ENOMEM`) after freeing
/// it.
///
/// # Safety
///
/// `chan` is a channel reference of the `dma_device` (see `DmaChan::from_raw`); `desc` is the
/// `KBox::into_raw` of [`neuron_udma_dma_prep`] for that channel, submitted once (a client
/// submits a descriptor once, dmaengine's rule).
#[no_mangle]
unsafe extern "C" fn neuron_udma_dma_submit(chan: *const DmaChan, desc: *mut Desc) -> i32 {
    // SAFETY: per the function's contract `desc` is an unsubmitted `KBox::into_raw`.
    let mut d = unsafe { KBox::from_raw(desc) };
    // SAFETY: per the function's contract.
    let this = unsafe { DmaChan::from_raw(chan) };
    let mut st = this.state.lock();
    if st.dead {
        return ENODEV.to_errno();
    }
    if st.descs.reserve(1, GFP_NOWAIT).is_err() {
        return ENOMEM.to_errno();
    }
    // Under the state lock: the channel's cookies are assigned and completed in order.
    let cookie = d.txd.assign_cookie();
    d.cookie = cookie;
    // Cannot fail: capacity was reserved.
    let _ = st.descs.push_within_capacity(KBox::into_inner(d));
    cookie
}

/// `device_issue_pending`: the submitted descriptors go to the ring (from the completion work).
///
/// # Safety
///
/// `chan` as for [`neuron_udma_dma_alloc_chan`].
#[no_mangle]
unsafe extern "C" fn neuron_udma_dma_issue(chan: *const DmaChan) {
    // SAFETY: per the function's contract.
    let this = unsafe { DmaChan::from_raw(chan) };
    let mut st = this.state.lock();
    if st.dead {
        return;
    }
    let mut any = false;
    for d in st.descs.iter_mut().filter(|d| d.stage == Stage::Submitted) {
        d.stage = Stage::Issued;
        any = true;
    }
    if any {
        this.kick(&mut st);
    }
}

/// `device_tx_status` of a cookie the core reports complete: whether its transfer was aborted
/// (`DMA_ERROR`; the last [`FAILED_RANGES`] failed ranges are remembered).
///
/// # Safety
///
/// `chan` as for [`neuron_udma_dma_alloc_chan`].
#[no_mangle]
unsafe extern "C" fn neuron_udma_dma_failed(chan: *const DmaChan, cookie: i32) -> bool {
    // SAFETY: per the function's contract.
    unsafe { DmaChan::from_raw(chan) }
        .state
        .lock()
        .is_failed(cookie)
}

/// `device_tx_status` of a cookie in progress: its residue, the whole length of its descriptor
/// (descriptor granularity; 0 for an unknown cookie).
///
/// # Safety
///
/// `chan` as for [`neuron_udma_dma_alloc_chan`].
#[no_mangle]
unsafe extern "C" fn neuron_udma_dma_residue(chan: *const DmaChan, cookie: i32) -> u32 {
    // SAFETY: per the function's contract.
    let this = unsafe { DmaChan::from_raw(chan) };
    let st = this.state.lock();
    let left = st
        .descs
        .iter()
        .find(|d| d.cookie == cookie)
        .map_or(0, |d| d.len.min(u64::from(u32::MAX)));
    // CAST: clamped to u32 above.
    left as u32
}

/// `device_terminate_all`: drops every descriptor that did not complete, without callbacks
/// (their cookies complete and read `DMA_ERROR` from now on); those on the ring are dropped once
/// the completion work stopped the queue (`device_synchronize` waits for it).
///
/// # Safety
///
/// `chan` as for [`neuron_udma_dma_alloc_chan`].
#[no_mangle]
unsafe extern "C" fn neuron_udma_dma_terminate(chan: *const DmaChan) {
    // SAFETY: per the function's contract.
    let this = unsafe { DmaChan::from_raw(chan) };
    let mut st = this.state.lock();
    let mut on_ring = false;
    let mut range: Option<(i32, i32)> = None;
    for d in st.descs.iter_mut() {
        match d.stage {
            Stage::Active | Stage::Failed => {
                d.stage = Stage::Terminated;
                on_ring = true;
            }
            Stage::Submitted | Stage::Issued => {}
            _ => continue,
        }
        d.txd.cookie_complete();
        range = Some((range.map_or(d.cookie, |r| r.0), d.cookie));
    }
    st.descs
        .retain(|d| !matches!(d.stage, Stage::Submitted | Stage::Issued));
    if let Some((first, last)) = range {
        st.record_failed(first, last);
    }
    if on_ring && !st.dead {
        st.terminate = true;
        this.kick(&mut st);
    }
}

/// `device_synchronize`: waits until the completion engine is done with the channel
/// (terminated transfers stopped, no callback running).
///
/// # Safety
///
/// `chan` as for [`neuron_udma_dma_alloc_chan`].
#[no_mangle]
unsafe extern "C" fn neuron_udma_dma_sync(chan: *const DmaChan) {
    // SAFETY: per the function's contract.
    unsafe { DmaChan::from_raw(chan) }.wait_idle();
}

/// The `dma_device` was released: gives back its reference of the channel.
///
/// # Safety
///
/// `chan` is a channel reference `DmaProvider::register` gave the `dma_device`, given back once
/// (its release), not used by C afterwards.
#[no_mangle]
unsafe extern "C" fn neuron_udma_dma_put_chan(chan: *const DmaChan) {
    // SAFETY: per the function's contract, the `Arc::into_raw` reference given back once.
    drop(unsafe { Arc::<DmaChan>::from_raw(chan) });
}

/// A device's dmaengine provider: its channels and the registered `dma_device`.
#[pin_data(PinnedDrop)]
pub(crate) struct DmaProvider {
    chans: KVec<Arc<DmaChan>>,
    /// The channels' places in the completion engine, given up at unbind.
    #[pin]
    members: Mutex<KVec<Membership>>,
    /// The registration (`None` once unregistered) and whether [`Self::shutdown`] ran.
    #[pin]
    reg: Mutex<(Option<DmaRegistration>, bool)>,
}

impl DmaProvider {
    /// Takes `n` (at most [`MAX_CHANNELS`]) free queues of the last H2T engine of `dev` for the
    /// driver and registers a `dma_device` with one channel each. `n == 0` registers nothing.
    ///
    /// # Errors
    ///
    /// `ENOMEM`, the errors of `UdmaDevice::queue_init`, or those of
    /// `dma_async_device_register()`; the queues taken so far stay taken until unbind.
    pub(crate) fn register(
        dev: &UdmaDevice,
        pdev: &pci::Device<Bound>,
        n: u32,
    ) -> Result<Pin<KBox<Self>>> {
        let mut chans = KVec::new();
        let Some(&(eng, _)) = dev.arch.h2t.last() else {
            return Err(ENODEV);
        };
        let queues = (0..QUEUES_PER_ENGINE)
            .rev()
            .filter(|&qid| !dev.arch.is_reserved_queue(eng, qid))
            .take(n.min(MAX_CHANNELS) as usize);
        for qid in queues {
            let id = QueueId::new(dev.arch, eng, qid).ok_or(EINVAL)?;
            let q = dev.queue_init(id, RING_DESCS, RING_DESCS, Owner::Driver, None)?;
            chans.push(DmaChan::new(dev, q)?, GFP_KERNEL)?;
        }
        // Members of the completion engine from before the first client can issue, to unbind
        // (`shutdown`), or until a failed registration below.
        let mut members = KVec::with_capacity(chans.len(), GFP_KERNEL)?;
        for c in chans.iter() {
            members.push(Completer::add(&dev.completer, c.clone())?, GFP_KERNEL)?;
        }
        if chans.is_empty() {
            return KBox::pin_init(
                pin_init!(Self { chans, members <- new_mutex!(members), reg <- new_mutex!((None, false)) }),
                GFP_KERNEL,
            );
        }
        let mut raw = KVec::with_capacity(chans.len(), GFP_KERNEL)?;
        for c in chans.iter() {
            raw.push(Arc::into_raw(c.clone()), GFP_KERNEL)?;
        }
        // SAFETY: each entry is an `Arc<DmaChan>` reference that the trampolines accept.
        match unsafe { DmaRegistration::register(pdev.as_ref(), &raw) } {
            Ok(reg) => {
                dev_info!(
                    pdev,
                    "dmaengine: {} memcpy channels on engine {}\n",
                    chans.len(),
                    eng
                );
                KBox::pin_init(
                    pin_init!(Self {
                        chans,
                        members <- new_mutex!(members),
                        reg <- new_mutex!((Some(reg), false)),
                    }),
                    GFP_KERNEL,
                )
            }
            Err(e) => {
                for p in raw.iter() {
                    // SAFETY: the `dma_device` was not registered: each reference is still
                    // ours (`Arc::into_raw` above), given back once.
                    unsafe { neuron_udma_dma_put_chan(*p) };
                }
                Err(e)
            }
        }
    }

    /// Unbind, before the queues are released: unregisters the `dma_device`, then completes
    /// every outstanding descriptor as aborted (callbacks run here), waits for the completion
    /// work, and waits (at most [`CLIENT_WAIT`]) for the clients to give their channels back.
    /// Afterwards no callback runs and every operation fails; a client that still holds a
    /// channel keeps it (and its memory) until it lets go.
    pub(crate) fn shutdown(&self) {
        let reg = {
            let mut r = self.reg.lock();
            if r.1 {
                return;
            }
            r.1 = true;
            r.0.take()
        };
        if let Some(reg) = reg {
            reg.unregister();
        }
        for c in self.chans.iter() {
            {
                let mut st = c.state.lock();
                st.dead = true;
                c.kick(&mut st);
            }
            c.wait_idle();
        }
        // Idle for good (dead): out of the completion engine.
        self.members.lock().clear();
        // A client still using a channel also has buffers mapped for this device: give it time
        // to see its transfers fail and let go, so that nothing of it is mapped once the
        // device is unbound.
        let start = Instant::<Monotonic>::now();
        while self.chans.iter().any(|c| c.state.lock().client) {
            if start.elapsed() >= CLIENT_WAIT {
                if let Some(c) = self.chans.first() {
                    dev_warn!(
                        c.pdev,
                        "dmaengine: unbinding with a client still holding a channel\n"
                    );
                }
                break;
            }
            fsleep(Delta::from_millis(10));
        }
    }
}

#[pinned_drop]
impl PinnedDrop for DmaProvider {
    fn drop(self: Pin<&mut Self>) {
        self.shutdown();
    }
}

/// Frees the released `dma_device`s at module unload (dropped after the driver is unregistered).
pub(crate) struct ReleasedGuard;

impl Drop for ReleasedGuard {
    fn drop(&mut self) {
        provider::dma_free_released();
    }
}
