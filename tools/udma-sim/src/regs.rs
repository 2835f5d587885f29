// SPDX-License-Identifier: GPL-2.0
//! Register offsets and bit fields of one UDMA engine block.
//!
//! All offsets are *unit offsets*: bytes from the start of one engine's register
//! block (hardware.rst §3.1). All registers are 32 bits wide, little-endian. This module
//! is the only place where register numbers appear; the rest of the model uses
//! these names.

/// Size of one engine's register block in bytes (`sizeof(struct unit_regs_v4)`,
/// hardware.rst §2.1/§3.1).
pub const UNIT_FOOTPRINT: u32 = 0x3C800;
/// Number of queues per engine (`DMA_MAX_Q_V4`, hardware.rst §2.1).
pub const QUEUES_PER_ENGINE: usize = 16;

/// Start of the M2S (Tx) queue banks; queue `q` is at `M2S_Q_BASE + q * Q_STRIDE`
/// (hardware.rst §3.1).
pub const M2S_Q_BASE: u32 = 0x1000;
/// Start of the S2M (Rx) queue banks; queue `q` is at `S2M_Q_BASE + q * Q_STRIDE`
/// (hardware.rst §3.1).
pub const S2M_Q_BASE: u32 = 0x21000;
/// Distance between two queue banks in bytes (hardware.rst §3.1).
pub const Q_STRIDE: u32 = 0x1000;

// ---- engine-level M2S registers (hardware.rst §3.2) ----
/// `m2s.state`: four 2-bit fields (hardware.rst §3.2).
pub const M2S_STATE: u32 = 0x200;
/// `m2s.change_state`: bit 0 normal, bit 1 disable, bit 2 abort (hardware.rst §3.2).
pub const M2S_CHANGE_STATE: u32 = 0x204;
/// `m2s.err_log_mask` (hardware.rst §3.2).
pub const M2S_ERR_LOG_MASK: u32 = 0x20C;
/// `m2s.cfg_len`: \[19:0\] max packet bytes, \[24\] length 0 means 64 KiB (hardware.rst §3.2).
pub const M2S_CFG_LEN: u32 = 0x254;
/// `m2s.stream_cfg`: \[0\] disable (hardware.rst §3.2); the M2S stream stops while set.
pub const M2S_STREAM_CFG: u32 = 0x258;
/// `m2s_rd.desc_pref_cfg_2`: \[7:0\] max descriptors per packet (hardware.rst §3.2).
pub const M2S_DESC_PREF_CFG_2: u32 = 0x304;

// ---- engine-level S2M registers (hardware.rst §3.3) ----
/// `s2m.state` (hardware.rst §3.3).
pub const S2M_STATE: u32 = 0x20200;
/// `s2m.change_state` (hardware.rst §3.3).
pub const S2M_CHANGE_STATE: u32 = 0x20204;

/// `s2m.stream_cfg`: \[0\] disable, \[4\] flush, \[8\] stop prefetch (hardware.rst §3.3); the S2M stream
/// stops while bit 0 is set.
pub const S2M_STREAM_CFG: u32 = 0x20250;
/// `stream_cfg` bit 0: stream disabled.
pub const STREAM_DISABLE: u32 = 1 << 0;

/// `cfg_len` bit 24: a descriptor length of 0 encodes 65536 bytes (hardware.rst §3.2).
pub const CFG_LEN_64K: u32 = 1 << 24;
/// `cfg_len` \[19:0\]: maximum packet length in bytes (hardware.rst §3.2).
pub const CFG_LEN_MAX_MASK: u32 = 0x000F_FFFF;
/// `desc_pref_cfg_2` \[7:0\]: maximum descriptors per packet (hardware.rst §3.2).
pub const MAX_DESCS_MASK: u32 = 0xFF;
/// Max descriptors per packet if 0x304 was never written (V2/V3 driver value, hardware.rst
/// §3.6 step 19).
pub const DEFAULT_MAX_DESCS: u32 = 65;

/// change_state bit: go to normal (hardware.rst §3.2).
pub const CHANGE_STATE_NORMAL: u32 = 1 << 0;
/// change_state bit: disable (idle) (hardware.rst §3.2).
pub const CHANGE_STATE_DISABLE: u32 = 1 << 1;
/// change_state bit: abort (hardware.rst §3.2).
pub const CHANGE_STATE_ABORT: u32 = 1 << 2;
/// State register value with all four fields idle (0).
pub const STATE_IDLE: u32 = 0x0000;
/// State register value with all four fields normal (1).
pub const STATE_NORMAL: u32 = 0x1111;
/// State register value with all four fields abort (2).
pub const STATE_ABORT: u32 = 0x2222;

