// SPDX-License-Identifier: GPL-2.0

//! UDMA register definitions: the only place where register offsets and bits appear.
//!
//! Offsets are relative to the start of one engine's UDMA register block ("unit offset",
//! hardware.rst §3.1): M2S (Tx) engine registers at 0x0, S2M (Rx) engine registers at 0x20000, GEN
//! at 0x38000, GEN_EX at 0x3C000. Each direction has 16 queue banks of 0x1000 bytes (M2S at 0x1000,
//! S2M at 0x21000) that share one layout (hardware.rst §3.4). SDMA wrapper registers are relative
//! to the wrapper block (hardware.rst §2.2). All registers are 32 bits wide and little-endian.

use kernel::io::register;
use kernel::io::register::RegisterBase;
use kernel::prelude::Zeroable;

/// Size in bytes of one engine's UDMA register block (hardware.rst §3.1,
/// `sizeof(struct unit_regs_v4)`).
pub(crate) const ENGINE_SIZE: usize = 0x3C800;

/// Size in bytes of the v3 user FIS window the driver touches (hardware.rst §3.5).
pub(crate) const FIS_SIZE: usize = 0x1000;

/// Size in bytes of the SDMA wrapper register window the driver touches (hardware.rst §3.6
/// step 20).
pub(crate) const SDMA_SIZE: usize = 0x1000;

/// Base family of the per-queue register banks.
pub(crate) struct QueueBank;

/// The M2S (Tx, source side) queue banks, at unit offset 0x1000 (hardware.rst §3.4).
pub(crate) struct M2s;
impl RegisterBase<QueueBank> for M2s {
    const BASE: usize = 0x1000;
}

/// The S2M (Rx, destination side) queue banks, at unit offset 0x21000 (hardware.rst §3.4).
pub(crate) struct S2m;
impl RegisterBase<QueueBank> for S2m {
    const BASE: usize = 0x21000;
}

/// Base family of the per-queue control registers whose offset inside the queue bank differs by
/// direction: `comp_cfg` at bank + 0xA0 (M2S) / + 0x54 (S2M), `q_sw_ctrl` 0x10 above it
/// (hardware.rst §3.4).
pub(crate) struct QueueCtl;
impl RegisterBase<QueueCtl> for M2s {
    const BASE: usize = 0x10A0;
}
impl RegisterBase<QueueCtl> for S2m {
    const BASE: usize = 0x21054;
}

/// Base family of the engine-level registers both directions share the layout of: M2S at unit
/// offset 0x0, S2M at 0x20000 (hardware.rst §3.2, 3.3).
pub(crate) struct DirEngine;
impl RegisterBase<DirEngine> for M2s {
    const BASE: usize = 0;
}
impl RegisterBase<DirEngine> for S2m {
    const BASE: usize = 0x20000;
}

/// Base family of the IOFIC interrupt-controller groups.
pub(crate) struct IoficGroup;

/// The main IOFIC (groups A-D, 0x40 apart) at unit offset 0x38000 (hardware.rst §3.5).
pub(crate) struct MainIofic;
impl RegisterBase<IoficGroup> for MainIofic {
    const BASE: usize = 0x38000;
}

/// The secondary IOFIC (groups A: M2S errors, B: S2M errors, C: AXI FIFO parity) at 0x3A000.
pub(crate) struct SecondaryIofic;
impl RegisterBase<IoficGroup> for SecondaryIofic {
    const BASE: usize = 0x3A000;
}

/// Main IOFIC group D, the summary group of the secondary controller (hardware.rst §3.5).
pub(crate) const MAIN_GROUP_D: usize = 3;
/// Secondary IOFIC group A: M2S errors (hardware.rst §3.5).
pub(crate) const SECONDARY_GROUP_M2S: usize = 0;
/// Secondary IOFIC group B: S2M errors (hardware.rst §3.5).
pub(crate) const SECONDARY_GROUP_S2M: usize = 1;
/// Secondary IOFIC group C: AXI FIFO parity errors (hardware.rst §3.5).
pub(crate) const SECONDARY_GROUP_C: usize = 2;

