// SPDX-License-Identifier: GPL-2.0
//! Strictness: every error class sets its cause bit, aborts only its engine,
//! leaves heads and destination bytes untouched; recovery paths.

mod common;

use common::*;
use udma_sim::engine::ErrorKind;
use udma_sim::layout::Model;
use udma_sim::mem::GuestMemory;
use udma_sim::regs::{self, desc, m2s_cause, s2m_cause};
use udma_sim::Options;

const TX_RING: u64 = RAM_BASE;
const RX_RING: u64 = RAM_BASE + 0x40000;
const SRC: u64 = RAM_BASE + 0x10_0000;
const DST: u64 = RAM_BASE + 0x80_0000;
const E: u32 = 32;
const OTHER: u32 = 33;

fn setup() -> (Rig, SwQueue) {
    let rig = Rig::new(Model::Trn1);
    rig.init_engine(E);
    rig.init_engine(OTHER);
    let sq = rig.init_queue(E, 0, TX_RING, RX_RING, 64);
    rig.fill(SRC, 0x10000, 0x5A);
    (rig, sq)
}

/// Asserts the abort: kind, cause bits, state, heads unmoved, DST untouched,
/// and that the other engine still works.
fn expect_error(rig: &Rig, kind: ErrorKind, a: u32, b: u32) {
    rig.wait_abort(E);
    let le = rig.dev.last_error().expect("last error");
    assert_eq!((le.engine, le.record.kind), (E, kind), "{le:?}");
    assert_eq!(rig.cause_a(E), a, "M2S cause");
    assert_eq!(rig.cause_b(E), b, "S2M cause");
    let sum = if a != 0 { regs::MAIN_D_SUM_A } else { 0 } | if b != 0 { regs::MAIN_D_SUM_B } else { 0 };
    assert_eq!(rig.rd(E, regs::IOFIC_MAIN_D) & (regs::MAIN_D_SUM_A | regs::MAIN_D_SUM_B), sum);
    assert_eq!(rig.head(E, 0, true), 1 << 30, "tx head must not move");
    assert_eq!(rig.head(E, 0, false), 1 << 30, "rx head must not move");
    assert_eq!(rig.ram_bytes(DST, 4096), vec![0u8; 4096], "no bytes may be written");
    assert_eq!(rig.dev.counters().errors, 1);
    // Errors stop only the affected engine.
    assert_eq!(rig.rd(OTHER, regs::M2S_STATE), regs::STATE_NORMAL);
    let mut sq = rig.init_queue(OTHER, 2, TX_RING + 0x8000, RX_RING + 0x8000, 64);
    rig.prepare(&mut sq, rig.host(SRC), rig.host(DST + 0x20000), 64);
    rig.start(&sq, 1);
    rig.wait_done(&sq);
    assert_eq!(rig.ram_bytes(DST + 0x20000, 64), rig.ram_bytes(SRC, 64));
}

#[test]
fn desc_fetch_from_unmapped_ring() {
    let (rig, _) = setup();
    // Tx ring base outside guest RAM (still 256-byte aligned); the Rx descriptor is valid, so
    // the Rx prefetch at the Rx doorbell passes and the Tx fetch fails.
    let mut sq = rig.init_queue(E, 0, 0x4000_0000, RX_RING, 64);
    let (ri, rrid) = sq.rx.take();
    rig.put_desc(&sq.rx, ri, rrid << 24 | 64, 0, rig.host(DST));
    rig.start(&sq, 1);
    expect_error(&rig, ErrorKind::DescFetch, m2s_cause::DESC_FETCH, 0);
    // Rx ring unmapped (Tx descriptor valid).
    let (rig, _) = setup();
    sq = rig.init_queue(E, 0, TX_RING, 0x4000_0000, 64);
    let (ti, trid) = sq.tx.take();
    rig.put_desc(&sq.tx, ti, desc::FIRST | desc::LAST | trid << 24 | 64, desc::META_COPY, rig.host(SRC));
    rig.start(&sq, 1);
    expect_error(&rig, ErrorKind::DescFetch, 0, s2m_cause::DESC_FETCH);
}

