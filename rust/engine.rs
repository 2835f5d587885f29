// SPDX-License-Identifier: GPL-2.0

//! Register-level operations on one UDMA engine: the engine init sequence (hardware.rst §3.6),
//! queue hardware init and reset (hardware.rst §3.7), doorbells (hardware.rst §3.8) and state
//! readout.
//!
//! Everything here is a sequence of register accesses on an [`EngineIo`] view of the engine's
//! register block; nothing sleeps, so callers may hold a spinlock or an RCU read section.

use crate::{
    arch::{Arch, QUEUES_PER_ENGINE},
    regs::{self, DirEngine, M2s, MainIofic, QueueBank, QueueCtl, S2m, SecondaryIofic},
    ring::{RingSize, MAX_DESCS},
};
use kernel::{
    io::{
        register::{Array, RegisterBase, RelativeRegisterArrayLoc, WithBase},
        Io, IoBackend, IoBase, Mmio, MmioBackend, Region,
    },
    num::{Bounded, TryIntoBounded},
    pci,
    prelude::*,
    sync::barrier::{mb, Full},
};

/// I/O view of one engine's UDMA register block.
pub(crate) type EngineIo<'a> = Mmio<'a, Region<{ regs::ENGINE_SIZE }>>;
/// I/O view of one engine's SDMA wrapper block.
pub(crate) type SdmaIo<'a> = Mmio<'a, Region<{ regs::SDMA_SIZE }>>;

/// A `N`-byte I/O view of BAR0 starting at byte `offset`, for a register block of an engine that
/// the generation may not have (`offset` is `None`).
///
/// # Errors
///
/// `EINVAL` if `offset` is `None`; `ERANGE` if the window does not lie inside the BAR or is not
/// 4-byte aligned.
fn window<'a, const N: usize>(
    bar: &'a pci::Bar<'_>,
    offset: Option<usize>,
) -> Result<Mmio<'a, Region<N>>> {
    let Some(offset) = offset else {
        return Err(EINVAL);
    };
    let view = bar.as_view();
    let whole = MmioBackend::as_ptr(view);
    let end = offset.checked_add(N).ok_or(ERANGE)?;
    if end > bar.size() || offset % 4 != 0 {
        return Err(ERANGE);
    }
    let sub = Region::<N>::ptr_from_raw_parts_mut(whole.cast::<u8>().wrapping_byte_add(offset), N);
    // SAFETY: `sub` covers `offset..offset + N`, which was checked to lie inside the BAR mapping
    // that `view` represents, and is 4-byte aligned (BAR mappings are page aligned), so it is a
    // valid projection of `view`.
    Ok(unsafe { MmioBackend::project_view(view, sub) })
}

/// The register block of engine `eng`.
///
/// # Errors
///
/// `ERANGE` if BAR0 does not hold it (probe checks that BAR0 holds every engine of the
/// generation, hardware.rst §2.2).
pub(crate) fn engine_io<'a>(
    arch: &Arch,
    bar: &'a pci::Bar<'_>,
    eng: EngineId,
) -> Result<EngineIo<'a>> {
    window(bar, arch.engine_offset(eng.0))
}

/// An engine of the device's generation: validated once, when it is made from a user's or the
/// driver's engine number (as [`QueueIndex`] is), so that nothing downstream checks it again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct EngineId(u32);

impl EngineId {
    /// Engine `eng` of generation `arch`, or `None` if it has no such engine (hardware.rst
    /// §2.1-2.2: the engines are numbered from 0 without gaps, so [`Arch::engines`] bounds them;
    /// KUnit `neuron_udma_arch` checks that `Arch::engine_offset` agrees).
    pub(crate) fn new(arch: &Arch, eng: u32) -> Option<Self> {
        (eng < arch.engines).then_some(Self(eng))
    }

    /// The engine number.
    pub(crate) fn get(self) -> u32 {
        self.0
    }
}

/// A queue of the device: its engine and its index in the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct QueueId {
    /// The engine.
    pub(crate) eng: EngineId,
    /// The queue's index in the engine.
    pub(crate) q: QueueIndex,
}

impl QueueId {
    /// Queue `qid` of engine `eng` of generation `arch`, or `None` if either does not exist.
    pub(crate) fn new(arch: &Arch, eng: u32, qid: u32) -> Option<Self> {
        Some(Self {
            eng: EngineId::new(arch, eng)?,
            q: QueueIndex::new(qid)?,
        })
    }

