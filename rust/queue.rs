// SPDX-License-Identifier: GPL-2.0

//! One DMA queue: its Tx (M2S) and Rx (S2M) rings in coherent memory, `copy_prepare_one`,
//! `copy_start`, and completion fences (hardware.rst §3.7, 4.5-4.7, 5).
//!
//! A [`Queue`] is plain data guarded by its owner's lock; the register accesses it needs are
//! given an [`EngineIo`] by the caller, so nothing here sleeps. A doorbell is rung through a
//! [`Doorbell`]: the engine's registers, or the channel's ringer, which may first have the engine
//! move descriptors (and sleep for it).
//!
//! Placement ([`Placement`]): the rings and completion slots are in host memory, or in device
//! memory (`devring.rs`). Descriptors are written the same way for both, into the rings in host
//! memory (for device rings those are staging rings, published to device memory before each
//! doorbell), so the per-descriptor path has no branch on the placement; a doorbell, a fence and a
//! retire have one.
//!
//! Completion: a fence appends one 4-byte host-to-host pair that copies the marker 0xABCDEF01
//! from word 0 of a completion slot to word 1 (hardware.rst §5.1). The marker's Tx descriptor
//! carries DMB (see [`MARKER_BARRIER`]), so when word 1 holds the marker, every descriptor before
//! the pair is done, its data visible, and is acked.

mod ahead;
mod fences;
mod obs;

pub(crate) use ahead::{Ahead, Written};

use crate::{
    arch::Arch,
    buffer::Buffer,
    counters::{QueueObs, ResetCause},
    desc::{Barrier, Desc, DescLen, Dir, DESC_SIZE},
    devring::{DeviceMemory, DeviceRings, Moves},
    engine::{self, DescCount, EngineIo, QueueIndex},
    holds::Holds,
    regs::{M2s, S2m},
    ring::{Ring, RingSize, RingState, RESERVE},
};
use kernel::{
    device::{Bound, Device},
    dma::Coherent,
    io::{io_project, io_read, io_write},
    prelude::*,
    time::{Delta, Instant, Monotonic},
};

/// The completion marker (hardware.rst §5.1, `DMA_COMPLETION_MARKER`).
pub(crate) const COMPLETION_MARKER: u32 = 0xABCD_EF01;
/// Ordering of the completion marker's Tx descriptor: DMB (`len_ctrl` bit 30).
///
/// Descriptors are consumed in queue order, but their writes are not ordered: without a
/// barrier, the marker's 4-byte write may become visible before the data writes of earlier
/// pairs (hardware.rst §8.2 item 7: the completion protocol needs the marker's write to be visible
/// after all earlier pairs' writes). The reference driver gets this order from a write barrier on
/// its own last data pair (hardware.rst §4.4, 5.1), but pairs prepared by user space (COPY_PREPARE)
/// usually carry no barrier, and the driver cannot know which pair the fence follows. DMB on the
/// marker — "wait for all previous transfers before this one" (hardware.rst §4.2 bit 30) — makes
/// the marker wait for every earlier transfer of the queue whatever the user pairs carry, at the
/// cost of one pipeline drain per fence.
pub(crate) const MARKER_BARRIER: Barrier = Barrier::Dmb;
/// Most data pairs the driver puts in front of one marker pair (hardware.rst §6.1: 2032 + 1 per
/// doorbell).
pub(crate) const MAX_PAIRS_PER_SUBMISSION: u32 = 2032;
/// Bytes of a page, for the memory a queue is charged for.
const PAGE_BYTES: u64 = kernel::page::PAGE_SIZE as u64;
/// Completion slots of a queue, i.e. the most fences in flight at once.
pub(crate) const FENCE_SLOTS: usize = 256;

/// What became of a fence ([`Queue::state`]).
pub(crate) use fences::FenceState;

/// Rings a queue's doorbells (hardware.rst §3.8) once its descriptors are where the engine
/// fetches them.
pub(crate) trait Doorbell {
    /// Has the engine make `moves` first, if any (descriptors staged in host memory for rings in
    /// device memory filled by the engine, `devring.rs`), then rings the doorbells of queue `q`:
    /// Rx += `rx`, then Tx += `tx`.
    ///
    /// # Errors
    ///
    /// Those of the moves (nothing was rung then), `ENODEV` after unbind.
    fn ring(self, q: QueueIndex, moves: Option<&Moves>, tx: DescCount, rx: DescCount) -> Result;
}