/// The secondary M2S errors the driver unmasks (bits 0-27) (hardware.rst §3.5).
pub(crate) const M2S_ERRORS: u32 = 0x0FFF_FFFF;
/// The secondary S2M errors the driver unmasks (hardware.rst §3.5).
pub(crate) const S2M_ERRORS: u32 = 0xFFFF_EF07;
/// Main group D summary bits of the M2S errors (bit 8 = secondary A, bit 10 = secondary C).
pub(crate) const MAIN_D_M2S_SUMMARY: u32 = 0x500;
/// Main group D summary bits of the S2M errors (bit 9 = secondary B, bit 10 = secondary C).
pub(crate) const MAIN_D_S2M_SUMMARY: u32 = 0x600;
/// Secondary group C bits of the M2S AXI FIFO parity errors.
pub(crate) const GROUP_C_M2S: u32 = 0x3F;
/// Secondary group C bits of the S2M AXI FIFO parity errors.
pub(crate) const GROUP_C_S2M: u32 = 0xFC0;

/// Secondary IOFIC cause bit of the M2S prefetch ring-id mismatch (hardware.rst §3.5).
pub(crate) const M2S_RING_ID_ERROR: u32 = 1 << 17;
/// Secondary IOFIC cause bit of the S2M prefetch ring-id mismatch (hardware.rst §3.5).
pub(crate) const S2M_RING_ID_ERROR: u32 = 1 << 11;

// ---- Values of the engine init sequence (hardware.rst §3.6) ----

/// Reset-value bits 25:24 of a queue `cfg` that the driver keeps once it has cached them
/// (0x0300_0000; hardware.rst §3.4, §3.6 steps 1 and 18).
pub(crate) const Q_CFG_DEFAULTS: u32 = 3;
/// Maximum packets in the M2S data FIFO, `0x310` bits 27:16 (hardware.rst §3.6 step 2).
pub(crate) const M2S_MAX_PKT_LIMIT: u32 = 0x100;
/// AXI transaction timeout in cycles, `gen.axi.cfg_1` (hardware.rst §3.5, §3.6 step 4).
pub(crate) const AXI_TIMEOUT_CYCLES: u32 = 100_000_000;
/// Maximum M2S packet length in bytes, `0x254` bits 19:0 (hardware.rst §3.6 step 6).
pub(crate) const M2S_MAX_PKT_SIZE: u32 = 0xF_FFFF;
/// M2S stream read threshold in beats, `0x258` bits 18:8 (hardware.rst §3.6 step 7).
pub(crate) const M2S_STREAM_RD_THRESHOLD: u32 = 1;
/// Address-high selector value of every Tx and Rx VMPR entry (hardware.rst §3.5, §3.6 steps 8
/// and 11).
pub(crate) const VMPR_SEL_ALL: u32 = u32::MAX;
/// Maximum AXI burst of the M2S data reads and of the M2S/S2M descriptor reads (hardware.rst
/// §3.6 steps 9 and 19).
pub(crate) const AXI_MAX_BURST: u32 = 8;
/// The four S2M outstanding-write limits, `0x20128` (hardware.rst §3.3, §3.6 step 13).
pub(crate) const S2M_OSTAND_CFG_WR: u32 = 0x4080_4080;
/// Completion descriptor size in 32-bit words: 16-byte descriptors (hardware.rst §3.3, §3.6
/// step 17).
pub(crate) const COMP_DESC_WORDS: u32 = 4;
/// Minimum descriptor prefetch burst above the prefetch threshold (hardware.rst §3.6 step 19).
pub(crate) const PREF_MIN_BURST_ABOVE_THR: u32 = 8;
/// Minimum descriptor prefetch burst below the prefetch threshold (hardware.rst §3.6 step 19).
pub(crate) const PREF_MIN_BURST_BELOW_THR: u32 = 1;
/// v3 SDMA wrapper configuration written to wrapper + 0x800 (hardware.rst §3.6 step 20).
pub(crate) const SDMA_V3_CFG_INIT: u32 = 0x26;
/// Number of v2 AXI error detection tables, control entries and AXI-error IOFIC blocks the init
/// programs (hardware.rst §3.5, §3.6 step 21).
pub(crate) const AXI_ERR_BLOCKS: usize = 6;
/// Entries of one v2 AXI error detection table (0x40 bytes apart; hardware.rst §3.5).
pub(crate) const AXI_ERR_DETECTION_ENTRIES: usize = 16;
/// The detection-table entries that the v2 init sets (hardware.rst §3.5, §3.6 step 21).
pub(crate) const AXI_ERR_DETECTED: [usize; 6] = [1, 2, 3, 9, 10, 11];
/// Value written to a set detection-table entry (hardware.rst §3.5).
pub(crate) const AXI_ERR_DETECTION_ON: u32 = 0xF;
/// Value written to the data half of every v2 AXI error control entry (hardware.rst §3.5).
pub(crate) const AXI_ERR_CONTROL_DATA: u32 = 0x10;
/// AXI timeout of a v2 engine once AXI errors abort it (hardware.rst §3.5, §3.6 step 21).
pub(crate) const AXI_TIMEOUT_V2_ABORTING: u32 = u32::MAX;
/// Rate-limiter mask of an M2S queue: types 0 and 1 masked, "pause on DMB" clear (hardware.rst
/// §3.4, §3.7).
pub(crate) const RLIMIT_MASK_INIT: u32 = 3;
/// Value of a 2-bit engine state field in abort (hardware.rst §3.2, §3.8 "Engine state get").
pub(crate) const STATE_ABORT: u32 = 2;
/// Bits of a ring base's low half that the queue-state readout keeps: bits 5:0 are not part of
/// the address (hardware.rst §3.4, §3.8 "Queue state get").
pub(crate) const RING_BASE_LOW_MASK: u32 = 0xFFFF_FFC0;