    /// Position of the queue in a table of every queue of the device (engine-major).
    pub(crate) fn key(self) -> usize {
        // CAST: engine ids are below 132, queue indices below 16.
        self.eng.0 as usize * QUEUES_PER_ENGINE as usize + self.q.get()
    }
}

/// Bits of a queue index: the per-queue register arrays have `1 << QUEUE_BITS` entries.
const QUEUE_BITS: u32 = 4;
const _: () = assert!(QUEUES_PER_ENGINE == 1 << QUEUE_BITS);

/// Index of a queue of an engine, `0..QUEUES_PER_ENGINE`.
///
/// The per-queue register arrays have exactly [`QUEUES_PER_ENGINE`] entries, so every register
/// location built from a `QueueIndex` is in bounds; the bound is carried by the type and checked
/// at build time by the register accessors (`at`), not at each access.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct QueueIndex(Bounded<usize, QUEUE_BITS>);

impl QueueIndex {
    /// Queue `qid`, or `None` if `qid` is not below [`QUEUES_PER_ENGINE`].
    pub(crate) fn new(qid: u32) -> Option<Self> {
        qid.try_into_bounded().map(Self)
    }

    /// Every queue of an engine, in order (the range bounds each index, which the compiler sees).
    fn all() -> impl Iterator<Item = Self> {
        (0..QUEUES_PER_ENGINE as usize).map(|q| Self(Bounded::from_expr(q)))
    }

    /// The index as an array position, known to the compiler to be below
    /// [`QUEUES_PER_ENGINE`].
    #[inline(always)]
    pub(crate) fn get(self) -> usize {
        *self.0
    }

    /// The queue number.
    pub(crate) fn number(self) -> u32 {
        // CAST: below QUEUES_PER_ENGINE.
        self.get() as u32
    }
}

/// A number of descriptors that fits the 24-bit ring-length and doorbell fields
/// (hardware.rst §3.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DescCount(Bounded<u32, DESC_COUNT_BITS>);

/// Width in bits of the ring-length and doorbell count fields (hardware.rst §3.4).
const DESC_COUNT_BITS: u32 = 24;
const _: () = assert!(MAX_DESCS < 1 << DESC_COUNT_BITS);

impl DescCount {
    /// `n` descriptors, or `None` if `n` does not fit the 24-bit register fields.
    pub(crate) fn new(n: u32) -> Option<Self> {
        Bounded::try_new(n).map(Self)
    }

    /// The size of a ring: at most [`MAX_DESCS`], which fits (asserted above).
    fn ring(size: RingSize) -> Self {
        // `size.descs() <= MAX_DESCS < 2^24`, so the mask changes nothing; it lets the compiler
        // see the bound.
        Self(Bounded::from_expr(
            size.descs() & ((1 << DESC_COUNT_BITS) - 1),
        ))
    }
}