impl Doorbell for EngineIo<'_> {
    /// The registers alone: `EOPNOTSUPP` if descriptors must be moved first.
    fn ring(self, q: QueueIndex, moves: Option<&Moves>, tx: DescCount, rx: DescCount) -> Result {
        if moves.is_some() {
            return Err(EOPNOTSUPP);
        }
        engine::doorbell(self, q, tx, rx);
        Ok(())
    }
}

/// Where a queue's rings and completion slots are.
enum Placement {
    /// Host memory: the engine fetches the rings themselves; the completion slots are coherent
    /// memory.
    Host(Coherent<[CompletionSlot]>),
    /// Device memory (`NEURON_UDMA_QUEUE_DEVICE_RINGS`): the rings in host memory are staging
    /// rings, published before each doorbell; the completion slots are in device memory.
    Device(DeviceRings),
}

/// One completion slot: word 0 holds the marker (the pair's source), word 1 receives it.
#[repr(C)]
#[derive(Clone, Copy, Default, FromBytes, IntoBytes)]
pub(crate) struct CompletionSlot {
    src: u32,
    dst: u32,
}

// SAFETY: `repr(C)`, two `u32`, no padding; every bit pattern is valid.
unsafe impl kernel::transmute::AsBytes for CompletionSlot {}
// SAFETY: As above.
unsafe impl kernel::transmute::FromBytes for CompletionSlot {}

/// A fence in flight: its completion slot and the ring positions just past its marker pair.
#[derive(Clone, Copy, Debug)]
struct Fence {
    seq: u64,
    slot: usize,
    tx_end: u32,
    rx_end: u32,
}

/// Fences a reset dropped: `first..=last`, and why.
#[derive(Clone, Copy, Debug)]
struct LostRange {
    first: u64,
    last: u64,
    why: Error,
}

/// Resets whose dropped fences a queue remembers (older outcomes read [`FenceState::Expired`]).
pub(crate) const LOST_RANGES: usize = 32;

/// The buffers of one submission (the pairs of one prepare call), held until the Tx ack
/// position passes `end` (the fence after the submission retired) or a reset or pause drops
/// them: a buffer is held once per submission, not once per pair.
struct SubmissionHolds {
    /// Free-running Tx position just past the submission's last pair.
    end: u64,
    /// The buffers, busy while the record lives (a revoked import asks which queues hold it).
    holds: Holds,
}

/// Holds records from which the retired ones are compacted away once this many are dead.
const HOLDS_COMPACT: usize = 64;

/// Parameters of one copy (one descriptor pair), addresses already translated.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Copy {
    /// Source, device-fabric address.
    pub(crate) src: u64,
    /// Destination, device-fabric address.
    pub(crate) dst: u64,
    /// Validated length.
    pub(crate) len: DescLen,
    /// Ordering of the Tx descriptor.
    pub(crate) barrier: Barrier,
}

/// Where a queue's rings stood before a submission was written ([`Queue::checkpoint`]), so that
/// the submission can be taken back whole when its fence cannot be rung ([`Queue::rollback`]).
#[derive(Clone, Copy)]
struct Checkpoint {
    tx: RingState,
    rx: RingState,
    rung: (u32, u32),
    holds: usize,
}