#[test]
fn ring_id_mismatch_tx_and_rx() {
    for tx in [true, false] {
        let (rig, mut sq) = setup();
        rig.prepare(&mut sq, rig.host(SRC), rig.host(DST), 64);
        // Restamp one side with a stale ring id (2 instead of 1).
        let ring = if tx { sq.tx } else { sq.rx };
        let mut d = [0u8; 16];
        assert!(rig.ram.read(ring.gpa, &mut d));
        d[3] = (d[3] & !3) | 2;
        assert!(rig.ram.write(ring.gpa, &d));
        rig.start(&sq, 1);
        if tx {
            expect_error(&rig, ErrorKind::RingId, m2s_cause::RING_ID, 0);
        } else {
            expect_error(&rig, ErrorKind::RingId, 0, s2m_cause::RING_ID);
        }
    }
}

#[test]
fn masked_ring_id_stalls_until_slot_valid() {
    let (rig, mut sq) = setup();
    // V3 SENG style masking (hardware.rst §3.5): abort mask bit 17 set.
    let m = rig.rd(E, regs::IOFIC_SEC_A + regs::IOFIC_MASK) | m2s_cause::RING_ID;
    rig.wr(E, regs::IOFIC_SEC_A + regs::IOFIC_MASK, m);
    rig.wr(E, regs::IOFIC_SEC_A + regs::IOFIC_ABORT_MASK, m);
    rig.fill(SRC, 64, 1);
    rig.prepare(&mut sq, rig.host(SRC), rig.host(DST), 64);
    let mut d = [0u8; 16];
    assert!(rig.ram.read(sq.tx.gpa, &mut d));
    let good = d;
    d[3] = (d[3] & !3) | 3;
    assert!(rig.ram.write(sq.tx.gpa, &d));
    rig.start(&sq, 1);
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert_eq!(rig.rd(E, regs::M2S_STATE), regs::STATE_NORMAL);
    assert_eq!(rig.head(E, 0, true), 1 << 30);
    assert!(rig.ram.write(sq.tx.gpa, &good)); // slot becomes valid: processing resumes
    rig.wait_done(&sq);
    assert_eq!(rig.ram_bytes(DST, 64), rig.ram_bytes(SRC, 64));
}

#[test]
fn doorbell_on_disabled_queue() {
    let (rig, mut sq) = setup();
    rig.wr(E, Rig::bank(true, 0) + regs::Q_CFG, 0x0300_0000);
    rig.prepare(&mut sq, rig.host(SRC), rig.host(DST), 64);
    rig.start(&sq, 1);
    expect_error(&rig, ErrorKind::QueueDisabled, m2s_cause::PREFETCH_TIMEOUT, 0);
    assert_eq!(rig.tail(E, 0, true), 1 << 30, "rejected doorbell must not move the tail");
}

#[test]
fn misaligned_ring_base() {
    let (rig, _) = setup();
    let sq = rig.init_queue(E, 0, TX_RING + 0x40, RX_RING, 64);
    rig.doorbell(E, 0, true, 1);
    expect_error(&rig, ErrorKind::BadRing, m2s_cause::DESC_FETCH, 0);
    let _ = sq;
}

#[test]
fn bad_ring_lengths() {
    for len in [0u32, 16, 48, 1 << 24] {
        let (rig, _) = setup();
        rig.init_queue(E, 0, TX_RING, RX_RING, len);
        rig.doorbell(E, 0, false, 1);
        expect_error(&rig, ErrorKind::BadRing, 0, s2m_cause::DESC_FETCH);
    }
}