/// One of the two directions of a queue. The direction type carries its registers: the queue
/// banks ([`QueueBank`]), the per-queue control registers ([`QueueCtl`]), the engine-level state
/// registers ([`DirEngine`]) and the constants of its error group.
pub(crate) trait Direction:
    RegisterBase<QueueBank> + RegisterBase<QueueCtl> + RegisterBase<DirEngine>
{
    /// Secondary IOFIC group of this direction's errors (hardware.rst §3.5).
    const ERROR_GROUP: usize;
    /// The errors of [`Self::ERROR_GROUP`] that the init unmasks (hardware.rst §3.5).
    const ERRORS: u32;
    /// This direction's AXI FIFO parity bits of secondary group C (hardware.rst §3.5).
    const GROUP_C: u32;
    /// Main group D summary bits of this direction's errors (hardware.rst §3.5).
    const MAIN_D_SUMMARY: u32;
    /// Cause bit of this direction's prefetch ring-id mismatch (hardware.rst §3.5).
    const RING_ID_ERROR: u32;

    /// Writes the direction-specific registers that precede the pause in the queue init
    /// (hardware.rst §3.7): the M2S rate-limiter mask; nothing for S2M.
    fn init_queue_extra(_io: EngineIo<'_>, _q: QueueIndex) {}
}

impl Direction for M2s {
    const ERROR_GROUP: usize = regs::SECONDARY_GROUP_M2S;
    const ERRORS: u32 = regs::M2S_ERRORS;
    const GROUP_C: u32 = regs::GROUP_C_M2S;
    const MAIN_D_SUMMARY: u32 = regs::MAIN_D_M2S_SUMMARY;
    const RING_ID_ERROR: u32 = regs::M2S_RING_ID_ERROR;

    fn init_queue_extra(io: EngineIo<'_>, q: QueueIndex) {
        io.write(
            regs::M2S_Q_RLIMIT_MASK::at(q.get()),
            regs::M2S_Q_RLIMIT_MASK::zeroed().with_const_mask::<{ regs::RLIMIT_MASK_INIT }>(),
        );
    }
}

impl Direction for S2m {
    const ERROR_GROUP: usize = regs::SECONDARY_GROUP_S2M;
    const ERRORS: u32 = regs::S2M_ERRORS;
    const GROUP_C: u32 = regs::GROUP_C_S2M;
    const MAIN_D_SUMMARY: u32 = regs::MAIN_D_S2M_SUMMARY;
    const RING_ID_ERROR: u32 = regs::S2M_RING_ID_ERROR;
}

/// `cfg` value with both processing enables set and the reset-value bits kept (0x0303_0000).
fn q_cfg_enabled() -> regs::Q_CFG {
    q_cfg_paused().with_pref_en(true).with_sched_en(true)
}

/// `cfg` value of a paused queue (0x0300_0000).
fn q_cfg_paused() -> regs::Q_CFG {
    regs::Q_CFG::zeroed().with_const_defaults::<{ regs::Q_CFG_DEFAULTS }>()
}

/// The register windows of one engine that its init sequence writes, mapped and checked against
/// BAR0 once.
struct EngineWindows<'a> {
    /// UDMA register block.
    io: EngineIo<'a>,
    /// SDMA wrapper block.
    sdma: SdmaIo<'a>,
    /// v3 SENG user FIS block, where the ring-id error is masked.
    fis: Option<Mmio<'a, Region<{ regs::FIS_SIZE }>>>,
}

/// Runs the engine init sequence of hardware.rst §3.6 on engine `eng`, register for register, in
/// order.
///
/// `first` selects the queue-enable value of step 1: the first init after probe (or after a
/// device reset, which returns the engines to their power-on state: `device/reset.rs`) writes
/// 0x0003_0000 (the reference's cached cfg is still 0), later inits 0x0303_0000.
///
/// # Errors
///
/// `ERANGE` if one of its register blocks is not inside BAR0. Nothing is written then.
pub(crate) fn init_engine(arch: &Arch, bar: &pci::Bar<'_>, id: EngineId, first: bool) -> Result {
    let eng = id.get();
    let w = EngineWindows {
        io: engine_io(arch, bar, id)?,
        sdma: window(bar, arch.sdma_offset(eng))?,
        fis: arch
            .fis_offset(eng)
            .map(|o| window(bar, Some(o)))
            .transpose()?,
    };
    run_init(arch, eng, &w, first);
    Ok(())
}