/// Software view of one queue and its memory.
pub(crate) struct Queue {
    index: QueueIndex,
    host_route: u64,
    /// The M2S (Tx, source) ring.
    tx: Ring,
    /// The S2M (Rx, destination) ring.
    rx: Ring,
    /// Where the engine fetches the rings from and writes the markers to.
    placement: Placement,
    /// Tx slot up to which the doorbell was rung: the descriptors from it to the ring's next
    /// slot are prepared and not rung ([`Self::pending`]). Fewer than a ring of them, so the
    /// distance is never ambiguous. Kept instead of a count so that writing a pair updates no
    /// counter beyond the rings' own state (Documentation/benchmarks.rst, (a)).
    tx_rung: u32,
    /// Rx slot up to which the doorbell was rung (as `tx_rung`).
    rx_rung: u32,
    /// Fences in flight, oldest first: always the fences `settled + 1 .. next_seq` (settling
    /// is in order: a retire settles a prefix, a reset all of them).
    fences: KVec<Fence>,
    /// Sequence number of the next fence.
    next_seq: u64,
    /// This queue instance's first fence number: 1, or for a file's queue id it used before,
    /// one past the previous instance's newest fence (fence numbers are never reused on a
    /// queue id of a file, so a fence of a released instance never names one of this one).
    first_seq: u64,
    /// Every fence up to this one is settled (done or failed).
    settled: u64,
    /// The newest fence that is done.
    done: u64,
    /// The last [`LOST_RANGES`] resets' dropped fences, oldest first.
    lost: KVec<LostRange>,
    /// Fences below this one may be in a dropped range that was forgotten.
    expired_below: u64,
    /// Times the queue was reset (after a timeout or an engine error).
    pub(crate) resets: u32,
    /// A reset dropped work no fence covered (prepared, or started without a fence), for this
    /// reason: the next submission call of the queue's user reports it, once
    /// ([`Self::take_lost`]).
    lost_unfenced: Option<Error>,
    /// Fences completed, and fences dropped by a reset (not by a pause), since creation.
    pub(crate) fences_done: u64,
    pub(crate) fences_failed: u64,
    /// The buffers of the submissions not yet retired, oldest first from `holds_head` (the
    /// entries before it are retired, `None`).
    holds: KVVec<Option<SubmissionHolds>>,
    /// First live entry of `holds`.
    holds_head: usize,
    /// Tx descriptors acked (or dropped by a reset) since the queue was created; with the
    /// outstanding ones, those written ([`Self::tx_written`]).
    tx_acked: u64,
    /// When a fence last completed, the engine last completed a descriptor of this queue
    /// (seen by [`Self::stalled_for`]), or the queue last went from idle to busy.
    progress_at: Instant<Monotonic>,
    /// The Rx completion head (`rcrhp`, raw) when [`Self::stalled_for`] last read it.
    progress_head: u32,
    /// What it reports to: its device's counters and its tracepoints (set by the queue
    /// instance that wraps it, [`Self::set_obs`]); `None`: nothing.
    obs: Option<QueueObs>,
}

impl Queue {
    /// Allocates the rings (`tx_descs` / `rx_descs` descriptors, power-of-two sizes from 32 to
    /// 2^23) of queue `index` in coherent memory, and its completion slots: in coherent memory
    /// too, or, with `device` (of [`Self::device_bytes`] bytes), the rings and completion slots
    /// the engine uses are in that device memory and the rings in host memory are staging rings.
    ///
    /// # Errors
    ///
    /// `EINVAL` for a bad size or a `first_seq` of 0, `ENOMEM` if the memory cannot be
    /// allocated, `EIO` if the allocator returns memory that is not 256-byte aligned
    /// (hardware.rst §4.8), `ENODEV` after unbind. The queue's fences are numbered from
    /// `first_seq` on.
    pub(crate) fn new(
        dev: &Device<Bound>,
        arch: &Arch,
        index: QueueIndex,
        (tx_descs, rx_descs): (u32, u32),
        device: Option<DeviceMemory>,
        first_seq: u64,
    ) -> Result<Self> {
        if first_seq == 0 {
            return Err(EINVAL);
        }
        let (tx_size, rx_size) = (RingSize::new(tx_descs)?, RingSize::new(rx_descs)?);
        let placement = match device {
            None => Placement::Host(Coherent::<CompletionSlot>::zeroed_slice(
                dev,
                FENCE_SLOTS,
                GFP_KERNEL,
            )?),
            Some(m) => Placement::Device(DeviceRings::new(
                m,
                (tx_size, rx_size, FENCE_SLOTS),
                COMPLETION_MARKER,
            )?),
        };
        let tx = Ring::new(dev, tx_size)?;
        let rx = Ring::new(dev, rx_size)?;
        Ok(Self {
            index,
            host_route: arch.host_route,
            tx,
            rx,
            placement,
            tx_rung: 0,
            rx_rung: 0,
            fences: KVec::with_capacity(FENCE_SLOTS, GFP_KERNEL_ACCOUNT)?,
            next_seq: first_seq,
            first_seq,
            settled: first_seq - 1,
            done: 0,
            lost: KVec::with_capacity(LOST_RANGES, GFP_KERNEL_ACCOUNT)?,
            expired_below: 0,
            resets: 0,
            lost_unfenced: None,
            fences_done: 0,
            fences_failed: 0,
            holds: KVVec::new(),
            holds_head: 0,
            tx_acked: 0,
            progress_at: Instant::now(),
            progress_head: 0,
            obs: None,
        })
    }

