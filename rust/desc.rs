// SPDX-License-Identifier: GPL-2.0

//! The 16-byte UDMA descriptor and its Tx (m2s) / Rx (s2m) builders (hardware.rst §4).
//!
//! A copy is always a pair: one Tx descriptor on the queue's M2S ring names the source, one Rx
//! descriptor on the S2M ring of the same queue names the destination (hardware.rst §4.5). The
//! builders here produce the exact words of the reference driver's `udma_m2m.c`; the caller
//! publishes the whole 16 bytes into the ring slot before any doorbell.

use kernel::{bitfield, num::Bounded, prelude::*};

bitfield! {
    /// Word 0 of a descriptor, `len_ctrl`: length, ring id and packet flags (hardware.rst §4.2).
    pub(crate) struct LenCtrl(u32) {
        /// CONCAT (user-space HAL only, never set by the driver).
        31:31 concat => bool;
        /// DMB: wait for all earlier transfers of the queue before this one (Tx only).
        30:30 dmb => bool;
        /// Interrupt on completion (the driver never sets it on Tx).
        28:28 int_en => bool;
        /// LAST descriptor of a packet (Tx only).
        27:27 last => bool;
        /// FIRST descriptor of a packet (Tx only).
        26:26 first => bool;
        /// Ring id (phase) of the pass over the ring the descriptor was written in.
        25:24 ring_id;
        /// META descriptor (user-space HAL only).
        23:23 meta => bool;
        /// Length in bytes; 0 means 65536 (M2S `cfg_len` bit 24).
        15:0 len;
    }
}

bitfield! {
    /// Word 1 of a Tx descriptor, `meta_ctrl`: the SDMA operation (hardware.rst §4.3).
    pub(crate) struct MetaCtrl(u32) {
        /// Write barrier: the packet's writes are visible before later packets' writes.
        26:26 write_barrier => bool;
        /// SSMAE operation; 2 = plain copy.
        25:23 ssmae_op;
        /// Operation type.
        22:20 op_type;
        /// Copy the source data.
        19:19 copy_src_data => bool;
        /// First block.
        1:1 first_block => bool;
        /// Last block.
        0:0 last_block => bool;
    }
}

impl MetaCtrl {
    /// The `meta_ctrl` of every driver-built Tx descriptor: a plain copy, `0x0108_0003`.
    pub(crate) fn copy() -> Self {
        Self::zeroed()
            .with_last_block(true)
            .with_first_block(true)
            .with_copy_src_data(true)
            .with_const_ssmae_op::<2>()
    }
}

/// Ordering requested for a Tx descriptor (hardware.rst §4.4; values as in the reference ABI).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Barrier {
    /// No ordering beyond the queue's order.
    None = 0,
    /// DMB: `len_ctrl` bit 30.
    Dmb = 1,
    /// Write barrier: `meta_ctrl` bit 26.
    Write = 2,
}

impl TryFrom<u32> for Barrier {
    type Error = Error;

    /// Decodes a barrier mode.
    ///
    /// # Errors
    ///
    /// `EINVAL` for any value other than 0, 1 or 2 (hardware.rst §4.4).
    fn try_from(v: u32) -> Result<Self> {
        match v {
            0 => Ok(Self::None),
            1 => Ok(Self::Dmb),
            2 => Ok(Self::Write),
            _ => Err(EINVAL),
        }
    }
}

/// Largest number of bytes one descriptor moves (hardware.rst §4.8).
pub(crate) const MAX_DESC_BYTES: u32 = 65536;

/// A validated descriptor length: 1..=65536 bytes, held in its 16-bit encoding (65536 -> 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DescLen(u16);

impl DescLen {
    /// 65536 bytes, the longest transfer of one descriptor.
    pub(crate) const MAX: Self = Self(0);

    /// Validates a transfer size in bytes.
    ///
    /// # Errors
    ///
    /// `EINVAL` for 0 (which the reference silently turns into 64 KiB) and for sizes above
    /// 65536 bytes.
    pub(crate) fn new(bytes: u32) -> Result<Self> {
        match bytes {
            MAX_DESC_BYTES => Ok(Self(0)),
            // CAST: 1..=65535 fits in 16 bits.
            1..MAX_DESC_BYTES => Ok(Self(bytes as u16)),
            _ => Err(EINVAL),
        }
    }