/// The register writes of [`init_engine`].
fn run_init(arch: &Arch, eng: u32, w: &EngineWindows<'_>, first: bool) {
    let (io, sdma) = (w.io, w.sdma);

    // Step 0 (v2 SENG engines only): SDMA broadcast configuration.
    if let Some(b) = arch.sdma_broadcast(eng) {
        sdma.write_reg(regs::SDMA_BROADCAST_GROUP::from(b.group));
        sdma.write_reg(regs::SDMA_BROADCAST_ENABLE::from(b.enable));
    }

    // Step 1: enable every queue, M2S then S2M.
    let cfg = if first {
        regs::Q_CFG::zeroed().with_pref_en(true).with_sched_en(true)
    } else {
        q_cfg_enabled()
    };
    for q in QueueIndex::all() {
        io.write(regs::Q_CFG::of::<M2s>().at(q.get()), cfg);
        io.write(regs::Q_CFG::of::<S2m>().at(q.get()), cfg);
    }

    // Steps 2-7: M2S defaults.
    io.write_reg(
        regs::M2S_DATA_CFG::zeroed()
            .with_const_max_pkt_limit::<{ regs::M2S_MAX_PKT_LIMIT }>()
            .with_data_fifo_depth(arch.m2s_data_fifo_beats),
    );
    io.write_reg(regs::AXI_M2S_OSTAND_CFG::from(arch.m2s_ostand_cfg));
    io.write_reg(
        regs::GEN_AXI_CFG_1::zeroed().with_const_timeout::<{ regs::AXI_TIMEOUT_CYCLES }>(),
    );
    io.write_reg(regs::M2S_COMP_CFG_APPLICATION_ACK::zeroed());
    io.write_reg(
        regs::M2S_CFG_LEN::zeroed()
            .with_len0_is_64k(true)
            .with_const_max_pkt_size::<{ regs::M2S_MAX_PKT_SIZE }>(),
    );
    io.write_reg(
        regs::M2S_STREAM_CFG::zeroed()
            .with_const_rd_threshold::<{ regs::M2S_STREAM_RD_THRESHOLD }>()
            .with_threshold_mode(true),
    );

    // Step 8: Tx address-high selectors.
    for q in QueueIndex::all() {
        io.write(
            regs::VMPR_TX_SEL::at(q.get()),
            regs::VMPR_TX_SEL::from(regs::VMPR_SEL_ALL),
        );
    }

    // Step 9: M2S read boundaries.
    io.write_reg(
        regs::AXI_M2S_DATA_RD_CFG::zeroed()
            .with_break_on_max_boundary(true)
            .with_const_max_burst::<{ regs::AXI_MAX_BURST }>(),
    );

    // Step 10: S2M app-ack timeout. Step 11: Rx address-high selectors.
    io.write_reg(regs::S2M_COMP_CFG_APPLICATION_ACK::zeroed());
    for q in QueueIndex::all() {
        io.write(
            regs::VMPR_RX_SEL0::at(q.get()),
            regs::VMPR_RX_SEL0::from(regs::VMPR_SEL_ALL),
        );
        io.write(
            regs::VMPR_RX_SEL1::at(q.get()),
            regs::VMPR_RX_SEL1::from(regs::VMPR_SEL_ALL),
        );
        io.write(
            regs::VMPR_RX_SEL2::at(q.get()),
            regs::VMPR_RX_SEL2::from(regs::VMPR_SEL_ALL),
        );
    }

    // Steps 12-13: S2M outstanding reads and writes.
    io.write_reg(regs::AXI_S2M_OSTAND_CFG_RD::from(arch.s2m_ostand_cfg_rd));
    io.write_reg(regs::AXI_S2M_OSTAND_CFG_WR::from(regs::S2M_OSTAND_CFG_WR));

    // Step 14: turn completion-head reporting on (clear spare bit 0).
    io.update(regs::SPARE_ZEROES0, |r| r.with_crhp_off(false));

    // Step 15: unmask the M2S errors and let them abort the engine. Step 16: the same for S2M.
    unmask_errors::<M2s>(io);
    unmask_errors::<S2m>(io);

    // Step 17: completion descriptor size, 4 words.
    io.write_reg(
        regs::S2M_COMP_CFG_1C::zeroed()
            .with_q_promotion(true)
            .with_const_desc_size::<{ regs::COMP_DESC_WORDS }>(),
    );

    // Step 19: prefetch and maximum descriptors per packet.
    let n = arch.max_descs_per_packet;
    io.write_reg(
        regs::M2S_DESC_PREF_CFG_2::zeroed()
            .with_force_rr(true)
            .with_max_descs_per_pkt(n),
    );
    let pref3 = regs::M2S_DESC_PREF_CFG_3::zeroed()
        .with_pref_thr(n)
        .with_const_min_burst_above_thr::<{ regs::PREF_MIN_BURST_ABOVE_THR }>()
        .with_const_min_burst_below_thr::<{ regs::PREF_MIN_BURST_BELOW_THR }>();
    io.write_reg(pref3);
    io.write_reg(regs::S2M_DESC_PREF_CFG_3::from(pref3.into_raw()));
    io.write_reg(
        regs::AXI_M2S_DESC_RD_CFG_3::zeroed()
            .with_always_break_on_max_boundary(true)
            .with_const_max_burst::<{ regs::AXI_MAX_BURST }>(),
    );
    io.write_reg(
        regs::AXI_S2M_DESC_RD_CFG_3::zeroed()
            .with_always_break_on_max_boundary(true)
            .with_const_max_burst::<{ regs::AXI_MAX_BURST }>(),
    );

    // Step 20: SDMA wrapper: read and write reordering, event acceleration (v3: + 0x800).
    sdma.write_reg(regs::SDMA_RD_REORDER::zeroed().with_enable(true));
    sdma.write_reg(regs::SDMA_WR_REORDER::zeroed().with_enable(true));
    sdma.write_reg(regs::SDMA_EVENT_ACCEL::zeroed().with_enable(true));
    if let Some(v) = arch.sdma_cfg {
        sdma.write_reg(regs::SDMA_V3_CFG::from(v));
    }

    // Step 21 (v2): AXI errors abort the engine.
    if arch.axi_error_abort {
        route_axi_errors_to_abort(io);
    }

    // Step 22 (v3 SENG engines): ring-id errors neither interrupt, log nor abort.
    if let Some(fis) = w.fis {
        mask_ring_id_errors(io, fis);
    }

    // Not in the reference sequence, which runs after a firmware reset: the engine may still be
    // aborted, or carry cause bits, from before this init (the cause bits stay set until
    // software clears them, and only change_state NORMAL ends an abort; hardware.rst §3.5, 8.3).
    // Start from a clean state so that a stale error neither stops the queues nor shows up in a
    // later failure report.
    let errors = engine_errors(io);
    if errors.aborted() || errors.m2s.cause != 0 || errors.s2m.cause != 0 {
        recover_engine(io, &errors);
    }
}