/// Address half of v2 AXI error control entry `queue` (hardware.rst §3.5):
/// `(queue << 3) | 7`.
pub(crate) const fn axi_err_control_addr(queue: u32) -> u32 {
    (queue << 3) | 7
}

register! {
    // ---- M2S (Tx) engine level (hardware.rst §3.2) ----

    /// AXI M2S data read configuration.
    pub(crate) AXI_M2S_DATA_RD_CFG(u32) @ 0x118 {
        /// Break read bursts on the maximum boundary.
        16:16 break_on_max_boundary => bool;
        /// Maximum burst.
        7:0 max_burst;
    }

    /// AXI M2S descriptor read configuration 3.
    pub(crate) AXI_M2S_DESC_RD_CFG_3(u32) @ 0x11C {
        /// Always break on the maximum boundary.
        16:16 always_break_on_max_boundary => bool;
        /// Maximum burst, in descriptors.
        7:0 max_burst;
    }

    /// AXI M2S outstanding transactions.
    pub(crate) AXI_M2S_OSTAND_CFG(u32) @ 0x124 {
        /// Maximum completion data beats.
        31:24 max_comp_data_beats;
        /// Maximum completion requests.
        23:16 max_comp_reqs;
        /// Maximum descriptor reads.
        15:8 max_desc_reads;
        /// Maximum data reads.
        7:0 max_data_reads;
    }

    /// M2S error log mask.
    pub(crate) M2S_ERR_LOG_MASK(u32) @ 0x20C {
        /// Prefetch ring-id error.
        17:17 ring_id_error => bool;
    }

    /// M2S maximum packet length.
    pub(crate) M2S_CFG_LEN(u32) @ 0x254 {
        /// A descriptor length of 0 means 64 KiB.
        24:24 len0_is_64k => bool;
        /// Maximum packet length in bytes.
        19:0 max_pkt_size;
    }

    /// M2S stream configuration.
    pub(crate) M2S_STREAM_CFG(u32) @ 0x258 {
        /// Read threshold in beats.
        18:8 rd_threshold;
        /// Threshold read mode.
        1:1 threshold_mode => bool;
        /// Disable the stream.
        0:0 disable => bool;
    }

    /// M2S descriptor prefetch configuration 2.
    pub(crate) M2S_DESC_PREF_CFG_2(u32) @ 0x304 {
        /// Force round-robin between queues.
        16:16 force_rr => bool;
        /// Maximum descriptors per packet.
        7:0 max_descs_per_pkt;
    }

    /// M2S descriptor prefetch configuration 3.
    pub(crate) M2S_DESC_PREF_CFG_3(u32) @ 0x308 {
        /// Prefetch threshold.
        15:8 pref_thr;
        /// Minimum burst above the threshold.
        7:4 min_burst_above_thr;
        /// Minimum burst below the threshold.
        3:0 min_burst_below_thr;
    }

    /// M2S data read configuration.
    pub(crate) M2S_DATA_CFG(u32) @ 0x310 {
        /// Maximum packets in the data FIFO.
        27:16 max_pkt_limit;
        /// Data FIFO depth in beats.
        11:0 data_fifo_depth;
    }

    /// M2S completion application-ack timeout.
    pub(crate) M2S_COMP_CFG_APPLICATION_ACK(u32) @ 0x408 {
        /// Timeout.
        31:0 timeout;
    }

    // ---- S2M (Rx) engine level (hardware.rst §3.3) ----

    /// AXI S2M descriptor read configuration 3.
    pub(crate) AXI_S2M_DESC_RD_CFG_3(u32) @ 0x2011C {
        /// Always break on the maximum boundary.
        16:16 always_break_on_max_boundary => bool;
        /// Maximum burst, in descriptors.
        7:0 max_burst;
    }

    /// AXI S2M outstanding reads.
    pub(crate) AXI_S2M_OSTAND_CFG_RD(u32) @ 0x20124 {
        /// Maximum outstanding stream acks.
        23:16 max_stream_ack;
        /// Maximum outstanding descriptor reads.
        7:0 max_desc_reads;
    }

    /// AXI S2M outstanding writes.
    pub(crate) AXI_S2M_OSTAND_CFG_WR(u32) @ 0x20128 {
        /// Raw limits.
        31:0 value;
    }

    /// S2M error log mask.
    pub(crate) S2M_ERR_LOG_MASK(u32) @ 0x2020C {
        /// Prefetch ring-id error.
        11:11 ring_id_error => bool;
    }

    /// S2M descriptor prefetch configuration 3 (same layout as [`M2S_DESC_PREF_CFG_3`]).
    pub(crate) S2M_DESC_PREF_CFG_3(u32) @ 0x20308 {
        /// Prefetch threshold.
        15:8 pref_thr;
        /// Minimum burst above the threshold.
        7:4 min_burst_above_thr;
        /// Minimum burst below the threshold.
        3:0 min_burst_below_thr;
    }

    /// S2M completion configuration: completion descriptor size.
    pub(crate) S2M_COMP_CFG_1C(u32) @ 0x20380 {
        /// Queue promotion.
        12:12 q_promotion => bool;
        /// Completion descriptor size in 32-bit words.
        3:0 desc_size;
    }

    /// S2M completion application-ack timeout.
    pub(crate) S2M_COMP_CFG_APPLICATION_ACK(u32) @ 0x2038C {
        /// Timeout.
        31:0 timeout;
    }

    // ---- Per-queue banks, common layout (hardware.rst §3.4) ----

    /// Queue configuration.
    pub(crate) Q_CFG(u32)[16, stride = 0x1000] @ QueueBank + 0x20 {
        /// AXI QoS.
        31:28 axi_qos;
        /// Reset-value bits the driver keeps (0x0300_0000).
        25:24 defaults;
        /// Scheduling (M2S) / stream (S2M) enable.
        17:17 sched_en => bool;
        /// Descriptor prefetch enable.
        16:16 pref_en => bool;
    }

    /// Queue status (raw).
    pub(crate) Q_STATUS(u32)[16, stride = 0x1000] @ QueueBank + 0x24 {
        /// Raw status.
        31:0 value;
    }

    /// Descriptor ring base, low half; bits 5:0 must be zero.
    pub(crate) Q_DRBP_LOW(u32)[16, stride = 0x1000] @ QueueBank + 0x28 {
        /// Address bits 31:0.
        31:0 addr;
    }

    /// Descriptor ring base, high half.
    pub(crate) Q_DRBP_HIGH(u32)[16, stride = 0x1000] @ QueueBank + 0x2C {
        /// Address bits 63:32.
        31:0 addr;
    }

    /// Descriptor ring length.
    pub(crate) Q_DRL(u32)[16, stride = 0x1000] @ QueueBank + 0x30 {
        /// Ring length in descriptors.
        23:0 len;
    }

    /// Descriptor ring head (next descriptor the engine prefetches).
    pub(crate) Q_DRHP(u32)[16, stride = 0x1000] @ QueueBank + 0x34 {
        /// Ring id of the head.
        31:30 ring_id;
        /// Head index in descriptors.
        23:0 index;
    }

    /// Doorbell: TDRTP_inc (M2S) / RDRTP_inc (S2M) adds `count` descriptors to the tail.
    pub(crate) Q_DRTP_INC(u32)[16, stride = 0x1000] @ QueueBank + 0x38 {
        /// Number of descriptors added.
        23:0 count;
    }

    /// Descriptor ring tail (next free slot).
    pub(crate) Q_DRTP(u32)[16, stride = 0x1000] @ QueueBank + 0x3C {
        /// Ring id of the tail.
        31:30 ring_id;
        /// Tail index in descriptors.
        23:0 index;
    }

    /// Completion ring base, low half.
    pub(crate) Q_CRBP_LOW(u32)[16, stride = 0x1000] @ QueueBank + 0x44 {
        /// Address bits 31:0.
        31:0 addr;
    }

    /// Completion ring base, high half.
    pub(crate) Q_CRBP_HIGH(u32)[16, stride = 0x1000] @ QueueBank + 0x48 {
        /// Address bits 63:32.
        31:0 addr;
    }

    /// Completion ring head.
    pub(crate) Q_CRHP(u32)[16, stride = 0x1000] @ QueueBank + 0x4C {
        /// Ring id.
        31:30 ring_id;
        /// Completion head index in descriptors.
        23:0 index;
    }

    // ---- Per-queue registers whose offset differs by direction (hardware.rst §3.4) ----

    /// M2S queue rate-limiter mask (v2/v3); bit 2 is the internal "pause on DMB".
    pub(crate) M2S_Q_RLIMIT_MASK(u32)[16, stride = 0x1000] @ 0x1074 {
        /// Rate-limiter type masks (1 = masked).
        2:0 mask;
    }

    /// Queue completion configuration (M2S bank + 0xA0, S2M bank + 0x54).
    pub(crate) Q_COMP_CFG(u32)[16, stride = 0x1000] @ QueueCtl + 0x00 {
        /// Disable coalescing.
        1:1 dis_coal => bool;
        /// Completion-ring update enable.
        0:0 en_comp_ring_update => bool;
    }

    /// Queue software control (M2S bank + 0xB0, S2M bank + 0x64).
    pub(crate) Q_SW_CTRL(u32)[16, stride = 0x1000] @ QueueCtl + 0x10 {
        /// Reset the queue.
        8:8 rst_q => bool;
    }

    // ---- Engine level, common layout of M2S (0x0) and S2M (0x20000) (hardware.rst §3.2, 3.3) ----

    /// Engine state: four 2-bit fields, 0 idle, 1 normal, 2 abort.
    pub(crate) DIR_STATE(u32) @ DirEngine + 0x200 {
        /// Descriptor prefetch.
        13:12 desc_prefetch;
        /// Data read (M2S) / write (S2M) controller.
        9:8 data;
        /// Stream interface.
        5:4 stream_if;
        /// Completion controller.
        1:0 comp_ctrl;
    }

    /// Change-state command.
    pub(crate) DIR_CHANGE_STATE(u32) @ DirEngine + 0x204 {
        /// Abort.
        2:2 abort => bool;
        /// Disable.
        1:1 disable => bool;
        /// Go to normal operation.
        0:0 normal => bool;
    }

    // ---- IOFIC groups (hardware.rst §3.5) ----

    /// Interrupt cause.
    pub(crate) IOFIC_INT_CAUSE(u32)[4, stride = 0x40] @ IoficGroup + 0x00 {
        /// Cause bits.
        31:0 bits;
    }

    /// Interrupt mask (1 = masked).
    pub(crate) IOFIC_INT_MASK(u32)[4, stride = 0x40] @ IoficGroup + 0x10 {
        /// Mask bits.
        31:0 bits;
    }

    /// Interrupt mask clear: a 0 bit clears that mask bit.
    pub(crate) IOFIC_INT_MASK_CLEAR(u32)[4, stride = 0x40] @ IoficGroup + 0x18 {
        /// Bits.
        31:0 bits;
    }

    /// Interrupt control.
    pub(crate) IOFIC_INT_CONTROL(u32)[4, stride = 0x40] @ IoficGroup + 0x28 {
        /// MSI-X suppressed.
        5:5 no_msix => bool;
        /// Cause set on the rising edge.
        3:3 edge => bool;
    }

    /// Abort mask: a 0 bit makes that cause abort the engine.
    pub(crate) IOFIC_INT_ABORT_MASK(u32)[4, stride = 0x40] @ IoficGroup + 0x30 {
        /// Bits.
        31:0 bits;
    }

    // ---- GEN / GEN_EX (hardware.rst §3.5) ----

    /// AXI transaction timeout.
    pub(crate) GEN_AXI_CFG_1(u32) @ 0x3A300 {
        /// Timeout in cycles.
        31:0 timeout;
    }

    /// v2 AXI error-detection tables 0..6, entries 0..15.
    pub(crate) AXI_ERR_DETECTION_TABLE(u32)[112, stride = 4] @ 0x3A900 {
        /// Entry value.
        31:0 value;
    }

    /// v2 AXI error control, table address.
    pub(crate) AXI_ERR_CONTROL_TABLE_ADDR(u32)[6, stride = 8] @ 0x3AB00 {
        /// Address.
        31:0 value;
    }

    /// v2 AXI error control, table data.
    pub(crate) AXI_ERR_CONTROL_TABLE_DATA(u32)[6, stride = 8] @ 0x3AB04 {
        /// Data.
        31:0 value;
    }

    /// v2 AXI error IOFIC blocks (m2s desc-rd, m2s data-rd, m2s cmpl-wr, s2m desc-rd, s2m
    /// data-wr, s2m cmpl-wr): mask clear.
    pub(crate) AXI_ERR_IOFIC_MASK_CLEAR(u32)[6, stride = 0x100] @ 0x3AD18 {
        /// Bits.
        31:0 bits;
    }

    /// v2 AXI error IOFIC blocks: control.
    pub(crate) AXI_ERR_IOFIC_CONTROL(u32)[6, stride = 0x100] @ 0x3AD28 {
        /// MSI-X suppressed.
        5:5 no_msix => bool;
        /// Cause set on the rising edge.
        3:3 edge => bool;
    }

    /// v2 AXI error IOFIC blocks: abort mask.
    pub(crate) AXI_ERR_IOFIC_ABORT_MASK(u32)[6, stride = 0x100] @ 0x3AD30 {
        /// Bits.
        31:0 bits;
    }

    /// Spare register; bit 0 cleared turns completion-ring-head reporting on (v2/v3).
    pub(crate) SPARE_ZEROES0(u32) @ 0x3B460 {
        /// Completion head reporting off.
        0:0 crhp_off => bool;
    }

    /// Per-queue Tx address-high selector.
    pub(crate) VMPR_TX_SEL(u32)[16, stride = 0x40] @ 0x3C400 {
        /// Selector.
        31:0 value;
    }

    /// Per-queue Rx address-high selector 0.
    pub(crate) VMPR_RX_SEL0(u32)[16, stride = 0x40] @ 0x3C404 {
        /// Selector.
        31:0 value;
    }

    /// Per-queue Rx address-high selector 1.
    pub(crate) VMPR_RX_SEL1(u32)[16, stride = 0x40] @ 0x3C408 {
        /// Selector.
        31:0 value;
    }

    /// Per-queue Rx address-high selector 2.
    pub(crate) VMPR_RX_SEL2(u32)[16, stride = 0x40] @ 0x3C40C {
        /// Selector.
        31:0 value;
    }

    // ---- SDMA wrapper, relative to the wrapper block (hardware.rst §3.6 steps 0 and 20) ----

    /// Event acceleration enable.
    pub(crate) SDMA_EVENT_ACCEL(u32) @ 0x00 {
        /// Enable.
        0:0 enable => bool;
    }

    /// Read reorder enable.
    pub(crate) SDMA_RD_REORDER(u32) @ 0x1C {
        /// Enable.
        0:0 enable => bool;
    }

    /// Write reorder enable.
    pub(crate) SDMA_WR_REORDER(u32) @ 0x20 {
        /// Enable.
        0:0 enable => bool;
    }

    /// v2 SENG broadcast group mask.
    pub(crate) SDMA_BROADCAST_GROUP(u32) @ 0x100 {
        /// Group mask.
        15:0 mask;
    }

    /// v2 SENG broadcast enable.
    pub(crate) SDMA_BROADCAST_ENABLE(u32) @ 0x104 {
        /// Enable mask.
        15:0 mask;
    }

    /// v3 user FIS group 2 interrupt mask (relative to the FIS block); bit 11 is the ring-id
    /// error.
    pub(crate) FIS_GRP2_INT_MASK(u32) @ 0x90 {
        /// Ring-id error masked.
        11:11 ring_id_error => bool;
    }

    /// v3 user FIS group 3 interrupt mask (relative to the FIS block); bit 2 is the ring-id
    /// error.
    pub(crate) FIS_GRP3_INT_MASK(u32) @ 0xD0 {
        /// Ring-id error masked.
        2:2 ring_id_error => bool;
    }

    /// v3 wrapper configuration written at init (0x26).
    pub(crate) SDMA_V3_CFG(u32) @ 0x800 {
        /// Raw value.
        31:0 value;
    }
}