    /// Bytes of memory a queue with rings of `tx_descs` / `rx_descs` descriptors pins: both
    /// rings, the completion slots and the fence records (what [`Self::new`] allocates; the
    /// records of submissions' buffer holds grow with use and are charged to the caller's
    /// memory cgroup as they do).
    pub(crate) fn memory_bytes(tx_descs: u32, rx_descs: u32) -> u64 {
        // Coherent memory comes in power-of-two blocks of pages; the other allocations are
        // counted in whole pages.
        let block = |bytes: u64| bytes.max(PAGE_BYTES).next_power_of_two();
        let pages = |bytes: u64| bytes.div_ceil(PAGE_BYTES) * PAGE_BYTES;
        let size_of = |n: usize, each: usize| (n * each) as u64;
        block(u64::from(tx_descs) * DESC_SIZE as u64)
            + block(u64::from(rx_descs) * DESC_SIZE as u64)
            + block(size_of(FENCE_SLOTS, core::mem::size_of::<CompletionSlot>()))
            + pages(
                size_of(FENCE_SLOTS, core::mem::size_of::<Fence>())
                    + size_of(LOST_RANGES, core::mem::size_of::<LostRange>()),
            )
    }

    /// Bytes of device memory a queue with rings of `tx_descs` / `rx_descs` descriptors in
    /// device memory takes (rings and completion slots, whole 4 KiB units).
    ///
    /// # Errors
    ///
    /// `EINVAL` for a bad size.
    pub(crate) fn device_bytes(tx_descs: u32, rx_descs: u32) -> Result<u64> {
        Ok(DeviceRings::bytes(
            RingSize::new(tx_descs)?,
            RingSize::new(rx_descs)?,
            FENCE_SLOTS,
        ))
    }

    /// The device memory of a queue whose rings are there: `(device address, bytes)`, to give
    /// back (scrubbed) once the queue is paused.
    pub(crate) fn device_range(&self) -> Option<(u64, u64)> {
        match &self.placement {
            Placement::Host(_) => None,
            Placement::Device(d) => Some(d.range()),
        }
    }

    /// Whether the rings are in device memory and the engine fills them (the channel then needs
    /// a queue that moves descriptors).
    pub(crate) fn engine_filled(&self) -> bool {
        matches!(&self.placement, Placement::Device(d) if d.fill() == crate::devring::Fill::Engine)
    }

    /// The queue's index in its engine.
    pub(crate) fn q(&self) -> QueueIndex {
        self.index
    }

    /// Device-fabric address of the Tx ring the engine fetches.
    pub(crate) fn tx_base(&self) -> u64 {
        match &self.placement {
            Placement::Host(_) => self.tx.dma_address() | self.host_route,
            Placement::Device(d) => d.tx_base(),
        }
    }

    /// Device-fabric address of the Rx ring the engine fetches.
    pub(crate) fn rx_base(&self) -> u64 {
        match &self.placement {
            Placement::Host(_) => self.rx.dma_address() | self.host_route,
            Placement::Device(d) => d.rx_base(),
        }
    }

    /// Programs the queue registers (hardware.rst §3.7: Tx, then Rx) and resets the software state:
    /// empty rings, ring id 1, no fences.
    pub(crate) fn hw_init(&mut self, io: EngineIo<'_>) {
        engine::init_queue_dir::<M2s>(io, self.q(), self.tx_base(), self.tx.state().size());
        engine::init_queue_dir::<S2m>(io, self.q(), self.rx_base(), self.rx.state().size());
        self.forget_inflight(ECANCELED);
    }

    /// Resets the software state after the engine was stopped from using the rings (queue
    /// init or pause): empty rings, ring id 1; every fence in flight is settled as failed for
    /// `why` and every submission's buffer holds are dropped.
    fn forget_inflight(&mut self, why: Error) {
        self.holds.clear();
        self.holds_head = 0;
        self.tx_acked = self.tx_written();
        self.tx.reset();
        self.rx.reset();
        if let Placement::Device(d) = &mut self.placement {
            d.reset();
        }
        self.tx_rung = 0;
        self.rx_rung = 0;
        if why != ECANCELED {
            self.fences_failed += self.fences.len() as u64;
        }
        if let (Some(first), Some(last)) = (self.fences.first(), self.fences.last()) {
            let (first, last) = (first.seq, last.seq);
            self.record_lost(first, last, why);
        }
        self.fences.clear();
    }

    /// Stops the engine from using the rings: pauses both directions and resets the queue.
    pub(crate) fn pause(&mut self, io: EngineIo<'_>) {
        engine::pause_queue_dir::<M2s>(io, self.q());
        engine::pause_queue_dir::<S2m>(io, self.q());
        self.forget_inflight(ECANCELED);
    }