/// Routes the v2 AXI errors to an engine abort (hardware.rst §3.5, §3.6 step 21): detection
/// tables, control entries, AXI-error IOFIC blocks, then the final AXI timeout.
fn route_axi_errors_to_abort(io: EngineIo<'_>) {
    for table in 0..regs::AXI_ERR_BLOCKS {
        for entry in regs::AXI_ERR_DETECTED {
            io.write(
                regs::AXI_ERR_DETECTION_TABLE::at(table * regs::AXI_ERR_DETECTION_ENTRIES + entry),
                regs::AXI_ERR_DETECTION_TABLE::from(regs::AXI_ERR_DETECTION_ON),
            );
        }
    }
    for ctrl in 0..regs::AXI_ERR_BLOCKS {
        for q in 0..QUEUES_PER_ENGINE {
            io.write(
                regs::AXI_ERR_CONTROL_TABLE_ADDR::at(ctrl),
                regs::AXI_ERR_CONTROL_TABLE_ADDR::from(regs::axi_err_control_addr(q)),
            );
            io.write(
                regs::AXI_ERR_CONTROL_TABLE_DATA::at(ctrl),
                regs::AXI_ERR_CONTROL_TABLE_DATA::from(regs::AXI_ERR_CONTROL_DATA),
            );
        }
    }
    for blk in 0..regs::AXI_ERR_BLOCKS {
        io.write(
            regs::AXI_ERR_IOFIC_CONTROL::at(blk),
            regs::AXI_ERR_IOFIC_CONTROL::edge_no_msix(),
        );
        io.write(
            regs::AXI_ERR_IOFIC_ABORT_MASK::at(blk),
            regs::AXI_ERR_IOFIC_ABORT_MASK::zeroed(),
        );
        io.write(
            regs::AXI_ERR_IOFIC_MASK_CLEAR::at(blk),
            regs::AXI_ERR_IOFIC_MASK_CLEAR::zeroed(),
        );
    }
    io.write_reg(regs::GEN_AXI_CFG_1::from(regs::AXI_TIMEOUT_V2_ABORTING));
}

/// Unmasks the errors of direction `D` (and its bits of group C) so that they raise their summary
/// bits in main group D and abort the engine (hardware.rst §3.6 steps 15/16).
fn unmask_errors<D: Direction>(io: EngineIo<'_>) {
    let sec_control = regs::IOFIC_INT_CONTROL::of::<SecondaryIofic>();
    let sec_abort = regs::IOFIC_INT_ABORT_MASK::of::<SecondaryIofic>();
    let sec_unmask = regs::IOFIC_INT_MASK_CLEAR::of::<SecondaryIofic>();
    io.write(
        sec_control.at(D::ERROR_GROUP),
        regs::IOFIC_INT_CONTROL::edge_no_msix(),
    );
    io.write(
        regs::IOFIC_INT_CONTROL::of::<MainIofic>().at(regs::MAIN_GROUP_D),
        regs::IOFIC_INT_CONTROL::edge_no_msix(),
    );
    io.write(
        sec_abort.at(D::ERROR_GROUP),
        regs::IOFIC_INT_ABORT_MASK::from(!D::ERRORS),
    );
    io.write(
        regs::IOFIC_INT_ABORT_MASK::of::<SecondaryIofic>().at(regs::SECONDARY_GROUP_C),
        regs::IOFIC_INT_ABORT_MASK::from(!D::GROUP_C),
    );
    io.write(
        sec_unmask.at(D::ERROR_GROUP),
        regs::IOFIC_INT_MASK_CLEAR::from(!D::ERRORS),
    );
    io.write(
        regs::IOFIC_INT_MASK_CLEAR::of::<SecondaryIofic>().at(regs::SECONDARY_GROUP_C),
        regs::IOFIC_INT_MASK_CLEAR::from(!D::GROUP_C),
    );
    io.write(
        regs::IOFIC_INT_MASK_CLEAR::of::<MainIofic>().at(regs::MAIN_GROUP_D),
        regs::IOFIC_INT_MASK_CLEAR::from(!D::MAIN_D_SUMMARY),
    );
}