#[test]
fn overrun() {
    let (rig, _) = setup();
    rig.doorbell(E, 0, true, 64); // increment == ring length
    expect_error(&rig, ErrorKind::Overrun, m2s_cause::RING_ID, 0);
    let (rig, sq) = setup();
    rig.dev.inject(udma_sim::fault::Fault::Stall { engine: E, queue: 0, ms: 60_000 }).unwrap();
    rig.doorbell(E, 0, false, 40);
    rig.doorbell(E, 0, false, 24); // tail would catch up with the head
    expect_error(&rig, ErrorKind::Overrun, 0, s2m_cause::RING_ID);
    assert_eq!(rig.tail(E, 0, false), 40 | 1 << 30);
    let _ = sq;
}

fn raw_tx(rig: &Rig, sq: &mut SwQueue, w0_extra: u32, meta: u32, len: u32, src: u64) {
    let (ti, trid) = sq.tx.take();
    rig.put_desc(&sq.tx, ti, trid << 24 | w0_extra | len, meta, src);
}

fn raw_rx(rig: &Rig, sq: &mut SwQueue, len: u32, dst: u64) {
    let (ri, rrid) = sq.rx.take();
    rig.put_desc(&sq.rx, ri, rrid << 24 | len, 0, dst);
}

#[test]
fn missing_first() {
    let (rig, mut sq) = setup();
    raw_tx(&rig, &mut sq, desc::LAST, desc::META_COPY, 64, rig.host(SRC));
    raw_rx(&rig, &mut sq, 64, rig.host(DST));
    rig.start(&sq, 1);
    expect_error(&rig, ErrorKind::BadFirst, m2s_cause::BAD_FIRST, 0);
}

#[test]
fn missing_last() {
    let (rig, mut sq) = setup();
    raw_tx(&rig, &mut sq, desc::FIRST, desc::META_COPY, 64, rig.host(SRC));
    raw_tx(&rig, &mut sq, desc::FIRST | desc::LAST, desc::META_COPY, 64, rig.host(SRC));
    raw_rx(&rig, &mut sq, 128, rig.host(DST));
    rig.doorbell(E, 0, false, 1);
    rig.doorbell(E, 0, true, 2);
    expect_error(&rig, ErrorKind::BadLast, m2s_cause::BAD_LAST, 0);
    assert_eq!(rig.dev.last_error().unwrap().record.index, Some(1));
}

#[test]
fn too_many_descriptors_per_packet() {
    let (rig, mut sq) = setup();
    rig.wr(E, regs::M2S_DESC_PREF_CFG_2, 0x0001_0008);
    for i in 0..9 {
        let f = if i == 0 { desc::FIRST } else { 0 } | if i == 8 { desc::LAST } else { 0 };
        raw_tx(&rig, &mut sq, f, desc::META_COPY, 16, rig.host(SRC + i * 16));
    }
    raw_rx(&rig, &mut sq, 144, rig.host(DST));
    rig.doorbell(E, 0, false, 1);
    rig.doorbell(E, 0, true, 9);
    expect_error(&rig, ErrorKind::TooManyDescs, m2s_cause::TOO_MANY_DESCS, 0);
}

#[test]
fn packet_longer_than_cfg_len() {
    let (rig, mut sq) = setup();
    rig.wr(E, regs::M2S_CFG_LEN, 0x0100_0100); // max 256 bytes
    rig.prepare(&mut sq, rig.host(SRC), rig.host(DST), 512);
    rig.start(&sq, 1);
    expect_error(&rig, ErrorKind::PktTooLong, m2s_cause::PKT_TOO_LONG, 0);
}

#[test]
fn tx_rx_length_mismatch() {
    let (rig, mut sq) = setup();
    raw_tx(&rig, &mut sq, desc::FIRST | desc::LAST, desc::META_COPY, 100, rig.host(SRC));
    raw_rx(&rig, &mut sq, 128, rig.host(DST));
    rig.start(&sq, 1);
    expect_error(&rig, ErrorKind::LenMismatch, m2s_cause::LEN_MISMATCH, s2m_cause::LEN_MISMATCH);
}