    /// The length in bytes, 1..=65536.
    pub(crate) fn bytes(self) -> u32 {
        if self.0 == 0 {
            MAX_DESC_BYTES
        } else {
            u32::from(self.0)
        }
    }
}

/// A 2-bit ring id (phase) stamped into `len_ctrl` (hardware.rst §4.6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RingId(Bounded<u32, 2>);

impl RingId {
    /// The ring id after a queue reset, which the hardware expects first (`UDMA_INITIAL_RING_ID`).
    pub(crate) const INITIAL: Self = Self(Bounded::<u32, 2>::new::<1>());

    /// The ring id of the next pass: `(id + 1) & 3`.
    #[cfg(neuron_udma_kunit)]
    pub(crate) fn next(self) -> Self {
        self.after_slot(true)
    }

    /// The ring id after a slot was handed out: [`Self::next`] if the ring index `wrapped` to 0,
    /// else unchanged. Computed without a branch: under TCG every branch ends a translation
    /// block, and this runs twice per pair (Documentation/benchmarks.rst, (a)).
    #[inline(always)]
    pub(crate) fn after_slot(self, wrapped: bool) -> Self {
        // Values of a 2-bit `Bounded` are 0..=3, so the masked sum fits.
        Self(Bounded::<u32, 2>::from_expr(
            (self.0.get() + u32::from(wrapped)) & 3,
        ))
    }

    /// The 2-bit value.
    pub(crate) fn bits(self) -> Bounded<u32, 2> {
        self.0
    }
}

/// Size in bytes of one descriptor (hardware.rst §4.1).
pub(crate) const DESC_SIZE: usize = 16;

/// One 16-byte descriptor exactly as it lies in a ring slot (hardware.rst §4.1): four
/// little-endian words, `len_ctrl`, word 1 (Tx: `meta_ctrl`; Rx: `buf2_ptr_lo`, always 0) and the
/// 64-bit device-fabric address (Tx: source `buf_ptr`; Rx: destination `buf1_ptr`).
///
/// The only descriptor type of the driver: the builders write it, rings store it, debugfs and
/// the tests read it back through [`Desc::decode`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes)]
pub(crate) struct Desc {
    len_ctrl: u32,
    word1: u32,
    addr: u64,
}

// SAFETY: `repr(C)`, two `u32` then a `u64` at offset 8: no padding; every bit pattern is valid.
unsafe impl kernel::transmute::AsBytes for Desc {}
// SAFETY: As above.
unsafe impl kernel::transmute::FromBytes for Desc {}

/// Which ring a descriptor is on, for [`Desc::decode`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dir {
    /// The M2S (Tx, source) ring.
    Tx,
    /// The S2M (Rx, destination) ring.
    Rx,
}

/// The fields of a descriptor, in CPU byte order ([`Desc::decode`]); `Display` prints the
/// length in bytes, the ring id, the flags set, word 1 and the address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Decoded {
    /// Ring of the descriptor.
    pub(crate) dir: Dir,
    /// `len_ctrl`.
    pub(crate) len_ctrl: LenCtrl,
    /// Word 1 (`meta_ctrl` on Tx).
    pub(crate) word1: u32,
    /// Device-fabric address.
    pub(crate) addr: u64,
}

impl Decoded {
    /// Bytes moved, 1..=65536 (the 16-bit field 0 means 65536, hardware.rst §4.2).
    pub(crate) fn len_bytes(&self) -> u32 {
        match self.len_ctrl.len().get() {
            0 => MAX_DESC_BYTES,
            n => n,
        }
    }

    /// The ring id (phase) the descriptor was stamped with.
    pub(crate) fn ring_id(&self) -> u32 {
        self.len_ctrl.ring_id().get()
    }

    /// `meta_ctrl` of a Tx descriptor (`None` on Rx).
    pub(crate) fn meta_ctrl(&self) -> Option<MetaCtrl> {
        (self.dir == Dir::Tx).then(|| MetaCtrl::from_raw(self.word1))
    }
}