impl IOFIC_INT_CONTROL {
    /// The `int_control` value the driver writes (0x28): cause set on the rising edge, MSI-X
    /// suppressed (hardware.rst §3.5, §3.6 steps 15/16).
    pub(crate) fn edge_no_msix() -> Self {
        Self::zeroed().with_edge(true).with_no_msix(true)
    }
}

impl AXI_ERR_IOFIC_CONTROL {
    /// The control value of a v2 AXI-error IOFIC block, as [`IOFIC_INT_CONTROL::edge_no_msix`]
    /// (hardware.rst §3.5, §3.6 step 21).
    pub(crate) fn edge_no_msix() -> Self {
        Self::zeroed().with_edge(true).with_no_msix(true)
    }
}

impl DIR_STATE {
    /// Whether any of the four state fields reads "abort" (hardware.rst §3.8 "Engine state
    /// get").
    pub(crate) fn aborted(self) -> bool {
        [
            self.desc_prefetch().get(),
            self.data().get(),
            self.stream_if().get(),
            self.comp_ctrl().get(),
        ]
        .contains(&STATE_ABORT)
    }
}

impl Q_DRBP_LOW {
    /// The ring base bits 31:6 this register holds, bits 5:0 cleared (hardware.rst §3.8 "Queue
    /// state get").
    pub(crate) fn base_low(self) -> u32 {
        self.into_raw() & RING_BASE_LOW_MASK
    }
}