#[test]
fn bad_source_and_destination_addresses() {
    // Unmapped source.
    let (rig, mut sq) = setup();
    rig.prepare(&mut sq, rig.host(0x7000_0000), rig.host(DST), 64);
    rig.start(&sq, 1);
    expect_error(&rig, ErrorKind::DataRead, m2s_cause::DATA_READ, 0);
    // Source straddling the end of guest RAM.
    let (rig, mut sq) = setup();
    rig.prepare(&mut sq, rig.host(RAM_BASE + RAM_SIZE as u64 - 32), rig.host(DST), 64);
    rig.start(&sq, 1);
    expect_error(&rig, ErrorKind::DataRead, m2s_cause::DATA_READ, 0);
    // Unsupported route (V2 route value 0x3 = neighbour device).
    let (rig, mut sq) = setup();
    rig.prepare(&mut sq, 0x3000_0000_0000 | SRC, rig.host(DST), 64);
    rig.start(&sq, 1);
    expect_error(&rig, ErrorKind::DataRead, m2s_cause::DATA_READ, 0);
    // Unmapped destination in host memory and beyond HBM.
    for dst in [0x1000_7000_0000u64, 16 << 20] {
        let (rig, mut sq) = setup();
        rig.prepare(&mut sq, rig.host(SRC), dst, 64);
        rig.start(&sq, 1);
        expect_error(&rig, ErrorKind::DataWrite, 0, s2m_cause::DATA_WRITE);
    }
}

#[test]
fn unsupported_meta_and_desc_bits() {
    for (extra, meta) in [(0, 0x0108_0007u32), (0, 0), (desc::META, desc::META_COPY), (desc::CONCAT, desc::META_COPY)] {
        let (rig, mut sq) = setup();
        raw_tx(&rig, &mut sq, desc::FIRST | desc::LAST | extra, meta, 64, rig.host(SRC));
        raw_rx(&rig, &mut sq, 64, rig.host(DST));
        rig.start(&sq, 1);
        expect_error(&rig, ErrorKind::Unsupported, m2s_cause::UNSUPPORTED, 0);
    }
}

#[test]
fn bus_master_disabled() {
    let (rig, mut sq) = setup();
    rig.dev.set_bus_master(false);
    rig.prepare(&mut sq, rig.host(SRC), rig.host(DST), 64);
    rig.start(&sq, 1);
    rig.wait_abort(E);
    assert_eq!(rig.dev.last_error().unwrap().record.kind, ErrorKind::BusMasterOff);
    assert_eq!(rig.cause_a(E), m2s_cause::DESC_FETCH);
}

#[test]
fn queue_reinit_keeps_abort_and_cause_bits() {
    let (rig, mut sq) = setup();
    rig.prepare(&mut sq, rig.host(SRC), rig.host(0x7000_0000), 64);
    rig.start(&sq, 1);
    rig.wait_abort(E);
    assert_eq!(rig.cause_b(E), s2m_cause::DATA_WRITE);
    // Strict (hardware.rst §8.3 [I]): a full queue init (hardware.rst §3.7) of the failing queue
    // neither ends the abort nor clears the cause bits.
    let mut sq = rig.init_queue(E, 0, TX_RING, RX_RING, 64);
    assert_eq!(rig.rd(E, regs::M2S_STATE), regs::STATE_ABORT);
    assert_eq!(rig.rd(E, regs::S2M_STATE), regs::STATE_ABORT);
    assert_eq!(rig.cause_b(E), s2m_cause::DATA_WRITE);
    rig.prepare(&mut sq, rig.host(SRC), rig.host(DST), 64);
    rig.start(&sq, 1);
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert_eq!(rig.head(E, 0, true), 1 << 30, "aborted engine must not process");
    // The driver's recovery: write-0-to-clear the causes seen, then change_state NORMAL.
    rig.wr(E, regs::IOFIC_SEC_B + regs::IOFIC_CAUSE, !s2m_cause::DATA_WRITE);
    assert_eq!(rig.cause_b(E), 0);
    assert_eq!(rig.rd(E, regs::M2S_STATE), regs::STATE_ABORT);
    rig.wr(E, regs::M2S_CHANGE_STATE, regs::CHANGE_STATE_NORMAL);
    rig.wr(E, regs::S2M_CHANGE_STATE, regs::CHANGE_STATE_NORMAL);
    rig.wait_done(&sq);
    assert_eq!(rig.ram_bytes(DST, 64), rig.ram_bytes(SRC, 64));
}