impl core::fmt::Display for Decoded {
    fn fmt(&self, w: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let lc = self.len_ctrl;
        write!(w, "len={} ring_id={}", self.len_bytes(), self.ring_id())?;
        for (set, name) in [
            (lc.first(), "first"),
            (lc.last(), "last"),
            (lc.dmb(), "dmb"),
            (lc.int_en(), "int_en"),
            (lc.meta(), "meta"),
            (lc.concat(), "concat"),
        ] {
            if set {
                write!(w, " {name}")?;
            }
        }
        match self.meta_ctrl() {
            Some(meta) => {
                if meta.write_barrier() {
                    write!(w, " wb")?;
                }
                write!(w, " meta_ctrl={:#010x}", self.word1)?;
            }
            None if self.word1 != 0 => write!(w, " word1={:#010x}", self.word1)?,
            None => {}
        }
        write!(w, " addr={:#018x}", self.addr)
    }
}

impl Desc {
    /// The slot's bytes as two 8-byte words in memory order (`len_ctrl` and word 1, then the
    /// address): a ring slot is written with two stores (`ring.rs`, `Ring::push`).
    #[inline(always)]
    pub(crate) fn halves(self) -> [u64; 2] {
        // SAFETY: `Desc` is `repr(C)`, 16 bytes without padding, and every bit pattern is valid
        // for it and for `[u64; 2]`: the transmute keeps the bytes in memory order.
        unsafe { core::mem::transmute::<Self, [u64; 2]>(self) }
    }

    fn new(len_ctrl: LenCtrl, word1: u32, addr: u64) -> Self {
        Self {
            len_ctrl: len_ctrl.into_raw().to_le(),
            word1: word1.to_le(),
            addr: addr.to_le(),
        }
    }

    /// Tx (m2s) descriptor of a one-descriptor packet: FIRST | LAST [| DMB] | ring id | len,
    /// `meta_ctrl` = 0x0108_0003 [| write barrier] (hardware.rst §4.5 step 4).
    pub(crate) fn tx(len: DescLen, ring_id: RingId, barrier: Barrier, src: u64) -> Self {
        let len_ctrl = LenCtrl::zeroed()
            .with_first(true)
            .with_last(true)
            .with_dmb(barrier == Barrier::Dmb)
            .with_ring_id(ring_id.bits())
            .with_len(len.0);
        let meta = MetaCtrl::copy().with_write_barrier(barrier == Barrier::Write);
        Self::new(len_ctrl, meta.into_raw(), src)
    }

    /// Rx (s2m) descriptor: [INT_EN |] ring id | len, word 1 zero (hardware.rst §4.5 step 5).
    pub(crate) fn rx(len: DescLen, ring_id: RingId, int_en: bool, dst: u64) -> Self {
        let len_ctrl = LenCtrl::zeroed()
            .with_int_en(int_en)
            .with_ring_id(ring_id.bits())
            .with_len(len.0);
        Self::new(len_ctrl, 0, dst)
    }

    /// The fields, read as a descriptor of ring `dir`.
    pub(crate) fn decode(&self, dir: Dir) -> Decoded {
        Decoded {
            dir,
            len_ctrl: LenCtrl::from_raw(u32::from_le(self.len_ctrl)),
            word1: u32::from_le(self.word1),
            addr: u64::from_le(self.addr),
        }
    }

    /// The 16 bytes as they lie in ring memory.
    pub(crate) fn to_bytes(self) -> [u8; DESC_SIZE] {
        let mut b = [0u8; DESC_SIZE];
        b[0..4].copy_from_slice(&self.len_ctrl.to_ne_bytes());
        b[4..8].copy_from_slice(&self.word1.to_ne_bytes());
        b[8..16].copy_from_slice(&self.addr.to_ne_bytes());
        b
    }
}

#[cfg(neuron_udma_kunit)]
#[kunit_tests(neuron_udma_desc)]
mod tests {
    use super::*;

    const H: u64 = 0x0000_1000_0000_0000;

    /// `len_ctrl` of `d`, in CPU byte order.
    fn lc(d: Desc) -> u32 {
        d.decode(Dir::Tx).len_ctrl.into_raw()
    }

    /// Word 1 of `d`, in CPU byte order.
    fn w1(d: Desc) -> u32 {
        d.decode(Dir::Tx).word1
    }

    fn id(n: u32) -> RingId {
        let mut r = RingId::INITIAL;
        while r.bits().get() != n {
            r = r.next();
        }
        r
    }

