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
//! ([`Channel::submit`], [`Channel::state`], [`Channel::recover`]).

use crate::{
    arch::{Arch, QUEUES_PER_ENGINE},
    channel::{Channel, Owner, QueueId},
    completion::{Completer, Look, Member, Membership},
    device::UdmaDevice,
    kfac::dmaengine::{self as provider, DmaRegistration, TxResult, Txd, TxdRef},
    pattern::{PatternRef, Patterns},
    queue::{FenceState, FENCE_SLOTS},
    split::{Cut, Move},
};
use kernel::{
    device::Bound,
    new_condvar, new_mutex, new_spinlock_irq, pci,
    prelude::*,
    sync::{aref::ARef, Arc, CondVar, Mutex, SpinLockIrq},
    time::{delay::fsleep, Delta, Instant, Monotonic},
};

mod ops;

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
/// Most descriptors one submission writes pairs of (each takes at least one pair).
const MAX_MOVES: usize = 256;
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
    /// The moves of the next submission and the cookies of their descriptors (only the
    /// completion engine uses them; capacity [`MAX_MOVES`] each).
    #[pin]
    moves: Mutex<(KVec<Move>, KVec<i32>)>,
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
        match self.step(check, &mut done) {
            Ok(()) => {}
            // A device reset is under way: its stop fails what was on the ring (the fences
            // settle as failed, which a later round reads); nothing else fails meanwhile, and
            // the descriptors not written yet are written after the restart.
            // Not at unbind (`dead`): everything fails then, reset or not.
            Err(_) if self.chan.resetting() && !self.state.lock().dead => {
                Self::complete(&mut self.state.lock(), &mut done)
            }
            Err(_) => {
                // The queue is gone (unbind): fail what is left.
                let mut st = self.state.lock();
                Self::fail_all(&mut st);
                Self::complete(&mut st, &mut done);
            }
        }
        let progress = done.n > 0;
        let mut acked = [false; BATCH];
        for (a, (txd, result, residue)) in acked.iter_mut().zip(done.items.iter().flatten()) {
            // SAFETY: the descriptor is `Completing`: only this look removes it, below.
            *a = unsafe { txd.complete(*result, *residue) };
        }
        let mut st = self.state.lock();
        if progress {
            // The `Completing` ones are this round's, in order (nothing else changes them);
            // one the client acked in its callback goes now, a `Done` one once it acks.
            let mut acked = acked.iter();
            st.descs.retain(|d| match d.stage {
                Stage::Completing => {
                    d.stage = Stage::Done;
                    acked.next() != Some(&true)
                }
                Stage::Done => !d.txd.acked(),
                _ => true,
            });
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
        let moves = (
            KVec::with_capacity(MAX_MOVES, GFP_KERNEL)?,
            KVec::with_capacity(MAX_MOVES, GFP_KERNEL)?,
        );
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
                moves <- new_mutex!(moves),
                completer: dev.completer.clone(),
                idle <- new_condvar!("neuron_udma::dma_idle"),
            }),
            GFP_KERNEL,
        )
    }

    /// Waits until the completion engine is done with the channel: no work left and no
    /// callback running.
    fn wait_idle(&self) {
        let mut st = self.state.lock();
        while st.running {
            self.idle.wait(&mut st);
        }
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
                match self.chan.reset(ECANCELED) {
                    // A device reset's stop paused the queue and dropped its fences already.
                    Err(_) if self.chan.resetting() => {}
                    r => r?,
                }
                self.state.lock().fences.clear();
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
            // A fence was dropped: nothing that was on the ring completes. During a device
            // reset its stop dropped it and emptied the ring already: nothing to reset.
            match self.chan.reset(EIO) {
                Err(_) if self.chan.resetting() => {}
                r => r?,
            }
            Some(EIO)
        } else if check && !self.state.lock().fences.is_empty() {
            self.chan.recover()?
        } else {
            None
        };
        if failed.is_some() {
            self.state.lock().fences.clear();
            Self::fail_active(&mut self.state.lock());
        }
        Self::complete(&mut self.state.lock(), done);
        self.write()
    }

    /// Writes issued descriptors to the ring, in order: hands the submission engine
    /// ([`Channel::submit`]) the moves of up to [`MAX_MOVES`] of them, of which it writes as
    /// many pairs as the ring has room for (at most 2032, cut by the splitter, `split.rs`) and
    /// one fence; then counts the bytes it took against them. One it took nothing of is
    /// `Issued` again: only descriptors with pairs on the ring fail when the queue is reset.
    fn write(&self) -> Result {
        if self.state.lock().fences.len() >= FENCE_SLOTS {
            return Ok(());
        }
        self.find_patterns();
        let (list, cookies) = &mut *self.moves.lock();
        list.clear();
        cookies.clear();
        {
            let mut st = self.state.lock();
            for d in st.descs.iter_mut() {
                match d.stage {
                    Stage::Issued | Stage::Active if d.written < d.len => {}
                    Stage::Submitted => break,
                    _ => continue,
                }
                // A fill reads its whole block for every pair.
                let (src, repeat) = match (&d.fill, &d.pattern) {
                    (None, _) => (self.arch.host_addr(d.src + d.written), false),
                    (Some(_), Some(p)) => (p.addr(), true),
                    // Not found yet (issued after this round's look): the next round, and
                    // nothing after it before it (the channel runs in order).
                    (Some(_), None) => break,
                };
                let dst = self.arch.host_addr(d.dst + d.written);
                let (bytes, cookie) = (d.len - d.written, d.cookie);
                // Fails only at MAX_MOVES, the capacity of both.
                let m = Move {
                    src,
                    dst,
                    bytes,
                    repeat,
                };
                if list.push_within_capacity(m).is_err()
                    || cookies.push_within_capacity(cookie).is_err()
                {
                    break;
                }
                d.stage = Stage::Active;
            }
        }
        if list.is_empty() {
            return Ok(());
        }
        let mut cut = Cut::moves(list);
        // `None`: no room; nothing written.
        let seq = self.chan.submit(&mut cut)?;
        let mut taken = match seq {
            Some(_) => list.iter().map(|m| m.bytes).sum::<u64>() - cut.remaining(),
            None => 0,
        };
        let mut st = self.state.lock();
        if let Some(seq) = seq {
            // Cannot fail: fewer than FENCE_SLOTS fences are in flight (checked above; only
            // this work adds them).
            let _ = st.fences.push_within_capacity(seq);
        }
        // The descriptors of the moves, in cookie order (nothing removes an `Active` one
        // meanwhile; one terminated meanwhile still counts: its pairs are on the ring until
        // the queue is stopped).
        let mut descs = st.descs.iter_mut();
        for (m, &cookie) in list.iter().zip(cookies.iter()) {
            let Some(d) = descs.find(|d| d.cookie == cookie) else {
                break;
            };
            let n = m.bytes.min(taken);
            taken -= n;
            match seq {
                Some(seq) if n > 0 => {
                    d.written += n;
                    d.fence = Some(seq);
                }
                // Nothing of it reached the ring: issued again, so that a reset of the queue
                // does not fail it (only what was on the ring fails).
                _ if d.stage == Stage::Active && d.written == 0 => d.stage = Stage::Issued,
                _ => {}
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
                    "dmaengine: {} memcpy and memset channels on engine {}\n",
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
                    unsafe { ops::neuron_udma_dma_put_chan(*p) };
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
