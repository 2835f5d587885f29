// SPDX-License-Identifier: GPL-2.0

//! Register-level operations on one UDMA engine: the engine init sequence (hardware.rst §3.6),
//! queue hardware init and reset (hardware.rst §3.7), doorbells (hardware.rst §3.8) and state
//! readout.
//!
//! Everything here is a sequence of register accesses on an [`EngineIo`] view of the engine's
//! register block; nothing sleeps, so callers may hold a spinlock or an RCU read section.

use crate::{
    arch::{Arch, Generation, QUEUES_PER_ENGINE},
    regs::{self, M2s, MainIofic, QueueBank, S2m, SecondaryIofic},
};
use kernel::{
    io::{
        register::{Array, RegisterBase, WithBase},
        Io, IoBackend, IoBase, Mmio, MmioBackend, Region,
    },
    pci,
    prelude::*,
    sync::barrier::{mb, Full},
};

/// I/O view of one engine's UDMA register block.
pub(crate) type EngineIo<'a> = Mmio<'a, Region<{ regs::ENGINE_SIZE }>>;
/// I/O view of one engine's SDMA wrapper block.
pub(crate) type SdmaIo<'a> = Mmio<'a, Region<{ regs::SDMA_SIZE }>>;

/// A `N`-byte I/O view of BAR0 starting at byte `offset`.
///
/// # Errors
///
/// `ERANGE` if the window does not lie inside the BAR or is not 4-byte aligned.
fn window<'a, const N: usize>(bar: &'a pci::Bar<'_>, offset: usize) -> Result<Mmio<'a, Region<N>>> {
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
/// `EINVAL` if the generation has no engine `eng`; `ERANGE` if BAR0 does not hold it.
pub(crate) fn engine_io<'a>(arch: &Arch, bar: &'a pci::Bar<'_>, eng: u32) -> Result<EngineIo<'a>> {
    window(bar, arch.engine_offset(eng).ok_or(EINVAL)?)
}

/// One of the two directions of a queue, with its direction-specific registers.
pub(crate) trait Direction: RegisterBase<QueueBank> {
    /// Writes the queue's completion configuration (`comp_cfg`).
    fn write_comp_cfg(io: EngineIo<'_>, q: usize, v: u32) -> Result;
    /// Requests a queue reset through `q_sw_ctrl`.
    fn reset(io: EngineIo<'_>, q: usize) -> Result;
}

impl Direction for M2s {
    fn write_comp_cfg(io: EngineIo<'_>, q: usize, v: u32) -> Result {
        io.write(
            regs::M2S_Q_COMP_CFG::try_at(q).ok_or(EINVAL)?,
            regs::M2S_Q_COMP_CFG::from(v),
        );
        Ok(())
    }

    fn reset(io: EngineIo<'_>, q: usize) -> Result {
        io.write(
            regs::M2S_Q_SW_CTRL::try_at(q).ok_or(EINVAL)?,
            regs::M2S_Q_SW_CTRL::zeroed().with_rst_q(true),
        );
        Ok(())
    }
}

impl Direction for S2m {
    fn write_comp_cfg(io: EngineIo<'_>, q: usize, v: u32) -> Result {
        io.write(
            regs::S2M_Q_COMP_CFG::try_at(q).ok_or(EINVAL)?,
            regs::S2M_Q_COMP_CFG::from(v),
        );
        Ok(())
    }

    fn reset(io: EngineIo<'_>, q: usize) -> Result {
        io.write(
            regs::S2M_Q_SW_CTRL::try_at(q).ok_or(EINVAL)?,
            regs::S2M_Q_SW_CTRL::zeroed().with_rst_q(true),
        );
        Ok(())
    }
}

/// `cfg` value with both processing enables set and the reset-value bits kept (0x0303_0000).
fn q_cfg_enabled() -> regs::Q_CFG {
    regs::Q_CFG::zeroed()
        .with_const_defaults::<3>()
        .with_pref_en(true)
        .with_sched_en(true)
}

/// `cfg` value of a paused queue (0x0300_0000).
fn q_cfg_paused() -> regs::Q_CFG {
    regs::Q_CFG::zeroed().with_const_defaults::<3>()
}

/// Runs the engine init sequence of hardware.rst §3.6 on engine `eng`, register for register, in
/// order.
///
/// `first` selects the queue-enable value of step 1: the first init after probe writes
/// 0x0003_0000 (the reference's cached cfg is still 0), later inits 0x0303_0000.
///
/// # Errors
///
/// `EINVAL`/`ERANGE` if the engine does not exist or is not inside BAR0.
pub(crate) fn init_engine(arch: &Arch, bar: &pci::Bar<'_>, eng: u32, first: bool) -> Result {
    let io = engine_io(arch, bar, eng)?;
    let sdma: SdmaIo<'_> = window(bar, arch.sdma_offset(eng).ok_or(EINVAL)?)?;

    // Step 0 (v2 SENG engines only): SDMA broadcast configuration.
    if arch.generation == Generation::V2 && !arch.is_h2t_engine(eng) {
        let e = eng % 16;
        let group = if e == 0 {
            0xFFFF
        } else {
            0xFFFF & !(0xFFFFu32 << (16 - e))
        };
        let enable = if matches!(e, 0 | 3 | 6 | 9 | 15) {
            0xFFFF
        } else {
            0
        };
        sdma.write(
            regs::SDMA_BROADCAST_GROUP,
            regs::SDMA_BROADCAST_GROUP::from(group),
        );
        sdma.write(
            regs::SDMA_BROADCAST_ENABLE,
            regs::SDMA_BROADCAST_ENABLE::from(enable),
        );
    }

    // Step 1: enable every queue, M2S then S2M.
    let cfg = if first {
        regs::Q_CFG::zeroed().with_pref_en(true).with_sched_en(true)
    } else {
        q_cfg_enabled()
    };
    for q in 0..QUEUES_PER_ENGINE as usize {
        io.write(regs::Q_CFG::of::<M2s>().try_at(q).ok_or(EINVAL)?, cfg);
        io.write(regs::Q_CFG::of::<S2m>().try_at(q).ok_or(EINVAL)?, cfg);
    }

    // Steps 2-7: M2S defaults.
    io.write_reg(
        regs::M2S_DATA_CFG::zeroed()
            .with_const_max_pkt_limit::<0x100>()
            .try_with_data_fifo_depth(arch.m2s_data_fifo_beats)?,
    );
    io.write_reg(regs::AXI_M2S_OSTAND_CFG::from(arch.m2s_ostand_cfg));
    io.write_reg(
        regs::GEN_AXI_CFG_1::zeroed()
            .with_timeout(kernel::num::Bounded::<u32, 32>::new::<100_000_000>()),
    );
    io.write_reg(regs::M2S_COMP_CFG_APPLICATION_ACK::zeroed());
    io.write_reg(
        regs::M2S_CFG_LEN::zeroed()
            .with_len0_is_64k(true)
            .with_const_max_pkt_size::<0xFFFFF>(),
    );
    io.write_reg(
        regs::M2S_STREAM_CFG::zeroed()
            .with_const_rd_threshold::<1>()
            .with_threshold_mode(true),
    );

    // Step 8: Tx address-high selectors.
    for q in 0..QUEUES_PER_ENGINE as usize {
        io.write(
            regs::VMPR_TX_SEL::try_at(q).ok_or(EINVAL)?,
            regs::VMPR_TX_SEL::from(u32::MAX),
        );
    }

    // Step 9: M2S read boundaries.
    io.write_reg(
        regs::AXI_M2S_DATA_RD_CFG::zeroed()
            .with_break_on_max_boundary(true)
            .with_const_max_burst::<8>(),
    );

    // Step 10: S2M app-ack timeout. Step 11: Rx address-high selectors.
    io.write_reg(regs::S2M_COMP_CFG_APPLICATION_ACK::zeroed());
    for q in 0..QUEUES_PER_ENGINE as usize {
        io.write(
            regs::VMPR_RX_SEL0::try_at(q).ok_or(EINVAL)?,
            regs::VMPR_RX_SEL0::from(u32::MAX),
        );
        io.write(
            regs::VMPR_RX_SEL1::try_at(q).ok_or(EINVAL)?,
            regs::VMPR_RX_SEL1::from(u32::MAX),
        );
        io.write(
            regs::VMPR_RX_SEL2::try_at(q).ok_or(EINVAL)?,
            regs::VMPR_RX_SEL2::from(u32::MAX),
        );
    }

    // Steps 12-13: S2M outstanding reads and writes.
    io.write_reg(regs::AXI_S2M_OSTAND_CFG_RD::from(arch.s2m_ostand_cfg_rd));
    io.write_reg(regs::AXI_S2M_OSTAND_CFG_WR::from(0x4080_4080));

    // Step 14: turn completion-head reporting on (clear spare bit 0).
    io.update(regs::SPARE_ZEROES0, |r| r.with_crhp_off(false));

    // Step 15: unmask the M2S errors and let them abort the engine.
    unmask_errors(
        io,
        regs::SECONDARY_GROUP_M2S,
        regs::M2S_ERRORS,
        regs::GROUP_C_M2S,
        regs::MAIN_D_M2S_SUMMARY,
    )?;
    // Step 16: the same for the S2M errors.
    unmask_errors(
        io,
        regs::SECONDARY_GROUP_S2M,
        regs::S2M_ERRORS,
        regs::GROUP_C_S2M,
        regs::MAIN_D_S2M_SUMMARY,
    )?;

    // Step 17: completion descriptor size, 4 words.
    io.write_reg(
        regs::S2M_COMP_CFG_1C::zeroed()
            .with_q_promotion(true)
            .with_const_desc_size::<4>(),
    );

    // Step 19: prefetch and maximum descriptors per packet.
    let n = arch.max_descs_per_packet;
    io.write_reg(
        regs::M2S_DESC_PREF_CFG_2::zeroed()
            .with_force_rr(true)
            .try_with_max_descs_per_pkt(n)?,
    );
    let pref3 = regs::M2S_DESC_PREF_CFG_3::zeroed()
        .try_with_pref_thr(n)?
        .with_const_min_burst_above_thr::<8>()
        .with_const_min_burst_below_thr::<1>();
    io.write_reg(pref3);
    io.write_reg(regs::S2M_DESC_PREF_CFG_3::from(pref3.into_raw()));
    io.write_reg(
        regs::AXI_M2S_DESC_RD_CFG_3::zeroed()
            .with_always_break_on_max_boundary(true)
            .with_const_max_burst::<8>(),
    );
    io.write_reg(
        regs::AXI_S2M_DESC_RD_CFG_3::zeroed()
            .with_always_break_on_max_boundary(true)
            .with_const_max_burst::<8>(),
    );

    // Step 20: SDMA wrapper: read and write reordering, event acceleration (v3: + 0x800).
    sdma.write_reg(regs::SDMA_RD_REORDER::zeroed().with_enable(true));
    sdma.write_reg(regs::SDMA_WR_REORDER::zeroed().with_enable(true));
    sdma.write_reg(regs::SDMA_EVENT_ACCEL::zeroed().with_enable(true));
    if arch.generation == Generation::V3 {
        sdma.write_reg(regs::SDMA_V3_CFG::from(0x26));
    }

    // Step 21 (v2): AXI errors abort the engine.
    if arch.axi_error_abort {
        for table in 0..6 {
            for addr in [1, 2, 3, 9, 10, 11] {
                io.write(
                    regs::AXI_ERR_DETECTION_TABLE::try_at(table * 16 + addr).ok_or(EINVAL)?,
                    regs::AXI_ERR_DETECTION_TABLE::from(0xF),
                );
            }
        }
        for ctrl in 0..6 {
            for q in 0..QUEUES_PER_ENGINE {
                io.write(
                    regs::AXI_ERR_CONTROL_TABLE_ADDR::try_at(ctrl).ok_or(EINVAL)?,
                    regs::AXI_ERR_CONTROL_TABLE_ADDR::from((q << 3) | 7),
                );
                io.write(
                    regs::AXI_ERR_CONTROL_TABLE_DATA::try_at(ctrl).ok_or(EINVAL)?,
                    regs::AXI_ERR_CONTROL_TABLE_DATA::from(0x10),
                );
            }
        }
        for blk in 0..6 {
            io.write(
                regs::AXI_ERR_IOFIC_CONTROL::try_at(blk).ok_or(EINVAL)?,
                regs::AXI_ERR_IOFIC_CONTROL::from(regs::IOFIC_CONTROL_EDGE_NO_MSIX),
            );
            io.write(
                regs::AXI_ERR_IOFIC_ABORT_MASK::try_at(blk).ok_or(EINVAL)?,
                regs::AXI_ERR_IOFIC_ABORT_MASK::zeroed(),
            );
            io.write(
                regs::AXI_ERR_IOFIC_MASK_CLEAR::try_at(blk).ok_or(EINVAL)?,
                regs::AXI_ERR_IOFIC_MASK_CLEAR::zeroed(),
            );
        }
        io.write_reg(regs::GEN_AXI_CFG_1::from(u32::MAX));
    }

    // Step 22 (v3 SENG engines): ring-id errors neither interrupt, log nor abort.
    if let Some(fis) = arch.fis_offset(eng) {
        mask_ring_id_errors(io, window(bar, fis)?)?;
    }

    // Not in the reference sequence, which runs after a firmware reset: the engine may still be
    // aborted, or carry cause bits, from before this init (the cause bits stay set until
    // software clears them, and only change_state NORMAL ends an abort; hardware.rst §3.5, 8.3).
    // Start from a clean state so that a stale error neither stops the queues nor shows up in a
    // later failure report.
    let errors = engine_errors(io)?;
    if errors.aborted() || errors.m2s_cause != 0 || errors.s2m_cause != 0 {
        recover_engine(io, &errors)?;
    }
    Ok(())
}

/// Unmasks `errors` of secondary group `group` (and `group_c` of group C) so that they raise
/// their summary bits in main group D and abort the engine (hardware.rst §3.6 steps 15/16).
fn unmask_errors(
    io: EngineIo<'_>,
    group: usize,
    errors: u32,
    group_c: u32,
    summary: u32,
) -> Result {
    let sec = |i| {
        regs::IOFIC_INT_CONTROL::of::<SecondaryIofic>()
            .try_at(i)
            .ok_or(EINVAL)
    };
    io.write(
        sec(group)?,
        regs::IOFIC_INT_CONTROL::from(regs::IOFIC_CONTROL_EDGE_NO_MSIX),
    );
    io.write(
        regs::IOFIC_INT_CONTROL::of::<MainIofic>()
            .try_at(regs::MAIN_GROUP_D)
            .ok_or(EINVAL)?,
        regs::IOFIC_INT_CONTROL::from(regs::IOFIC_CONTROL_EDGE_NO_MSIX),
    );
    let abort = |i| {
        regs::IOFIC_INT_ABORT_MASK::of::<SecondaryIofic>()
            .try_at(i)
            .ok_or(EINVAL)
    };
    let unmask = |i| {
        regs::IOFIC_INT_MASK_CLEAR::of::<SecondaryIofic>()
            .try_at(i)
            .ok_or(EINVAL)
    };
    io.write(abort(group)?, regs::IOFIC_INT_ABORT_MASK::from(!errors));
    io.write(
        abort(regs::SECONDARY_GROUP_C)?,
        regs::IOFIC_INT_ABORT_MASK::from(!group_c),
    );
    io.write(unmask(group)?, regs::IOFIC_INT_MASK_CLEAR::from(!errors));
    io.write(
        unmask(regs::SECONDARY_GROUP_C)?,
        regs::IOFIC_INT_MASK_CLEAR::from(!group_c),
    );
    io.write(
        regs::IOFIC_INT_MASK_CLEAR::of::<MainIofic>()
            .try_at(regs::MAIN_GROUP_D)
            .ok_or(EINVAL)?,
        regs::IOFIC_INT_MASK_CLEAR::from(!summary),
    );
    Ok(())
}

/// Masks the prefetch ring-id error (M2S bit 17, S2M bit 11) on a v3 SENG engine
/// (hardware.rst §3.5).
fn mask_ring_id_errors(io: EngineIo<'_>, fis: Mmio<'_, Region<{ regs::FIS_SIZE }>>) -> Result {
    for (group, bit) in [
        (regs::SECONDARY_GROUP_M2S, 17),
        (regs::SECONDARY_GROUP_S2M, 11),
    ] {
        let mask_loc = || {
            regs::IOFIC_INT_MASK::of::<SecondaryIofic>()
                .try_at(group)
                .ok_or(EINVAL)
        };
        let mask = io.read(mask_loc()?).into_raw() | (1 << bit);
        io.write(mask_loc()?, regs::IOFIC_INT_MASK::from(mask));
        io.write(
            regs::IOFIC_INT_ABORT_MASK::of::<SecondaryIofic>()
                .try_at(group)
                .ok_or(EINVAL)?,
            regs::IOFIC_INT_ABORT_MASK::from(mask),
        );
    }
    fis.update(regs::FIS_GRP2_INT_MASK, |r| r.with_ring_id_error(true));
    fis.update(regs::FIS_GRP3_INT_MASK, |r| r.with_ring_id_error(true));
    io.update(regs::M2S_ERR_LOG_MASK, |r| r.with_ring_id_error(true));
    io.update(regs::S2M_ERR_LOG_MASK, |r| r.with_ring_id_error(true));
    Ok(())
}

/// Programs one direction of queue `q` (hardware.rst §3.7 steps b-h): rate-limit mask (M2S), pause,
/// queue reset, ring base and length, completion config, enable.
///
/// `base` is the ring's device-fabric address (256-byte aligned), `descs` its size.
pub(crate) fn init_queue_dir<D: Direction>(
    io: EngineIo<'_>,
    q: usize,
    base: u64,
    descs: u32,
) -> Result {
    let cfg = || regs::Q_CFG::of::<D>().try_at(q).ok_or(EINVAL);
    if D::BASE == M2s::BASE {
        io.write(
            regs::M2S_Q_RLIMIT_MASK::try_at(q).ok_or(EINVAL)?,
            regs::M2S_Q_RLIMIT_MASK::zeroed().with_const_mask::<3>(),
        );
    }
    io.write(cfg()?, q_cfg_paused());
    D::reset(io, q)?;
    // CAST: splitting the 64-bit base into its register halves.
    io.write(
        regs::Q_DRBP_LOW::of::<D>().try_at(q).ok_or(EINVAL)?,
        regs::Q_DRBP_LOW::from(base as u32),
    );
    io.write(
        regs::Q_DRBP_HIGH::of::<D>().try_at(q).ok_or(EINVAL)?,
        regs::Q_DRBP_HIGH::from((base >> 32) as u32),
    );
    io.write(
        regs::Q_DRL::of::<D>().try_at(q).ok_or(EINVAL)?,
        regs::Q_DRL::zeroed().try_with_len(descs)?,
    );
    D::write_comp_cfg(io, q, 0)?;
    io.write(cfg()?, q_cfg_enabled());
    Ok(())
}

/// Pauses one direction of queue `q` (clears both enables) and resets it (hardware.rst §3.8 "queue
/// pause", §3.7 step d), so the engine fetches nothing more from its ring.
pub(crate) fn pause_queue_dir<D: Direction>(io: EngineIo<'_>, q: usize) -> Result {
    io.write(
        regs::Q_CFG::of::<D>().try_at(q).ok_or(EINVAL)?,
        q_cfg_paused(),
    );
    D::reset(io, q)
}

/// Rings the doorbells of queue `q`: a full memory barrier so that every descriptor written
/// before is visible to the device, then RDRTP_inc += `s2m_count`, then TDRTP_inc += `m2s_count`
/// when it is non-zero (hardware.rst §3.8, `udma_m2m_copy_start`).
pub(crate) fn doorbell(io: EngineIo<'_>, q: usize, m2s_count: u32, s2m_count: u32) -> Result {
    let rx = regs::Q_DRTP_INC::of::<S2m>().try_at(q).ok_or(EINVAL)?;
    let tx = regs::Q_DRTP_INC::of::<M2s>().try_at(q).ok_or(EINVAL)?;
    let rx_val = regs::Q_DRTP_INC::zeroed().try_with_count(s2m_count)?;
    let tx_val = regs::Q_DRTP_INC::zeroed().try_with_count(m2s_count)?;
    mb(Full);
    io.write(rx, rx_val);
    if m2s_count > 0 {
        io.write(tx, tx_val);
    }
    Ok(())
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
pub(crate) fn queue_regs<D: Direction>(io: EngineIo<'_>, q: usize) -> Result<QueueRegs> {
    let lo = io
        .read(regs::Q_DRBP_LOW::of::<D>().try_at(q).ok_or(EINVAL)?)
        .into_raw()
        & 0xFFFF_FFC0;
    let hi = io
        .read(regs::Q_DRBP_HIGH::of::<D>().try_at(q).ok_or(EINVAL)?)
        .into_raw();
    Ok(QueueRegs {
        cfg: io
            .read(regs::Q_CFG::of::<D>().try_at(q).ok_or(EINVAL)?)
            .into_raw(),
        status: io
            .read(regs::Q_STATUS::of::<D>().try_at(q).ok_or(EINVAL)?)
            .into_raw(),
        base: (u64::from(hi) << 32) | u64::from(lo),
        len: io
            .read(regs::Q_DRL::of::<D>().try_at(q).ok_or(EINVAL)?)
            .len()
            .get(),
        head: io
            .read(regs::Q_DRHP::of::<D>().try_at(q).ok_or(EINVAL)?)
            .into_raw(),
        tail: io
            .read(regs::Q_DRTP::of::<D>().try_at(q).ok_or(EINVAL)?)
            .into_raw(),
        comp_head: io
            .read(regs::Q_CRHP::of::<D>().try_at(q).ok_or(EINVAL)?)
            .into_raw(),
    })
}

/// Engine error state: both state registers and the M2S/S2M error causes (hardware.rst §3.5, 3.8).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct EngineErrors {
    /// `m2s.state`.
    pub(crate) m2s_state: u32,
    /// `s2m.state`.
    pub(crate) s2m_state: u32,
    /// Secondary group A cause (M2S errors).
    pub(crate) m2s_cause: u32,
    /// Secondary group B cause (S2M errors).
    pub(crate) s2m_cause: u32,
}

/// Value of a 2-bit engine state field in abort (hardware.rst §3.2).
const STATE_ABORT: u32 = 2;

impl EngineErrors {
    /// Whether any state field of either direction reads "abort".
    pub(crate) fn aborted(&self) -> bool {
        [self.m2s_state, self.s2m_state]
            .iter()
            .any(|s| (0..4).any(|f| (s >> (f * 4)) & 3 == STATE_ABORT))
    }
}

/// Reads the engine's state and error-cause registers.
pub(crate) fn engine_errors(io: EngineIo<'_>) -> Result<EngineErrors> {
    let cause = |g| {
        regs::IOFIC_INT_CAUSE::of::<SecondaryIofic>()
            .try_at(g)
            .ok_or(EINVAL)
    };
    Ok(EngineErrors {
        m2s_state: io.read(regs::M2S_STATE).into_raw(),
        s2m_state: io.read(regs::S2M_STATE).into_raw(),
        m2s_cause: io.read(cause(regs::SECONDARY_GROUP_M2S)?).into_raw(),
        s2m_cause: io.read(cause(regs::SECONDARY_GROUP_S2M)?).into_raw(),
    })
}

/// Returns an aborted engine to normal operation: clears the M2S and S2M error causes it
/// reports and writes change_state NORMAL to M2S, then S2M (hardware.rst §3.8, 8.3).
pub(crate) fn recover_engine(io: EngineIo<'_>, errors: &EngineErrors) -> Result {
    let cause = |g| {
        regs::IOFIC_INT_CAUSE::of::<SecondaryIofic>()
            .try_at(g)
            .ok_or(EINVAL)
    };
    // The cause registers are write-0-to-clear: keep every bit except those seen.
    io.write(
        cause(regs::SECONDARY_GROUP_M2S)?,
        regs::IOFIC_INT_CAUSE::from(!errors.m2s_cause),
    );
    io.write(
        cause(regs::SECONDARY_GROUP_S2M)?,
        regs::IOFIC_INT_CAUSE::from(!errors.s2m_cause),
    );
    io.write_reg(regs::M2S_CHANGE_STATE::zeroed().with_normal(true));
    io.write_reg(regs::S2M_CHANGE_STATE::zeroed().with_normal(true));
    Ok(())
}