    /// Resets the queue after a timeout or an engine error (`why`: `ETIMEDOUT` or `EIO`, the
    /// reason its dropped fences report; `cause` what the counters count it as): the full queue init sequence again (which includes
    /// `q_sw_ctrl` reset), so the next submission starts from slot 0, ring id 1. Fences whose
    /// marker landed before the reset are retired first: they completed, only the later ones
    /// are dropped.
    pub(crate) fn reset(&mut self, io: EngineIo<'_>, why: Error, cause: ResetCause) {
        self.retire();
        self.count_reset(why, cause);
        engine::init_queue_dir::<M2s>(io, self.q(), self.tx_base(), self.tx.state().size());
        engine::init_queue_dir::<S2m>(io, self.q(), self.rx_base(), self.rx.state().size());
        self.forget_inflight(why);
    }

    /// Stops the queue for a device reset: pauses both directions when `io` reaches the
    /// registers, retires the fences whose markers landed, and fails the rest with `why`
    /// (`EIO`), counted as `cause`; work no fence covers fails as one more fence, reported to
    /// the next submission call ([`Self::fail_unfenced`]). The rings are programmed again by [`Self::hw_init`] once
    /// the device is back.
    pub(crate) fn halt(&mut self, io: Option<EngineIo<'_>>, why: Error, cause: ResetCause) {
        if let Some(io) = io {
            engine::pause_queue_dir::<M2s>(io, self.q());
            engine::pause_queue_dir::<S2m>(io, self.q());
        }
        self.retire();
        self.count_reset(why, cause);
        let unfenced = self.unfenced() != 0;
        self.forget_inflight(why);
        if unfenced {
            self.fail_unfenced(why);
        }
    }

    fn count_reset(&mut self, why: Error, cause: ResetCause) {
        self.resets = self.resets.wrapping_add(1);
        if let Some(o) = &self.obs {
            o.reset(why, cause);
        }
    }

    /// Tx ring state.
    pub(crate) fn tx_state(&self) -> &RingState {
        self.tx.state()
    }

    /// Rx ring state.
    pub(crate) fn rx_state(&self) -> &RingState {
        self.rx.state()
    }

    /// Prepared descriptors not yet doorbelled: `(tx, rx)`.
    pub(crate) fn pending(&self) -> (u32, u32) {
        let pending = |r: &RingState, rung| r.size().distance(rung, r.next_index());
        (
            pending(self.tx.state(), self.tx_rung),
            pending(self.rx.state(), self.rx_rung),
        )
    }

    /// Tx descriptors written since the queue was created (free-running, across resets): the
    /// acked ones and those still outstanding.
    fn tx_written(&self) -> u64 {
        self.tx_acked + u64::from(self.tx.state().outstanding())
    }

    /// Free descriptor pairs, keeping the 16-slot reserve on both rings (hardware.rst §4.7).
    pub(crate) fn available_pairs(&self) -> u32 {
        self.tx.state().available().min(self.rx.state().available())
    }

    /// Pairs the queue can hold at all: the free space of its empty rings (the 16-slot reserve
    /// kept). A copy of more pairs can never be prepared (`E2BIG`, not `ENOSPC`).
    pub(crate) fn capacity_pairs(&self) -> u32 {
        let cap = |r: &RingState| r.size().descs().saturating_sub(RESERVE);
        cap(self.tx.state()).min(cap(self.rx.state()))
    }

    /// Pairs one fenced submission may write now, after retiring what completed: the free space
    /// less one pair for the marker, at most [`MAX_PAIRS_PER_SUBMISSION`]; 0 when no fence can
    /// be added ([`Self::can_fence`]).
    pub(crate) fn submission_room(&mut self) -> u32 {
        self.retire();
        if !self.can_fence() {
            return 0;
        }
        self.available_pairs()
            .saturating_sub(1)
            .min(MAX_PAIRS_PER_SUBMISSION)
    }

    /// Whether a fence can be added now: a free completion slot and room for the marker pair.
    /// The marker may use the 16-descriptor reserve, so a wait is possible on a ring that
    /// `prepare_one` considers full. The fences in flight are consecutive, so fewer than
    /// [`FENCE_SLOTS`] of them never share a slot (`seq % FENCE_SLOTS`).
    pub(crate) fn can_fence(&self) -> bool {
        self.fences.len() < FENCE_SLOTS && self.marker_room()
    }

    /// Whether [`FENCE_SLOTS`] fences are in flight (no fence can be added until one retires).
    pub(crate) fn fences_full(&self) -> bool {
        self.fences.len() >= FENCE_SLOTS
    }

    /// Room for one pair beyond the reserve-keeping limit: the rings never fill completely.
    fn marker_room(&self) -> bool {
        let room = |r: &RingState| r.outstanding() + 2 < r.size().descs();
        room(self.tx.state()) && room(self.rx.state())
    }