/// Masks the prefetch ring-id error of direction `D` in the engine's secondary IOFIC: neither
/// interrupt nor abort (hardware.rst §3.5).
fn mask_ring_id_error<D: Direction>(io: EngineIo<'_>) {
    let mask_loc = regs::IOFIC_INT_MASK::of::<SecondaryIofic>().at(D::ERROR_GROUP);
    let mask = io.read(mask_loc).into_raw() | D::RING_ID_ERROR;
    io.write(
        regs::IOFIC_INT_MASK::of::<SecondaryIofic>().at(D::ERROR_GROUP),
        regs::IOFIC_INT_MASK::from(mask),
    );
    io.write(
        regs::IOFIC_INT_ABORT_MASK::of::<SecondaryIofic>().at(D::ERROR_GROUP),
        regs::IOFIC_INT_ABORT_MASK::from(mask),
    );
}

/// Masks the prefetch ring-id error (M2S bit 17, S2M bit 11) on a v3 SENG engine
/// (hardware.rst §3.5).
fn mask_ring_id_errors(io: EngineIo<'_>, fis: Mmio<'_, Region<{ regs::FIS_SIZE }>>) {
    mask_ring_id_error::<M2s>(io);
    mask_ring_id_error::<S2m>(io);
    fis.update(regs::FIS_GRP2_INT_MASK, |r| r.with_ring_id_error(true));
    fis.update(regs::FIS_GRP3_INT_MASK, |r| r.with_ring_id_error(true));
    io.update(regs::M2S_ERR_LOG_MASK, |r| r.with_ring_id_error(true));
    io.update(regs::S2M_ERR_LOG_MASK, |r| r.with_ring_id_error(true));
}

/// Requests a reset of direction `D` of queue `q` through `q_sw_ctrl` (hardware.rst §3.4).
fn reset_queue_dir<D: Direction>(io: EngineIo<'_>, q: QueueIndex) {
    io.write(
        regs::Q_SW_CTRL::of::<D>().at(q.get()),
        regs::Q_SW_CTRL::zeroed().with_rst_q(true),
    );
}

/// Programs one direction of queue `q` (hardware.rst §3.7 steps b-h): rate-limit mask (M2S), pause,
/// queue reset, ring base and length, completion config, enable.
///
/// `base` is the ring's device-fabric address (256-byte aligned), `size` its size.
pub(crate) fn init_queue_dir<D: Direction>(
    io: EngineIo<'_>,
    q: QueueIndex,
    base: u64,
    size: RingSize,
) {
    let cfg = regs::Q_CFG::of::<D>().at(q.get());
    D::init_queue_extra(io, q);
    io.write(cfg, q_cfg_paused());
    reset_queue_dir::<D>(io, q);
    // CAST: splitting the 64-bit base into its register halves.
    io.write(
        regs::Q_DRBP_LOW::of::<D>().at(q.get()),
        regs::Q_DRBP_LOW::from(base as u32),
    );
    io.write(
        regs::Q_DRBP_HIGH::of::<D>().at(q.get()),
        regs::Q_DRBP_HIGH::from((base >> 32) as u32),
    );
    io.write(
        regs::Q_DRL::of::<D>().at(q.get()),
        regs::Q_DRL::zeroed().with_len(DescCount::ring(size).0),
    );
    io.write(
        regs::Q_COMP_CFG::of::<D>().at(q.get()),
        regs::Q_COMP_CFG::zeroed(),
    );
    io.write(regs::Q_CFG::of::<D>().at(q.get()), q_cfg_enabled());
}