impl Q_DRHP {
    /// `(index, ring id)` of a head, tail or completion-head register, which share this layout
    /// (hardware.rst §3.4).
    pub(crate) fn position(raw: u32) -> (u32, u32) {
        let p = Self::from(raw);
        (p.index().get(), p.ring_id().get())
    }
}

register! {
    /// PCI command register of the config space (PCI spec; no 7.3 wrapper clears bus mastering).
    pub(crate) PCI_COMMAND(u16) @ 0x04 {
        /// Bus master enable.
        2:2 bus_master => bool;
        /// Memory space enable.
        1:1 memory => bool;
    }
}

/// Size in bytes of the device model's control window (BAR2 of `tools/udma-sim`).
#[cfg(neuron_udma_kunit)]
pub(crate) const MODEL_CTL_SIZE: usize = 0x1000;

/// Registers of the device model's control window (BAR2 of `tools/udma-sim`, absent on real
/// devices), used only by the KUnit suites to inject faults (`Documentation/udma-sim.rst`).
#[cfg(neuron_udma_kunit)]
pub(crate) mod model {
    use kernel::io::register;

    /// `MAGIC` value: "UDMA".
    pub(crate) const MAGIC_UDMA: u32 = 0x5544_4D41;
    /// `FAULT_KIND` value: fail the n-th next Tx descriptor of a queue with a bad address.
    pub(crate) const FAULT_FAIL_NTH: u32 = 1;
    /// `FAULT_KIND` value: do not process a queue for `FAULT_ARG` milliseconds.
    pub(crate) const FAULT_STALL: u32 = 3;

    register! {
        /// Identifies the window.
        pub(crate) MAGIC(u32) @ 0x000 { 31:0 value; }
        /// Staged fault kind.
        pub(crate) FAULT_KIND(u32) @ 0x010 { 31:0 value; }
        /// Staged fault engine.
        pub(crate) FAULT_ENGINE(u32) @ 0x014 { 31:0 value; }
        /// Staged fault queue.
        pub(crate) FAULT_QUEUE(u32) @ 0x018 { 31:0 value; }
        /// Staged fault argument (n, ms or factor).
        pub(crate) FAULT_ARG(u32) @ 0x01C { 31:0 value; }
        /// Write 1 to apply the staged fault; reads 0 when it was applied.
        pub(crate) FAULT_COMMIT(u32) @ 0x020 { 31:0 value; }
    }
}