    /// Writes one descriptor pair (hardware.rst §4.5): Rx slot, then Tx slot, each written whole.
    ///
    /// # Errors
    ///
    /// `ENOSPC` if either ring has no free slot; nothing is written then.
    #[inline(always)]
    pub(crate) fn prepare_one(&mut self, c: &Copy) -> Result {
        // Room on both rings, the reserve kept (`&`: no short circuit asked for; the compiler
        // still tests each ring with a branch of its own).
        if !(self.tx.state().has_room() & self.rx.state().has_room()) {
            return Err(ENOSPC);
        }
        self.write_pair(c);
        Ok(())
    }

    /// Writes the pairs `copies` of one submission whose buffers `holds` keeps busy until the
    /// engine has consumed them (the fence after them retired) or can no longer reach them:
    /// written ahead, then published ([`Self::publish`]).
    ///
    /// # Errors
    ///
    /// `ENOSPC` if the rings have no room for all of them, `ENOMEM` if the holds record cannot
    /// be stored; nothing is written then.
    pub(crate) fn write_submission(&mut self, copies: &[Copy], holds: Holds) -> Result {
        if (self.available_pairs() as usize) < copies.len() {
            return Err(ENOSPC);
        }
        let mut ahead = self.ahead();
        ahead.write_while(copies, |c| Ok(Some(*c)))?;
        let w = ahead.done();
        self.publish(w, holds, || {
            copies.iter().map(|c| u64::from(c.len.bytes())).sum()
        })
    }

    /// Runs `write` (pairs, then the fence that rings them) as one step: if it fails, everything
    /// it wrote is taken back ([`Self::checkpoint`], [`Self::rollback`]), so no unrecorded pair
    /// runs later. Returns the fence.
    ///
    /// # Errors
    ///
    /// Those of `write`; nothing it wrote stays then.
    pub(crate) fn all_or_nothing(
        &mut self,
        write: impl FnOnce(&mut Self) -> Result<u64>,
    ) -> Result<u64> {
        let cp = self.checkpoint();
        write(self).inspect_err(|_| self.rollback(cp))
    }

    /// Where the rings stand now: everything written after it can be taken back whole
    /// ([`Self::rollback`]) as long as nothing of it was rung and nothing was retired since.
    fn checkpoint(&self) -> Checkpoint {
        Checkpoint {
            tx: *self.tx.state(),
            rx: *self.rx.state(),
            rung: (self.tx_rung, self.rx_rung),
            holds: self.holds.len(),
        }
    }

    /// Takes back everything written since `cp` (pairs, and the holds of their submissions):
    /// for a submission whose fence could not be rung, so that no unrecorded pair runs later.
    fn rollback(&mut self, cp: Checkpoint) {
        self.tx.restore(cp.tx);
        self.rx.restore(cp.rx);
        (self.tx_rung, self.rx_rung) = cp.rung;
        self.holds.truncate(cp.holds);
    }

    /// Writes one pair without the reserve check (callers check the space): the Rx slot, then
    /// the Tx slot. Only the rings' own state changes: the pending and written counts are
    /// derived from it.
    #[inline(always)]
    fn write_pair(&mut self, c: &Copy) {
        self.rx.push(|id| Desc::rx(c.len, id, false, c.dst));
        self.tx.push(|id| Desc::tx(c.len, id, c.barrier, c.src));
    }

    /// Rings the doorbells for `m2s_count` Tx and `s2m_count` Rx prepared descriptors
    /// (hardware.rst §3.8: full barrier, Rx, then Tx if `m2s_count > 0`), through `bell`; rings in
    /// device memory get what was written to the staging rings first.
    ///
    /// # Errors
    ///
    /// `EINVAL` if `s2m_count` is 0 or either count exceeds the prepared, not yet started
    /// descriptors of its ring (which also bounds it by the ring size); those of `bell` and of
    /// publishing to device memory. Nothing is rung then.
    pub(crate) fn start(&mut self, bell: impl Doorbell, m2s_count: u32, s2m_count: u32) -> Result {
        let (pending_tx, pending_rx) = self.pending();
        if s2m_count == 0 || m2s_count > pending_tx || s2m_count > pending_rx {
            return Err(EINVAL);
        }
        let (Some(tx), Some(rx)) = (DescCount::new(m2s_count), DescCount::new(s2m_count)) else {
            return Err(EINVAL);
        };
        match &mut self.placement {
            Placement::Host(_) => bell.ring(self.index, None, tx, rx)?,
            Placement::Device(d) => {
                let staged = d.stage(&self.tx, &self.rx, self.host_route)?;
                bell.ring(self.index, staged.moves.as_ref(), tx, rx)?;
                d.published(&staged);
            }
        }
        self.tx_rung = self.tx.state().size().index(self.tx_rung + m2s_count);
        self.rx_rung = self.rx.state().size().index(self.rx_rung + s2m_count);
        if let Some(t) = self.trace() {
            t.doorbell(m2s_count, s2m_count);
        }
        Ok(())
    }