/// Pauses one direction of queue `q` (clears both enables) and resets it (hardware.rst §3.8 "queue
/// pause", §3.7 step d), so the engine fetches nothing more from its ring.
pub(crate) fn pause_queue_dir<D: Direction>(io: EngineIo<'_>, q: QueueIndex) {
    io.write(regs::Q_CFG::of::<D>().at(q.get()), q_cfg_paused());
    reset_queue_dir::<D>(io, q);
}

/// Rings the doorbells of queue `q`: a full memory barrier so that every descriptor written
/// before is visible to the device, then RDRTP_inc += `s2m_count`, then TDRTP_inc += `m2s_count`
/// when it is non-zero (hardware.rst §3.8, `udma_m2m_copy_start`).
pub(crate) fn doorbell(
    io: EngineIo<'_>,
    q: QueueIndex,
    m2s_count: DescCount,
    s2m_count: DescCount,
) {
    mb(Full);
    io.write(
        regs::Q_DRTP_INC::of::<S2m>().at(q.get()),
        regs::Q_DRTP_INC::zeroed().with_count(s2m_count.0),
    );
    if m2s_count.0.get() > 0 {
        io.write(
            regs::Q_DRTP_INC::of::<M2s>().at(q.get()),
            regs::Q_DRTP_INC::zeroed().with_count(m2s_count.0),
        );
    }
}

/// The Rx (s2m) completion head of queue `q`: raw `rcrhp`, completed descriptors mod the ring
/// length with the ring id in bits [31:30] (hardware.rst §8.4; reported since [`init_engine`] turns
/// completion-head reporting on). A value that changed means the engine completed descriptors.
pub(crate) fn rx_completion_head(io: EngineIo<'_>, q: QueueIndex) -> u32 {
    io.read(regs::Q_CRHP::of::<S2m>().at(q.get())).into_raw()
}

/// Register snapshot of one direction of a queue (hardware.rst §3.8 "queue state").
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct QueueRegs {
    /// `cfg`.
    pub(crate) cfg: u32,
    /// `status`.
    pub(crate) status: u32,
    /// Ring base (device-fabric address, low bits masked as the reference does).
    pub(crate) base: u64,
    /// Ring length in descriptors.
    pub(crate) len: u32,
    /// Head: index in bits 23:0, ring id in 31:30.
    pub(crate) head: u32,
    /// Tail: index in bits 23:0, ring id in 31:30.
    pub(crate) tail: u32,
    /// Completion head.
    pub(crate) comp_head: u32,
}

/// Reads the queue-state registers of one direction of queue `q`.
pub(crate) fn queue_regs<D: Direction>(io: EngineIo<'_>, q: QueueIndex) -> QueueRegs {
    let q = q.get();
    let lo = io.read(regs::Q_DRBP_LOW::of::<D>().at(q)).base_low();
    let hi = io.read(regs::Q_DRBP_HIGH::of::<D>().at(q)).into_raw();
    QueueRegs {
        cfg: io.read(regs::Q_CFG::of::<D>().at(q)).into_raw(),
        status: io.read(regs::Q_STATUS::of::<D>().at(q)).into_raw(),
        base: (u64::from(hi) << 32) | u64::from(lo),
        len: io.read(regs::Q_DRL::of::<D>().at(q)).len().get(),
        head: io.read(regs::Q_DRHP::of::<D>().at(q)).into_raw(),
        tail: io.read(regs::Q_DRTP::of::<D>().at(q)).into_raw(),
        comp_head: io.read(regs::Q_CRHP::of::<D>().at(q)).into_raw(),
    }
}

/// Error state of one direction of an engine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct DirErrors {
    /// The direction's `state` register (hardware.rst §3.8).
    pub(crate) state: u32,
    /// Its error cause: secondary group A for M2S, B for S2M (hardware.rst §3.5).
    pub(crate) cause: u32,
}

impl DirErrors {
    /// Reads direction `D`'s state and error-cause registers.
    fn read<D: Direction>(io: EngineIo<'_>) -> Self {
        Self {
            state: io.read(regs::DIR_STATE::of::<D>()).into_raw(),
            cause: io.read(cause::<D>()).into_raw(),
        }
    }

    /// Whether any state field reads "abort".
    pub(crate) fn aborted(&self) -> bool {
        regs::DIR_STATE::from(self.state).aborted()
    }
}

/// Engine error state: both directions' (hardware.rst §3.5, 3.8).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct EngineErrors {
    /// M2S (Tx).
    pub(crate) m2s: DirErrors,
    /// S2M (Rx).
    pub(crate) s2m: DirErrors,
}