    /// The two words a slot is written with are the descriptor's 16 bytes in memory order.
    #[test]
    fn halves_are_the_slot_bytes() -> Result {
        let d = Desc::tx(
            DescLen::new(0x1234)?,
            RingId::INITIAL.next(),
            Barrier::Write,
            0x0000_beef_0000_1000 | H,
        );
        let [lo, hi] = d.halves();
        assert_eq!(
            &lo.to_ne_bytes()[..],
            &kernel::transmute::AsBytes::as_bytes(&d)[..8]
        );
        assert_eq!(
            &hi.to_ne_bytes()[..],
            &kernel::transmute::AsBytes::as_bytes(&d)[8..]
        );
        Ok(())
    }

    #[test]
    fn appendix_a_vectors() -> Result {
        // hardware.rst Appendix A: one 4 KiB host->HBM copy on v2, then the completion marker pair.
        let src = 0x1234_5000 | H;
        let tx0 = Desc::tx(DescLen::new(0x1000)?, RingId::INITIAL, Barrier::Write, src);
        assert_eq!(lc(tx0), 0x0D00_1000);
        assert_eq!(w1(tx0), 0x0508_0003);
        assert_eq!(
            tx0.to_bytes(),
            [
                0x00, 0x10, 0x00, 0x0D, 0x03, 0x00, 0x08, 0x05, 0x00, 0x50, 0x34, 0x12, 0x00, 0x10,
                0x00, 0x00
            ]
        );
        let rx0 = Desc::rx(DescLen::new(0x1000)?, RingId::INITIAL, false, 0x4000);
        assert_eq!(lc(rx0), 0x0100_1000);
        assert_eq!(w1(rx0), 0);
        assert_eq!(rx0.decode(Dir::Rx).addr, 0x4000);
        let tx1 = Desc::tx(DescLen::new(4)?, RingId::INITIAL, Barrier::None, 0x8000 | H);
        assert_eq!(lc(tx1), 0x0D00_0004);
        assert_eq!(w1(tx1), 0x0108_0003);
        let rx1 = Desc::rx(DescLen::new(4)?, RingId::INITIAL, false, 0x8004 | H);
        assert_eq!(lc(rx1), 0x0100_0004);
        assert_eq!(tx0.decode(Dir::Tx).addr, src);
        assert_eq!(tx0.decode(Dir::Tx).len_bytes(), 0x1000);
        Ok(())
    }

    #[test]
    fn flags_alone_and_combined() -> Result {
        let len = DescLen::new(1)?;
        assert_eq!(MetaCtrl::copy().into_raw(), 0x0108_0003);
        let dmb = Desc::tx(len, id(1), Barrier::Dmb, 0);
        assert_eq!(lc(dmb), 0x4D00_0001);
        assert_eq!(w1(dmb), 0x0108_0003);
        let wb = Desc::tx(len, id(1), Barrier::Write, 0);
        assert_eq!(lc(wb), 0x0D00_0001);
        assert_eq!(w1(wb), 0x0508_0003);
        assert_eq!(lc(Desc::rx(len, id(1), true, 0)), 0x1100_0001);
        assert_eq!(lc(Desc::tx(len, id(0), Barrier::Dmb, 0)), 0x4C00_0001);
        assert_eq!(lc(Desc::tx(len, id(2), Barrier::None, 0)), 0x0E00_0001);
        assert_eq!(lc(Desc::tx(len, id(3), Barrier::None, 0)), 0x0F00_0001);
        assert_eq!(lc(Desc::rx(len, id(3), true, 0)), 0x1300_0001);
        assert_eq!(lc(Desc::rx(len, id(0), false, 0)), 0x0000_0001);
        assert_eq!(Barrier::try_from(3u32), Err(EINVAL));
        assert_eq!(Barrier::try_from(2u32), Ok(Barrier::Write));
        Ok(())
    }

    #[test]
    fn lengths() -> Result {
        assert_eq!(DescLen::new(0), Err(EINVAL));
        assert_eq!(DescLen::new(65537), Err(EINVAL));
        assert_eq!(DescLen::new(u32::MAX), Err(EINVAL));
        let full = DescLen::new(65536)?;
        assert_eq!(full.bytes(), 65536);
        assert_eq!(lc(Desc::tx(full, id(1), Barrier::None, 0)), 0x0D00_0000);
        assert_eq!(lc(Desc::rx(full, id(1), false, 0)), 0x0100_0000);
        assert_eq!(DescLen::new(65535)?.bytes(), 65535);
        assert_eq!(
            lc(Desc::rx(DescLen::new(65535)?, id(1), false, 0)),
            0x0100_FFFF
        );
        Ok(())
    }
}