    /// Arms completion slot `slot` for a fence (word 1 cleared, word 0 the marker) and returns
    /// the device-fabric address of word 0.
    fn arm(&self, slot: usize) -> Result<u64> {
        match &self.placement {
            Placement::Host(c) => {
                io_write!(c, [try: slot].dst, 0);
                io_write!(c, [try: slot].src, COMPLETION_MARKER);
                Ok(io_project!(c, [try: slot]).dma_address() | self.host_route)
            }
            Placement::Device(d) => {
                d.arm(slot, COMPLETION_MARKER)?;
                Ok(d.slot_addr(slot))
            }
        }
    }

    /// Appends a completion marker pair after everything prepared so far and rings the
    /// doorbells for all prepared descriptors, marker included, with one doorbell (through
    /// `bell`). Returns the fence's sequence number; [`Self::state`] tells its outcome.
    ///
    /// # Errors
    ///
    /// `ENOSPC` if the rings have no room for the marker pair, `EBUSY` if [`FENCE_SLOTS`]
    /// fences are in flight, those of [`Self::start`]; nothing changes then.
    pub(crate) fn fence(&mut self, bell: impl Doorbell) -> Result<u64> {
        if !self.marker_room() {
            return Err(ENOSPC);
        }
        if self.fences.len() >= FENCE_SLOTS {
            return Err(EBUSY);
        }
        let seq = self.next_seq;
        // CAST: the remainder is below FENCE_SLOTS.
        let slot = (seq % FENCE_SLOTS as u64) as usize;
        // Arm the slot before the pair that copies it can run.
        let src = self.arm(slot)?;
        let len = DescLen::new(4)?;
        let saved = self.checkpoint();
        self.write_pair(&Copy {
            src,
            dst: src + 4,
            len,
            barrier: MARKER_BARRIER,
        });
        let (tx, rx) = self.pending();
        if let Err(e) = self.start(bell, tx, rx) {
            // Nothing was rung (moving descriptors into device rings failed, or the device is
            // gone): take the marker pair back, so that no unrecorded marker runs later.
            self.rollback(saved);
            return Err(e);
        }
        // Cannot fail: the capacity is FENCE_SLOTS and fewer fences are in flight (checked
        // above), so this does not allocate (callers may be in an atomic section). The doorbell
        // rang: an error here would leave the pairs running unrecorded (`all_or_nothing` would
        // take their holds back), which is why nothing after `start` may fail.
        self.fences
            .push_within_capacity(Fence {
                seq,
                slot,
                tx_end: self.tx.state().next_index(),
                rx_end: self.rx.state().next_index(),
            })
            .map_err(|_| EBUSY)?;
        if self.fences.len() == 1 {
            // Idle until now: the time without progress starts here.
            self.progress_at = Instant::now();
        }
        self.next_seq += 1;
        if let Some(t) = self.trace() {
            t.fence(seq);
        }
        Ok(seq)
    }

    /// Whether the marker of fence `seq` (in flight) has arrived, without retiring anything;
    /// `false` for a fence not in flight (KUnit: a fence its waiter has not seen complete).
    #[cfg(neuron_udma_kunit)]
    pub(crate) fn marker_arrived(&self, seq: u64) -> bool {
        let Some(i) = self.fences.iter().position(|f| f.seq == seq) else {
            return false;
        };
        match &self.placement {
            Placement::Host(c) => {
                let dst: u32 = io_read!(c, [panic: self.fences[i].slot].dst);
                dst == COMPLETION_MARKER
            }
            Placement::Device(d) => d
                .newest_arrived(
                    core::iter::once((i, self.fences[i].slot)),
                    COMPLETION_MARKER,
                )
                .is_some(),
        }
    }