impl EngineErrors {
    /// Whether either direction is aborted.
    pub(crate) fn aborted(&self) -> bool {
        self.m2s.aborted() || self.s2m.aborted()
    }
}

/// Location of the error-cause register of direction `D` (hardware.rst §3.5).
fn cause<D: Direction>() -> RelativeRegisterArrayLoc<regs::IOFIC_INT_CAUSE, SecondaryIofic> {
    regs::IOFIC_INT_CAUSE::of::<SecondaryIofic>().at(D::ERROR_GROUP)
}

/// Reads the engine's state and error-cause registers.
pub(crate) fn engine_errors(io: EngineIo<'_>) -> EngineErrors {
    EngineErrors {
        m2s: DirErrors::read::<M2s>(io),
        s2m: DirErrors::read::<S2m>(io),
    }
}

/// Returns an aborted engine to normal operation: clears the M2S and S2M error causes it
/// reports and writes change_state NORMAL to M2S, then S2M (hardware.rst §3.8, 8.3).
pub(crate) fn recover_engine(io: EngineIo<'_>, errors: &EngineErrors) {
    // The cause registers are write-0-to-clear: keep every bit except those seen.
    io.write(
        cause::<M2s>(),
        regs::IOFIC_INT_CAUSE::from(!errors.m2s.cause),
    );
    io.write(
        cause::<S2m>(),
        regs::IOFIC_INT_CAUSE::from(!errors.s2m.cause),
    );
    let normal = regs::DIR_CHANGE_STATE::zeroed().with_normal(true);
    io.write(regs::DIR_CHANGE_STATE::of::<M2s>(), normal);
    io.write(regs::DIR_CHANGE_STATE::of::<S2m>(), normal);
}

#[cfg(neuron_udma_kunit)]
#[kernel::prelude::kunit_tests(neuron_udma_engine)]
mod tests {
    use super::*;

    #[test]
    fn queue_index_bounds() {
        assert_eq!(QueueIndex::new(0).map(QueueIndex::get), Some(0));
        assert_eq!(QueueIndex::new(15).map(QueueIndex::get), Some(15));
        assert_eq!(QueueIndex::new(16), None);
        assert_eq!(QueueIndex::new(u32::MAX), None);
        assert!(QueueIndex::all().map(QueueIndex::get).eq(0..16));
    }

    #[test]
    fn desc_count_bounds() -> Result {
        assert!(DescCount::new((1 << 24) - 1).is_some());
        assert_eq!(DescCount::new(1 << 24), None);
        assert_eq!(
            DescCount::ring(RingSize::new(MAX_DESCS)?).0.get(),
            MAX_DESCS
        );
        Ok(())
    }

    #[test]
    fn init_values() {
        // Values hardware.rst §3.6 gives as numbers, built from the typed fields.
        assert_eq!(q_cfg_enabled().into_raw(), 0x0303_0000);
        assert_eq!(q_cfg_paused().into_raw(), 0x0300_0000);
        assert_eq!(regs::IOFIC_INT_CONTROL::edge_no_msix().into_raw(), 0x28);
        assert_eq!(regs::AXI_ERR_IOFIC_CONTROL::edge_no_msix().into_raw(), 0x28);
        assert_eq!(regs::AXI_TIMEOUT_CYCLES, 0x05F5_E100);
        assert_eq!(regs::axi_err_control_addr(15), 0x7F);
    }

    #[test]
    fn state_decoding() {
        let state = |m2s, s2m| EngineErrors {
            m2s: DirErrors {
                state: m2s,
                cause: 0,
            },
            s2m: DirErrors {
                state: s2m,
                cause: 0,
            },
        };
        assert!([0, 4, 8, 12]
            .iter()
            .all(|&shift| state(2 << shift, 0).aborted() && state(0, 2 << shift).aborted()));
        assert!(!state(0x1111, 0x3333).aborted());
        assert!(!state(0x2222_0000, 0x0000_0022 << 14).aborted());
        assert_eq!(regs::Q_DRHP::position(0xC000_0010), (0x10, 3));
        assert_eq!(regs::Q_DRHP::position(0x4123_4567), (0x23_4567, 1));
        assert_eq!(regs::Q_DRBP_LOW::from(0x1234_56FF).base_low(), 0x1234_56C0);
    }
}