// ---- per-queue bank registers (offsets inside a bank, hardware.rst §3.4) ----
/// Queue cfg: \[16\] prefetch enable, \[17\] scheduling/stream enable.
pub const Q_CFG: u32 = 0x20;
/// Queue status (raw, reported as `hw_status`).
pub const Q_STATUS: u32 = 0x24;
/// Ring base address bits \[31:0\].
pub const Q_BASE_LO: u32 = 0x28;
/// Ring base address bits \[63:32\].
pub const Q_BASE_HI: u32 = 0x2C;
/// Ring length in descriptors, \[23:0\].
pub const Q_LEN: u32 = 0x30;
/// Head pointer (RO): \[23:0\] index, \[31:30\] ring id.
pub const Q_HEAD: u32 = 0x34;
/// Doorbell (`tdrtp_inc` / `rdrtp_inc`): \[23:0\] descriptors to add to the tail.
pub const Q_DOORBELL: u32 = 0x38;
/// Tail pointer (RO): \[23:0\] index, \[31:30\] ring id.
pub const Q_TAIL: u32 = 0x3C;
/// Completion ring base low (stored only).
pub const Q_COMP_BASE_LO: u32 = 0x44;
/// Completion ring base high (stored only).
pub const Q_COMP_BASE_HI: u32 = 0x48;
/// Completion head (RO): \[23:0\] completed descriptors mod length, \[31:30\] ring id
/// (hardware.rst §8.4).
pub const Q_COMP_HEAD: u32 = 0x4C;
/// S2M comp_cfg (stored only).
pub const S2M_Q_COMP_CFG: u32 = 0x54;
/// S2M q_sw_ctrl: bit 8 resets the queue.
pub const S2M_Q_SW_CTRL: u32 = 0x64;
/// M2S rate-limiter mask (reset value 0x7).
pub const M2S_Q_RLIMIT_MASK: u32 = 0x74;
/// M2S comp_cfg (stored only).
pub const M2S_Q_COMP_CFG: u32 = 0xA0;
/// M2S q_sw_ctrl: bit 8 resets the queue.
pub const M2S_Q_SW_CTRL: u32 = 0xB0;

/// Queue cfg bit 16: descriptor prefetch enable.
pub const Q_CFG_PREFETCH_EN: u32 = 1 << 16;
/// Queue cfg bit 17: scheduling (M2S) / stream (S2M) enable.
pub const Q_CFG_SCHED_EN: u32 = 1 << 17;
/// Both enable bits; a queue processes only when both are set.
pub const Q_CFG_ENABLE: u32 = Q_CFG_PREFETCH_EN | Q_CFG_SCHED_EN;
/// Queue cfg reset value assumed by the driver (hardware.rst §3.4, §8.1).
pub const Q_CFG_RESET: u32 = 0x0300_0000;
/// M2S rlimit mask reset value (hardware.rst §8.1).
pub const RLIMIT_MASK_RESET: u32 = 0x7;
/// q_sw_ctrl bit 8: queue reset.
pub const Q_SW_CTRL_RESET: u32 = 1 << 8;
/// Pointer registers: index field \[23:0\].
pub const PTR_INDEX_MASK: u32 = 0x00FF_FFFF;
/// Pointer registers: ring id field shift (\[31:30\]).
pub const PTR_RING_ID_SHIFT: u32 = 30;

// ---- IOFIC groups (hardware.rst §3.5) ----
/// Secondary IOFIC group A: M2S error causes.
pub const IOFIC_SEC_A: u32 = 0x3A000;
/// Secondary IOFIC group B: S2M error causes.
pub const IOFIC_SEC_B: u32 = 0x3A040;
/// Secondary IOFIC group C: AXI FIFO parity.
pub const IOFIC_SEC_C: u32 = 0x3A080;
/// Main IOFIC group D: summary of the secondary groups (bits 8, 9, 10).
pub const IOFIC_MAIN_D: u32 = 0x380C0;
/// Sub-register: int_cause.
pub const IOFIC_CAUSE: u32 = 0x00;
/// Sub-register: int_cause_set (write 1 to set).
pub const IOFIC_CAUSE_SET: u32 = 0x08;
/// Sub-register: int_mask.
pub const IOFIC_MASK: u32 = 0x10;
/// Sub-register: int_mask_clear (a 0 bit clears that mask bit).
pub const IOFIC_MASK_CLEAR: u32 = 0x18;
/// Sub-register: int_control.
pub const IOFIC_CONTROL: u32 = 0x28;
/// Sub-register: int_abort_mask (1 = that cause does not abort).
pub const IOFIC_ABORT_MASK: u32 = 0x30;
/// Main group D summary bit for secondary group A.
pub const MAIN_D_SUM_A: u32 = 1 << 8;
/// Main group D summary bit for secondary group B.
pub const MAIN_D_SUM_B: u32 = 1 << 9;
/// Main group D summary bit for secondary group C.
pub const MAIN_D_SUM_C: u32 = 1 << 10;