    /// Retires every fence whose marker (or a later fence's marker) has arrived: acks the
    /// descriptors up to it on both rings, drops the buffer holds of the submissions it covers
    /// and settles the fences as done.
    pub(crate) fn retire(&mut self) {
        // Retire from the newest arrived fence: in-order processing means all older ones are
        // done too, even though their markers are checked no more. Looked for from the newest
        // back.
        let newest = match &self.placement {
            Placement::Host(c) => self.fences.iter().rposition(|f| {
                let dst: u32 = io_read!(c, [panic: f.slot].dst);
                dst == COMPLETION_MARKER
            }),
            Placement::Device(d) => d.newest_arrived(
                self.fences.iter().map(|f| f.slot).enumerate(),
                COMPLETION_MARKER,
            ),
        };
        let Some(n) = newest else {
            return;
        };
        let f = self.fences[n];
        let tx_n = self
            .tx
            .state()
            .size()
            .distance(self.tx.state().ack_index(), f.tx_end);
        let rx_n = self
            .rx
            .state()
            .size()
            .distance(self.rx.state().ack_index(), f.rx_end);
        // The fence was recorded from these rings, so the counts are outstanding ones: an
        // error here means the software state is corrupt, and the fences stay unsettled
        // rather than report copies as done.
        if tx_n > self.tx.state().outstanding()
            || rx_n > self.rx.state().outstanding()
            || self.tx.ack(tx_n).is_err()
            || self.rx.ack(rx_n).is_err()
        {
            pr_err!(
                "neuron_udma: queue {}: fence {} beyond the rings\n",
                self.index.number(),
                f.seq
            );
            return;
        }
        match &self.placement {
            Placement::Host(c) => {
                for old in self.fences.iter().take(n + 1) {
                    io_write!(c, [panic: old.slot].dst, 0);
                }
            }
            Placement::Device(d) => d.clear(self.fences.iter().take(n + 1).map(|f| f.slot)),
        }
        self.fences_done += n as u64 + 1;
        if let Some(o) = &self.obs {
            // CAST: at most FENCE_SLOTS fences.
            o.fence_done(f.seq, n as u32 + 1);
        }
        self.fences.retain(|x| x.seq > f.seq);
        self.settled = f.seq;
        self.done = f.seq;
        self.progress_at = Instant::now();
        self.tx_acked += u64::from(tx_n);
        self.release_holds();
    }

    /// Whether a submission whose holds are not dropped yet holds `buf` by a counted reference
    /// ([`Holds::contains`]: an import, or an io_uring registered range).
    pub(crate) fn holds(&self, buf: &Buffer) -> bool {
        self.holds
            .iter()
            .skip(self.holds_head)
            .flatten()
            .any(|h| h.holds.contains(buf))
    }

    /// Drops the buffer holds of every submission whose last pair was acked.
    fn release_holds(&mut self) {
        while let Some(Some(h)) = self.holds.get(self.holds_head) {
            if h.end > self.tx_acked {
                break;
            }
            // PANIC: `holds_head` indexes an entry (just read).
            self.holds[self.holds_head] = None;
            self.holds_head += 1;
        }
        if self.holds_head == self.holds.len() {
            self.holds.clear();
            self.holds_head = 0;
        } else if self.holds_head >= HOLDS_COMPACT && 2 * self.holds_head >= self.holds.len() {
            self.holds.retain(|h| h.is_some());
            self.holds_head = 0;
        }
    }

    /// How long fences have been in flight without the engine completing any of their
    /// descriptors (zero when idle): a queue stalled for the channel's default timeout is
    /// stuck and may be reset even by a waiter whose own timeout was shorter. Progress is a
    /// fence completing or the Rx completion head moving (read from `io`), so one long
    /// submission on a slow but working engine is not taken for a hung one.
    pub(crate) fn stalled_for(&mut self, io: EngineIo<'_>) -> Delta {
        self.retire();
        if self.fences.is_empty() {
            return Delta::from_millis(0);
        }
        let head = engine::rx_completion_head(io, self.q());
        if head != self.progress_head {
            self.progress_head = head;
            self.progress_at = Instant::now();
        }
        self.progress_at.elapsed()
    }

    /// The Tx and Rx rings, for the benchmark's plain-store floor (`tests/bench/kernel/bench.rs`).
    #[cfg(neuron_udma_bench)]
    pub(crate) fn rings(&self) -> (&Ring, &Ring) {
        (&self.tx, &self.rx)
    }

    /// The Tx ring (`tx == true`) or the Rx ring.
    pub(crate) fn ring(&self, dir: Dir) -> &Ring {
        match dir {
            Dir::Tx => &self.tx,
            Dir::Rx => &self.rx,
        }
    }

    /// The Tx ring, to overwrite slots (KUnit only: hand-built and deliberately broken
    /// descriptors for the device model's checks).
    #[cfg(neuron_udma_kunit)]
    pub(crate) fn tx_ring_mut(&mut self) -> &mut Ring {
        &mut self.tx
    }
}