#[test]
fn lenient_recovery_by_queue_reinit() {
    let rig = Rig::with_options(Model::Trn1, None, Options { sticky_errors: false, ..Options::default() });
    rig.init_engine(E);
    let mut sq = rig.init_queue(E, 0, TX_RING, RX_RING, 64);
    rig.fill(SRC, 0x10000, 0x5A);
    rig.prepare(&mut sq, rig.host(SRC), rig.host(0x7000_0000), 64);
    rig.start(&sq, 1);
    rig.wait_abort(E);
    assert_eq!(rig.cause_b(E), s2m_cause::DATA_WRITE);
    // Resetting only the Tx side is not enough.
    rig.wr(E, Rig::bank(true, 0) + regs::M2S_Q_SW_CTRL, regs::Q_SW_CTRL_RESET);
    rig.wr(E, Rig::bank(true, 0) + regs::Q_CFG, 0x0303_0000);
    assert_eq!(rig.rd(E, regs::M2S_STATE), regs::STATE_ABORT);
    // Re-initialising another queue does not clear queue 0's error.
    rig.init_queue(E, 5, TX_RING + 0x8000, RX_RING + 0x8000, 64);
    assert_eq!(rig.rd(E, regs::M2S_STATE), regs::STATE_ABORT);
    // Full queue init of the failing queue clears the abort and its cause bits.
    let mut sq = rig.init_queue(E, 0, TX_RING, RX_RING, 64);
    assert_eq!(rig.rd(E, regs::M2S_STATE), regs::STATE_NORMAL);
    assert_eq!(rig.rd(E, regs::S2M_STATE), regs::STATE_NORMAL);
    assert_eq!(rig.cause_b(E), 0);
    rig.prepare(&mut sq, rig.host(SRC), rig.host(DST), 64);
    rig.start(&sq, 1);
    rig.wait_done(&sq);
    assert_eq!(rig.ram_bytes(DST, 64), rig.ram_bytes(SRC, 64));
}

#[test]
fn recovery_by_change_state_normal() {
    let (rig, mut sq) = setup();
    rig.wr(E, regs::M2S_CHANGE_STATE, regs::CHANGE_STATE_ABORT);
    rig.wr(E, regs::S2M_CHANGE_STATE, regs::CHANGE_STATE_ABORT);
    assert_eq!(rig.rd(E, regs::M2S_STATE), regs::STATE_ABORT);
    rig.prepare(&mut sq, rig.host(SRC), rig.host(DST), 64);
    rig.start(&sq, 1);
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert_eq!(rig.head(E, 0, true), 1 << 30, "aborted engine must not process");
    rig.wr(E, regs::M2S_CHANGE_STATE, regs::CHANGE_STATE_NORMAL);
    assert_eq!(rig.head(E, 0, true), 1 << 30, "S2M still aborted");
    rig.wr(E, regs::S2M_CHANGE_STATE, regs::CHANGE_STATE_NORMAL);
    rig.wait_done(&sq); // pending work resumes
    assert_eq!(rig.ram_bytes(DST, 64), rig.ram_bytes(SRC, 64));
}