/// `spare_reg.zeroes0` (hardware.rst §3.5); stored and read back.
pub const SPARE_REG: u32 = 0x3B460;

/// M2S error cause bits (secondary group A, hardware.rst §3.5).
pub mod m2s_cause {
    /// Stream serial mismatch; used by the model for Tx/Rx length mismatch.
    pub const LEN_MISMATCH: u32 = 1 << 0;
    /// Stream response error; used by the model for unsupported meta/ops.
    pub const UNSUPPORTED: u32 = 1 << 1;
    /// Data read AXI response error (bad source address).
    pub const DATA_READ: u32 = 1 << 8;
    /// Prefetch AXI response error (bad descriptor fetch / ring geometry).
    pub const DESC_FETCH: u32 = 1 << 11;
    /// Prefetch AXI timeout (model: doorbell on a disabled queue).
    pub const PREFETCH_TIMEOUT: u32 = 1 << 12;
    /// Packet length above cfg_len max.
    pub const PKT_TOO_LONG: u32 = 1 << 13;
    /// More descriptors in a packet than desc_pref_cfg_2 allows.
    pub const TOO_MANY_DESCS: u32 = 1 << 14;
    /// Bad FIRST.
    pub const BAD_FIRST: u32 = 1 << 15;
    /// Bad LAST.
    pub const BAD_LAST: u32 = 1 << 16;
    /// Prefetch ring-id mismatch.
    pub const RING_ID: u32 = 1 << 17;
}

/// S2M error cause bits (secondary group B, hardware.rst §3.5).
pub mod s2m_cause {
    /// Data write AXI response error (bad destination address).
    pub const DATA_WRITE: u32 = 1 << 1;
    /// Prefetch AXI response error (bad descriptor fetch / ring geometry).
    pub const DESC_FETCH: u32 = 1 << 9;
    /// Prefetch AXI timeout (model: doorbell on a disabled queue).
    pub const PREFETCH_TIMEOUT: u32 = 1 << 10;
    /// Prefetch ring-id mismatch.
    pub const RING_ID: u32 = 1 << 11;
    /// Stream packet length mismatch.
    pub const LEN_MISMATCH: u32 = 1 << 24;
}

/// Descriptor word 0 (`len_ctrl`) and word 1 (`meta_ctrl`) fields (hardware.rst §4.2, §4.3).
pub mod desc {
    /// Size of one descriptor in bytes.
    pub const SIZE: u64 = 16;
    /// \[15:0\] length in bytes (0 = 65536).
    pub const LEN_MASK: u32 = 0xFFFF;
    /// \[23\] META descriptor (userspace HAL only; unsupported by the model).
    pub const META: u32 = 1 << 23;
    /// \[25:24\] ring id shift.
    pub const RING_ID_SHIFT: u32 = 24;
    /// \[25:24\] ring id mask (after shift).
    pub const RING_ID_MASK: u32 = 0x3;
    /// \[26\] FIRST descriptor of a packet.
    pub const FIRST: u32 = 1 << 26;
    /// \[27\] LAST descriptor of a packet.
    pub const LAST: u32 = 1 << 27;
    /// \[28\] interrupt on completion (no interrupt is modelled).
    pub const INT_EN: u32 = 1 << 28;
    /// Tx `len_ctrl` bits with no meaning for M2M (hardware.rst §4.2: \[22:16\] unused, \[29\]
    /// undefined).
    pub const TX_UNDEFINED: u32 = 0x007F_0000 | 1 << 29;
    /// Rx `len_ctrl` bits with no meaning (hardware.rst §4.2: only length, ring id and INT_EN are
    /// defined for S2M).
    pub const RX_UNDEFINED: u32 = !(LEN_MASK | RING_ID_MASK << RING_ID_SHIFT | INT_EN);
    /// \[30\] DMB barrier.
    pub const DMB: u32 = 1 << 30;
    /// \[31\] CONCAT (userspace HAL only; unsupported by the model).
    pub const CONCAT: u32 = 1 << 31;
    /// meta_ctrl bit 26: write barrier.
    pub const META_WB: u32 = 1 << 26;
    /// Default plain-copy meta_ctrl value.
    pub const META_COPY: u32 = 0x0108_0003;
    /// Plain copy plus write barrier.
    pub const META_COPY_WB: u32 = 0x0508_0003;
}
